"""Releases of an engine kept by sglfix, each one a folder a process puts first on ``PYTHONPATH``.

A release is fetched once (``pip download --no-deps``, or taken from a directory of wheels for an
offline machine) and unpacked into ``$SGLFIX_CACHE/releases/<distribution>-<version>/``: the
engine's own files without its compiled extensions (sglfix never imports them), its
``.dist-info`` (so the version is read beside the package, as for an installed wheel), and, where
the release pins a light package this environment holds in another version (sglang 0.5.18 pins
transformers 5.12.1, whose own pins want an older tokenizers), that package as the release wants
it. Nothing in the user's environment is installed or changed: a run of one release is a process
with that folder first on its path, and its workers follow it there.

A folder is marked done only once it holds the release's package in the very version asked for
(a wheel of another distribution or version, or a zip without the package, is refused in one
line), and a done folder that no longer does is fetched again. A fetch works in a temporary
folder of the cache that it holds locked; one whose process died (SIGKILL, OOM) is removed by
the next fetch, and the ``pip`` it runs dies with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from sglfix.common import cachedir
from sglfix.common.atomic import write_atomic
from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError

__all__ = [
    "Release",
    "cached_release",
    "check_version",
    "die_with_parent",
    "fetch_release",
    "light_packages",
    "owned_tempdir",
    "release_env",
    "sweep_dead",
    "use_release",
    "versions_on_index",
]

# Light packages older releases import at module level on the way to the attention backends and
# the newest do not (so the [sglang] extra does not name them): sglang 0.5.18's function-call
# parsers import xgrammar.
_ALSO_IMPORTED = ("xgrammar",)
_DONE = "sglfix-release.json"  # written last: a folder without it is a fetch that did not finish
# Held locked (flock) by the process that owns a temporary folder: a lock that can be taken is a
# folder whose owner died.
_OWNER = ".sglfix-owner"
# A temporary folder without the owner file (written by an older sglfix, or a fetch cut short
# between making the folder and locking it) is a leftover once it is this old.
_UNOWNED_AFTER_S = 600.0
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
    os.environ["PYTHONPATH"] = release_env(release)["PYTHONPATH"]
    envs.SGLFIX_RELEASE.set(release.version)
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


def _folder(distribution: str, version: str) -> Path:
    return Path(cachedir.releases()) / f"{distribution}-{version}"


def cached_release(distribution: str, version: str, *, package: str | None = None) -> Release | None:
    """The release's folder when a finished fetch left it holding the release (None: fetch it)."""
    folder = _folder(distribution, version)
    done = folder / _DONE
    if not done.is_file():
        return None
    try:
        record = Release(**json.loads(done.read_text()))
    except (ValueError, TypeError, OSError):
        return None  # a record of another layout: fetch again
    if record.version != version or _holds(folder, distribution, package or _package(distribution)) != version:
        return None  # not the release asked for (an older sglfix kept what it was given): fetch again
    return record


def fetch_release(distribution: str, version: str, *, wheels: str | None = None, package: str | None = None) -> Release:
    """The release's folder, fetched and unpacked unless it already is. ``wheels``: a directory
    of wheels to take it (and any light package it pins) from instead of the package index.
    ``package``: the top-level package the release must hold (default: the distribution's name)."""
    package = package or _package(distribution)
    if wheels is not None and not os.path.isdir(wheels):
        raise ConfigError(f"--wheels {wheels}: not a directory; name a directory of wheels")
    folder = _folder(distribution, version)
    folder.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead(folder.parent, prefix=".")
    # One fetch of a release at a time: a second waits, then finds it done.
    with _locked(folder.parent / f".{distribution}-{version}.lock"):
        record = cached_release(distribution, version, package=package)
        if record is not None:
            return record
        with owned_tempdir(folder.parent, prefix=f".{distribution}-{version}-") as work:
            wheel = _wheel(distribution, version, wheels=wheels, into=work / "dl")
            _check_wheel(wheel, distribution=distribution, version=version, package=package, wheels=wheels)
            site = work / "site"
            _unpack(wheel, site, skip_binary=True)
            found = _holds(site, distribution, package)
            if found != version:  # what a run would read there (the check of the wheel said so too)
                raise ConfigError(
                    f"{_source(wheels)}: {wheel.name} unpacked holds {package} {found or 'of no version'}, "
                    f"not {version}; remove it"
                )
            overlay = _overlay(_pins(wheel), wheels=wheels, into=work / "dl-light", site=site)
            record = Release(
                distribution=distribution, version=version, path=str(folder), wheel=wheel.name, overlay=overlay
            )
            write_atomic(site / _DONE, json.dumps(record.to_json(), indent=1) + "\n")
            if folder.exists():
                shutil.rmtree(folder)  # an unfinished earlier fetch, or one that held something else
            os.replace(site, folder)
    return record


def _package(distribution: str) -> str:
    return distribution.replace("-", "_")


def _source(wheels: str | None) -> str:
    return f"--wheels {wheels}" if wheels is not None else "the package index"


def _holds(root: Path, distribution: str, package: str) -> str | None:
    """The version of ``package`` a process with ``root`` first on its path would import from
    there, read as a run reads it (None: no such package there)."""
    from sglfix.codebases.installed import version_of_tree

    if not (root / package / "__init__.py").is_file():
        return None
    return version_of_tree(str(root), SimpleNamespace(distribution=distribution, package=package))


def _check_wheel(wheel: Path, *, distribution: str, version: str, package: str, wheels: str | None) -> None:
    """The wheel is a release of ``distribution`` ``version`` holding ``package``, or one line."""
    from packaging.version import InvalidVersion, Version

    where = _source(wheels)
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            metas = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            meta = zf.read(metas[0]).decode("utf-8", "replace") if len(metas) == 1 else ""
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConfigError(f"{where}: {wheel.name} is not a wheel ({exc}); remove it") from None
    if f"{package}/__init__.py" not in names:
        raise ConfigError(
            f"{where}: {wheel.name} holds no {package} package (no {package}/__init__.py among its "
            f"{len(names)} files): it is not a release of {distribution}; remove it"
        )
    name = re.search(r"^Name:\s*(\S+)", meta, re.MULTILINE)
    held = re.search(r"^Version:\s*(\S+)", meta, re.MULTILINE)
    if not name or not held:
        raise ConfigError(f"{where}: {wheel.name} has no .dist-info/METADATA naming its release; remove it")
    try:
        same = Version(held.group(1)) == Version(version)
    except InvalidVersion:
        same = False
    if _canonical(name.group(1)) != _canonical(distribution) or not same:
        raise ConfigError(
            f"{where}: {wheel.name} is {name.group(1)} {held.group(1)}, not {distribution} {version}; remove it"
        )


def die_with_parent(parent: int | None = None) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGTERM when this process dies, however it dies (Linux's
    ``PR_SET_PDEATHSIG``, as the worker pool's workers do), and exits at once if it already has."""
    parent = os.getpid() if parent is None else parent

    def preexec() -> None:
        if sys.platform.startswith("linux"):
            with contextlib.suppress(Exception):
                import ctypes

                ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return preexec


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def owned_tempdir(parent: Path | str, *, prefix: str) -> Iterator[Path]:
    """A temporary folder in ``parent``, held locked while in use and removed afterwards; if this
    process dies first, the next ``sweep_dead`` of ``parent`` removes it."""
    import fcntl

    work = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    try:
        with open(work / _OWNER, "w") as owner:
            fcntl.flock(owner, fcntl.LOCK_EX)
            owner.write(f"{os.getpid()}\n")
            owner.flush()
            yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def sweep_dead(parent: Path | str, *, prefix: str) -> list[str]:
    """Remove the folders of ``parent`` named ``prefix...`` that a dead process left (their owner
    lock is free, or they have none and are old); the names removed."""
    import fcntl

    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
            continue
        owner = os.path.join(entry.path, _OWNER)
        if not os.path.exists(owner):
            try:
                old = time.time() - entry.stat(follow_symlinks=False).st_mtime > _UNOWNED_AFTER_S
            except OSError:
                continue
            if old and not os.path.exists(os.path.join(entry.path, _DONE)):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
            continue
        try:
            with open(owner) as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # held: its owner is alive
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
        except OSError:
            continue
    return removed


def versions_on_index(distribution: str) -> list[str] | None:
    """The releases of ``distribution`` the package index lists (None: it did not answer)."""
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", distribution, "--disable-pip-version-check"],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=die_with_parent(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in r.stdout.splitlines():
        if line.strip().startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    return None


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip(*args: str, what: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=die_with_parent(),  # a fetch killed outright leaves no pip behind
    )
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
    listed = versions_on_index(distribution)
    if listed is not None and version not in listed:
        from sglfix.common.schema import nearest

        raise ConfigError(
            f"--release {version}: {distribution} has no release {version} on the package index"
            f"{nearest(version, listed)}; its newest: {', '.join(listed[:5])}"
        )
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
