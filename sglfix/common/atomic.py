"""Files that are whole or absent: written to a temporary file beside them, then renamed over them.

Every report, memo and cache record sglfix writes goes through ``write_atomic``: a reader (a CI
job, a worker beside this one, the next run) sees the old file or the new one, never half of
either, and a write cut short by an error, Ctrl-C or SIGTERM leaves no temporary file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from sglfix.common.signals import deferred

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, fsync: bool = True) -> None:
    """``data`` (text, written as UTF-8, or bytes) to ``path`` through a temporary file renamed
    over it. ``fsync``: the data reaches the disk before the rename, so a crash of the machine
    too leaves the old file or the new one (a cache that checks what it reads may skip it).

    SIGINT and SIGTERM are deferred from before the temporary file exists until it is renamed or
    removed (``sglfix.common.signals.deferred``), however many arrive and whichever thread the
    kernel hands them to: one that arrives while the file is written abandons the write (the
    temporary file removed), and is raised once nothing is left behind. Any other failure on the
    way (a full disk, an exception in the middle of the write) removes the temporary file too and
    leaves the old file as it was."""
    p = Path(path)
    mode = "wb" if isinstance(data, bytes) else "w"
    with deferred() as arrived:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent if str(p.parent) else "."))
        renamed = False
        try:
            try:
                # mkstemp's file is private (0600); give the file the mode a plain open() would.
                os.fchmod(fd, 0o666 & ~_umask())
                fh = os.fdopen(fd, mode) if mode == "wb" else os.fdopen(fd, mode, encoding="utf-8")
            except BaseException:
                with contextlib.suppress(OSError):  # fdopen may have taken the fd and closed it
                    os.close(fd)
                raise
            with fh:
                fh.write(data)
                if fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            if not arrived:  # else the signal asks to stop: the write is abandoned
                os.replace(tmp, p)
                renamed = True
        finally:
            if not renamed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
