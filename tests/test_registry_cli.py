"""Toggle registry, ids and parts, env toggle parsing, and the CLI verbs on fixture toggles."""

from __future__ import annotations

import json

import pytest

from clihelp import assert_one_line_error, run_cli
from patch_fixtures import targets as T
from sglfix.toggling.env import maybe_revert_pr_fix, parse_env_value
from sglfix.common.errors import ConfigError, PatchStateError
from sglfix.toggling.registry import load_registry
from sglfix.toggling.revert import revert, reverted_ids

M = "patch_fixtures.targets"
ALLOW = ["--allow-target", "patch_fixtures"]

TOGGLE_PARTS = f"""\
pr: 11111
title: Scale and double fixes
url: https://example.invalid/pr/11111
bug: arithmetic
parts:
  scale:
    summary: scale by SCALE
    patches:
      - target: {M}.plain
        edits:
          - match: |
              total = total * SCALE
            replacement: |
              total = total * 1
  double:
    summary: double means times two
    patches:
      - target: {M}.Child.double
        edits:
          - match: return x * 2
            replacement: return x * 3
expect:
  - {{scenario: none-*, verdict: [DIVERGE], revert: "11111:scale"}}
"""

TOGGLE_PLAIN = f"""\
pr: 22222
title: Greeting fix
patches:
  - target: {M}.Child.greet
    edits:
      - match: |
          word = super().greet()
        replacement: |
          word = "zero"
"""

DRIFTED = f"""\
pr: 33333
title: Drifted
patches:
  - target: {M}.plain
    edits:
      - match: |
          total = total * SCALE_OLD
        replacement: |
          total = 0
"""


@pytest.fixture
def reg_dir(toggles_dir):
    (toggles_dir / "11111.yaml").write_text(TOGGLE_PARTS)
    (toggles_dir / "22222.yaml").write_text(TOGGLE_PLAIN)
    return toggles_dir


def test_ids_and_parts(reg_dir):
    reg = load_registry()
    assert reg.ids() == ["11111", "11111:scale", "11111:double", "22222", "22222:main"]
    t = reg.toggles[11111]
    assert t.expect[0].revert == ("11111:scale",) and t.expect[0].verdicts == ("DIVERGE",)


def test_revert_whole_and_part_and_twice(reg_dir):
    with revert(["11111:scale"], allowed_prefixes=("patch_fixtures",)):
        assert T.plain(1) == 3 and T.Child.double(1) == 2
        with pytest.raises(PatchStateError, match="already reverted"):
            revert(["11111"], allowed_prefixes=("patch_fixtures",))
        assert T.plain(1) == 3 and T.Child.double(1) == 2  # the refused revert applied nothing
    with revert(["11111", "22222"], allowed_prefixes=("patch_fixtures",)) as r:
        assert T.plain(1) == 3 and T.Child.double(1) == 3 and T.Child().greet() == "zero-child"
        assert sorted(reverted_ids()) == sorted(r.ids)
    assert T.plain(1) == 9 and T.Child.double(1) == 2 and T.Child().greet() == "base-child"
    assert reverted_ids() == []


def test_overlapping_ids_are_an_error(reg_dir):
    with pytest.raises(ConfigError, match="again"):
        revert(["11111", "11111:scale"], allowed_prefixes=("patch_fixtures",))


def test_env_applies_a_list_and_is_idempotent(reg_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_DEBUG_REVERT_PR", "22222,11111:double")
    held = maybe_revert_pr_fix(allowed_prefixes=("patch_fixtures",))
    try:
        assert T.Child.double(2) == 6 and T.Child().greet() == "zero-child" and T.plain(1) == 9
        assert maybe_revert_pr_fix(allowed_prefixes=("patch_fixtures",)) is held
        monkeypatch.setenv("SGLANG_DEBUG_REVERT_PR", "11111")
        with pytest.raises(ConfigError, match="already reverted"):
            maybe_revert_pr_fix(allowed_prefixes=("patch_fixtures",))
    finally:
        held.restore()
    assert T.Child.double(2) == 4


@pytest.mark.parametrize("value", ["", "0", "  ", " 0 "])
def test_env_none(reg_dir, value):
    assert parse_env_value(value) == []


BAD_ENV = {
    "abc": "'abc'",
    "27460,": "empty",
    "-1": "'-1'",
    "27460::x": "'27460::x'",
    "1e3": "'1e3'",
    "99999": "not registered",
    "\uff12\uff17\uff14\uff16\uff10": "bad item",
    "1" * 10000: "10000 characters",
    "11111:nope": "no part 'nope'",
    "11111,11111": "again",
    "0,11111": "0 means",
    "11111;22222": "bad item",
    "0x10": "bad item",
    "011111": "bad item",
    ",": "empty",
}


@pytest.mark.parametrize("value", list(BAD_ENV), ids=[repr(v[:12]) for v in BAD_ENV])
def test_bad_env_values_one_line_exit_2_nothing_applied(reg_dir, value):
    result = run_cli("env", env={"SGLANG_DEBUG_REVERT_PR": value})
    line = assert_one_line_error(result, "SGLANG_DEBUG_REVERT_PR", BAD_ENV[value])
    assert "11111" in line and "22222" in line  # lists the registered ids
    assert len(line) < 400
    with pytest.raises(ConfigError):
        parse_env_value(value)


def test_bad_env_in_process_applies_nothing(reg_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_DEBUG_REVERT_PR", "22222,abc")
    before = T.Child.greet.__code__
    with pytest.raises(ConfigError):
        maybe_revert_pr_fix(allowed_prefixes=("patch_fixtures",))
    assert T.Child.greet.__code__ is before and reverted_ids() == []


def test_cli_list_show_env_doctor(reg_dir):
    r = run_cli("list", "--json")
    assert r.code == 0
    data = json.loads(r.out)
    assert [t["id"] for t in data["toggles"]] == ["11111", "22222"]
    assert data["toggles"][0]["parts"] == ["scale", "double"]

    r = run_cli(*ALLOW, "show", "11111:scale", "--diff")
    assert r.code == 0, r.err
    assert "-    total = total * SCALE" in r.out and "+    total = total * 1" in r.out
    assert "return x * 3" not in r.out  # only the selected part
    r = run_cli(*ALLOW, "show", "11111", "--json", "--diff")
    shown = json.loads(r.out)
    assert set(shown["diff"]) == {f"{M}.plain", f"{M}.Child.double"}

    r = run_cli("env", "--json", env={"SGLANG_DEBUG_REVERT_PR": "11111:double"})
    assert r.code == 0 and [s["id"] for s in json.loads(r.out)["selected"]] == ["11111:double"]

    r = run_cli(*ALLOW, "doctor", "--json")
    assert r.code == 0, r.out + r.err
    ids = [t["id"] for t in json.loads(r.out)["toggles"]]
    assert ids == ["11111", "11111:scale", "11111:double", "22222"]


def test_doctor_live_and_static_report_drift(reg_dir):
    (reg_dir / "33333.yaml").write_text(DRIFTED)
    r = run_cli(*ALLOW, "doctor")
    assert r.code == 1
    assert "DRIFTED 33333" in r.out and "SCALE_OLD" in r.out and "targets.py:" in r.out
    import patch_fixtures

    root = str(__import__("pathlib").Path(patch_fixtures.__file__).parent.parent)
    r = run_cli("doctor", "--source", root, "--toggles", str(reg_dir), "--json")
    assert r.code == 1
    rows = {t["id"]: t for t in json.loads(r.out)["toggles"]}
    assert not rows["33333"]["ok"] and rows["11111"]["ok"] and rows["22222"]["ok"]
    live = run_cli(*ALLOW, "doctor", "--json")
    live_rows = {t["id"]: t for t in json.loads(live.out)["toggles"]}
    # Same rule, same message: the static error names the same edit and closest window.
    assert rows["33333"]["error"].splitlines()[0] == live_rows["33333"]["error"].splitlines()[0]


def test_unknown_command_and_option_exit_2(reg_dir):
    assert_one_line_error(run_cli("frobnicate"), "frobnicate")
    assert_one_line_error(run_cli("list", "--jsn"), "--jsn")
    assert_one_line_error(run_cli("show", "nope"), "'nope'")
    assert_one_line_error(run_cli("show", "11111:scal"), "did you mean 'scale'")
    assert_one_line_error(run_cli("doctor", "--source", "/nonexistent/dir"), "/nonexistent/dir")
    assert_one_line_error(run_cli("--toggles", "/nonexistent/t", "list"), "/nonexistent/t")


def test_debug_shows_a_traceback(reg_dir):
    r = run_cli("--debug", "show", "nope")
    assert r.code == 2 and "Traceback" in r.err


def test_builtin_caught_by_entries_name_real_tests():
    """A toggle's caught_by list must point at tests that exist, or it records nothing."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for toggle in load_registry(root / "toggles"):
        assert toggle.caught_by, f"{toggle.id} records no test that catches its revert"
        for item in toggle.caught_by:
            path, _, name = item.partition("::")
            tree = ast.parse((root / path).read_text())
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in names, f"{toggle.id}: caught_by {item} names no test"
