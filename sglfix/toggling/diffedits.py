"""The functions of an installed file, and the edits that revert a fix's changes to one of them:
each a ``match`` (the post-fix lines, widened to the smallest anchor that occurs once in the
function) and a ``replacement`` (the pre-fix lines), as the patcher's editor applies them."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from sglfix.patching.editor import apply_single_edit, find_match_positions
from sglfix.patching.types import EditSpec
from sglfix.toggling.diffread import Change

__all__ = ["Function", "NoAnchor", "anchored_edit", "defined_names", "enclosing", "functions_of", "revert_edits"]


@dataclass
class Function:
    qualname: str  # Class.method or function, as a patch target names it after the module
    start: int  # 0-based first line (decorators included)
    end: int  # 0-based last line, inclusive
    node: Any = None


def functions_of(tree: ast.Module) -> list[Function]:
    """Every patchable function: module-level functions and methods of (nested) classes; a
    function nested inside another is part of its outer function's source."""
    out: list[Function] = []

    def walk(body: list, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
                out.append(Function(prefix + node.name, start, (node.end_lineno or node.lineno) - 1, node))
            elif isinstance(node, ast.ClassDef):
                walk(node.body, prefix + node.name + ".")

    walk(tree.body, "")
    return out


def enclosing(functions: list[Function], first: int, last: int) -> Function | None:
    """The first of ``functions`` whose lines hold ``first`` to ``last`` (0-based); None when none does."""
    for f in functions:
        if f.start <= first and last <= f.end:
            return f
    return None


def defined_names(tree: ast.Module) -> dict[str, tuple[int, int]]:
    """Top-level functions and classes: name -> (first, last) 0-based lines."""
    out: dict[str, tuple[int, int]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            out[node.name] = (start, (node.end_lineno or node.lineno) - 1)
    return out


class NoAnchor(Exception):
    """A change no context makes unique in its function: it cannot be reverted as an edit."""


def revert_edits(func: Function, changes: list[Change], post: list[str]) -> tuple[list[EditSpec], str]:
    """The edits that turn ``func``'s post-fix source into its pre-fix one, in order, each
    anchored uniquely in the source as the previous edits left it; and that pre-fix source."""
    lines = post[func.start : func.end + 1]
    base = func.start
    # The pre-fix function as the diff says it was: every change undone, bottom to top.
    pre_lines = list(lines)
    for c in sorted(changes, key=lambda c: c.at, reverse=True):
        i = c.at - base
        pre_lines[i : i + len(c.post)] = c.pre
    current = "\n".join(lines) + "\n"
    edits: list[EditSpec] = []
    # Lines of the post-fix function already taken by an earlier edit's anchor cannot anchor again.
    taken_until = 0
    for c in sorted(changes, key=lambda c: c.at):
        i = c.at - base
        edit = anchored_edit(lines, i, c, floor=taken_until, current=current)
        if edit is None:
            raise NoAnchor(
                f"no anchor occurs once in the function for the change at line {c.at + 1} "
                f"({c.hunk}); revert this function by hand"
            )
        spec, after = edit
        current = apply_single_edit(source=current, edit=spec)
        edits.append(spec)
        taken_until = i + len(c.post) + after
    return edits, "\n".join(pre_lines) + "\n"


def anchored_edit(lines: list[str], i: int, c: Change, *, floor: int, current: str) -> tuple[EditSpec, int] | None:
    """The edit for change ``c`` with the smallest (before, after) context widening that makes
    ``match`` occur exactly once in ``current`` and keeps the replacement's indentation base that
    of the match, and how many lines after the change its anchor took."""
    cur_lines = current.splitlines()
    n = len(c.post)
    for total in range(12):
        for before in range(total, -1, -1):
            after = total - before
            lo, hi = i - before, i + n + after
            if lo < floor or hi > len(lines):
                continue
            match = lines[lo:hi]
            # A lone bracket or blank is no anchor a reader (or a later release) can keep: a
            # match holds at least one line with a name or a number in it.
            if not any(re.search(r"\w", s) for s in match):
                continue
            # Blank context adds nothing (the editor strips the ends); skip widenings that only add them.
            if (before and not lines[lo].strip()) or (after and not lines[hi - 1].strip()):
                continue
            replacement = lines[lo:i] + c.pre + lines[i + n : hi]
            if not _same_base(match, replacement):
                continue
            if (
                len(find_match_positions(source_lines=cur_lines, match_lines="\n".join(match).strip().splitlines()))
                != 1
            ):
                continue
            return EditSpec(match=_block(match), replacement=_block(replacement)), after
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _same_base(match: list[str], replacement: list[str]) -> bool:
    """The editor puts the replacement's first non-blank line at the match's first line's indent
    and keeps every other line's indent relative to it, but cannot place a line to the left of
    that first one: an anchor starting inside brackets (a call's last argument) would move the
    lines after it. Both must start on their least indented line, at the same indent."""
    m = [_indent(s) for s in match if s.strip()]
    r = [_indent(s) for s in replacement if s.strip()]
    if not m or m[0] != min(m) or (r and r[0] != min(r)):
        return False
    return not r or r[0] == m[0]


def _block(lines: list[str]) -> str:
    """Lines as a YAML block: dedented by the first non-blank line's indent, newline-terminated."""
    non_blank = [s for s in lines if s.strip()]
    if not non_blank:
        return ""
    cut = _indent(non_blank[0])
    out = []
    for s in lines:
        out.append(s[min(cut, _indent(s)) :] if s.strip() else "")
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"
