"""A function's source as the file has it: ``inspect.getsourcelines``' block, read without
Python's tokenizer (most of a first apply's time on a long function)."""

from __future__ import annotations

import ast
import inspect
import textwrap
import types

__all__ = ["source_block"]


def _last_code_line(code: types.CodeType) -> int:
    last = code.co_firstlineno
    stack = [code]
    while stack:
        c = stack.pop()
        for _, end, _, _ in c.co_positions():
            if end is not None and end > last:
                last = end
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return last


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def source_block(fn: types.FunctionType) -> tuple[str, int] | None:
    """What ``inspect.getsourcelines`` returns, without Python's tokenizer (most of a first
    apply's time on a long function): the lines from the def (decorators included) past the
    last line its bytecode covers, up to the next line indented no deeper than the def, parsed
    by the C parser for the def's true end; then comment lines indented at least as deep as the
    body, as inspect's block finder keeps them. None when that text does not parse as exactly
    this def (a string or bracket reaching back past the def's indentation): the caller asks
    inspect."""
    import linecache

    fn = inspect.unwrap(fn)  # as inspect does
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    lines = linecache.getlines(code.co_filename, fn.__globals__)
    start = code.co_firstlineno
    if not lines or start > len(lines):
        return None
    outer = _indent(lines[start - 1])
    stop = min(_last_code_line(code), len(lines))
    while stop < len(lines):
        line = lines[stop]
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and _indent(line) <= outer:
            break
        stop += 1
    dedented = textwrap.dedent("".join(lines[start - 1 : stop]))
    try:
        tree = ast.parse(dedented)
    except (SyntaxError, ValueError):
        return None
    removed = outer - _indent(dedented.split("\n", 1)[0])
    if len(tree.body) != 1 or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    node = tree.body[0]
    if node.name != code.co_name or not node.body:
        return None
    last = start + node.end_lineno - 1
    # inspect keeps trailing comments only below an indented body (not after `def f(): x`).
    one_line = node.body[0].lineno == node.lineno
    body_col = node.body[0].col_offset + removed
    for number in range(last + 1, len(lines) + 1) if not one_line else ():
        line = lines[number - 1]
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        if _indent(line) >= body_col:
            last = number
    return "".join(lines[start - 1 : last]), start
