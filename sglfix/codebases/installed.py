"""Which version of a code base is importable here, and where, read without importing it: the
CLI parent never imports the engine, and the start-up hook asks in every process.

A wheel records its version (the ``.dist-info`` beside the package, the generated
``_version.py``). A source tree does not always: a fresh clone of sglang has no generated
``_version.py``, and its ``version.py`` names only a fallback (``0.0.0.dev0``) that is not a
version at all. Its version is then read the way its own build would compute it: a version in
the tree's ``pyproject.toml``, else its git history (the nearest release tag ``vX.Y.Z``; commits
past it make the next release's ``.devN``, as setuptools-scm writes it). When none of these
says, the version is unknown (``"unknown"``), and ``--codebase-version V`` (``CODEBASE_VERSION_ENV``
in every process of the run) gives it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from sglfix.common.environ import envs

__all__ = ["CODEBASE_VERSION_ENV", "UNKNOWN", "Installed", "installed", "version_of_tree"]

# ``--codebase-version V``: the version of a source tree that does not say its own; inherited by
# the workers and read by the start-up hook, as the rest of the run's choices are.
CODEBASE_VERSION_ENV = envs.SGLFIX_CODEBASE_VERSION.name
UNKNOWN = "unknown"
# What a package's version file says when it does not know (sglang's version.py without the
# generated _version.py, setuptools-scm's fallback_version): no version.
_FALLBACKS = ("0.0.0.dev0", "0.0.0")


@dataclass(frozen=True)
class Installed:
    distribution: str
    version: str
    path: str
    # Where the version was read: "build" (recorded by a build or install: a .dist-info, the
    # generated _version.py), "tree" (the source tree's pyproject.toml or git tags), "option"
    # (--codebase-version), "" (unknown).
    read_from: str = "build"

    def to_json(self) -> dict:
        return {"distribution": self.distribution, "version": self.version, "path": self.path}

    @property
    def known(self) -> bool:
        return self.version != UNKNOWN


def installed(cb: Any) -> Installed | None:
    """Where the code base is and which version, without importing it (None: not importable)."""
    from sglfix.common.codebase import package_dir

    path = package_dir(cb.package)
    if cb.is_reproduction:
        from importlib import metadata

        try:
            version = metadata.version("sglfix")
        except metadata.PackageNotFoundError:
            version = UNKNOWN
        return Installed(distribution="sglfix (reproduction)", version=version, path=path or "?")
    if path is None:
        return None
    given = envs.SGLFIX_CODEBASE_VERSION.get() or ""
    # With a version given, the tree's own guess (its pyproject, its git tags) is not asked: it
    # would give way to the one given (the start-up hook asks in every process).
    version, read_from = _version_at(path, cb, tree=not given)
    if given and read_from != "build":
        # A version a build recorded is checked against the one given by the CLI instead.
        return Installed(cb.distribution, given, path, read_from="option")
    if version is None:
        return Installed(cb.distribution, UNKNOWN, path, read_from="")
    return Installed(cb.distribution, version, path, read_from=read_from)


def _dist_info_beside(path: str, distribution: str) -> str | None:
    """The version in the one ``<distribution>-<version>.dist-info`` folder next to the package
    at ``path`` (how pip installs it), read from the folder's name: the start-up hook asks in
    every process, and importlib.metadata costs it more than the rest of its check."""
    site = os.path.dirname(path)
    prefix = distribution.replace("-", "_").lower() + "-"
    try:
        names = [n for n in os.listdir(site) if n.endswith(".dist-info") and n.lower().startswith(prefix)]
    except OSError:
        return None
    return names[0][len(prefix) : -len(".dist-info")] if len(names) == 1 else None


def _version_at(path: str, cb: Any, *, tree: bool = True) -> tuple[str | None, str]:
    """The version of the distribution that owns ``path`` (the one that would be imported), and
    where it was read ("build" or "tree"; None: nowhere). ``tree``: also from the source tree's
    own metadata and git history when no build recorded one."""
    beside = _dist_info_beside(path, cb.distribution)
    if beside is not None and beside not in _FALLBACKS:
        return beside, "build"
    from importlib import metadata

    try:
        dist = metadata.distribution(cb.distribution)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None and dist.version not in _FALLBACKS:
        where = os.path.abspath(str(dist.locate_file(cb.package)))
        if os.path.realpath(where) == os.path.realpath(path) or _editable_at(dist, path):
            return dist.version, "build"
    # A checkout on sys.path, or a distribution elsewhere than the package imported: read the
    # package's own version file without importing the package. The generated one first: sglang's
    # version.py imports it and names only a fallback ("0.0.0.dev0") itself.
    for name in ("_version.py", "version.py"):
        candidate = os.path.join(path, name)
        if os.path.isfile(candidate):
            with open(candidate, encoding="utf-8", errors="replace") as fh:
                m = re.search(r"__version__\s*=\s*(?:\w+\s*=\s*)*['\"]([^'\"]+)['\"]", fh.read())
            if m and m.group(1) not in _FALLBACKS:
                return m.group(1), "build"
    found = _version_of_checkout(os.path.realpath(path)) if tree else None
    return (found, "tree") if found else (None, "")


def _editable_at(dist: Any, path: str) -> bool:
    """Whether ``dist`` is an editable install of the tree that holds ``path``."""
    import json

    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except (ValueError, OSError):
        return False
    url = info.get("url", "")
    if not (info.get("dir_info") or {}).get("editable") or not url.startswith("file://"):
        return False
    root = os.path.realpath(url[len("file://") :])
    return os.path.realpath(path).startswith(root.rstrip(os.sep) + os.sep)


def _version_of_checkout(path: str) -> str | None:
    """The version a source tree's own build would give the package at ``path``: a static
    ``version`` in the pyproject.toml (or PKG-INFO) of its project, else its git history (read
    each time: a checkout moves)."""
    return _declared(path) or _from_git(path)


def _declared(path: str) -> str | None:
    """``[project] version`` of the pyproject.toml in the package's folder or the one above it
    (sglang's is python/pyproject.toml beside python/sglang), or an sdist's PKG-INFO there."""
    for folder in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        pyproject = os.path.join(folder, "pyproject.toml")
        if os.path.isfile(pyproject):
            import tomllib

            try:
                with open(pyproject, "rb") as fh:
                    project = tomllib.load(fh).get("project") or {}
            except (OSError, tomllib.TOMLDecodeError):
                return None
            version = project.get("version")
            if isinstance(version, str) and "version" not in (project.get("dynamic") or ()):
                return _valid(version)
            return None  # the project's version is computed (setuptools-scm): git decides
        pkg_info = os.path.join(folder, "PKG-INFO")
        if os.path.isfile(pkg_info):
            with open(pkg_info, encoding="utf-8", errors="replace") as fh:
                m = re.search(r"^Version:\s*(\S+)", fh.read(), re.MULTILINE)
            return _valid(m.group(1)) if m else None
    return None


def _from_git(path: str) -> str | None:
    """From the git history of the checkout that tracks ``path``: the nearest release tag
    ``vX.Y.Z`` itself, or with commits past it the next release's ``.devN+g<commit>``
    (setuptools-scm's default, what a build of that checkout would write in _version.py)."""
    import shutil
    import subprocess

    git = shutil.which("git")
    init = os.path.join(path, "__init__.py")
    if git is None or not os.path.isfile(init):
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}

    def ask(*args: str) -> str | None:
        try:
            r = subprocess.run([git, "-C", path, *args], capture_output=True, text=True, timeout=20, env=env)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    # The package must be part of that repository (not a folder some other project's checkout holds).
    if ask("ls-files", "--error-unmatch", "__init__.py") is None:
        return None
    described = ask("describe", "--tags", "--long", "--match", "v[0-9]*", "--abbrev=7")
    m = re.fullmatch(r"v(.+)-(\d+)-g([0-9a-f]+)", described or "")
    if not m:
        return None
    tag, distance, commit = m.group(1), int(m.group(2)), m.group(3)
    base = _valid(tag)
    if base is None:
        return None
    if distance == 0:
        return base
    from packaging.version import Version

    release = list(Version(base).release)
    release[-1] += 1
    return f"{'.'.join(map(str, release))}.dev{distance}+g{commit}"


def _valid(text: str) -> str | None:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging comes with sglfix
        return None
    try:
        Version(text)
    except InvalidVersion:
        return None
    return text if text not in _FALLBACKS else None


def version_of_tree(root: str, cb: Any) -> str | None:
    """The version of the code base's package in the source tree ``root`` (an unpacked wheel, a
    checkout's python/), read from its files."""
    path = os.path.join(root, cb.package)
    return _version_at(path, cb)[0] if os.path.isdir(path) else None
