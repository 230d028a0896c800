"""What a source file is worth to a stored result: its whole content where the cell ran its code,
its import-time skeleton where the cell's process only imported it.

A file a cell ran code of is keyed on every byte. A file the process imported and the cell never
entered still ran at import: its module-level statements, class bodies, decorators and default
values, and (the ``@triton.jit`` family) kernels that a GPU runs without a Python frame. Its
*skeleton* is the file's syntax tree with the body of every other function left out: an edit
inside such a body cannot change a cell that never entered it, an edit anywhere else can.

Skeletons cost a parse; they are kept by content digest (``Store.skeletons``), so a file is
parsed once per distinct content, across runs and machines sharing a store.
"""

from __future__ import annotations

import ast
import hashlib
import os
from typing import Any

__all__ = ["content_digest", "skeleton_digest"]

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
    try:
        tree = ast.parse(data, filename=os.fspath(path))
    except (SyntaxError, ValueError):
        return "whole:" + content_digest(data)
    tree = _Hollow().visit(tree)
    return hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()
