"""The mutation operators: small changes of one function's body, each modelled on a metadata bug
the catalogue's fixes undo (±1 on a length, a dropped ``+ num_draft_tokens``, ``extend_seq_lens``
read for ``extend_prefix_lens``, a skipped ``cumsum`` into a static buffer, ``[:bs]`` dropped, a
mode check gone, a change made only at capture or only at replay).

Everything is source text: the function is found with ``ast`` in the file's text, each change is
text surgery at the AST nodes' columns on the original lines (comments and the rest of the line
kept), and a mutant whose function no longer parses is dropped. Nothing is imported or run.

A mutant whose change ``--apply`` could not place (a line repeated, with its context, elsewhere
in the function) is not made: every mutant replays as a candidate fix.

Caps keep a function's mutants few enough to run, every one a distinct change:
- a change equal to another one of the function (the same mutated AST), or to no change, is
  dropped (``x[(1 + 1):]`` from ``off-by-one`` and ``x[2:]`` from ``slice-bound`` are one);
- ``off-by-one`` changes a whole ``a + b - c`` chain, never its terms one by one (±1 on any term
  of a sum is ±1 on the sum);
- ``swap-same-typed`` swaps at most ``MAX_SWAPS_PER_CALL`` argument pairs of a call and reads at
  most ``MAX_FIELD_ALTERNATIVES`` other fields for one field (the most similar names first);
- at most ``MAX_PER_LINE`` mutants of one operator start on one line (the leftmost first).
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sglfix.common.errors import ConfigError
from sglfix.common.schema import nearest
from sglfix.mutation.model import Mutant, mutant_id

__all__ = [
    "MAX_FIELD_ALTERNATIVES",
    "MAX_PER_LINE",
    "MAX_SWAPS_PER_CALL",
    "OPERATORS",
    "check_operators",
    "function_node",
    "mutants_of_function",
]

OPERATORS: dict[str, str] = {
    "off-by-one": "± 1 on a length, offset or index expression (E -> (E + 1), (E - 1))",
    "drop-addend": "an operand dropped: a + b -> a | b, a - b -> a, a * b -> a | b, a clamp torch.clamp(x, min=0) -> x",
    "swap-same-typed": "two same-typed arguments swapped, or a field read for its sibling (extend_seq_lens -> extend_prefix_lens)",
    "skip-update": "a buffer update, a state assignment, a value's refinement or a check replaced by pass",
    "slice-bound": "a slice bound dropped or moved by one ([:bs] -> [:], [:bs + 1], [:bs - 1])",
    "negate-condition": "an if / elif / while / conditional expression's condition inverted",
    "drop-mode-check": "a mode or configuration check made always true or always false (dropped from an and/or)",
    "none-arg": "an argument of a metadata call replaced by None",
    "capture-only": "an off-by-one or slice-bound change made only when the shared body captures a graph",
    "replay-only": "an off-by-one or slice-bound change made only when the shared body replays a graph",
}

MAX_PER_LINE = 8
MAX_SWAPS_PER_CALL = 4
MAX_FIELD_ALTERNATIVES = 2

# Words (between underscores) of a name that holds a length, an offset or an index.
_LENGTH_WORDS = frozenset(
    [
        "len",
        "lens",
        "length",
        "lengths",
        "offset",
        "offsets",
        "indptr",
        "index",
        "indices",
        "idx",
        "size",
        "sizes",
        "bs",
        "step",
        "steps",
        "start",
        "end",
        "sum",
        "max",
        "min",
        "width",
        "stride",
        "strides",
        "cumsum",
        "loc",
        "locs",
        "pos",
        "positions",
        "topk",
        "count",
        "total",
    ]
)
# A name's last word that makes it an object, not a number (``kv_index_translator``, ``kv_loc_plan``).
_OBJECT_WORDS = frozenset(
    [
        "plan",
        "translator",
        "pool",
        "backend",
        "backends",
        "info",
        "runner",
        "fn",
        "func",
        "mode",
        "dtype",
        "device",
        "layer",
        "wrapper",
        "wrappers",
        "kernel",
        "metadata",
        "config",
        "cls",
    ]
)
# Words of a ``self`` attribute that make it a static buffer the function fills: ± 1 on the
# buffer itself is a copy written in vain, not a length off by one.
_BUFFER_WORDS = frozenset(["indptr", "indices", "loc", "locs", "offsets", "buffer", "buf"])
# Calls that allocate a tensor (a buffer's contents are not a length).
_ALLOCATORS = frozenset(
    [
        "empty",
        "empty_like",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "new_empty",
        "new_zeros",
        "new_ones",
        "new_full",
    ]
)
_LENGTH_CALLS = frozenset(["len", "sum", "max", "min", "cumsum", "numel", "size", "stride"])
# Calls that pass a length through (``x[:bs].to(torch.int32)`` is still a length).
_THROUGH_CALLS = frozenset(["int", "to", "long", "item", "clamp", "clamp_min", "clamp_max", "contiguous"])
_RANGE_CALLS = frozenset({"arange", "range"})
_CLAMP_CALLS = frozenset({"clamp", "clamp_min", "clamp_max", "clip"})
# Calls whose arguments are words, not metadata: nothing inside them is mutated. ``on_metadata``
# is the harness's hook through which the reproduction's graph runners hand their metadata to the
# judge: sglfix's instrument, not the code under test.
_QUIET_CALLS = frozenset(
    ["print", "debug", "info", "warning", "warn", "error", "exception", "critical", "log", "format", "on_metadata"]
)
# Names of the harness's own plumbing inside the code under test (the reproduction's graph
# runners hand their metadata to the judge through ``on_metadata``): lines that name them are
# sglfix's instrument, and a change there tests the judge, not the code.
_HARNESS_NAMES = ("on_metadata",)
_METADATA_CALLEE = re.compile(
    r"init|metadata|update|plan|create|kv|indices|indptr|fill|copy|generate|assign|build|prepare|compute", re.I
)
_CHECK_NAME = re.compile(r"^(is|use|enable|has)_|_mode$|capture", re.I)
_GUARD_CALL = re.compile(r"^_?(assert|check|validate)", re.I)


def check_operators(operators: Sequence[str] | None) -> tuple[str, ...]:
    """The operators asked for, in ``OPERATORS``' order (all when None), or a one-line
    ConfigError naming an unknown one, its nearest name and the valid ones."""
    if operators is None:
        return tuple(OPERATORS)
    for name in operators:
        if name not in OPERATORS:
            raise ConfigError(
                f"unknown mutation operator {name!r}{nearest(name, OPERATORS)}; the operators are: {', '.join(OPERATORS)}"
            )
    return tuple(o for o in OPERATORS if o in set(operators))


# ----------------------------------------------------------------------------- the source text


class _Text:
    """The file's lines and AST positions as character columns (``ast`` counts UTF-8 bytes)."""

    def __init__(self, file_text: str) -> None:
        self.lines = file_text.splitlines()

    def col(self, lineno: int, byte_col: int) -> int:
        line = self.lines[lineno - 1]
        return byte_col if line.isascii() else len(line.encode()[:byte_col].decode(errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int, int, int]:
        return (
            node.lineno,
            self.col(node.lineno, node.col_offset),
            node.end_lineno,
            self.col(node.end_lineno, node.end_col_offset),
        )

    def segment(self, node: ast.AST) -> str:
        a, ca, b, cb = self.span(node)
        if a == b:
            return self.lines[a - 1][ca:cb]
        return "\n".join([self.lines[a - 1][ca:], *self.lines[a : b - 1], self.lines[b - 1][:cb]])

    def splice(self, spans: Sequence[tuple[ast.AST, str]]) -> tuple[int, int, list[str]]:
        """The whole lines the spans touch, each span replaced by its text: (first line, last
        line, the new lines)."""
        placed = sorted((self.span(node), text) for node, text in spans)
        first = min(s[0] for s, _ in placed)
        last = max(s[2] for s, _ in placed)
        starts = {}
        offset = 0
        for n in range(first, last + 1):
            starts[n] = offset
            offset += len(self.lines[n - 1]) + 1
        region = "\n".join(self.lines[first - 1 : last])
        end_before = len(region) + 1
        for (a, ca, b, cb), text in reversed(placed):
            lo, hi = starts[a] + ca, starts[b] + cb
            if hi > end_before:  # overlapping spans: not one change
                raise _Overlap
            region = region[:lo] + text + region[hi:]
            end_before = lo
        return first, last, region.split("\n")


class _Overlap(Exception):
    pass


def _short(text: str, width: int = 60) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 3] + "..."


def _name(node: ast.AST) -> str | None:
    """The identifier a Name or Attribute reads (``forward_batch.seq_lens`` -> ``seq_lens``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Subscript):  # kernel[grid](...)
        func = func.value
    return _name(func)


def _words(identifier: str) -> list[str]:
    return [w for w in identifier.lower().split("_") if w]


def _lengthy_name(identifier: str) -> bool:
    words = _words(identifier)
    if not words or words[-1] in _OBJECT_WORDS:
        return False
    return any(w in _LENGTH_WORDS or w.startswith("num") for w in words)


def _is_buffer(node: ast.AST) -> bool:
    """``self.kv_indptr``, ``self.cuda_graph_kv_indices[:bs]``: a static buffer of the object."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"):
        return False
    return node.attr.startswith("cuda_graph_") or bool(_BUFFER_WORDS & set(_words(node.attr)))


def _suffix(identifier: str) -> str:
    return identifier.rsplit("_", 1)[-1].lower()


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set)
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult)


def _paren(node: ast.AST, text: str) -> str:
    """``text`` (the source of ``node``) safe as the left operand of ``+``/``-``."""
    if isinstance(node, _ATOMS) or (isinstance(node, ast.BinOp) and isinstance(node.op, _ARITH)):
        return text if "\n" not in text or isinstance(node, _ATOMS) else f"({text})"
    return f"({text})"


def _plus(node: ast.AST, text: str, delta: int) -> str:
    """``text`` moved by ``delta``: a literal folded (``0`` -> ``1``), else ``U + 1`` / ``U - 1``."""
    if _is_int(node):
        return str(node.value + delta)
    return f"{_paren(node, text)} {'+' if delta > 0 else '-'} {abs(delta)}"


# ----------------------------------------------------------------------------- the function


def function_node(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The def of ``qualname`` (``func``, ``Class.method``) at the top of the module or of its
    classes; the last definition wins, as at import time."""
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for name in qualname.split("."):
        defs = [
            n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        ]
        if not defs:
            return None
        node = defs[-1]
        body = getattr(node, "body", [])
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _accessor(node: ast.AST) -> bool:
    """A property's getter, setter or deleter (a redefinition of a plain function replaces it)."""
    for d in getattr(node, "decorator_list", []):
        if (isinstance(d, ast.Name) and d.id in {"property", "cached_property"}) or (
            isinstance(d, ast.Attribute) and d.attr in {"setter", "getter", "deleter"}
        ):
            return True
    return False


def _defined_twice(tree: ast.Module, qualname: str) -> bool:
    body: list[ast.stmt] = tree.body
    for name in qualname.split("."):
        defs = [
            n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        ]
        if len(defs) > 1 and any(_accessor(d) for d in defs):
            return True
        body = getattr(defs[-1], "body", []) if defs else []
    return False


@dataclass
class _Where:
    parent: ast.AST | None
    field: str  # the parent's field holding the node ("value", "args", "slice", ...)


class _Scope:
    """The nodes of a function body an operator may change, with their parents: the docstring,
    decorators and signatures, asserts' and raises' insides, f-strings and log calls' arguments
    are left alone."""

    def __init__(self, func: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.where: dict[int, _Where] = {}
        self.nodes: list[ast.AST] = []
        body = list(func.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        for stmt in body:
            self._visit(stmt, func, "body")

    def _visit(self, node: ast.AST, parent: ast.AST, field: str) -> None:
        self.where[id(node)] = _Where(parent, field)
        self.nodes.append(node)
        if isinstance(node, (ast.Assert, ast.Raise, ast.JoinedStr)):
            return
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return
        if isinstance(node, ast.Call) and _callee(node) in _QUIET_CALLS:
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            fields = ["body"]
        else:
            fields = list(node._fields)
        for name in fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                self._visit(value, node, name)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self._visit(item, node, name)

    def parent(self, node: ast.AST) -> ast.AST | None:
        w = self.where.get(id(node))
        return w.parent if w else None

    def field(self, node: ast.AST) -> str:
        w = self.where.get(id(node))
        return w.field if w else ""


@dataclass(frozen=True)
class _Change:
    operator: str
    spans: tuple[tuple[ast.AST, str], ...]
    description: str
    # For off-by-one and slice-bound: the one expression changed and its replacement, from which
    # the capture-only and replay-only variants are made.
    expr: tuple[ast.AST, str] | None = None


# ----------------------------------------------------------------------------- the operators


class _Operators:
    def __init__(self, func: ast.FunctionDef | ast.AsyncFunctionDef, text: _Text) -> None:
        self.func = func
        self.text = text
        self.scope = _Scope(func)
        self.nodes = self.scope.nodes
        # Names the body assigns (a parameter it never assigns is changed at each use).
        self.assigned = {
            n.id for n in self.nodes if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))
        }

    def seg(self, node: ast.AST) -> str:
        return self.text.segment(node)

    # -- shared predicates

    def _value_position(self, node: ast.AST) -> bool:
        """A read whose value an operator may change: not a target, a callee, the base of an
        attribute or subscript, nor one side of an ``is None`` test."""
        if isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del)):
            return False
        parent, field = self.scope.parent(node), self.scope.field(node)
        if parent is None or isinstance(parent, (ast.Assert, ast.Raise)):
            return False
        if isinstance(parent, ast.Call) and field == "func":
            return False
        if isinstance(parent, (ast.Attribute, ast.Subscript)) and field == "value":
            return False
        if isinstance(parent, ast.Compare):
            sides = [parent.left, *parent.comparators]
            if any(isinstance(s, ast.Constant) and s.value is None for s in sides):
                return False
        return not (isinstance(parent, ast.keyword) and parent.arg in {"dtype", "device", "layout"})

    def lengthy(self, node: ast.AST) -> bool:
        if isinstance(node, (ast.Name, ast.Attribute)):
            ident = _name(node)
            return ident is not None and ident != "self" and _lengthy_name(ident)
        if isinstance(node, ast.Subscript):
            base = node.value
            return self.lengthy(base) or (isinstance(base, ast.Attribute) and base.attr == "shape")
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name in _LENGTH_CALLS:
                return True
            if name in _THROUGH_CALLS:
                inner = node.func.value if isinstance(node.func, ast.Attribute) else (node.args or [None])[0]
                return inner is not None and self.lengthy(inner)
            return False
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            return self.lengthy(node.left) or self.lengthy(node.right)
        return False

    def _defines_length(self, node: ast.AST) -> bool:
        """The value assigned to a name that holds a length (``num_tokens = foo()``)."""
        parent = self.scope.parent(node)
        if isinstance(node, ast.Constant) and not _is_int(node):
            return False
        if isinstance(node, ast.Call) and _callee(node) in _ALLOCATORS:
            return False
        return (
            isinstance(parent, (ast.Assign, ast.AnnAssign))
            and self.scope.field(node) == "value"
            and any(
                isinstance(t, ast.Name) and _lengthy_name(t.id)
                for t in (parent.targets if isinstance(parent, ast.Assign) else [parent.target])
            )
        )

    def in_slice_bound(self, node: ast.AST) -> bool:
        parent = self.scope.parent(node)
        return isinstance(parent, ast.Slice) and self.scope.field(node) in {"lower", "upper"}

    # -- off-by-one

    def off_by_one(self) -> Iterator[_Change]:
        for node in self.nodes:
            if not isinstance(node, ast.expr) or not self._value_position(node) or self.in_slice_bound(node):
                continue
            parent = self.scope.parent(node)
            if _is_int(node):
                in_index = isinstance(parent, ast.Subscript) and self.scope.field(node) == "slice"
                in_range = (isinstance(parent, ast.Call) and _callee(parent) in _RANGE_CALLS) or (
                    isinstance(parent, ast.keyword)
                    and isinstance(self.scope.parent(parent), ast.Call)
                    and _callee(self.scope.parent(parent)) in _RANGE_CALLS
                )
                if not (in_index or in_range):
                    continue
            elif not (self.lengthy(node) or self._defines_length(node)) or _is_buffer(node):
                continue
            elif isinstance(node, ast.Name) and node.id in self.assigned:
                continue  # a local's value is moved by one where it is assigned, not at each use
            # A term of a sum: ±1 on it is ±1 on the sum, which is changed instead.
            if (
                isinstance(parent, ast.BinOp)
                and isinstance(parent.op, (ast.Add, ast.Sub))
                and (self.lengthy(parent) or _is_int(parent.left) or _is_int(parent.right))
            ):
                continue
            text = self.seg(node)
            for delta in (1, -1):
                new = _plus(node, text, delta) if _is_int(node) else f"({_paren(node, text)} {'+-'[delta < 0]} 1)"
                word = f"{'+-'[delta < 0]} 1 on {_short(text, 50)}"
                yield _Change("off-by-one", ((node, new),), word, expr=(node, new))

    # -- drop-addend

    def drop_addend(self) -> Iterator[_Change]:
        for node in self.nodes:
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
                if any(
                    isinstance(side, ast.JoinedStr) or (isinstance(side, ast.Constant) and isinstance(side.value, str))
                    for side in (node.left, node.right)
                ):
                    continue
                left, right = self.seg(node.left), self.seg(node.right)
                kind = {ast.Add: "addend", ast.Sub: "subtrahend", ast.Mult: "factor"}[type(node.op)]
                keep = [(node.left, left, right)]
                if not isinstance(node.op, ast.Sub):
                    keep.append((node.right, right, left))
                for kept, kept_text, dropped in keep:
                    other = node.right if kept is node.left else node.left
                    if (
                        isinstance(node.op, (ast.Add, ast.Sub))
                        and _is_int(other)
                        and other.value == 1
                        and (self.lengthy(node) or self.in_slice_bound(node))
                    ):
                        continue  # ± 1 on a length: off-by-one's and slice-bound's change
                    new = self._in_place(node, kept, kept_text)
                    yield _Change("drop-addend", ((node, new),), f"dropped {kind} {_short(dropped, 50)}")
            elif isinstance(node, ast.Call) and node.args:
                clamp = self._clamped(node)
                if clamp is not None:
                    new = self._in_place(node, clamp, self.seg(clamp))
                    yield _Change("drop-addend", ((node, new),), f"dropped clamp {_short(self.seg(node), 50)}")

    def _clamped(self, call: ast.Call) -> ast.AST | None:
        """The value a clamp bounds: ``torch.clamp(x, min=0)``, ``x.clamp_min(1)``, ``max(x, 0)``."""
        name = _callee(call)
        if name in _CLAMP_CALLS:
            if isinstance(call.func, ast.Attribute) and not (
                isinstance(call.func.value, ast.Name) and call.func.value.id in {"torch", "np", "numpy"}
            ):
                return call.func.value
            return call.args[0] if call.args else None
        if name in {"max", "min"} and isinstance(call.func, ast.Name) and len(call.args) == 2:
            a, b = call.args
            if isinstance(b, ast.Constant) and not isinstance(a, ast.Constant):
                return a
            if isinstance(a, ast.Constant) and not isinstance(b, ast.Constant):
                return b
        return None

    def _in_place(self, node: ast.AST, kept: ast.AST, text: str) -> str:
        """``text`` (of ``kept``) where ``node`` was: bracketed when the place binds tighter."""
        parent, field = self.scope.parent(node), self.scope.field(node)
        loose = (
            (isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.Expr)) and field == "value")
            or (isinstance(parent, (ast.If, ast.While)) and field == "test")
            or (
                isinstance(parent, ast.keyword)
                or (isinstance(parent, ast.Call) and field == "args")
                or (isinstance(parent, (ast.Tuple, ast.List)) and field == "elts")
            )
        )
        if isinstance(kept, _ATOMS) and "\n" not in text:
            return text
        if loose and "\n" not in text:
            return text
        if (
            isinstance(parent, ast.BinOp)
            and isinstance(kept, ast.BinOp)
            and "\n" not in text
            and _precedence(kept.op) > _precedence(parent.op)
        ):
            return text  # a + (b * c) -> a + b * c reads the same; a * (b + c) keeps its brackets
        return f"({text})"

    # -- swap-same-typed

    def swap_same_typed(self) -> Iterator[_Change]:
        fields: dict[str, set[str]] = {}
        methods: set[str] = set()
        for node in self.nodes:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                methods.add(node.func.attr)
        for node in self.nodes:
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and self._field_read(node):
                fields.setdefault(self.seg(node.value), set()).add(node.attr)
        for node in self.nodes:
            if isinstance(node, ast.Call):
                yield from self._swap_args(node)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and self._field_read(node):
                if node.attr in methods:
                    continue
                base = self.seg(node.value)
                others = [
                    b
                    for b in fields.get(base, ())
                    if b != node.attr and b not in methods and _suffix(b) == _suffix(node.attr)
                ]
                others.sort(key=lambda b: (-difflib.SequenceMatcher(None, node.attr, b).ratio(), b))
                for other in others[:MAX_FIELD_ALTERNATIVES]:
                    new = f"{base}.{other}"
                    yield _Change("swap-same-typed", ((node, new),), f"{node.attr} -> {other}")

    def _field_read(self, node: ast.Attribute) -> bool:
        parent, field = self.scope.parent(node), self.scope.field(node)
        if parent is None or (isinstance(parent, ast.Call) and field == "func"):
            return False
        return not isinstance(parent, (ast.Assert, ast.Raise))

    def _swap_args(self, call: ast.Call) -> Iterator[_Change]:
        args = [a for a in call.args if isinstance(a, (ast.Name, ast.Attribute))]
        args += [k.value for k in call.keywords if k.arg and isinstance(k.value, (ast.Name, ast.Attribute))]
        args = [a for a in args if _name(a) != "self"]
        made = 0
        for i, a in enumerate(args):
            for b in args[i + 1 :]:
                if made >= MAX_SWAPS_PER_CALL:
                    return
                ta, tb = self.seg(a), self.seg(b)
                if ta == tb or _suffix(_name(a) or "") != _suffix(_name(b) or ""):
                    continue
                made += 1
                yield _Change(
                    "swap-same-typed", ((a, tb), (b, ta)), f"{_short(ta, 30)} <-> {_short(tb, 30)} in {_callee(call)}()"
                )

    # -- skip-update

    def skip_update(self) -> Iterator[_Change]:
        for node in self.nodes:
            if isinstance(node, ast.stmt) and self._is_update(node):
                first = self.seg(node).splitlines()[0]
                what = "check" if self._is_guard(node) else "update"
                more = " ..." if "\n" in self.seg(node) else ""
                yield _Change("skip-update", ((node, "pass"),), f"skipped {what}: {_short(first, 60)}{more}")

    def _is_guard(self, node: ast.stmt) -> bool:
        if isinstance(node, ast.Assert):
            return True
        return (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and bool(_GUARD_CALL.match(_callee(node.value) or ""))
        )

    def _is_update(self, node: ast.stmt) -> bool:
        if isinstance(node, ast.Assert) or self._is_guard(node):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return _callee(node.value) not in _QUIET_CALLS
        if isinstance(node, ast.AugAssign):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat: list[ast.AST] = []
            for t in targets:
                flat.extend(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
            if any(isinstance(t, (ast.Subscript, ast.Attribute)) for t in flat):
                return True
            # A refinement of a value: x = torch.clamp(x, min=0), seq_lens = seq_lens[:bs].
            names = {t.id for t in flat if isinstance(t, ast.Name)}
            value = node.value
            return value is not None and any(
                isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names for n in ast.walk(value)
            )
        if isinstance(node, ast.If) and not node.orelse:
            # A block that only updates: skipping the whole `if` is one skipped update.
            return all(self._is_update(s) and not isinstance(s, ast.If) for s in node.body)
        return False

    # -- slice-bound

    def slice_bound(self) -> Iterator[_Change]:
        for node in self.nodes:
            if not isinstance(node, ast.Slice) or self.scope.parent(node) is None:
                continue
            parts = {k: getattr(node, k) for k in ("lower", "upper", "step")}
            texts = {k: (self.seg(v) if v is not None else "") for k, v in parts.items()}

            def shown(texts: dict[str, str]) -> str:
                s = f"[{texts['lower']}:{texts['upper']}"
                return s + (f":{texts['step']}]" if texts["step"] else "]")

            for key, moves in (("upper", ("drop", 1, -1)), ("lower", ("drop", 1))):
                bound = parts[key]
                if bound is None:
                    continue
                for move in moves:
                    if move == "drop":
                        if _is_int(bound) and bound.value == 0 and key == "lower":
                            continue  # [0:] is [:]
                        after = dict(texts, **{key: ""})
                        # The slice written again without the bound (x[:bs] -> x[:]); None is
                        # the dropped bound where it must stay an expression.
                        span = (node, shown(after)[1:-1])
                        new = "None"
                    else:
                        new = _plus(bound, texts[key], move)
                        after = dict(texts, **{key: new})
                        span = (bound, new)
                    yield _Change("slice-bound", (span,), f"{shown(texts)} -> {shown(after)}", expr=(bound, new))

    # -- negate-condition

    def _conditions(self) -> Iterator[tuple[ast.AST, ast.AST]]:
        """(the statement or expression, its condition): if / elif / while / conditional
        expressions and comprehension filters."""
        for node in self.nodes:
            if isinstance(node, (ast.If, ast.While, ast.IfExp)):
                yield node, node.test
            elif isinstance(node, ast.comprehension):
                for cond in node.ifs:
                    yield node, cond

    def negate_condition(self) -> Iterator[_Change]:
        for node, test in self._conditions():
            text = self.seg(test)
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                new = self._in_place(test, test.operand, self.seg(test.operand))
            elif isinstance(test, _ATOMS) and "\n" not in text:
                new = f"not {text}"
            else:
                new = f"not ({text})"
            yield _Change("negate-condition", ((test, new),), f"negated: {self._keyword(node)} {_short(text, 60)}")

    def _keyword(self, node: ast.AST) -> str:
        if isinstance(node, ast.While):
            return "while"
        if isinstance(node, ast.IfExp):
            return "... if"
        if isinstance(node, ast.comprehension):
            return "for ... if"
        parent = self.scope.parent(node)
        if isinstance(parent, ast.If) and self.scope.field(node) == "orelse" and len(parent.orelse) == 1:
            line = self.text.lines[node.lineno - 1].lstrip()
            if line.startswith("elif"):
                return "elif"
        return "if"

    # -- drop-mode-check

    def is_check(self, node: ast.AST) -> bool:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return self.is_check(node.operand)
        if isinstance(node, ast.Call):
            name = _callee(node) or ""
            return name.startswith(("is_", "has_"))
        if isinstance(node, (ast.Name, ast.Attribute)):
            return bool(_CHECK_NAME.search(_name(node) or ""))
        if isinstance(node, ast.BoolOp):
            return all(self.is_check(v) for v in node.values)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and s.value is None for s in sides):
                return True  # a presence check: x is None, getattr(x, "f", None) is not None
            if any(isinstance(s, ast.Attribute) and "Mode" in self.seg(s.value) for s in sides):
                return True
            read = [s for s in sides if isinstance(s, (ast.Name, ast.Attribute))]
            const = [
                s for s in sides if isinstance(s, ast.Constant) and (s.value is None or type(s.value) in (int, bool))
            ]
            return len(read) == 1 and len(const) == 1
        return False

    def drop_mode_check(self) -> Iterator[_Change]:
        for node, test in self._conditions():
            if isinstance(node, ast.comprehension):
                if self.is_check(test):
                    yield from self._drop_filter(node, test)
                continue
            if self.is_check(test):
                shown = _short(self.seg(test), 50)
                if isinstance(node, ast.IfExp):
                    for value, branch in ((True, node.body), (False, node.orelse)):
                        new = self._in_place(node, branch, self.seg(branch))
                        yield _Change("drop-mode-check", ((node, new),), f"mode check {shown} -> {value}")
                else:
                    for value in (True, False):
                        inlined = self._inlined(node, value) if isinstance(node, ast.If) else None
                        span = (node, inlined) if inlined is not None else (test, str(value))
                        yield _Change("drop-mode-check", (span,), f"mode check {shown} -> {value}")
            for sub in ast.walk(test):
                if isinstance(sub, ast.BoolOp):
                    yield from self._drop_operands(sub)

    def _drop_filter(self, comp: ast.comprehension, cond: ast.AST) -> Iterator[_Change]:
        """``for b in xs if b is not None`` -> ``for b in xs``: the filter and its ``if`` go."""
        i = comp.ifs.index(cond)
        before = comp.ifs[i - 1] if i else comp.iter
        _, _, e0, ce0 = self.text.span(before)
        _, _, e1, ce1 = self.text.span(cond)
        span = ast.Constant(value=None, lineno=e0, col_offset=0, end_lineno=e1, end_col_offset=0)
        # The text between the previous clause's end and the filter's end, as byte columns.
        span.col_offset = len(self.text.lines[e0 - 1][:ce0].encode())
        span.end_col_offset = len(self.text.lines[e1 - 1][:ce1].encode())
        yield _Change("drop-mode-check", ((span, ""),), f"dropped filter if {_short(self.seg(cond), 50)}")

    def _inlined(self, node: ast.If, value: bool) -> str | None:
        """The ``if`` statement written as the branch ``value`` takes, that branch's lines moved
        out to the ``if``'s indentation (what the code was before a fix added the check); None
        where the ``if`` is an ``elif`` or shares its line with its body."""
        a, ca, _, _ = self.text.span(node)
        line = self.text.lines[a - 1]
        if line[:ca].strip() or not line[ca:].startswith("if") or node.body[0].lineno == a:
            return None
        branch = node.body if value else node.orelse
        if not branch:
            return "pass"
        if not value and len(branch) == 1 and isinstance(branch[0], ast.If):
            first = self.text.lines[branch[0].lineno - 1].lstrip()
            if first.startswith("elif"):
                return "if" + self.seg(branch[0])[len("elif") :]
        b0, cb0, _, _ = self.text.span(branch[0])
        if self.text.lines[b0 - 1][:cb0].strip():
            return None
        _, _, b1, cb1 = self.text.span(branch[-1])
        block = "\n".join(
            [self.text.lines[b0 - 1][cb0:], *self.text.lines[b0 : b1 - 1]]
            + ([self.text.lines[b1 - 1][:cb1]] if b1 > b0 else [])
        )
        if b1 == b0:
            block = self.text.lines[b0 - 1][cb0:cb1]
        shift = cb0 - ca
        lines = block.split("\n")
        out = [lines[0]]
        for rest in lines[1:]:
            lead = len(rest) - len(rest.lstrip(" "))
            out.append(rest[min(shift, lead) :])
        return "\n".join(out)

    def _drop_operands(self, op: ast.BoolOp) -> Iterator[_Change]:
        word = " and " if isinstance(op.op, ast.And) else " or "
        for i, value in enumerate(op.values):
            if not self.is_check(value):
                continue
            rest = [v for j, v in enumerate(op.values) if j != i]
            texts = [
                self.seg(v)
                if not isinstance(v, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr))
                else f"({self.seg(v)})"
                for v in rest
            ]
            new = word.join(texts)
            if len(rest) == 1:
                new = self._in_place(op, rest[0], self.seg(rest[0]))
            yield _Change(
                "drop-mode-check", ((op, new),), f"dropped mode check {_short(self.seg(value), 50)} ({word.strip()})"
            )

    # -- none-arg

    def none_arg(self) -> Iterator[_Change]:
        for node in self.nodes:
            if (
                not isinstance(node, ast.Call)
                or _callee(node) in _QUIET_CALLS
                or not _METADATA_CALLEE.search(_callee(node) or "")
            ):
                continue
            callee = _callee(node)
            args = list(node.args) + [k.value for k in node.keywords if k.arg]
            for arg in args:
                if not isinstance(arg, (ast.Name, ast.Attribute, ast.Subscript)) or _name(arg) == "self":
                    continue
                yield _Change("none-arg", ((arg, "None"),), f"None for {_short(self.seg(arg), 40)} in {callee}()")

    # -- capture-only / replay-only

    def under_flag(self, node: ast.AST, flag: str) -> bool:
        """Whether ``node`` is in a branch of an ``if`` on ``flag`` (``if in_capture:``)."""
        child, parent = node, self.scope.parent(node)
        while parent is not None and parent is not self.func:
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                test = parent.test
                if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                    test = test.operand
                if isinstance(test, ast.Name) and test.id == flag:
                    return True
            child, parent = parent, self.scope.parent(parent)
        return False

    def capture_flag(self) -> str | None:
        """The parameter that says whether a shared body captures (``in_capture``, ``is_capture``):
        a flag named for capture, not a list of sizes (``capture_bs``)."""
        a = self.func.args
        positional = [*a.posonlyargs, *a.args]
        defaults = dict(zip([p.arg for p in positional][len(positional) - len(a.defaults) :], a.defaults))
        defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
        for arg in [*positional, *a.kwonlyargs]:
            if "capture" not in arg.arg.lower():
                continue
            annotated = isinstance(arg.annotation, ast.Name) and arg.annotation.id == "bool"
            default = defaults.get(arg.arg)
            flag_default = isinstance(default, ast.Constant) and isinstance(default.value, bool)
            named = bool(re.match(r"(in|is|during|for)_|capture$|capturing$", arg.arg.lower()))
            if annotated or flag_default or (named and arg.annotation is None):
                return arg.arg
        return None


_PRECEDENCE = {ast.Add: 1, ast.Sub: 1, ast.Mult: 2, ast.Div: 2, ast.FloorDiv: 2, ast.Mod: 2, ast.MatMult: 2, ast.Pow: 3}


def _precedence(op: ast.AST) -> int:
    return _PRECEDENCE.get(type(op), 0)


_GENERATORS = {
    "off-by-one": _Operators.off_by_one,
    "drop-addend": _Operators.drop_addend,
    "swap-same-typed": _Operators.swap_same_typed,
    "skip-update": _Operators.skip_update,
    "slice-bound": _Operators.slice_bound,
    "negate-condition": _Operators.negate_condition,
    "drop-mode-check": _Operators.drop_mode_check,
    "none-arg": _Operators.none_arg,
}


def _changes(ops: _Operators, wanted: tuple[str, ...]) -> Iterator[_Change]:
    flag = ops.capture_flag() if ("capture-only" in wanted or "replay-only" in wanted) else None
    for name, gen in _GENERATORS.items():
        need = name in wanted or (flag is not None and name in {"off-by-one", "slice-bound"})
        if not need:
            continue
        for change in gen(ops):
            if name in wanted:
                yield change
            if flag is None or change.expr is None:
                continue
            node, new = change.expr
            if ops.under_flag(node, flag):
                continue  # inside `if FLAG:` / its else, the change is capture-only or replay-only already
            old = ops.seg(node)
            old = old if "\n" not in old else f"({old})"
            if "capture-only" in wanted:
                yield _Change(
                    "capture-only", ((node, f"({new} if {flag} else {old})"),), f"capture only: {change.description}"
                )
            if "replay-only" in wanted:
                yield _Change(
                    "replay-only", ((node, f"({old} if {flag} else {new})"),), f"replay only: {change.description}"
                )


# ----------------------------------------------------------------------------- mutants


def _parse_function(lines: list[str]) -> ast.AST | None:
    """The def in ``lines`` (indented as in its file), parsed; None when it does not parse."""
    text = "\n".join(lines) + "\n"
    indented = bool(lines) and lines[0][:1] in (" ", "\t")
    try:
        tree = ast.parse("if 1:\n" + text if indented else text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    node = tree.body[0]
    return node.body[0] if indented else node


def _anchored(lines: list[str], i: int, new_lines: list[str], n: int, current: str) -> bool:
    """Whether ``--apply`` can place the change: the candidate-fix planner anchors it by the
    smallest context that occurs once in the function, and refuses a change in code repeated
    line for line beyond its widest anchor."""
    from sglfix.toggling.diffedits import anchored_edit
    from sglfix.toggling.diffread import Change

    change = Change(at=i, post=lines[i : i + n], pre=new_lines, hunk="")
    return anchored_edit(lines, i, change, floor=0, current=current) is not None


def mutants_of_function(
    file_text: str,
    *,
    qualname: str,
    function: str,
    path: str,
    operators: Sequence[str] | None = None,
) -> list[Mutant]:
    """Every mutant of the function ``qualname`` of the module whose source is ``file_text``
    (``path``: the file as the code base's repository names it; ``function``: the dotted name the
    mutants carry), in order of line, operator and column. Each replaces whole lines of the
    function's body, keeps everything else of them, and leaves a function that parses."""
    from sglfix.mutation.diff import mutant_diff

    wanted = check_operators(operators)
    where = f"{path}: {qualname}"
    try:
        tree = ast.parse(file_text)
    except SyntaxError as exc:
        raise ConfigError(f"{path}:{exc.lineno or '?'}: not valid Python ({exc.msg})") from None
    func = function_node(tree, qualname)
    if func is None:
        raise ConfigError(f"{where}: no such function in the file (a def at module level or in a class)")
    if _defined_twice(tree, qualname):
        # A property's getter and setter share the name: a toggle, a candidate fix and so a
        # mutant name one function by it, and there is no one function to name. (A plain
        # function defined again is the last definition, as at import time.)
        return []
    text = _Text(file_text)
    ops = _Operators(func, text)
    first = min([func.lineno] + [d.lineno for d in func.decorator_list])
    last = func.end_lineno
    fn_lines = text.lines[first - 1 : last]
    fn_text = "\n".join(fn_lines) + "\n"
    original_tree = _parse_function(fn_lines)
    seen = {ast.dump(original_tree)} if original_tree is not None else set()
    order = {name: i for i, name in enumerate(OPERATORS)}

    placed = []
    for n, change in enumerate(_changes(ops, wanted)):
        try:
            line, end_line, new_lines = text.splice(change.spans)
        except _Overlap:
            continue
        column = min(text.span(node)[1] for node, _ in change.spans if text.span(node)[0] == line)
        placed.append(((line, order[change.operator], column, n), change, line, end_line, new_lines))
    placed.sort(key=lambda p: p[0])

    out: list[Mutant] = []
    ids: set[str] = set()
    per_line: dict[tuple[int, str], int] = {}
    for _, change, line, end_line, new_lines in placed:
        original = "\n".join(text.lines[line - 1 : end_line])
        mutated = "\n".join(new_lines)
        if mutated == original or any(name in original for name in _HARNESS_NAMES):
            continue
        key = (line, change.operator)
        if per_line.get(key, 0) >= MAX_PER_LINE:
            continue
        candidate = fn_lines[: line - first] + new_lines + fn_lines[end_line - first + 1 :]
        parsed = _parse_function(candidate)
        if parsed is None:
            continue
        dump = ast.dump(parsed)
        if dump in seen:  # no change to the code, or the same change as an earlier mutant
            continue
        if not _anchored(fn_lines, line - first, new_lines, end_line - line + 1, fn_text):
            continue
        # The line counted from the function's first line: an edit elsewhere in the file (one that
        # moves this function down) keeps its mutants' ids, and so their stored cells.
        mid = mutant_id(
            function=function, operator=change.operator, line=line - first, original=original, mutated=mutated
        )
        if mid in ids:
            continue
        seen.add(dump)
        ids.add(mid)
        per_line[key] = per_line.get(key, 0) + 1
        title = f"mutant {mid} ({change.operator}): {change.description}"
        out.append(
            Mutant(
                id=mid,
                function=function,
                path=path,
                line=line,
                end_line=end_line,
                operator=change.operator,
                original=original,
                mutated=mutated,
                description=change.description,
                diff=mutant_diff(
                    path=path, file_text=file_text, line=line, end_line=end_line, mutated=mutated, title=title
                ),
            )
        )
    return out
