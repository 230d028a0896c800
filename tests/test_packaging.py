"""A non-editable install into a fresh virtualenv works from anywhere, with only what the test env has."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, timeout=300)
    (found,) = out.glob("sglfix-*.whl")
    return found


def test_wheel_holds_only_sglfix_with_its_yaml_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"sglfix", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    for d in ("toggles", "scenarios"):
        src = sorted(p.name for p in (ROOT / d).glob("*.yaml"))
        got = sorted(n.split("/")[-1] for n in names if n.startswith(f"sglfix/{d}/") and n.endswith(".yaml"))
        assert got == src
    src_backends = sorted(str(p.relative_to(ROOT / "backends")) for p in (ROOT / "backends").rglob("*.py"))
    got_backends = sorted(n[len("sglfix/backends/"):] for n in names if n.startswith("sglfix/backends/") and n.endswith(".py"))
    assert got_backends == src_backends, "every backends/ module must be listed in pyproject's packages"
    assert not any(n.startswith("backends/") for n in names)


def test_fresh_virtualenv_install_works_from_any_directory(tmp_path, wheel):
    venv = tmp_path / "venv"
    # The running test environment's packages stand in for the heavy wheels (torch, triton):
    # a .pth names its site-packages. Never --system-site-packages: from inside a venv that
    # would inherit the *base* interpreter's packages, which a fresh machine does not have.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    new_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    Path(new_site, "test-env-packages.pth").write_text("\n".join(sorted(ours)) + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLFIX_TOGGLES_DIR")}
    exe = venv / "bin" / "sglfix"
    out = subprocess.run([str(exe), "list", "--json"], cwd=elsewhere, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    data = json.loads(out.stdout)
    assert str(venv) in data["directory"], data["directory"]
    assert len(data["toggles"]) == len(list((ROOT / "toggles").glob("*.yaml")))
    out = subprocess.run([str(py), "-m", "sglfix", "doctor"], cwd=elsewhere, capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    # From inside the source checkout, cells still run the installed package (the workers
    # must not pick up the checkout's sglfix/ from the current directory).
    run = subprocess.run([str(exe), "run", "-s", "triton-extend", "--device", "cpu", "--json", "-"], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert [c["verdict"] for c in json.loads(run.stdout)["cells"]] == ["PASS"]
    where = subprocess.run([str(py), "-c", "import sglfix, sglfix.backends; print(sglfix.__file__, sglfix.backends.__file__)"],
                           cwd=elsewhere, capture_output=True, text=True, env=env, timeout=120)
    assert where.returncode == 0, where.stderr
    assert all(str(venv) in p for p in where.stdout.split())


def test_every_package_directory_is_listed_in_pyproject():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "sglfix").rglob("__init__.py")}
    found |= {"sglfix." + ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "backends").rglob("__init__.py")}
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"
