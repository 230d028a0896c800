"""What a source file is worth to a stored result: each function a cell's process ran, by that
function's own code; every file the process imported, by its import-time skeleton.

A function is a ``def`` at module level or in a class body (a nested function, lambda or
comprehension runs inside the one that defines it, and is part of its syntax). Its digest is its
syntax tree, decorators and default values included, without positions: an edit inside another
function of the same file, or a comment, changes nothing of it. A result whose findings name a
line (a crash's frame) is keyed, for the functions of the files it names, on the positioned
digest instead: positions counted from the function's first line, so that a function moved as a
whole (an edit above it) still holds, and the store moves the lines it cites with it.

A file the process imported still ran at import: its module-level statements, class bodies,
decorators and default values, and (the ``@triton.jit`` family) kernels that a GPU runs without a
Python frame. Its *skeleton* is the file's syntax tree with the body of every other function
left out: an edit inside such a body cannot change a cell whose process never ran it, an edit
anywhere else can.

Both cost a parse; they are kept by content digest (the store's ``files`` table), so a file is
parsed once per distinct content, across runs and machines sharing a store.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from typing import Any

__all__ = ["content_digest", "file_digests", "function_digests", "read_digests", "skeleton_digest"]

# A function whose decorator names one of these is a kernel (or one of its helpers): the GPU
# compiles its body from the source, so the body counts as import-time code.
_KERNEL_DECORATORS = ("jit", "autotune", "heuristics")


def content_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_kernel(node: ast.AST) -> bool:
    for dec in getattr(node, "decorator_list", ()):
        text = ast.unparse(dec).lower()
        if any(word in text for word in _KERNEL_DECORATORS):
            return True
    return False


class _Hollow(ast.NodeTransformer):
    def _function(self, node: Any) -> Any:
        if _is_kernel(node):
            return node
        node.body = [ast.Expr(ast.Constant(...))]
        return node

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function


def skeleton_digest(data: bytes, *, path: str = "<file>") -> str:
    """The digest of ``data``'s import-time code (see the module's docstring); a file that does
    not parse is keyed on its whole content (what it is, it is everywhere it is imported)."""
    return file_digests(data, path=path)["skeleton"]


def _defs(body: list, prefix: str, out: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]) -> None:
    """Every function defined directly in ``body`` (through ``if``/``try``/``with``/loops, not
    into other functions), by qualified name as its code object names it."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(prefix + node.name, []).append(node)
        elif isinstance(node, ast.ClassDef):
            _defs(node.body, f"{prefix}{node.name}.", out)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    _defs(inner, prefix, out)
            for case in getattr(node, "cases", ()):  # match statements
                _defs(case.body, prefix, out)


def _first_line(node: Any) -> int:
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])


def function_digests(tree: ast.Module) -> dict[str, list]:
    """Qualified name -> [digest, positioned digest, first line, last line] of every function of
    ``tree`` (two defs of one name, as under ``if``/``else``, are keyed together: the first line
    of the first, the last of the last). Positions are counted from the first line."""
    found: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    _defs(tree.body, "", found)
    out = {}
    for name, nodes in found.items():
        plain, placed = hashlib.sha256(), hashlib.sha256()
        first = _first_line(nodes[0])
        for node in nodes:
            shape = ast.dump(node, include_attributes=False).encode()
            plain.update(shape)
            placed.update(shape + b"\0" + _positions(node, first) + b"\0")
        last = max(getattr(n, "end_lineno", None) or n.lineno for n in nodes)
        out[name] = [plain.hexdigest()[:32], placed.hexdigest()[:32], first, last]
    return out


def _positions(node: ast.AST, first: int) -> bytes:
    """Every position in ``node``, in ``ast.walk``'s order, its lines counted from ``first``. With
    the dump without positions (which fixes the tree's shape, hence that order) it says what a dump
    with positions says, at a fraction of the cost: that dump was most of a cold store's time
    spent fingerprinting a code base."""
    out = []
    for n in ast.walk(node):
        line = getattr(n, "lineno", None)
        if line is not None:  # a node with positions (expr, stmt, arg, keyword, ...)
            end = getattr(n, "end_lineno", None)
            col, end_col = getattr(n, "col_offset", None), getattr(n, "end_col_offset", None)
            out.append((line - first, col, None if end is None else end - first, end_col))
    return repr(out).encode()


def file_digests(data: bytes, *, path: str = "<file>") -> dict:
    """``{"skeleton": ..., "functions": {qualname: [digest, positioned, first, last]}}`` of a source file, one
    parse for both; a file that does not parse has no functions (each is keyed on the whole
    file then, as its skeleton is)."""
    try:
        tree = ast.parse(data, filename=os.fspath(path))
    except (SyntaxError, ValueError):
        return {"skeleton": "whole:" + content_digest(data), "functions": {}}
    functions = function_digests(tree)
    tree = _Hollow().visit(tree)
    return {
        "skeleton": hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest(),
        "functions": functions,
    }


def read_digests(text: str) -> dict | None:
    """``file_digests``'s value as kept in JSON (a store's files table, the machine's memo); None
    for a row that is not one, which is then parsed again."""
    try:
        got = json.loads(text)
    except ValueError:
        return None
    return got if isinstance(got, dict) and "skeleton" in got and "functions" in got else None
