"""An edited function's source compiled back into a code object that can replace the original's:
the same name, flags and closure shape, decorators, defaults and annotations left to the
function object that already holds them."""

from __future__ import annotations
import __future__ as _future

import ast
import inspect
import textwrap
import types
from typing import Any

from sglfix.common.errors import PatchApplicationError

__all__ = ["compile_edited"]

_FUTURE_FLAGS = 0
for _name in _future.all_feature_names:
    _FUTURE_FLAGS |= getattr(_future, _name).compiler_flag


def _function_node(tree: ast.Module, *, name: str, target: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    nodes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if len(tree.body) != 1 or len(nodes) != 1 or nodes[0].name != name:
        raise PatchApplicationError(
            f"{target}: after the edits the source is no longer a single `def {name}`; "
            "an edit must stay inside the function body"
        )
    return nodes[0]


def _check_parameters(node: ast.FunctionDef | ast.AsyncFunctionDef, fn: types.FunctionType, target: str) -> None:
    # Only the code is swapped: the defaults stay those the module's own `def` evaluated, matched
    # to parameters by position. An edit that adds, drops, renames or reorders a parameter, or
    # gives one a default or takes it away, would bind them to the wrong names (or to none).
    args, code = node.args, fn.__code__
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    keyword_defaults = {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None}
    same = (
        named == list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
        and len(args.posonlyargs) == code.co_posonlyargcount
        and len(args.kwonlyargs) == code.co_kwonlyargcount
        and (args.vararg is not None) == bool(code.co_flags & inspect.CO_VARARGS)
        and (args.kwarg is not None) == bool(code.co_flags & inspect.CO_VARKEYWORDS)
        and len(args.defaults) == len(fn.__defaults__ or ())
        and keyword_defaults == set(fn.__kwdefaults__ or {})
    )
    if not same:
        raise PatchApplicationError(
            f"{target}: the edit changes the function's parameters or which of them have defaults; "
            "a patch replaces the body only (the function keeps the defaults its module gave it): "
            "keep the signature and pass a new value from the callers instead"
        )


def _strip_signature_extras(node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    # Decorators, defaults and annotations are evaluated when `def` runs, in a scope we do
    # not reproduce; their results already live on the original function object.
    node.decorator_list = []
    node.returns = None
    args = node.args
    args.defaults = []
    args.kw_defaults = [None] * len(args.kwonlyargs)
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None:
            arg.annotation = None


def _insert_preamble(node: ast.FunctionDef | ast.AsyncFunctionDef, preamble: str, target: str) -> None:
    try:
        extra = ast.parse(textwrap.dedent(preamble)).body
    except SyntaxError as exc:
        raise PatchApplicationError(f"{target}: preamble is not valid Python: {exc.msg}") from None
    body = node.body
    has_doc = (
        bool(body)
        and isinstance(body[0], ast.Expr)
        and isinstance(getattr(body[0], "value", None), ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    at = 1 if has_doc else 0
    anchor = body[at] if at < len(body) else node
    for stmt in extra:
        for child in ast.walk(stmt):
            if "lineno" in child._attributes:
                ast.copy_location(child, anchor)
    node.body = body[:at] + extra + body[at:]
    for stmt in extra:
        ast.fix_missing_locations(stmt)


def compile_edited(
    *,
    fn: types.FunctionType,
    target: str,
    source: str,
    first_lineno: int,
    preamble: str,
    filename: str | None = None,
    margin: str = "",
) -> types.CodeType:
    """``source`` (``fn`` edited, dedented) compiled into a code object that can replace
    ``fn.__code__``: its lines at their place in the file (from ``first_lineno``, indented by
    ``margin``), shown as ``filename``, with ``preamble`` run first and ``fn``'s name, flags and
    closure shape; a PatchApplicationError naming ``target`` when it cannot be one. Not cached."""
    original = fn.__code__
    dedented = source  # the caller dedented it (it is also the patch's source_after)
    try:
        # Parsed at its real line numbers (blank lines before it): no walk renumbers the tree.
        tree = ast.parse("\n" * (first_lineno - 1) + dedented)
    except SyntaxError as exc:
        raise PatchApplicationError(
            f"{target}: the edited source does not parse ({exc.msg}, line "
            f"{exc.lineno or first_lineno}); check the replacement's indentation"
        ) from None
    node = _function_node(tree, name=fn.__name__, target=target)
    if margin:
        # Columns as in the file, where the shown text is indented: a traceback's carets
        # underline the right characters. Positions only: string values keep the dedented text.
        for child in ast.walk(node):
            if "col_offset" in child._attributes:
                child.col_offset += len(margin)
                if child.end_col_offset is not None:
                    child.end_col_offset += len(margin)
    if node.decorator_list:
        # The code starts at the first decorator, as the original's does (co_firstlineno, and
        # so where inspect.getsource starts reading).
        node.lineno = node.decorator_list[0].lineno
    _check_parameters(node, fn, target)
    _strip_signature_extras(node)
    if preamble.strip():
        _insert_preamble(node, preamble, target)
    freevars = original.co_freevars
    if freevars:
        # Recreate the closure's shape: an outer function owning cells of the same names.
        # Zero-argument super() needs `__class__` to be such a cell.
        pad = "\n" * (first_lineno - 1)
        keep = ast.parse(f"{pad}if False:\n    ({', '.join(freevars)},)").body[0]
        node.body.append(keep)
        outer = ast.parse(
            pad
            + "def __sglfix_scope__():\n"
            + "".join(f"    {name} = None\n" for name in freevars)
            + f"    return {fn.__name__}\n"
        ).body[0]
        outer.body.insert(len(freevars), node)
        tree = ast.Module(body=[outer], type_ignores=[])
    # Every node came from ast.parse (the preamble's are given their anchor's place), so all
    # have locations: no fix-up walk over the whole function.
    flags = original.co_flags & _FUTURE_FLAGS
    try:
        module_code = compile(tree, filename or original.co_filename, "exec", flags=flags, dont_inherit=True)
    except SyntaxError as exc:
        raise PatchApplicationError(f"{target}: the edited source does not compile: {exc.msg}") from None
    namespace: dict[str, Any] = {}
    try:
        exec(module_code, fn.__globals__, namespace)
    except Exception as exc:  # pragma: no cover - a bare def without defaults cannot raise
        raise PatchApplicationError(f"{target}: defining the edited function raised {exc!r}") from None
    new_fn = namespace["__sglfix_scope__"]() if freevars else namespace[fn.__name__]
    code = new_fn.__code__
    if code.co_freevars != freevars:
        raise PatchApplicationError(
            f"{target}: the edit changes the function's closure variables "
            f"({', '.join(freevars) or 'none'} -> {', '.join(code.co_freevars) or 'none'}); "
            "a patch may use only names the function already closes over, or globals"
        )
    replace: dict[str, Any] = {"co_name": original.co_name}
    if hasattr(original, "co_qualname"):
        replace["co_qualname"] = original.co_qualname
    return code.replace(**replace)
