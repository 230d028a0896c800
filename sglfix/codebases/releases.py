"""Releases of an engine kept by sglfix, each one a folder a process puts first on ``PYTHONPATH``.

A release is fetched once (``pip download --no-deps``, or taken from a directory of wheels for an
offline machine) and unpacked into ``$SGLFIX_CACHE/releases/<distribution>-<version>/``: the
engine's own files without its compiled extensions (sglfix never imports them), its
``.dist-info`` (so the version is read beside the package, as for an installed wheel), and, where
the release pins a light package this environment holds in another version (sglang 0.5.18 pins
transformers 5.12.1, whose own pins want an older tokenizers), that package as the release wants
it. Nothing in the user's environment is installed or changed: a run of one release is a process
with that folder first on its path, and its workers follow it there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from sglfix.common.errors import ConfigError

__all__ = [
    "CACHE_ENV",
    "Release",
    "cache_root",
    "check_version",
    "fetch_release",
    "light_packages",
    "release_env",
    "use_release",
]

CACHE_ENV = "SGLFIX_CACHE"
# Light packages older releases import at module level on the way to the attention backends and
# the newest do not (so the [sglang] extra does not name them): sglang 0.5.18's function-call
# parsers import xgrammar.
_ALSO_IMPORTED = ("xgrammar",)
_DONE = "sglfix-release.json"  # written last: a folder without it is a fetch that did not finish
# What a release's folder never needs: compiled extensions sglfix does not import.
_BINARY = (".so", ".pyd", ".dylib", ".dll")


@dataclass(frozen=True)
class Release:
    distribution: str
    version: str
    path: str  # the folder to put first on PYTHONPATH
    wheel: str  # the engine's wheel it was unpacked from
    overlay: list[str] = field(default_factory=list)  # "name==version" unpacked beside it

    def to_json(self) -> dict:
        return {
            "distribution": self.distribution,
            "version": self.version,
            "path": self.path,
            "wheel": self.wheel,
            "overlay": list(self.overlay),
        }


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path("~/.cache/sglfix").expanduser()


def release_env(release: Release, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the release's folder first on ``PYTHONPATH``."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (release.path, out.get("PYTHONPATH", "")) if p)
    return out


def use_release(release: Release) -> None:
    """This process and every process it starts import the release: its folder first on
    ``sys.path`` and on ``PYTHONPATH`` (call before anything of the engine is looked up)."""
    import importlib

    from sglfix.common.codebase import clear_package_dirs

    sys.path.insert(0, release.path)
    os.environ.update(PYTHONPATH=release_env(release)["PYTHONPATH"])
    importlib.invalidate_caches()
    clear_package_dirs()


def check_version(text: str, *, option: str) -> str:
    """``text`` as a release version (PEP 440), or a one-line ConfigError naming ``option``."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        raise ConfigError(f"{option}: reading a version needs packaging; pip install packaging") from None
    try:
        Version(text.strip())
    except InvalidVersion:
        raise ConfigError(f"{option} {text!r} is not a version; give one like 0.5.22") from None
    return text.strip()


def light_packages() -> set[str]:
    """The light packages the engine imports, as sglfix's ``[sglang]`` extra names them (what the
    README's CPU set-up installs): only their pins are honoured per release; a CUDA torch, kernels
    and the rest of a release's pins are never fetched."""
    from importlib import metadata

    try:
        requires = metadata.requires("sglfix") or []
    except metadata.PackageNotFoundError:
        return set()
    names = set(_ALSO_IMPORTED)
    for req in requires:
        if re.search(r"extra\s*==\s*['\"]sglang['\"]", req):
            names.add(_canonical(re.split(r"[\s;<>=!~\[]", req, maxsplit=1)[0]))
    return names


def fetch_release(distribution: str, version: str, *, wheels: str | None = None) -> Release:
    """The release's folder, fetched and unpacked unless it already is. ``wheels``: a directory
    of wheels to take it (and any light package it pins) from instead of the package index."""
    folder = cache_root() / "releases" / f"{distribution}-{version}"
    done = folder / _DONE
    if done.is_file():
        try:
            return Release(**json.loads(done.read_text()))
        except (ValueError, TypeError):
            pass  # a record of another layout: fetch again
    if wheels is not None and not os.path.isdir(wheels):
        raise ConfigError(f"--wheels {wheels}: not a directory; name a directory of wheels")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{distribution}-{version}-") as tmp:
        work = Path(tmp)
        wheel = _wheel(distribution, version, wheels=wheels, into=work / "dl")
        site = work / "site"
        _unpack(wheel, site, skip_binary=True)
        overlay = _overlay(_pins(wheel), wheels=wheels, into=work / "dl-light", site=site)
        record = Release(
            distribution=distribution, version=version, path=str(folder), wheel=wheel.name, overlay=overlay
        )
        (site / _DONE).write_text(json.dumps(record.to_json(), indent=1) + "\n")
        if folder.exists():
            shutil.rmtree(folder)  # an unfinished earlier fetch
        os.replace(site, folder)
    return record


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip(*args: str, what: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        tail = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        raise ConfigError(f"{what}: pip failed: {tail[-1] if tail else 'exit ' + str(proc.returncode)}")
    return proc


def _index_args(wheels: str | None) -> list[str]:
    return ["--no-index", "--find-links", wheels] if wheels is not None else []


def _wheel(distribution: str, version: str, *, wheels: str | None, into: Path) -> Path:
    stem = distribution.replace("-", "_")
    if wheels is not None:
        found = sorted(Path(wheels).glob(f"{stem}-{version}-*.whl"))
        if not found:
            raise ConfigError(f"--wheels {wheels}: no {stem}-{version}-*.whl there; add it or drop --wheels")
        return found[0]
    into.mkdir(parents=True, exist_ok=True)
    _pip(
        "download", "--no-deps", "--only-binary=:all:", f"{distribution}=={version}", "-d", str(into),
        what=f"{distribution} {version}",
    )  # fmt: skip
    found = sorted(into.glob(f"{stem}-{version}-*.whl"))
    if not found:
        raise ConfigError(f"{distribution} {version}: pip download gave no wheel")
    return found[0]


def _unpack(wheel: Path, site: Path, *, skip_binary: bool) -> None:
    site.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if skip_binary and info.filename.endswith(_BINARY):
                continue
            zf.extract(info, site)


def _pins(wheel: Path) -> dict[str, str]:
    """``name -> version`` for each light package the wheel's metadata pins with ``==``."""
    light = light_packages()
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta).decode("utf-8", "replace") if meta else ""
    pins = {}
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:") or "extra ==" in line:
            continue
        m = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)", line)
        if m and _canonical(m.group(1)) in light:
            pins[_canonical(m.group(1))] = m.group(2)
    return pins


def _overlay(pins: dict[str, str], *, wheels: str | None, into: Path, site: Path) -> list[str]:
    """The pinned light packages this environment holds in another version, with what pip says
    they need changed beside them (``--dry-run``: nothing is installed), unpacked into ``site``."""
    from importlib import metadata

    wanted = []
    for name, version in sorted(pins.items()):
        try:
            here = metadata.version(name)
        except metadata.PackageNotFoundError:
            here = None
        if here != version:
            wanted.append(f"{name}=={version}")
    if not wanted:
        return []
    into.mkdir(parents=True, exist_ok=True)
    report = into / "report.json"
    _pip(
        "install", "--dry-run", "--quiet", "--only-binary=:all:", "--report", str(report), *_index_args(wheels),
        *wanted, what=f"the light packages the release pins ({', '.join(wanted)})",
    )  # fmt: skip
    changed = [
        f"{item['metadata']['name']}=={item['metadata']['version']}"
        for item in json.loads(report.read_text())["install"]
    ]
    if changed:
        _pip(
            "download", "--no-deps", "--only-binary=:all:", *_index_args(wheels), "-d", str(into), *changed,
            what=f"the light packages the release pins ({', '.join(changed)})",
        )  # fmt: skip
        for wheel in sorted(into.glob("*.whl")):
            _unpack(wheel, site, skip_binary=False)
    return changed
