"""Releases kept by sglfix (``sglfix.codebases.releases``): taken from a directory of wheels
(offline), unpacked without compiled extensions into the cache, with the light packages a
release pins in another version than this environment holds beside it, and found again without
fetching. The wheels here are built by the test: a fake engine that pins a light package."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from clihelp import assert_one_line_error, run_cli

from sglfix.codebases.releases import fetch_release, light_packages, release_env
from sglfix.common.errors import ConfigError


def _wheel(folder: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid wheel of ``name`` ``version`` holding ``files``."""
    stem = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{stem}-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\n" + f"Name: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    info = f"{stem}.dist-info"
    entries = {
        **files,
        f"{info}/METADATA": meta,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    entries[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in entries) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for n, text in entries.items():
            zf.writestr(n, text)
    return path


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLFIX_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "wheels"
    folder.mkdir()
    # The fake engine pins a light package of sglfix's [sglang] extra in a version this environment
    # does not hold (loguru 0.0.1), and one it holds as installed (no overlay for that one).
    from importlib import metadata

    packaging = metadata.version("packaging")
    _wheel(
        folder, "sglang", "9.9.9",
        {"sglang/__init__.py": "", "sglang/_version.py": "__version__ = version = '9.9.9'\n", "sglang/fast.so": "ELF"},
        requires=("loguru==0.0.1", f"packaging=={packaging}", "torch==1.0.0", "loguru>=0.1; extra == 'dev'"),
    )  # fmt: skip
    _wheel(folder, "loguru", "0.0.1", {"loguru/__init__.py": "VERSION = 'planted'\n"})
    return folder


def test_a_release_is_unpacked_without_extensions_with_its_light_pins_beside_it(wheels, tmp_path):
    assert {"loguru", "packaging", "transformers"} <= light_packages()
    release = fetch_release("sglang", "9.9.9", wheels=str(wheels))
    folder = Path(release.path)
    assert folder == tmp_path / "cache" / "releases" / "sglang-9.9.9"
    assert (folder / "sglang" / "__init__.py").is_file() and not (folder / "sglang" / "fast.so").exists()
    assert (folder / "sglang-9.9.9.dist-info" / "METADATA").is_file()
    # Only the pinned light package held here in another version; never torch.
    assert release.overlay == ["loguru==0.0.1"]
    assert (folder / "loguru" / "__init__.py").read_text() == "VERSION = 'planted'\n"
    # A process with the release first on its path imports it, and sglfix reads its version there.
    code = (
        "import loguru, sglfix.codebases as c; print(loguru.VERSION);"
        "print(c.installed(c.get_codebase('sglang-0.5.23')).version)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=release_env(release), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["planted", "9.9.9"]


def test_a_release_is_fetched_once_and_an_unfinished_fetch_is_redone(wheels):
    first = fetch_release("sglang", "9.9.9", wheels=str(wheels))
    marker = Path(first.path) / "sglang" / "__init__.py"
    marker.write_text("# kept\n")
    again = fetch_release("sglang", "9.9.9", wheels=str(wheels))
    assert again == first and marker.read_text() == "# kept\n"  # not unpacked again
    os.remove(Path(first.path) / "sglfix-release.json")  # as a fetch cut short leaves it
    redone = fetch_release("sglang", "9.9.9", wheels=str(wheels))
    assert redone == first and marker.read_text() == ""
    assert json.loads((Path(redone.path) / "sglfix-release.json").read_text())["version"] == "9.9.9"


def test_a_missing_wheel_or_directory_is_one_line(wheels, tmp_path):
    with pytest.raises(ConfigError, match=r"no sglang-9\.9\.8-\*\.whl there"):
        fetch_release("sglang", "9.9.8", wheels=str(wheels))
    with pytest.raises(ConfigError, match="not a directory"):
        fetch_release("sglang", "9.9.9", wheels=str(tmp_path / "nowhere"))
    assert not (tmp_path / "cache" / "releases" / "sglang-9.9.8").exists()


def test_release_option_runs_the_command_against_the_cached_release(wheels, tmp_path):
    """``--release VERSION`` (anywhere on the line) fetches it and follows it: a version newer than
    every profile runs with the newest, whose folder is where the code base is found."""
    env = {"SGLFIX_CACHE": str(tmp_path / "cache")}
    r = run_cli("env", "--json", "--release", "9.9.9", "--wheels", str(wheels), env=env)
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["profile"] == "sglang-0.5.23" and data["profile_why"] == "--profile sglang", data
    folder = tmp_path / "cache" / "releases" / "sglang-9.9.9"
    assert data["codebase"] == {"distribution": "sglang", "version": "9.9.9", "path": str(folder / "sglang")}, data
    assert_one_line_error(run_cli("--release", "nope", "list", env=env), "--release 'nope' is not a version")
    assert_one_line_error(run_cli("--wheels", str(wheels), "list", env=env), "give --release with it")
    missing = run_cli("--release", "9.9.7", "--wheels", str(wheels), "list", env=env)
    assert_one_line_error(missing, "no sglang-9.9.7-*.whl there")


def test_a_wheel_that_is_not_the_release_is_refused_and_never_cached(wheels, tmp_path):
    """A zip without the package, or another version's wheel under the release's name, was
    unpacked and cached as the release: every later run of it silently ran the installed sglang."""
    empty = wheels / "sglang-9.9.8-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("README.txt", "no package here\n")
    env = {"SGLFIX_CACHE": str(tmp_path / "cache")}
    r = run_cli("--release", "9.9.8", "--wheels", str(wheels), "env", "--json", env=env)
    assert_one_line_error(r, "sglang-9.9.8-py3-none-any.whl holds no sglang package", "remove it")
    assert not (tmp_path / "cache" / "releases" / "sglang-9.9.8").exists()
    empty.unlink()
    other = _wheel(wheels, "sglang", "9.9.9", {"sglang/__init__.py": ""})
    other.rename(wheels / "sglang-9.9.8-py3-none-any.whl")
    with pytest.raises(ConfigError, match=r"is sglang 9\.9\.9, not sglang 9\.9\.8"):
        fetch_release("sglang", "9.9.8", wheels=str(wheels))
    (wheels / "sglang-9.9.8-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="is not a wheel"):
        fetch_release("sglang", "9.9.8", wheels=str(wheels))
    assert not (tmp_path / "cache" / "releases" / "sglang-9.9.8").exists()


def test_a_cached_release_that_does_not_hold_it_is_fetched_again(wheels, tmp_path):
    """What an older sglfix kept from such a zip (marked done, no package) is not served."""
    folder = tmp_path / "cache" / "releases" / "sglang-9.9.9"
    folder.mkdir(parents=True)
    (folder / "README.txt").write_text("no package here\n")
    record = {"distribution": "sglang", "version": "9.9.9", "path": str(folder), "wheel": "x.whl", "overlay": []}
    (folder / "sglfix-release.json").write_text(json.dumps(record))
    release = fetch_release("sglang", "9.9.9", wheels=str(wheels))
    assert (Path(release.path) / "sglang" / "__init__.py").is_file()
    assert not (folder / "README.txt").exists()


def test_the_leftovers_of_a_killed_fetch_are_removed_by_the_next(wheels, tmp_path):
    """SIGKILL in the middle of a fetch (after the wheel is unpacked, before it is marked done)
    leaves its temporary folder in the cache; the next fetch removes it."""
    code = textwrap.dedent(
        f"""
        import sys, time
        import sglfix.codebases.releases as r
        unpack = r._unpack
        def slow(*a, **k):
            unpack(*a, **k)
            print("unpacked", flush=True)
            time.sleep(120)
        r._unpack = slow
        r.fetch_release("sglang", "9.9.9", wheels={str(wheels)!r})
        """
    )
    env = {**os.environ, "SGLFIX_CACHE": str(tmp_path / "cache")}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "unpacked"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    releases = tmp_path / "cache" / "releases"
    left = [p.name for p in releases.iterdir() if p.is_dir() and p.name.startswith(".")]
    assert left, "the killed fetch left nothing to clean up: the test did not kill it in the middle"
    fetch_release("sglang", "9.9.9", wheels=str(wheels))
    assert not [p for p in releases.iterdir() if p.is_dir() and p.name.startswith(".")]


def _fake_python(tmp_path: Path) -> Path:
    """An interpreter stand-in that writes its pid and waits: what a long pip (or run) child does."""
    script = tmp_path / "slow-python"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'child.pid'}\nexec sleep 120\n")
    script.chmod(0o755)
    return script


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is dead: its parent has not reaped it yet
        return fh.read().split(") ", 1)[1][0] != "Z"


@pytest.mark.parametrize("call", ["fetch", "release run"])
def test_a_child_of_a_killed_fetch_or_release_run_dies_with_it(tmp_path, call):
    """The pip of a fetch and the per-release ``sglfix run`` of a release bisect are killed with
    the process that started them (PR_SET_PDEATHSIG, as the worker pool's workers)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    fake = _fake_python(tmp_path)
    start = (
        "r._pip('download', 'sglang==9.9.9', what='x')"
        if call == "fetch"
        else "from sglfix.execution.release_bisect import run_release; run_release('9.9.9', args=[], wheels=None)"
    )
    code = f"import sys; import sglfix.codebases.releases as r; sys.executable = {str(fake)!r}; {start}"
    env = {**os.environ, "SGLFIX_CACHE": str(tmp_path / "c"), "TMPDIR": str(tmp_path)}
    parent = subprocess.Popen([sys.executable, "-c", code], env=env)
    pid_file = tmp_path / "child.pid"
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline and parent.poll() is None, "the child never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, f"the {call}'s child outlived its parent"


def test_release_is_checked_with_the_rest_of_the_line_before_anything_is_fetched(wheels, tmp_path):
    """A release no profile covers, a profile that is not the engine's, a typo in the command's
    options, --release beside bisect --releases: one line each, and nothing fetched."""
    env = {"SGLFIX_CACHE": str(tmp_path / "cache")}
    w = ["--wheels", str(wheels)]
    older = run_cli("--release", "0.5.12", *w, "list", env=env)
    assert_one_line_error(older, "--release 0.5.12: no profile covers sglang 0.5.12", "sglang-0.5.23")
    reproduction = run_cli("--release", "9.9.9", *w, "--profile", "reproduction", "run", "-s", "*", env=env)
    assert_one_line_error(reproduction, "--profile reproduction replays the reproduction", "drop --profile")
    typo = run_cli("--release", "9.9.9", *w, "run", "--devise", "cpu", env=env)
    assert_one_line_error(typo, "--devise")
    both = run_cli("--release", "9.9.9", *w, "bisect", "--releases", "9.9.8..9.9.9", env=env)
    assert_one_line_error(both, "--release 9.9.9 and bisect --releases")
    toggles = run_cli("--release", "9.9.9", *w, "--toggles", str(tmp_path), "list", env=env)
    assert_one_line_error(toggles, "--toggles DIR alone replays the reproduction")
    assert not (tmp_path / "cache" / "releases" / "sglang-9.9.9").exists()


def test_a_release_the_index_does_not_have_is_one_line_before_pip_downloads(monkeypatch, tmp_path):
    import sglfix.codebases.releases as releases

    monkeypatch.setenv("SGLFIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(releases, "versions_on_index", lambda distribution: ["0.5.23", "0.5.22", "0.5.21"])

    def no_download(*args, **kw):
        raise AssertionError(f"pip ran: {args}")

    monkeypatch.setattr(releases, "_pip", no_download)
    with pytest.raises(ConfigError, match=r"--release 0\.5\.99: sglang has no release 0\.5\.99 on the package index"):
        fetch_release("sglang", "0.5.99")


def test_a_release_runs_report_says_release_not_the_installed_one():
    from sglfix.report.codebase import codebase_label

    cb = {"name": "sglang-0.5.23", "distribution": "sglang", "version": "0.5.17", "followed": "sglang"}
    assert "following the installed sglang" in codebase_label({"codebase": cb})
    label = codebase_label({"codebase": {**cb, "release": "0.5.17"}})
    assert "--release 0.5.17 from sglfix's cache" in label and "installed" not in label
