"""The start-up hook's view of a toggles directory, cached by content, so that a process started
with ``REVERT_PR`` set validates the value and arms its import finder without YAML
or pydantic: which parts each id selects and which functions each part reverts.

An entry holds sglfix's version, Python's, the directory and every toggle file's name and bytes,
compared with the files as they are at each use: an edited, added or removed file makes it
miss, so an entry is never stale (and no hash library is loaded for it). The patches
themselves are read the full way when a target module is imported. Whatever the cache cannot
answer (an id it does not hold, an overlap, a file that is not a regular file, a cache that
cannot be read or written) goes the full way too, which also words every error.
"""

from __future__ import annotations

import json
import os
import stat
import sys

from sglfix.common import cachedir

__all__ = ["lookup", "store"]

_MAX_FILE = 1024 * 1024  # a larger toggle file is the full path's to refuse


def _contents(toggles_dir: str) -> dict[str, str] | None:
    """Every toggle file's name and text, or None when one cannot be read as a regular file."""
    out: dict[str, str] = {}
    variants = os.path.join(toggles_dir, "variants")  # sglfix.toggling.variants.VARIANTS_DIR
    try:
        names = sorted(n for n in os.listdir(toggles_dir) if n.endswith(".yaml"))
        if os.path.isdir(variants):
            names += sorted(os.path.join("variants", n) for n in os.listdir(variants) if n.endswith(".yaml"))
        for name in names:
            path = os.path.join(toggles_dir, name)
            if not stat.S_ISREG(os.stat(path).st_mode):
                return None  # never opened here: a FIFO would block the process
            with open(path, "rb") as f:
                data = f.read(_MAX_FILE + 1)
            if len(data) > _MAX_FILE:
                return None
            out[name] = data.decode("latin-1")  # bytes as they are, whatever the encoding
    except OSError:
        return None
    return out


def _identity(toggles_dir: str) -> dict[str, str]:
    from sglfix.codebases.records import engine_version
    from sglfix.common.version import __version__

    # The engine version picks each part's variant: another version is another entry.
    return {
        "sglfix": __version__,
        "python": sys.version,
        "dir": os.path.abspath(toggles_dir),
        "engine": engine_version(toggles_dir) or "",
    }


def _path(identity: dict[str, str]) -> str:
    # The name only spreads entries over files; what an entry is for is checked inside it.
    import zlib

    tag = zlib.crc32("\0".join(identity.values()).encode())
    return os.path.join(cachedir.arm(), f"arm-{tag:08x}.json")


def lookup(value: str, toggles_dir: str) -> list[tuple[str, tuple[str, ...]]] | None:
    """(part id, targets) for each part ``value`` selects, in the order the full parse gives,
    or None when the cache cannot answer for certain."""
    identity = _identity(toggles_dir)
    try:
        with open(_path(identity)) as f:
            data = json.load(f)
        select, targets = data["select"], data["targets"]
        if data["identity"] != identity:
            return None
        known = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # Compared byte for byte with the files as they are now: an entry is never stale.
    if known != _contents(toggles_dir):
        return None
    out: list[tuple[str, tuple[str, ...]]] = []
    seen: set[str] = set()
    for token in (t.strip() for t in value.strip().split(",")):
        parts = select.get(token)
        if not isinstance(parts, list):
            return None
        for pid in parts:
            if pid in seen or not isinstance(targets.get(pid), list):
                return None
            seen.add(pid)
            out.append((pid, tuple(targets[pid])))
    return out or None


def store(toggles_dir: str, registry: object) -> None:
    """Write the entry for ``registry`` (loaded from ``toggles_dir``); a failure costs nothing
    but the next process's speed."""
    files = _contents(toggles_dir)
    if files is None:
        return
    identity = _identity(toggles_dir)
    select: dict[str, list[str]] = {}
    targets: dict[str, list[str]] = {}
    for toggle in registry:  # type: ignore[attr-defined]
        for rid in toggle.ids:
            sels = registry.select(rid)  # type: ignore[attr-defined]
            if any(s.part.absent for s in sels):
                continue  # the full path words the refusal
            select[rid] = [s.id for s in sels]
            for s in sels:
                targets[s.id] = list(s.part.targets)
    path = _path(identity)
    # Only a store pays for the writer's imports (tempfile, signal handling), not every lookup.
    from sglfix.common.atomic import write_atomic

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Not synced: an entry is checked at each use, so one a crash cut short is a miss.
        text = json.dumps({"identity": identity, "files": files, "select": select, "targets": targets})
        write_atomic(path, text, fsync=False)
    except OSError:
        pass
