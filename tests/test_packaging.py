"""A non-editable install into a fresh virtualenv works from anywhere, with only what the test env has."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from builders import ROOT, venv_on_these_packages


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (found,) = out.glob("sglfix-*.whl")
    return found


def test_wheel_holds_only_sglfix_with_its_yaml_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {
        "sglfix",
        "zz-sglfix-startup.pth",
        f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info",
    }, tops
    assert zipfile.ZipFile(wheel).read("zz-sglfix-startup.pth") == (ROOT / "zz-sglfix-startup.pth").read_bytes()
    profiles = sorted(
        str(p.relative_to(ROOT / "profiles"))
        for pattern in ("*/*.yaml", "*/scenarios/*.yaml", "*/known/*.yaml", "*/variants/*.yaml", "*/mutants/*.yaml")
        for p in (ROOT / "profiles").glob(pattern)
    )
    assert (
        profiles
        and sorted(
            n[len("sglfix/profiles/") :] for n in names if n.startswith("sglfix/profiles/") and n.endswith(".yaml")
        )
        == profiles
    )
    for d in ("toggles", "scenarios"):
        src = sorted(p.name for p in (ROOT / d).glob("*.yaml"))
        got = sorted(n.split("/")[-1] for n in names if n.startswith(f"sglfix/{d}/") and n.endswith(".yaml"))
        assert got == src
    src_backends = sorted(str(p.relative_to(ROOT / "backends")) for p in (ROOT / "backends").rglob("*.py"))
    got_backends = sorted(
        n[len("sglfix/backends/") :] for n in names if n.startswith("sglfix/backends/") and n.endswith(".py")
    )
    assert got_backends == src_backends, "every backends/ module must be listed in pyproject's packages"
    assert not any(n.startswith("backends/") for n in names)
    # The commit the wheel was built from, which the installed sglfix's reports record.
    import json

    recorded = json.loads(zipfile.ZipFile(wheel).read("sglfix/_source.json"))
    assert recorded["commit"] == _head(), recorded
    assert recorded["url"] is None or "@" not in recorded["url"], recorded  # never a credential


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def _venv_with_wheel(venv: Path, wheel: Path) -> Path:
    """A fresh venv on this test environment's heavy packages with sglfix installed from ``wheel``."""
    py = venv_on_these_packages(venv, with_pip=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=600)
    return venv


def test_fresh_virtualenv_install_works_from_any_directory(tmp_path, wheel):
    venv = _venv_with_wheel(tmp_path / "venv", wheel)
    py = venv / "bin" / "python"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLFIX_TOGGLES_DIR")}
    exe = venv / "bin" / "sglfix"
    out = subprocess.run(
        [str(exe), "list", "--json"], cwd=elsewhere, capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    import json

    data = json.loads(out.stdout)
    assert str(venv) in data["directory"], data["directory"]
    assert len(data["toggles"]) == len(list((ROOT / "toggles").glob("*.yaml")))
    out = subprocess.run(
        [str(py), "-m", "sglfix", "doctor"], cwd=elsewhere, capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # From inside the source checkout, cells still run the installed package (the workers
    # must not pick up the checkout's sglfix/ from the current directory).
    run = subprocess.run(
        [str(exe), "run", "-s", "triton-extend", "--device", "cpu", "--json", "-"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert [c["verdict"] for c in json.loads(run.stdout)["cells"]] == ["PASS"]
    # Run from the checkout, the installed sglfix names its own commit: the one its wheel was built from.
    assert json.loads(run.stdout)["sglfix_source"]["commit"] == _head()
    where = subprocess.run(
        [str(py), "-c", "import sglfix, sglfix.backends; print(sglfix.__file__, sglfix.backends.__file__)"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr
    assert all(str(venv) in p for p in where.stdout.split())
    # The start-up hook: unset, nothing of sglfix (nor yaml, torch, rich, typer) is imported at
    # interpreter start; set, a plain program runs the pre-fix code.
    timing = subprocess.run(
        [str(py), "-X", "importtime", "-c", "pass"], cwd=elsewhere, capture_output=True, text=True, env=env, timeout=60
    ).stderr
    names = [line.rsplit("|", 1)[-1].strip() for line in timing.splitlines() if "|" in line]
    assert names and not [n for n in names if "sglfix" in n or n.split(".")[0] in ("yaml", "torch", "rich", "typer")], (
        names
    )
    probe = (
        "import sglfix.backends.srt.managers.overlap_utils as m\n"
        "try:\n    m.decide_needs_cpu_seq_lens([None]); print('fixed')\nexcept AttributeError:\n    print('pre-fix')"
    )
    for value, expected in ((None, "fixed"), ("26738:overlap-guard", "pre-fix")):
        run_env = env if value is None else {**env, "SGLANG_DEBUG_REVERT_PR": value}
        r = subprocess.run(
            [str(py), "-c", probe], cwd=elsewhere, capture_output=True, text=True, env=run_env, timeout=120
        )
        assert r.returncode == 0 and r.stdout.strip() == expected, (value, r.stdout, r.stderr)
    # A production process of a regular install: the traceback of the reverted code quotes the
    # reverted line, under a file name that says which revert runs.
    crash = "import sglfix.backends.srt.managers.overlap_utils as m\nm.decide_needs_cpu_seq_lens([None])"
    r = subprocess.run(
        [str(py), "-c", crash],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env={**env, "SGLANG_DEBUG_REVERT_PR": "26738:overlap-guard"},
        timeout=120,
    )
    assert r.returncode == 1 and "AttributeError" in r.stderr, r.stderr
    assert "[sglfix revert 26738:overlap-guard]" in r.stderr and "b.needs_cpu_seq_lens for b in" in r.stderr, r.stderr
    assert 'getattr(b, "needs_cpu_seq_lens", True)' not in r.stderr, r.stderr
    # The installed command compares reports by what their cells stand for.
    results = ROOT / "bench" / "results"
    r = subprocess.run(
        [str(exe), "report", "compare", str(results / "matrix-cpu.json"), str(results / "matrix-cpu-reach.json")],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0 and "0 changed" in r.stdout, r.stdout[-2000:] + r.stderr


def test_every_package_directory_is_listed_in_pyproject():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "sglfix").rglob("__init__.py")}
    found |= {"sglfix." + ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "backends").rglob("__init__.py")}
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"


@pytest.fixture(scope="module")
def regular_venv(tmp_path_factory, wheel) -> Path:
    """A venv with sglfix installed from its wheel (not editable)."""
    return _venv_with_wheel(tmp_path_factory.mktemp("regular") / "venv", wheel)


_GUARDED_TEST = """
import sglfix
from sglfix.backends.srt.managers import overlap_utils


def test_the_guard_is_reverted():
    assert sglfix.reverted_ids() == ["26738:overlap-guard"]
    try:
        overlap_utils.decide_needs_cpu_seq_lens([None])
    except AttributeError:
        return  # the pre-fix code: the revert is in effect
    raise AssertionError("the fixed code ran: the revert was bypassed")
"""


@pytest.mark.parametrize("how", ["env", "env -n 2", "option -n 2", "env --assert=plain"])
def test_a_revert_is_in_effect_under_pytest_on_a_regular_install(tmp_path, regular_venv, how):
    """pytest's assertion rewriter claims every module of a distribution that ships a pytest
    plugin; on a regular install that is all of sglfix, and its import hook stands in front of
    the start-up hook's finder. The revert must hold anyway, in the session and in xdist workers."""
    (tmp_path / "test_guarded.py").write_text(_GUARDED_TEST)
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("PYTHONPATH", "SGLFIX_TOGGLES_DIR", "SGLANG_DEBUG_REVERT_PR", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")
    }
    args = ["-p", "no:cacheprovider", "-q", "test_guarded.py"]
    if how.startswith("env"):
        env["SGLANG_DEBUG_REVERT_PR"] = "26738:overlap-guard"
    else:
        args += ["--sglfix-revert", "26738:overlap-guard"]
    args += how.split()[1:]
    py = regular_venv / "bin" / "python"
    r = subprocess.run(
        [str(py), "-m", "pytest", *args], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout
    where = subprocess.run(
        [str(py), "-c", "import sglfix; print(sglfix.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert str(regular_venv) in where.stdout  # the wheel's sglfix, not the checkout's
