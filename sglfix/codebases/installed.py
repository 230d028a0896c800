"""Which version of a code base is importable here, and where, read without importing it: the
CLI parent never imports the engine, and the start-up hook asks in every process."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Installed", "installed", "version_of_tree"]


@dataclass(frozen=True)
class Installed:
    distribution: str
    version: str
    path: str

    def to_json(self) -> dict:
        return {"distribution": self.distribution, "version": self.version, "path": self.path}


def installed(cb: Any) -> Installed | None:
    """Where the code base is and which version, without importing it (None: not importable)."""
    from sglfix.common.codebase import package_dir

    path = package_dir(cb.package)
    if cb.is_reproduction:
        from importlib import metadata

        try:
            version = metadata.version("sglfix")
        except metadata.PackageNotFoundError:
            version = "unknown"
        return Installed(distribution="sglfix (reproduction)", version=version, path=path or "?")
    if path is None:
        return None
    version = _version_at(path, cb)
    return Installed(distribution=cb.distribution, version=version or "unknown", path=path)


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


def _version_at(path: str, cb: Any) -> str | None:
    """The version of the distribution that owns ``path`` (the one that would be imported)."""
    beside = _dist_info_beside(path, cb.distribution)
    if beside is not None:
        return beside
    from importlib import metadata

    try:
        dist = metadata.distribution(cb.distribution)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        where = os.path.abspath(str(dist.locate_file(cb.package)))
        if os.path.realpath(where) == os.path.realpath(path):
            return dist.version
    # A checkout on sys.path, or a distribution elsewhere than the package imported: read the
    # package's own version file without importing the package. The generated one first: sglang's
    # version.py imports it and names only a fallback ("0.0.0.dev0") itself.
    for name in ("_version.py", "version.py"):
        candidate = os.path.join(path, name)
        if os.path.isfile(candidate):
            import re

            with open(candidate, encoding="utf-8") as fh:
                m = re.search(r"__version__\s*=\s*(?:\w+\s*=\s*)*['\"]([^'\"]+)['\"]", fh.read())
            if m:
                return m.group(1)
    return dist.version if dist is not None else None


def version_of_tree(root: str, cb: Any) -> str | None:
    """The version of the code base's package in the source tree ``root`` (an unpacked wheel, a
    checkout's python/), read from its files."""
    path = os.path.join(root, cb.package)
    return _version_at(path, cb) if os.path.isdir(path) else None
