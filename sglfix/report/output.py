"""Output files: checked before any cell runs, written atomically (``sglfix.common.atomic``).

A run can take minutes; finding an unwritable ``--json`` path only at the end loses it, and a
half-written report is worse than none.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from sglfix.common.atomic import write_atomic
from sglfix.common.errors import ConfigError
from sglfix.common.signals import deferred

__all__ = ["check_output_file", "check_output_path", "write_atomic", "write_json"]


def check_output_path(path: str | None, *, option: str) -> None:
    """Fail now (exit 2) if ``path`` cannot be written later; ``-`` means stdout."""
    if path is None or path == "-":
        return
    if not path.strip():
        raise ConfigError(f"{option} {path!r}: the path is empty; give a file path")
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{option} {path} is a directory; give a file path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{option} {path}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: directory {parent} is not writable; choose another path")
    if p.exists() and not (p.is_file() and os.access(p, os.W_OK)):
        raise ConfigError(f"{option} {path} exists and is not a writable regular file; choose another path")
    # Permission bits do not tell whether a file can be created there (/proc, a read-only
    # mount): create one the way the report will be written, and remove it.
    # Signals deferred meanwhile: one between creating the probe and removing it would leave it behind.
    with deferred():
        try:
            fd, probe = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".check", dir=str(parent))
        except OSError as exc:
            raise ConfigError(
                f"{option} {path}: cannot create a file in {parent} ({exc.strerror or exc}); choose another path"
            ) from None
        os.close(fd)
        os.unlink(probe)


def check_output_file(path: str | None, *, option: str, suffixes: tuple[str, ...]) -> None:
    """A file output whose format its extension names (no stdout): the extension, then the path."""
    if path is None:
        return
    want = " or ".join(suffixes)
    if path == "-":
        raise ConfigError(f"{option} cannot write to stdout; give a {want} file path")
    if Path(path).suffix.lower() not in suffixes:
        raise ConfigError(f"{option} {path}: the file name must end in {want}")
    check_output_path(path, option=option)


def dumps_report(data: Any) -> str:
    """A report as JSON text: one top-level key per line and one item of a top-level list per
    line (a matrix's cells), each written compactly. json's C encoder runs only without
    ``indent``; with it a 3875-cell matrix took most of a second to write."""
    if not isinstance(data, dict):
        return json.dumps(data)
    lines = []
    for key, value in data.items():
        head = f" {json.dumps(str(key))}: "
        if isinstance(value, list) and value:
            items = ",\n".join(f"  {json.dumps(item)}" for item in value)
            lines.append(f"{head}[\n{items}\n ]")
        else:
            lines.append(head + json.dumps(value))
    return "{\n" + ",\n".join(lines) + "\n}" if lines else "{}"


def write_json(path: str, data: dict, *, stdout=None) -> None:
    text = dumps_report(data) + "\n"
    if path == "-":
        (stdout or sys.stdout).write(text)
        return
    write_atomic(path, text)
