"""Code bases: a profile names what its scenarios replay through, checked before any worker
starts; stand-ins let real sglang import on a CPU box without ever running a missing kernel."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time

import pytest
from builders import git
from clihelp import assert_one_line_error, run_cli

from sglfix.codebases import CODEBASES, REPRODUCTION, CodeBase, check_installed, check_scenarios_runnable, installed
from sglfix.common.errors import ConfigError


def _fake_sglang(root, version: str):
    pkg = root / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the fake sglang of this test must never be imported')\n")
    (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    return root


@pytest.mark.parametrize("command", [["run", "-s", "*"], ["matrix"], ["bisect"], ["doctor"]])
def test_another_sglang_version_is_one_line_naming_both_before_any_worker(tmp_path, command):
    fake = _fake_sglang(tmp_path / "site", "0.5.12")  # older than the profile's range (no kit before 0.5.13)
    t0 = time.monotonic()
    r = (
        run_cli(
            "--profile",
            "sglang-0.5.23",
            *command,
            "--device",
            "cpu" if command[0] != "doctor" else "",
            env={"PYTHONPATH": str(fake)},
            subprocess=True,
        )
        if command[0] != "doctor"
        else run_cli(*command, "--profile", "sglang-0.5.23", env={"PYTHONPATH": str(fake)}, subprocess=True)
    )
    line = assert_one_line_error(
        r, "sglang 0.5.23", "sglang 0.5.12 is installed", str(fake / "sglang"), "sglang==0.5.23"
    )
    assert "--profile sglang-0.5.23" in line
    assert time.monotonic() - t0 < 60  # no worker booted: importing torch alone takes seconds


def test_the_variable_names_the_profile_too(tmp_path):
    fake = _fake_sglang(tmp_path / "site", "0.6.0")
    r = run_cli(
        "run",
        "-s",
        "*",
        "--device",
        "cpu",
        env={"PYTHONPATH": str(fake), "SGLFIX_PROFILE": "sglang-0.5.23"},
        subprocess=True,
    )
    assert_one_line_error(r, "SGLFIX_PROFILE=sglang-0.5.23", "sglang 0.6.0 is installed")


def test_a_missing_code_base_names_the_install_line():
    cb = CodeBase(
        name="x",
        package="sglang_never_installed_here",
        summary="",
        distribution="sglang_never",
        version="1.0",
        install_hint="pip install sglang_never==1.0",
    )
    assert installed(cb) is None
    with pytest.raises(ConfigError) as exc:
        check_installed(cb, what="--profile x")
    message = str(exc.value)
    assert "\n" not in message and "not importable" in message and "pip install sglang_never==1.0" in message


def test_the_reproduction_is_always_there_and_is_sglfix_backends():
    here = installed(REPRODUCTION)
    assert here is not None and here.path.endswith("backends")
    assert check_installed(REPRODUCTION, what="x") == here


def test_a_mode_the_code_base_lacks_is_refused_before_any_cell(tmp_path):
    f = tmp_path / "v1.yaml"
    f.write_text(
        textwrap.dedent("""\
        scenarios:
          - name: my-draft-extend-v1
            backend: triton
            mode: DRAFT_EXTEND
            batch: {prefix_lens: [5, 7], accept_lens: [1, 2]}
            model: {num_heads: 4, num_kv_heads: 2, head_dim: 64, dtype: float16}
            spec: {topk: 1, num_steps: 3, num_draft_tokens: 4}
    """)
    )
    from sglfix.scenario import load_scenarios

    scenarios = load_scenarios([f], builtin=False)
    check_scenarios_runnable(scenarios, REPRODUCTION)  # the reproduction has spec-v1 draft extend
    with pytest.raises(ConfigError) as exc:
        check_scenarios_runnable(scenarios, CODEBASES["sglang-0.5.23"])
    assert "my-draft-extend-v1" in str(exc.value) and "DRAFT_EXTEND_V2" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_sliding_window_runs_where_the_code_base_has_one_and_is_refused_elsewhere(tmp_path):
    f = tmp_path / "swa.yaml"
    f.write_text(
        textwrap.dedent("""\
        scenarios:
          - name: my-swa-extend
            backend: triton
            mode: EXTEND
            batch: {prefix_lens: [5, 30], extend_lens: [3, 6]}
            model: {num_heads: 4, num_kv_heads: 2, head_dim: 64, dtype: float16, sliding_window: 8}
    """)
    )
    from sglfix.scenario import load_scenarios

    scenarios = load_scenarios([f], builtin=False)
    check_scenarios_runnable(scenarios, CODEBASES["sglang-0.5.23"])
    with pytest.raises(ConfigError) as exc:
        check_scenarios_runnable(scenarios, REPRODUCTION)  # the reproduction's backends have no window
    assert "my-swa-extend" in str(exc.value) and "model.sliding_window" in str(exc.value)
    assert "sglang-0.5.23" in str(exc.value) and "\n" not in str(exc.value)
    # Through the CLI: one line, exit 2, before any cell.
    assert_one_line_error(run_cli("run", "--scenario-file", str(f), "--device", "cpu"), "model.sliding_window")


def test_a_sliding_window_in_a_mode_without_one_is_refused_at_load(tmp_path):
    f = tmp_path / "swa-decode.yaml"
    f.write_text(
        textwrap.dedent("""\
        scenarios:
          - name: my-swa-verify
            backend: flashinfer
            mode: DRAFT_EXTEND_V2
            batch: {prefix_lens: [5]}
            model: {sliding_window: 8, dtype: float16}
    """)
    )
    r = run_cli("--profile", "sglang-0.5.23", "run", "--scenario-file", str(f), "--device", "cpu")
    assert_one_line_error(
        r,
        "sliding-window layer runs on triton in DECODE, EXTEND, TARGET_VERIFY, DRAFT_EXTEND_V2, DRAFT_DECODE; "
        "flashinfer in DECODE, EXTEND, TARGET_VERIFY",
    )


def test_scenarios_lists_the_profiles_own_scenarios():
    mine = run_cli("scenarios", "--json")
    theirs = run_cli("--profile", "sglang-0.5.23", "scenarios", "--json")
    assert mine.code == 0 and theirs.code == 0, (mine.err, theirs.err)
    import json

    from sglfix.scenario import load_scenarios
    from sglfix.toggling.profiles import PROFILES

    a = {s["name"] for s in json.loads(mine.out)["scenarios"]}
    b = {s["name"] for s in json.loads(theirs.out)["scenarios"]}
    assert a == {s.name for s in load_scenarios()}
    assert b == {s.name for s in load_scenarios(builtin_dir=PROFILES["sglang-0.5.23"].scenarios_dir)}
    assert a != b


def test_a_stand_in_imports_but_raises_when_called_and_is_only_for_what_is_missing():
    code = textwrap.dedent("""
        import sys
        from sglfix.codebases import standins
        used = standins.install(("json", "sgl_kernel_never_installed"))
        import json  # real, present: never stood in
        assert json.dumps([1]) == "[1]"
        from sgl_kernel_never_installed.ops import fused_kernel, Base
        import sgl_kernel_never_installed.sub.module as m
        class Mine(Base):  # subclassing at import time works
            pass
        try:
            fused_kernel(1, 2)
        except standins.StandInCalled as exc:
            print("raised", "sgl_kernel_never_installed" in str(exc))
        try:
            Mine()
        except standins.StandInCalled:
            print("raised on instantiation")
        print(used)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["raised True", "raised on instantiation", "['sgl_kernel_never_installed']"]


def test_the_test_kit_is_pinned_in_one_package_per_code_base():
    """Every use of the engine's private test kit sits in the code base's kit package; the
    adapters ask the active code base for a part and never name a version."""
    import importlib.util
    from pathlib import Path

    import sglfix
    from sglfix.harness.kits import PARTS, kit

    for codebase in CODEBASES.values():
        if codebase.kit is None:
            continue
        assert codebase.version and codebase.version.replace(".", "_") in codebase.kit
        for part in PARTS:
            assert importlib.util.find_spec(f"{codebase.kit}.{part}") is not None, (codebase.name, part)
    # Nothing outside the kit packages imports the kit's modules.
    root = Path(sglfix.__file__).parent
    for path in root.rglob("*.py"):
        if "kits" in path.relative_to(root).parts:
            continue
        assert not re.search(r"(?<![\w.])sglang\.test\.kits", path.read_text(encoding="utf-8")), path
    # The reproduction has no pinned kit: asking for one in its processes is a clear error.
    with pytest.raises(RuntimeError, match="no pinned test kit"):
        kit("drafts")
    with pytest.raises(ValueError, match="no kit part"):
        kit("nope")


def test_a_cpu_run_refuses_a_triton_too_old_to_interpret_the_code_bases_kernels(tmp_path):
    """No triton pin in the sglang extra (a CUDA torch pins its own); a CPU run checks instead."""
    from sglfix.codebases import SGLANG_0_5_23

    site = tmp_path / "site"
    meta = site / "triton-3.7.1.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: triton\nVersion: 3.7.1\n")
    t0 = time.monotonic()
    r = run_cli(
        "--profile",
        "sglang-0.5.23",
        "run",
        "-s",
        "*",
        "--device",
        "cpu",
        env={"PYTHONPATH": str(site)},
        subprocess=True,
    )
    if installed(SGLANG_0_5_23) is None:  # without sglang the install check speaks first, as it should
        assert_one_line_error(r, "sglang==0.5.23")
    else:
        assert_one_line_error(r, "triton >= 3.9", "installed: 3.7.1", "pip install 'triton>=3.9'", "--device cuda")
    assert time.monotonic() - t0 < 60  # before any worker


def test_a_cpu_run_of_the_reproduction_refuses_triton_3_6_in_one_line(tmp_path):
    """triton 3.6's interpreter fails on the reproduction's Triton kernels (every such cell an
    ERROR); the run says so before any cell, and the installed triton passes the same check."""
    from sglfix.codebases import check_interpreter

    site = tmp_path / "site"
    meta = site / "triton-3.6.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: triton\nVersion: 3.6.0\n")
    r = run_cli("matrix", "-s", "triton-extend", "--device", "cpu", env={"PYTHONPATH": str(site)}, subprocess=True)
    assert_one_line_error(r, "triton >= 3.7", "installed: 3.6.0", "pip install 'triton>=3.7'", "--device cuda")
    check_interpreter(REPRODUCTION, what="x")  # what this box has (the CPU runs of this suite use it)


# --------------------------------------------------------------------------- a source tree's version

_SGLANG_VERSION_PY = """\
try:
    from sglang._version import __version__, __version_tuple__
except ImportError:
    __version__ = "0.0.0.dev0"
    __version_tuple__ = (0, 0, 0, "dev0")
"""


def _checkout(root, *, pyproject: str = '[project]\nname = "sglang"\ndynamic = ["version"]\n'):
    """A clone of sglang as git leaves it: python/sglang without the generated _version.py, its
    version.py naming only the fallback, python/pyproject.toml computing the version."""
    pkg = root / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the fake sglang of this test must never be imported')\n")
    (pkg / "version.py").write_text(_SGLANG_VERSION_PY)
    (root / "python" / "pyproject.toml").write_text(pyproject)
    return root


def test_an_unbuilt_checkout_reads_its_version_as_its_build_would(tmp_path):
    """Not the fallback 0.0.0.dev0 (which followed the newest profile as a version newer than all
    of them, with every toggle variant of an older release left out): the nearest release tag, and
    past it the next release's .devN, as setuptools-scm writes it; a static version in the tree's
    pyproject.toml where it has one."""
    from sglfix.codebases.installed import version_of_tree

    cb = CODEBASES["sglang-0.5.23"]
    repo = _checkout(tmp_path / "sglang")
    python = str(repo / "python")
    assert version_of_tree(python, cb) is None  # no git history yet: unknown, never 0.0.0.dev0
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    git(repo, "tag", "v0.5.20")
    git(repo, "tag", "gateway-v9.0.0")  # another project's tag in the same repository is not a release
    assert version_of_tree(python, cb) == "0.5.20"
    (repo / "README").write_text("x\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "two")
    head = git(repo, "rev-parse", "--short=7", "HEAD")
    assert version_of_tree(python, cb) == f"0.5.21.dev1+g{head}"
    static = _checkout(tmp_path / "old", pyproject='[project]\nname = "sglang"\nversion = "0.5.19"\n')
    assert version_of_tree(str(static / "python"), cb) == "0.5.19"


def test_a_checkout_of_unknown_version_asks_for_codebase_version(tmp_path):
    tree = _checkout(tmp_path / "sglang") / "python"
    env = {"PYTHONPATH": str(tree)}
    t0 = time.monotonic()
    r = run_cli("--profile", "sglang", "run", "-s", "*", "--device", "cpu", env=env, subprocess=True)
    assert_one_line_error(r, "--profile sglang", str(tree / "sglang"), "cannot be read", "--codebase-version V")
    assert time.monotonic() - t0 < 60  # before any worker
    pinned = run_cli("--profile", "sglang-0.5.23", "run", "-s", "*", "--device", "cpu", env=env, subprocess=True)
    assert_one_line_error(pinned, "--codebase-version V")
    # Given, it is the tree's version everywhere: the profile it picks, what the reports say.
    import json

    given = run_cli("--profile", "sglang", "--codebase-version", "0.5.20", "env", "--json", env=env, subprocess=True)
    assert given.code == 0, given.err
    data = json.loads(given.out)
    assert data["profile"] == "sglang-0.5.23" and data["codebase"]["version"] == "0.5.20", data
    # Where a build recorded the version, a different one given is refused; so is the reproduction.
    recorded = _fake_sglang(tmp_path / "site", "0.5.21")
    wrong = run_cli(
        "--profile",
        "sglang",
        "--codebase-version",
        "0.5.20",
        "list",
        env={"PYTHONPATH": str(recorded)},
        subprocess=True,
    )
    assert_one_line_error(wrong, "--codebase-version 0.5.20", "records its version, 0.5.21")
    assert_one_line_error(run_cli("--codebase-version", "0.5.20", "list"), "--codebase-version", "reproduction")
    assert_one_line_error(run_cli("--codebase-version", "soon", "list"), "--codebase-version 'soon' is not a version")


# --------------------------------------------------------------------------- pins that break the import


def _pinning_sglang(root, version: str, requires: list[str]):
    site = _fake_sglang(root, version)
    info = site / f"sglang-{version}.dist-info"
    info.mkdir()
    meta = f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires) + "\nthe long description\n"
    (info / "METADATA").write_text(meta)
    return site


def test_an_exact_pin_the_engine_cannot_import_beside_is_named_before_any_cell(tmp_path):
    """sglang 0.5.13 beside the transformers of the README's install dies at import ("'qwen3_asr' is
    already used"); its worker cannot start, and the one line says why, before any cell. Its other
    pins (a CUDA torch, another tokenizers) are what the README's own working install mismatches:
    never named."""
    from importlib import metadata

    here = metadata.version("transformers")
    site = _pinning_sglang(
        tmp_path / "site", "0.5.13",
        ["torch==0.0.1", "tokenizers==0.0.1", "transformers==0.0.1", "pytest==0.0.1; extra == 'test'"],
    )  # fmt: skip
    t0 = time.monotonic()
    r = run_cli(
        "--profile", "sglang", "run", "-s", "*", "--device", "cpu", env={"PYTHONPATH": str(site)}, subprocess=True
    )
    assert_one_line_error(r, f"sglang 0.5.13 pins transformers==0.0.1; {here} is installed", "--release 0.5.13")
    assert time.monotonic() - t0 < 60
    from sglfix.codebases.installed import Installed
    from sglfix.codebases.pins import check_pins, exact_pins

    pins = {"torch": "0.0.1", "tokenizers": "0.0.1", "transformers": "0.0.1"}  # the extra's is no pin here
    assert exact_pins(str(site / "sglang"), "sglang") == pins
    # The same engine pinning the transformers that is here: its other pins pass.
    harmless = _pinning_sglang(
        tmp_path / "ok", "0.5.13", ["torch==0.0.1", "tokenizers==0.0.1", f"transformers=={here}"]
    )
    check_pins(CODEBASES["sglang-0.5.23"], Installed("sglang", "0.5.13", str(harmless / "sglang")), what="x")
    # The README's install (the installed sglang 0.5.23) passes as it is.
    found = installed(CODEBASES["sglang-0.5.23"])
    if found is not None:
        check_pins(CODEBASES["sglang-0.5.23"], found, what="x")
