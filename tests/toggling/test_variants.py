"""Per-version variants of a toggle and the port that writes them.

A part's variant is chosen by the engine version its registry is loaded for; a variant may say
that no revert exists at those versions (``absent``), which leaves the part out of a run with
the reason and refuses it where it is asked for. ``port_part`` re-anchors an edit onto a
function that moved around the fix and refuses what it cannot place. The command test ports
the sglang profile onto a tree of the installed sglang whose TRT-LLM MLA backend has 0.5.21's
call (no ``plan=`` argument), writes the variant, and ``doctor --source`` then applies it.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli

from sglfix.common.errors import ConfigError
from sglfix.patching.types import EditSpec, PatchSpec
from sglfix.toggling.port import port_part
from sglfix.toggling.registry import Part, parse_toggle

TOGGLE = """\
pr: 4242
title: a fix
parts:
  guard:
    summary: the guard
    patches:
      - target: pkgx.mod.f
        edits:
          - match: |
              y = g(x, plan=p)
            replacement: |
              y = g(x, plan=p) + 1
    variants:
      - versions: "<1.0"
        absent: the fix is newer than 1.0
      - versions: ">=1.0,<2.0"
        patches:
          - target: pkgx.mod.f
            edits:
              - match: |
                  y = g(x)
                replacement: |
                  y = g(x) + 1
"""


def test_the_variant_is_chosen_by_version(tmp_path):
    path = str(tmp_path / "4242.yaml")
    own = parse_toggle(TOGGLE, path=path).parts["guard"]
    assert own.patches[0].edits[0].match.strip() == "y = g(x, plan=p)" and own.variant is None
    mid = parse_toggle(TOGGLE, path=path, version="1.5").parts["guard"]
    assert mid.patches[0].edits[0].match.strip() == "y = g(x)" and mid.variant == ">=1.0,<2.0"
    old = parse_toggle(TOGGLE, path=path, version="0.9").parts["guard"]
    assert old.absent == "the fix is newer than 1.0" and old.patches == ()
    assert parse_toggle(TOGGLE, path=path, version="2.1.dev0").parts["guard"].variant is None


def test_a_variant_needs_patches_or_absent(tmp_path):
    bad = TOGGLE.replace("        absent: the fix is newer than 1.0\n", "")
    with pytest.raises(ConfigError, match="exactly one of 'patches'"):
        parse_toggle(bad, path=str(tmp_path / "4242.yaml"))
    worse = TOGGLE.replace('versions: "<1.0"', 'versions: "soon"')
    with pytest.raises(ConfigError, match="not a version range"):
        parse_toggle(worse, path=str(tmp_path / "4242.yaml"))


def test_an_absent_part_is_named_not_applied(tmp_path):
    from sglfix.toggling.envvalue import parse_env_value
    from sglfix.toggling.registry import Registry

    toggle = parse_toggle(TOGGLE, path=str(tmp_path / "4242.yaml"), version="0.9")
    registry = Registry([toggle], directory=str(tmp_path), version="0.9")
    assert registry.absent(["4242"]) == {
        "4242:guard": "4242:guard does not apply at version 0.9: the fix is newer than 1.0"
    }
    with pytest.raises(ConfigError, match=r"does not apply at version 0\.9"):
        parse_env_value("4242", registry=registry)


def _part(match: str, replacement: str) -> Part:
    edit = EditSpec(match=match, replacement=replacement)
    return Part(name="guard", summary="s", patches=(PatchSpec(target="pkgx.mod.f", edits=(edit,)),))


def _tree(tmp_path: Path, body: str) -> Path:
    pkg = tmp_path / "src" / "pkgx"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("def f(x, p):\n" + textwrap.indent(textwrap.dedent(body), "    "))
    return tmp_path / "src"


FIXED = """\
a = 1
y = g(
    x,
    plan=p,
)
return y
"""
REVERT = FIXED.replace("return y", "y = y + g(\n    x,\n    plan=p,\n)\nreturn y")


def test_port_reanchors_an_edit_and_carries_the_change_into_its_new_lines(tmp_path):
    moved = FIXED.replace("    plan=p,\n", "")  # the release has no plan argument
    result = port_part("4242:guard", _part(FIXED, REVERT), source_dir=_tree(tmp_path, "b = 0\n" + moved))
    assert result.status == "ported", result.why
    new = result.patches[0].edits[0]
    assert "plan=p" not in new.match and "plan=p" not in new.replacement
    assert new.replacement.count("g(") == 2  # the revert's own call lost the argument too


def test_port_says_when_the_release_predates_the_fix(tmp_path):
    result = port_part("4242:guard", _part(FIXED, REVERT), source_dir=_tree(tmp_path, REVERT))
    assert result.status == "absent" and "predates the fix" in result.why


def test_port_refuses_what_it_cannot_place(tmp_path):
    other = "z = 3\nreturn z\n"
    result = port_part("4242:guard", _part(FIXED, REVERT), source_dir=_tree(tmp_path, other))
    assert result.status == "failed" and "pkgx.mod.f edit #1" in result.why and "no block like" in result.why
    gone = Part(
        name="guard",
        summary="s",
        patches=(PatchSpec(target="pkgx.mod.h", edits=(EditSpec(match="a = 1", replacement="a = 2"),)),),
    )
    result = port_part("4242:guard", gone, source_dir=_tree(tmp_path / "2", FIXED))
    assert result.status == "failed" and "pkgx.mod.h: not in this release" in result.why
    moved = Part(
        name="guard",
        summary="s",
        patches=(PatchSpec(target="pkgx.later.f", edits=(EditSpec(match="a = 1", replacement="a = 2"),)),),
    )
    result = port_part("4242:guard", moved, source_dir=_tree(tmp_path / "3", FIXED))
    assert result.status == "failed" and "no module pkgx.later in" in result.why, result.why


# ------------------------------------------------------------------ the command, on real sglang

TRTLLM = Path("srt") / "layers" / "attention" / "trtllm_mla_backend.py"
PLAN = "                plan=forward_batch.kv_loc_plan,\n"


def _old_tree(tmp_path: Path) -> Path:
    """Links to the installed sglang, as version 0.5.21, its TRT-LLM MLA backend without the
    ``plan=`` argument the 0.5.22 code passes (as 0.5.18-0.5.21 have it)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("sglang is not installed: pip install --no-deps sglang==0.5.23 (README)", pytrace=False)
    sglang = Path(next(iter(spec.submodule_search_locations)))
    tree = tmp_path / "tree"
    shutil.copytree(sglang, tree / "sglang", copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("_version.py", "version.py"):
        (tree / "sglang" / name).unlink(missing_ok=True)
    (tree / "sglang" / "version.py").write_text('__version__ = "0.5.21"\n')
    text = (sglang / TRTLLM).read_text()
    assert PLAN in text, "the call this test edits has moved"
    (tree / "sglang" / TRTLLM).unlink()
    (tree / "sglang" / TRTLLM).write_text(text.replace(PLAN, ""))
    return tree


def _profile_copy(tmp_path: Path) -> tuple[dict, Path]:
    folder = tmp_path / "profiles" / "sglang-port-test"
    shutil.copytree(
        ROOT / "profiles" / "sglang-0.5.23", folder, ignore=shutil.ignore_patterns("__pycache__", "variants")
    )
    toml = folder / "profile.toml"
    toml.write_text(toml.read_text().replace('name = "sglang-0.5.23"', 'name = "sglang-port-test"'))
    env = {"SGLFIX_PROFILES_PATH": str(tmp_path / "profiles"), "SGLFIX_CACHE_DIR": str(tmp_path / "cache")}
    return env, folder


def test_toggle_port_writes_the_variant_that_doctor_then_applies(tmp_path):
    tree = _old_tree(tmp_path)
    env, folder = _profile_copy(tmp_path)
    profile = ["--profile", "sglang-port-test"]

    def doctor() -> dict:
        r = run_cli(*profile, "doctor", "--source", str(tree), "--json", env=env)
        return {t["id"]: t["ok"] for t in json.loads(r.out)["toggles"]}

    before = doctor()
    assert not before["21987:uniform-stride"] and before["26972"]
    r = run_cli(*profile, "toggle", "port", "--source", str(tree), "--versions", ">=0.5.18,<0.5.22", "--write", env=env)
    assert r.code == 0, r.err
    lines = {line.split()[1]: line.split()[0] for line in r.out.splitlines() if line.strip()}
    assert lines["21987:uniform-stride"] == "PORTED" and lines["26972"] == "applies"
    written = folder / "variants" / "21987.yaml"
    assert written.is_file() and "plan=forward_batch.kv_loc_plan" not in written.read_text()
    after = doctor()
    assert all(after.values()), [k for k, ok in after.items() if not ok]
    # Ported again, the part's variant is what is checked there: it applies, and nothing is rewritten.
    text = written.read_text()
    again = run_cli(
        *profile, "toggle", "port", "--source", str(tree), "--versions", ">=0.5.20,<0.5.22", "--write", env=env
    )
    assert again.code == 0, again.err
    line = next(x for x in again.out.splitlines() if x.split()[1:2] == ["21987:uniform-stride"])
    assert line.split()[0] == "applies" and "its variant for >=0.5.18,<0.5.22" in line, line
    assert written.read_text() == text
    # Bad input: one line, before anything is read.
    bad = run_cli(*profile, "toggle", "port", "--source", str(tree), "--versions", "soon", env=env)
    assert_one_line_error(bad, "--versions")


def test_toggle_port_refuses_a_range_that_would_misplace_its_variants(tmp_path):
    """An empty range, one that does not hold the source ported onto, one that would take the
    place of the profile's own patches, a range whose bounds cross: one line each, before any
    part is ported (and a toggle file with such a range is refused as it is read)."""
    env, _ = _profile_copy(tmp_path)
    profile = ["--profile", "sglang-port-test", "toggle", "port"]
    src = tmp_path / "src"
    (src / "sglang").mkdir(parents=True)
    (src / "sglang" / "version.py").write_text('__version__ = "0.5.21"\n')
    cases = (
        (["--versions", ""], "--versions ''"),
        (["--source", str(src), "--versions", "==0.5.20"], "does not hold 0.5.21"),
        (["--source", str(src), "--versions", ">=0.5.20"], "holds 0.5.23", "<0.5.23"),
        (["--source", str(src), "--versions", ">=0.5.22,<0.5.14"], "no version is in"),
        (["--source", ""], "--source ''"),
    )
    for args, *needles in cases:
        assert_one_line_error(run_cli(*profile, *args, env=env), *needles)
    crossed = TOGGLE.replace('versions: ">=1.0,<2.0"', 'versions: ">=2.0,<1.0"')
    with pytest.raises(ConfigError, match=r"variants\[1\]\.versions '>=2.0,<1.0' is a range no version is in"):
        parse_toggle(crossed, path=str(tmp_path / "4242.yaml"))
