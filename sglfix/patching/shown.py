"""The source a patched code object shows: its own file name, registered in ``linecache`` as the
real file with the function's lines replaced by the edited text, and ``real_filename`` to undo
the name.

Each patched code object gets a file name of its own, whose linecache lines are the real file
with the function's span replaced by the edited text: the code keeps the file's line numbers,
so everything outside the span reads as in the real file, and a traceback, inspect.getsource
or pdb quotes what runs.
"""

from __future__ import annotations

import itertools
import linecache
import os
import sys
import textwrap
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["real_filename", "show", "shown_file", "shown_name", "unshow"]

# name -> [linecache entry, live patches using it].
_SHOWN: dict[str, list] = {}
# Entries no live patch uses stay registered (a traceback kept from a reverted run and formatted
# after the restore must still quote what ran), the oldest dropped past this many.
_SHOWN_IDLE_LIMIT = 64
_TAG = "[sglfix "


def real_filename(filename: str) -> str:
    """The file a patched code object's ``co_filename`` stands for (any other name: itself)."""
    head, tail = os.path.split(filename)
    parent, tag = os.path.split(head)
    return os.path.join(parent, tail) if tag.startswith(_TAG) and tag.endswith("]") else filename


def shown_file(
    *, fn: types.FunctionType, filename: str, first_lineno: int, span: int, text: str, margin: str
) -> list[str]:
    """The lines of ``filename`` with the ``span`` lines of ``fn`` from ``first_lineno`` replaced by
    ``text`` indented by ``margin``: the file as a code object compiled from ``text`` shows it."""
    lines = linecache.getlines(filename, fn.__globals__)
    before = lines[: first_lineno - 1]
    before += ["\n"] * (first_lineno - 1 - len(before))  # no file text: the lines still count
    body = textwrap.indent(text, margin).splitlines(keepends=True)
    if body and not body[-1].endswith("\n"):
        body[-1] += "\n"
    return before + body + lines[first_lineno - 1 + span :]


def shown_name(
    *, filename: str, labels: Sequence[str], qualname: str, lines: list[str], claimed: dict[str, list[str]]
) -> str:
    """``<dir>/[sglfix revert A + revert B]/<file>``: the patches in the code, oldest first. The
    directory and base name stay the real ones: a frame still belongs to its package, a tool
    matching ``*.py`` or the base name still finds it. A name taken by other text (another
    function of the file patched by the same revert) also names the function."""
    tag = " + ".join(label or "patch" for label in labels).replace(os.sep, "_").replace("/", "_")
    head, tail = os.path.split(filename)
    extras = itertools.chain(("", f", {qualname}"), (f", {qualname} #{n}" for n in itertools.count(2)))
    for extra in extras:
        name = os.path.join(head, f"{_TAG}{tag}{extra}]", tail)
        held = claimed.get(name)
        if held is None and name in _SHOWN and _SHOWN[name][1]:
            held = _SHOWN[name][0][2]
        if held is None or held == lines:
            claimed[name] = lines
            return name
    raise AssertionError("unreachable")  # pragma: no cover


def _reshow() -> None:
    # Re-registered on every install and restore: linecache.clearcache() elsewhere drops them.
    cache = linecache.cache
    for name, (entry, _users) in _SHOWN.items():
        if cache.get(name) is not entry:
            cache[name] = entry


def _print_exception(exc_type: Any, exc: Any, tb: Any) -> None:
    """sys.excepthook where the built-in one reads source lines from the files on disk (Python
    before 3.13), which a patched code's file name is not: traceback's renderer reads linecache."""
    try:
        import traceback

        traceback.print_exception(exc_type, exc, tb)
    except Exception:
        sys.__excepthook__(exc_type, exc, tb)


def show(name: str, lines: list[str]) -> None:
    """Register ``lines`` in ``linecache`` as the file ``name`` for one more live patch (until its
    ``unshow``), so that tracebacks, ``inspect`` and debuggers quote them."""
    if sys.version_info < (3, 13) and sys.excepthook is sys.__excepthook__:
        # An uncaught exception would otherwise quote no line of the code that raised it.
        sys.excepthook = _print_exception
    held = _SHOWN.pop(name, None)
    if held is None or held[0][2] != lines:
        # mtime None: linecache.checkcache keeps the entry (no file on disk to compare with).
        held = [(sum(map(len, lines)), None, lines, name), held[1] if held else 0]
    held[1] += 1
    _SHOWN[name] = held
    _reshow()


def unshow(name: str) -> None:
    """One live patch less shows ``name``; the lines stay registered while idle (a traceback kept
    from a restored run still quotes what ran), the oldest idle ones dropped past a limit."""
    held = _SHOWN.get(name)
    if held is not None:
        held[1] -= 1
        if held[1] <= 0:
            _SHOWN[name] = _SHOWN.pop(name)  # newest idle entry last
            idle = [n for n, (_, users) in _SHOWN.items() if users <= 0]
            for old in idle[: max(0, len(idle) - _SHOWN_IDLE_LIMIT)]:
                entry = _SHOWN.pop(old)[0]
                if linecache.cache.get(old) is entry:
                    del linecache.cache[old]
    _reshow()
