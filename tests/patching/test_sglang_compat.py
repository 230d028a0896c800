"""sglfix's patch engine behaves like sglang's own, on sglang's real revert YAMLs.

The sglang wheel is downloaded at test time (see ``sglang_wheel.py``); its registered revert
YAMLs, its ``source_patcher`` engine and the target functions' real source files are
extracted from it into a scratch directory. Nothing of sglang is committed here and sglang
is never imported for real: the targets live in a fake ``sglang`` tree in ``sys.modules``.

For every registered PR, both engines run on the same YAML and the same function objects:
- the same PRs apply and the same PRs are refused (in 0.5.23, 27338 and 27460 no longer
  apply: their ``match`` text was refactored away);
- the code objects they install are the same (instructions, names, constants, recursively;
  line numbers and offsets aside);
- sglfix's edited text equals sglang's ``apply_edits`` + ``textwrap.dedent``;
- sglfix restores the very original code object, and leaves nothing patched on a refusal;
- ``sglfix doctor`` reports exactly the two drifted reverts, statically.

Run: ``python -m pytest tests/patching/test_sglang_compat.py -q`` (network on first run: ~39 MB,
cached in ``$SGLFIX_CACHE/wheels`` or ``~/.cache/sglfix/wheels``).
"""

from __future__ import annotations
import __future__

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import ROOT

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # sglang_wheel sits in tests/
import sglang_wheel as sw

pytestmark = pytest.mark.network


# What sglang 0.5.23's own engine does with its own registry.
EXPECTED = {
    25015: "applied",
    26329: "applied",
    27338: "refused",
    27360: "applied",
    26972: "applied",
    27460: "refused",
}
DRIFTED = sorted(pr for pr, status in EXPECTED.items() if status == "refused")
PRS = sorted(EXPECTED)

# Bits of co_flags that only record `from __future__ import ...` features.
FUTURE_BITS = 0
for _name in __future__.all_feature_names:
    FUTURE_BITS |= getattr(__future__, _name).compiler_flag


# --------------------------------------------------------------------------- fixtures


def _fetch_or_fail() -> Path:
    """A failed download is a test failure, with pip's own words, never a skip."""
    try:
        return sw.fetch_wheel()
    except sw.WheelFetchError as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def wheel() -> Path:
    return _fetch_or_fail()


@pytest.fixture(scope="session")
def extracted(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> sw.ExtractedWheel:
    return sw.extract_wheel(wheel, tmp_path_factory.mktemp("sglang-wheel"))


@pytest.fixture
def fake(extracted: sw.ExtractedWheel):
    before = {name for name in sys.modules if name == "sglang" or name.startswith("sglang.")}
    with sw.FakeSglang(extracted) as tree:
        yield tree
    after = {name for name in sys.modules if name == "sglang" or name.startswith("sglang.")}
    assert after == before, f"fake sglang modules left behind: {sorted(after - before)}"


@pytest.fixture(scope="session")
def sglang_toggles(extracted: sw.ExtractedWheel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The six YAMLs as sglfix toggle files: metadata + sglang's ``patches:`` text unchanged."""
    directory = tmp_path_factory.mktemp("sglang-toggles")
    for pr, text in extracted.yamls.items():
        body = f'pr: {pr}\ntitle: "sglang registered revert {pr}"\n{text}'
        assert yaml.safe_load(body)["patches"] == yaml.safe_load(text)["patches"]
        (directory / f"{pr}.yaml").write_text(body)
    return directory


def _sglfix_apply():
    from sglfix import apply_patches_from_config

    return apply_patches_from_config


def _run_both(extracted: sw.ExtractedWheel, fake: sw.FakeSglang, pr: int):
    text = extracted.yamls[pr]
    targets = extracted.targets(pr)
    ref = sw.run_engine(fake.patcher.apply_patches_from_config, text, fake, targets)
    got = sw.run_engine(_sglfix_apply(), text, fake, targets)
    return ref, got


def _sglang_edited_text(extracted: sw.ExtractedWheel, fake: sw.FakeSglang, pr: int) -> dict[str, str]:
    """What sglang's editor makes of each target's source: apply_edits, then dedent."""
    editor = sys.modules["sglang.srt.debug_utils.source_patcher.source_editor"]
    EditSpec = fake.patcher.EditSpec
    out: dict[str, str] = {}
    for patch in yaml.safe_load(extracted.yamls[pr])["patches"]:
        fn = fake.functions[patch["target"]]
        edited = editor.apply_edits(source=inspect.getsource(fn), edits=[EditSpec(**e) for e in patch["edits"]])
        out[patch["target"]] = textwrap.dedent(edited)
    return out


def _masked(fp: dict[str, Any]) -> dict[str, Any]:
    """A fingerprint without the __future__ bits of co_flags (recursively)."""
    out = dict(fp, flags=fp["flags"] & ~FUTURE_BITS)
    out["consts"] = tuple(_masked(c) if isinstance(c, dict) else c for c in fp["consts"])
    return out


# --------------------------------------------------------------------------- the wheel


def test_wheel_is_downloaded():
    wheel = _fetch_or_fail()
    assert wheel.name.startswith(f"sglang-{sw.SGLANG_VERSION}-") and wheel.suffix == ".whl"
    assert wheel.parent == sw.cache_dir()


def test_wheel_registers_the_six_reverts(extracted: sw.ExtractedWheel):
    assert sorted(extracted.yamls) == PRS
    for pr in PRS:
        for target in extracted.targets(pr):
            loc = extracted.locations[target]
            assert extracted.path(loc.relpath).is_file(), target


def test_fake_tree_is_faithful(extracted: sw.ExtractedWheel, fake: sw.FakeSglang):
    """Targets resolve by their dotted names and getsource returns the real file's text."""
    import importlib

    for target, fn in fake.functions.items():
        loc = extracted.locations[target]
        obj: Any = importlib.import_module(loc.module)
        for name in loc.member:
            obj = getattr(obj, name)
        assert obj is fn
        lines, start = inspect.getsourcelines(fn)
        real = extracted.path(loc.relpath).read_text().splitlines(keepends=True)
        assert "".join(lines) == "".join(real[start - 1 : start - 1 + len(lines)])
        assert lines[0].lstrip().startswith(("def ", "async def ")), target
        assert fn.__code__.co_filename == str(extracted.path(loc.relpath))
    assert fake.patcher.__name__ == "sglang.srt.debug_utils.source_patcher"
    assert fake.patcher.apply_patches_from_config.__module__.startswith(fake.patcher.__name__)


# --------------------------------------------------------------------------- sglang alone


@pytest.mark.parametrize("pr", PRS)
def test_sglang_engine_on_its_own_registry(extracted: sw.ExtractedWheel, fake: sw.FakeSglang, pr: int):
    """Harness check: sglang's engine, on the fake tree, does what it does for real."""
    targets = extracted.targets(pr)
    ref = sw.run_engine(fake.patcher.apply_patches_from_config, extracted.yamls[pr], fake, targets)
    assert ref.status == EXPECTED[pr], ref.error
    if ref.status == "applied":
        assert ref.restored
        for target in targets:
            before = sw.fingerprint(fake.original_code[target])
            assert ref.fingerprints[target] != before, f"{target}: the edits changed nothing"
    else:
        assert ref.error_type == "PatchApplicationError"
        assert ref.error.startswith("match text not found")


# --------------------------------------------------------------------------- sglfix vs sglang


@pytest.mark.parametrize("pr", PRS)
def test_sglfix_models_read_sglang_yaml_as_sglang_does(extracted: sw.ExtractedWheel, fake: sw.FakeSglang, pr: int):
    """The schema is sglang's: the same file gives the same specs under both sets of models."""
    from sglfix.patching.types import parse_patch_config

    theirs = fake.patcher.PatchConfig(**yaml.safe_load(extracted.yamls[pr]))
    mine = parse_patch_config(extracted.yamls[pr], source=f"pr_fix_toggle {pr}")
    assert len(mine.patches) == len(theirs.patches)
    for a, b in zip(mine.patches, theirs.patches):
        assert (a.target, a.preamble) == (b.target, b.preamble)
        assert [e.model_dump() for e in a.edits] == [e.model_dump() for e in b.edits]
        for edit in a.edits:
            # sglang's own validator, on sglfix's parsed edit, agrees it is a valid edit.
            fake.patcher.EditSpec(**edit.model_dump())


@pytest.mark.parametrize("pr", PRS)
def test_sglfix_engine_matches_sglang(extracted: sw.ExtractedWheel, fake: sw.FakeSglang, pr: int):
    from sglfix.common.errors import PatchApplicationError

    targets = extracted.targets(pr)
    expected_text = _sglang_edited_text(extracted, fake, pr) if EXPECTED[pr] == "applied" else {}
    ref, got = _run_both(extracted, fake, pr)

    assert ref.status == EXPECTED[pr]
    assert got.status == ref.status, f"sglang {ref.status}, sglfix {got.status}: {got.error}"

    if got.status == "refused":
        assert isinstance(got.exc, PatchApplicationError), repr(got.exc)
        assert got.leftover == []
        # the message names the target and the line that is gone
        message = str(got.exc)
        patch = yaml.safe_load(extracted.yamls[pr])["patches"][0]
        assert patch["target"] in message
        assert patch["edits"][0]["match"].strip().splitlines()[0].strip() in message
        return

    by_target = {getattr(s, "target", None): s for s in got.states}
    assert sorted(t for t in by_target if t) == sorted(targets), "one state per patched target"
    for target in targets:
        original = fake.original_code[target]
        mine, theirs = got.fingerprints[target], ref.fingerprints[target]
        # Same instructions, names, constants, arguments, closure shape; see the note on
        # flags: sglang compiles with `from __future__ import annotations` forced on, sglfix
        # keeps the original function's __future__ features.
        assert _masked(mine) == _masked(theirs), sw.fingerprint_diff(_masked(mine), _masked(theirs))[:10]
        assert mine["flags"] & FUTURE_BITS == original.co_flags & FUTURE_BITS

        state = by_target[target]
        new_code = getattr(state, "new_code", None)
        if new_code is not None:  # sglfix keeps the file's line numbers (sglang restarts at 1)
            assert new_code.co_firstlineno == original.co_firstlineno
            from sglfix.patching.patcher import real_filename

            # Its own file name shows the revert (its source in linecache); the real one is kept in it.
            assert real_filename(new_code.co_filename) == original.co_filename
        assert state.source_before == inspect.getsource(fake.functions[target])
        assert state.source_after == expected_text[target]
        fn = fake.functions[target]
        assert fn.__code__ is original, f"{target}: restore did not put the original code object back"
    assert got.restored and ref.restored


def test_sglfix_is_atomic_where_sglang_is_not(extracted: sw.ExtractedWheel, fake: sw.FakeSglang):
    """A YAML whose last patch is stale (25015's two patches, then 27338's)."""
    merged = {
        "patches": yaml.safe_load(extracted.yamls[25015])["patches"] + yaml.safe_load(extracted.yamls[27338])["patches"]
    }
    text = yaml.safe_dump(merged, sort_keys=False)
    targets = [p["target"] for p in merged["patches"]]
    ref = sw.run_engine(fake.patcher.apply_patches_from_config, text, fake, targets)
    assert ref.status == "refused"
    assert sorted(ref.leftover) == sorted(extracted.targets(25015)), "sglang leaves the first two patched"
    got = sw.run_engine(_sglfix_apply(), text, fake, targets)
    assert got.status == "refused" and got.error_type == "PatchApplicationError"
    assert got.leftover == []


# --------------------------------------------------------------------------- doctor


def _doctor(extracted: sw.ExtractedWheel, sglang_toggles: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglfix",
            "doctor",
            "--source",
            str(extracted.root),
            "--toggles",
            str(sglang_toggles),
            *extra,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # exit code 1 is also what an uncaught exception gives: make sure it is doctor's verdict
    assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr
    return proc


def test_doctor_json_reports_exactly_the_drifted_reverts(extracted: sw.ExtractedWheel, sglang_toggles: Path):
    proc = _doctor(extracted, sglang_toggles, "--json")
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(proc.stdout)
    assert report.get("mode", "static") == "static"  # --source: files are read, not imported
    items = {str(item["id"]): item for item in report["toggles"]}
    assert sorted(items) == [str(pr) for pr in PRS], proc.stdout
    drifted = sorted(int(i) for i, item in items.items() if not item["ok"])
    assert drifted == DRIFTED, proc.stdout
    for pr in DRIFTED:
        item = items[str(pr)]
        assert item["error"], item
        assert item.get("targets", extracted.targets(pr)) == extracted.targets(pr)


def test_doctor_plain_output_names_the_drifted_reverts(extracted: sw.ExtractedWheel, sglang_toggles: Path):
    proc = _doctor(extracted, sglang_toggles)
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    text = proc.stdout + proc.stderr
    for pr in DRIFTED:
        assert str(pr) in text, text
    flagged = [line for line in text.splitlines() if "DRIFTED" in line]
    assert sorted(int(next(w for w in line.split() if w.isdigit())) for line in flagged) == DRIFTED, text
