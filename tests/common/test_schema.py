"""Malformed toggle and patch YAML: one line, file and line number, exit 2, nothing applied."""

from __future__ import annotations

import pytest
from clihelp import assert_one_line_error, run_cli

from sglfix import apply_patches_from_config
from sglfix.common.errors import ConfigError

M = "patch_fixtures.targets"
GOOD_PATCH = f"""patches:
  - target: {M}.plain
    edits:
      - match: return total
        replacement: return 0
"""

# (file body, needle in the message, line the message must cite)
BAD_TOGGLES = {
    "syntax": ("pr: 44444\ntitle: [unclosed\n", "YAML syntax error", 3),
    "unknown-top": ("pr: 44444\ntitle: t\ntitel: x\n" + GOOD_PATCH, "unknown key 'titel'", 3),
    "no-title": ("pr: 44444\n" + GOOD_PATCH, "lacks required key 'title'", 1),
    "pr-text": ("pr: abc\ntitle: t\n" + GOOD_PATCH, "pr must be a positive PR number", 1),
    "pr-name": ("pr: 44445\ntitle: t\n" + GOOD_PATCH, "does not match the file name", 1),
    "both": ("pr: 44444\ntitle: t\nparts: {}\n" + GOOD_PATCH, "exactly one of 'patches'", 1),
    "part-key": ("pr: 44444\ntitle: t\nparts:\n  a:\n    summary: s\n    patchs: []\n", "unknown key 'patchs'", 6),
    "two-modes": (
        f"pr: 44444\ntitle: t\npatches:\n  - target: {M}.plain\n    edits:\n      - match: x\n"
        "        replacement: y\n        append: z\n",
        "both 'replacement' and 'append'",
        8,
    ),
    "empty-match": (
        f"pr: 44444\ntitle: t\npatches:\n  - target: {M}.plain\n    edits:\n      - match: ''\n",
        "match is empty",
        6,
    ),
    "no-edits": (f"pr: 44444\ntitle: t\npatches:\n  - target: {M}.plain\n    edits: []\n", "non-empty list", 5),
    "bad-target": (
        "pr: 44444\ntitle: t\npatches:\n  - target: plain\n    edits:\n      - match: x\n",
        "not a dotted path",
        4,
    ),
    "bad-verdict": (
        "pr: 44444\ntitle: t\n" + GOOD_PATCH + "expect:\n  - {scenario: s, verdict: DIVERG}\n",
        "did you mean 'DIVERGE'",
        9,
    ),
    "dup-key": ("pr: 44444\ntitle: t\ntitle: u\n" + GOOD_PATCH, "duplicate key 'title'", 3),
    "python-tag": ("pr: 44444\ntitle: !!python/object/apply:os.system [echo hi]\n" + GOOD_PATCH, "YAML", 2),
    "patches-map": ("pr: 44444\ntitle: t\npatches:\n  target: x.y\n", "must be a non-empty list", 4),
    "expect-part": (
        "pr: 44444\ntitle: t\n" + GOOD_PATCH + "expect:\n  - {scenario: s, verdict: PASS, revert: '44444:nope'}\n",
        "not a part of 44444",
        9,
    ),
    "edit-key": (
        f"pr: 44444\ntitle: t\npatches:\n  - target: {M}.plain\n    edits:\n      - match: x\n        replace: y\n",
        "did you mean 'replacement'",
        7,
    ),
    "part-name": (
        "pr: 44444\ntitle: t\nparts:\n  ok:\n    summary: s\n    patches: [{target: a.b, edits: [{match: x}]}]\n"
        "  Bad Name:\n    summary: s\n",
        "bad part name 'Bad Name'",
        7,
    ),
    "verdict-item": (
        "pr: 44444\ntitle: t\n" + GOOD_PATCH + "expect:\n  - scenario: s\n    verdict:\n      - PASS\n      - NAM\n",
        "expect[0].verdict 'NAM' is not a verdict (did you mean 'NAN'?)",
        12,
    ),
    "device": (
        "pr: 44444\ntitle: t\n" + GOOD_PATCH + "expect:\n  - {scenario: s, verdict: PASS, device: gpu}\n",
        "expect[0].device 'gpu' is not a device (did you mean 'cpu'?)",
        9,
    ),
    "revert-id": (
        "pr: 44444\ntitle: t\n" + GOOD_PATCH + "expect:\n  - {scenario: s, verdict: PASS, revert: '44444::x'}\n",
        "expect[0].revert '44444::x' is not a toggle id",
        9,
    ),
    "revert-empty": (
        "pr: 44444\ntitle: t\n" + GOOD_PATCH + "expect:\n  - {scenario: s, verdict: PASS, revert: '44444,'}\n",
        "expect[0].revert has an empty toggle id",
        9,
    ),
    "patches-null": ("pr: 44444\ntitle: t\npatches:\n", "patches must be a non-empty list", 3),
    "match-number": (
        f"pr: 44444\ntitle: t\npatches:\n  - target: {M}.plain\n    edits:\n      - match: 42\n",
        "patches[0].edits[0].match must be text",
        6,
    ),
    "misspelt-patches": (
        "pr: 44444\ntitle: t\npatchs: []\n",
        "unknown key 'patchs' in toggle file (did you mean 'patches'?)",
        3,
    ),
    "caught-by": ("pr: 44444\ntitle: t\ncaught_by: [3]\n" + GOOD_PATCH, "caught_by[0]", 3),
    "peers": ("pr: 44444\ntitle: t\npeers: [12, -4]\n" + GOOD_PATCH, "peers[1] must be a positive PR number", 3),
    "empty-title": ("pr: 44444\ntitle: ' '\n" + GOOD_PATCH, "title must be non-empty text", 2),
}


@pytest.mark.parametrize("name", list(BAD_TOGGLES))
def test_malformed_toggle_file(toggles_dir, name):
    body, needle, line = BAD_TOGGLES[name]
    (toggles_dir / "44444.yaml").write_text(body)
    message = assert_one_line_error(run_cli("list"), needle)
    assert f"44444.yaml:{line}:" in message, message


@pytest.mark.parametrize(
    "text,needle",
    [
        ("patches: [", "YAML syntax error"),
        ("patch:\n  - x\n", "unknown key 'patch'"),
        ("- 1\n", "must be a mapping"),
        (
            f"patches:\n  - target: {M}.plain\n    edits:\n      - match: a\n        prepend: b\n        append: c\n",
            "both",
        ),
        ("", "must be a mapping"),
    ],
)
def test_sglang_schema_errors_in_process(text, needle):
    with pytest.raises(ConfigError, match=needle):
        apply_patches_from_config(text, allowed_prefixes=("patch_fixtures",))


def test_yaml_is_loaded_safely(tmp_path):
    marker = tmp_path / "pwned"
    text = f"patches: !!python/object/apply:os.system ['touch {marker}']\n"
    with pytest.raises(ConfigError):
        apply_patches_from_config(text)
    assert not marker.exists()


def test_toggle_files_are_pydantic_models_with_unknown_keys_forbidden():
    from pydantic import BaseModel

    from sglfix.toggling.registry import ExpectFile, PartFile, ToggleFile
    from sglfix.toggling.variants import VariantFile, VariantsFile

    for model in (ToggleFile, PartFile, ExpectFile, VariantFile, VariantsFile):
        assert issubclass(model, BaseModel) and model.model_config["extra"] == "forbid"
    assert set(ToggleFile.model_fields) == {
        "pr",
        "title",
        "url",
        "bug",
        "description",
        "patches",
        "variants",
        "parts",
        "expect",
        "caught_by",
        "peers",
    }
    assert set(ExpectFile.model_fields) == {"scenario", "verdict", "revert", "device"}
    assert set(VariantFile.model_fields) == {"versions", "patches", "absent", "ported_from", "note"}


def test_expect_reads_verdicts_and_ids_through_the_shared_types(tmp_path):
    from sglfix.common.verdicts import Verdict
    from sglfix.toggling.registry import parse_toggle

    body = (
        "pr: 44444\ntitle: t\n"
        + GOOD_PATCH
        + (
            "expect:\n  - {scenario: a, verdict: NAN}\n  - {scenario: b, verdict: [DIVERGE, SYNC], revert: ' 44444:main , 26651'}\n"
        )
    )
    toggle = parse_toggle(body, path=str(tmp_path / "44444.yaml"))
    first, second = toggle.expect
    assert first.verdicts == (Verdict.NAN,) and first.revert == ("44444",) and first.line == 9
    assert second.verdicts == ("DIVERGE", "SYNC") and second.revert == ("44444:main", "26651")
