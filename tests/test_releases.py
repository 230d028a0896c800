"""Releases kept by sglfix (``sglfix.codebases.releases``): taken from a directory of wheels
(offline), unpacked without compiled extensions into the cache, with the light packages a
release pins in another version than this environment holds beside it, and found again without
fetching. The wheels here are built by the test: a fake engine that pins a light package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
