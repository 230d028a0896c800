"""The patch engine: edit a function's source, recompile it, swap its code object; restore exactly.

Compared with sglang's source_patcher (whose call shapes are kept: ``apply_patches_from_config``,
``CodePatcher``, ``patch_function``), this engine
- prepares every patch of a set before installing any, and rolls back on a failure mid-way;
- keeps a per-function LIFO stack, so a second patch edits the already-patched source and
  restores happen in reverse order; a set restores all or none (``restore_all``);
- recompiles inside a synthetic scope holding the original free variables, so closures and
  zero-argument ``super()`` keep their cells;
- drops decorators, default values and annotations before recompiling (they live on the
  function object, not in its code), so a decorated function is not wrapped a second time;
- remembers what it derived (a function's source, an edited source's compiled code, a parsed
  YAML), keyed by everything that decides it, so applying the same revert again (every toggle
  switch of a long-lived worker, every process of an engine) costs string edits and a swap;
- compiles the edited function under its own file name, ``<dir>/[sglfix revert 26738:overlap-guard]/
  <file>.py``, registered in ``linecache`` as the real file with the function's lines replaced by
  the edited text (at the original line numbers and indentation), so tracebacks,
  ``inspect.getsource`` and debuggers quote the code that runs, not the fix on disk; a restore
  puts back the original code, whose file is the real one (``real_filename`` undoes the name).
"""

from __future__ import annotations
import __future__ as _future

import ast
import inspect
import itertools
import linecache
import os
import sys
import textwrap
import threading
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglfix.common.errors import PatchApplicationError, PatchStateError, TargetError
from sglfix.patching.editor import SourceOrigin, apply_edits
from sglfix.patching.targets import ResolvedTarget, resolve_target
from sglfix.patching.types import EditSpec, PatchConfig, PatchSpec, parse_patch_config

__all__ = [
    "CodePatcher",
    "PatchState",
    "PreparedPatch",
    "apply_patches_from_config",
    "apply_specs",
    "blocking_state",
    "current_source",
    "install_prepared",
    "is_patched",
    "patch_function",
    "prepare_specs",
    "real_filename",
    "restore_all",
]

_FUTURE_FLAGS = 0
for _name in _future.all_feature_names:
    _FUTURE_FLAGS |= getattr(_future, _name).compiler_flag

_LOCK = threading.RLock()
# function -> states applied to it, oldest first. The top's source_after is the text the
# next patch edits, because inspect.getsource would return the file's (unpatched) text.
_STACKS: dict[types.FunctionType, list[PatchState]] = {}


@dataclass(eq=False)
class PatchState:
    """One installed patch. ``restore()`` puts the previous code object back."""

    target: str
    target_fn: types.FunctionType
    original_code: types.CodeType
    new_code: types.CodeType
    source_before: str
    source_after: str
    label: str = ""
    restored: bool = field(default=False)

    def restore(self) -> None:
        with _LOCK:
            if self.restored:
                return
            stack = _STACKS.get(self.target_fn, [])
            if not stack or stack[-1] is not self:
                top = stack[-1] if stack else None
                raise PatchStateError(
                    f"cannot restore {self.describe()}: {top.describe() if top else 'another patch'} "
                    f"was applied on top of it later; restore that first (last in, first out)"
                )
            self.target_fn.__code__ = self.original_code
            stack.pop()
            if not stack:
                del _STACKS[self.target_fn]
            self.restored = True
            _unshow(self.new_code.co_filename)

    def describe(self) -> str:
        return f"{self.label} on {self.target}" if self.label else f"the patch on {self.target}"


@dataclass(frozen=True)
class PreparedPatch:
    """A compiled but not yet installed patch: the first phase of an atomic apply."""

    spec: PatchSpec
    resolved: ResolvedTarget
    source_before: str
    source_after: str
    new_code: types.CodeType
    label: str = ""
    # The file as the new code sees it (linecache's lines for new_code.co_filename).
    shown_lines: list[str] = field(default_factory=list, compare=False, repr=False)


# The source of a loaded code object never changes (a file edited on disk afterwards does not
# change what runs), and an edited source compiles to the same code every time: both are kept.
_SOURCES: dict[tuple, tuple[str, int]] = {}
_COMPILED: dict[tuple, types.CodeType] = {}
_EDITED: dict[tuple, str] = {}  # (source, edits) -> the edited source, dedented
_CACHE_LIMIT = 512


def _remember(cache: dict, key: Any, value: Any) -> Any:
    if len(cache) >= _CACHE_LIMIT:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


# -- the source a patched code object shows --------------------------------------------------
# Each patched code object gets a file name of its own, whose linecache lines are the real file
# with the function's span replaced by the edited text: the code keeps the file's line numbers,
# so everything outside the span reads as in the real file, and a traceback, inspect.getsource
# or pdb quotes what runs. name -> [linecache entry, live patches using it].
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


def _origin(fn: types.FunctionType) -> tuple[str, int, str]:
    """The unpatched function's file, how many lines its source spans there, and the indentation
    the edited (dedented) text must get back to read as the file does."""
    stack = _STACKS.get(fn)
    if stack:
        filename, text = stack[0].original_code.co_filename, stack[0].source_before
    else:
        filename, text = fn.__code__.co_filename, current_source(fn)[0]
    first = text.split("\n", 1)[0]
    return filename, len(text.splitlines()), first[: _indent(first)]


def _shown_file(
    *, fn: types.FunctionType, filename: str, first_lineno: int, span: int, text: str, margin: str
) -> list[str]:
    lines = linecache.getlines(filename, fn.__globals__)
    before = lines[: first_lineno - 1]
    before += ["\n"] * (first_lineno - 1 - len(before))  # no file text: the lines still count
    body = textwrap.indent(text, margin).splitlines(keepends=True)
    if body and not body[-1].endswith("\n"):
        body[-1] += "\n"
    return before + body + lines[first_lineno - 1 + span :]


def _shown_name(
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


def _show(name: str, lines: list[str]) -> None:
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


def _unshow(name: str) -> None:
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


def _source_block(fn: types.FunctionType) -> tuple[str, int] | None:
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


def current_source(fn: types.FunctionType) -> tuple[str, int]:
    """The function's effective source (patched text if patched) and its first file line."""
    stack = _STACKS.get(fn)
    if stack:
        return stack[-1].source_after, stack[0].original_code.co_firstlineno
    # Code objects compare by value, not by file: the file is part of the key.
    key = (fn.__code__, fn.__code__.co_filename)
    known = _SOURCES.get(key)
    if known is not None:
        return known
    fast = _source_block(fn)
    if fast is not None:
        return _remember(_SOURCES, key, fast)
    try:
        lines, lineno = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise TargetError(
            f"{fn.__module__}.{fn.__qualname__}: its source is not available ({exc}); "
            "functions made by exec() or loaded from .pyc only cannot be patched"
        ) from None
    return _remember(_SOURCES, key, ("".join(lines), lineno))


def is_patched(fn: types.FunctionType) -> bool:
    return bool(_STACKS.get(fn))


def _function_node(tree: ast.Module, *, name: str, target: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    nodes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if len(tree.body) != 1 or len(nodes) != 1 or nodes[0].name != name:
        raise PatchApplicationError(
            f"{target}: after the edits the source is no longer a single `def {name}`; "
            "an edit must stay inside the function body"
        )
    return nodes[0]


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


def _compile_function(
    *,
    fn: types.FunctionType,
    target: str,
    source: str,
    first_lineno: int,
    preamble: str,
    filename: str | None = None,
    margin: str = "",
) -> types.CodeType:
    """``source``: the edited function, dedented; ``margin``: the indentation it had in the file;
    ``filename``: the name the new code shows (its linecache entry), the original's if None."""
    # The original code object decides name, flags and closure shape; the rest is the text.
    filename = fn.__code__.co_filename if filename is None else filename
    key = (fn.__code__, fn.__code__.co_filename, source, first_lineno, preamble, filename, margin)
    code = _COMPILED.get(key)
    if code is None:
        code = _remember(
            _COMPILED,
            key,
            _compile_uncached(
                fn=fn,
                target=target,
                source=source,
                first_lineno=first_lineno,
                preamble=preamble,
                filename=filename,
                margin=margin,
            ),
        )
    return code


def _compile_uncached(
    *,
    fn: types.FunctionType,
    target: str,
    source: str,
    first_lineno: int,
    preamble: str,
    filename: str | None = None,
    margin: str = "",
) -> types.CodeType:
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


def _prepare_one(
    *,
    spec: PatchSpec,
    resolved: ResolvedTarget,
    source: str,
    first_lineno: int,
    label: str,
    labels: Sequence[str] = (),
    claimed: dict[str, list[str]] | None = None,
) -> PreparedPatch:
    """``labels``: those of the patches already on the function (or before this one in the set)."""
    fn = resolved.function
    filename, span, margin = _origin(fn)
    key = (source, spec.edits)
    known = _EDITED.get(key)
    if known is None:
        # The real file, not a patched code's name: messages cite lines a reader can open.
        origin = SourceOrigin(target=spec.target, filename=filename, first_lineno=first_lineno)
        edited = apply_edits(source=source, edits=spec.edits, origin=origin)
        known = _remember(_EDITED, key, textwrap.dedent(edited))
    dedented = known
    shown = _shown_file(fn=fn, filename=filename, first_lineno=first_lineno, span=span, text=dedented, margin=margin)
    name = _shown_name(
        filename=filename,
        labels=[*labels, label],
        qualname=fn.__qualname__,
        lines=shown,
        claimed={} if claimed is None else claimed,
    )
    new_code = _compile_function(
        fn=fn,
        target=spec.target,
        source=dedented,
        first_lineno=first_lineno,
        preamble=spec.preamble,
        filename=name,
        margin=margin,
    )
    return PreparedPatch(
        spec=spec,
        resolved=resolved,
        source_before=source,
        source_after=dedented,
        new_code=new_code,
        label=label,
        shown_lines=shown,
    )


def prepare_specs(
    specs: Sequence[PatchSpec],
    *,
    allowed_prefixes: Iterable[str] | None = None,
    labels: Sequence[str] | None = None,
) -> list[PreparedPatch]:
    """Resolve, edit and compile every spec; install nothing. Raises on the first failure.

    Two specs on the same function stack: the second edits the first one's result.
    """
    allowed = tuple(allowed_prefixes) if allowed_prefixes is not None else None
    prepared: list[PreparedPatch] = []
    pending: dict[types.FunctionType, tuple[str, int, list[str]]] = {}
    claimed: dict[str, list[str]] = {}  # the names this set's patches show, with their lines
    for i, spec in enumerate(specs):
        label = labels[i] if labels else ""
        resolved = resolve_target(spec.target, allowed_prefixes=allowed)
        fn = resolved.function
        if fn in pending:
            source, first_lineno, below = pending[fn]
        else:
            source, first_lineno = current_source(fn)
            below = [s.label for s in _STACKS.get(fn, [])]
        item = _prepare_one(
            spec=spec,
            resolved=resolved,
            source=source,
            first_lineno=first_lineno,
            label=label,
            labels=below,
            claimed=claimed,
        )
        pending[fn] = (item.source_after, first_lineno, [*below, label])
        prepared.append(item)
    return prepared


def _install(item: PreparedPatch) -> PatchState:
    """Swap one code object in. Kept separate so tests can make it fail at any position."""
    fn = item.resolved.function
    state = PatchState(
        target=item.spec.target,
        target_fn=fn,
        original_code=fn.__code__,
        new_code=item.new_code,
        source_before=item.source_before,
        source_after=item.source_after,
        label=item.label,
    )
    fn.__code__ = item.new_code
    _STACKS.setdefault(fn, []).append(state)
    if item.shown_lines:
        _show(item.new_code.co_filename, item.shown_lines)
    return state


def install_prepared(prepared: Sequence[PreparedPatch]) -> list[PatchState]:
    """Install all or nothing: on a failure, everything installed so far is restored."""
    with _LOCK:
        states: list[PatchState] = []
        try:
            for item in prepared:
                states.append(_install(item))
        except BaseException:
            for state in reversed(states):
                state.restore()
            raise
        return states


def apply_specs(
    specs: Sequence[PatchSpec],
    *,
    allowed_prefixes: Iterable[str] | None = None,
    labels: Sequence[str] | None = None,
) -> list[PatchState]:
    with _LOCK:
        return install_prepared(prepare_specs(specs, allowed_prefixes=allowed_prefixes, labels=labels))


def blocking_state(states: Iterable[PatchState]) -> PatchState | None:
    """The newest patch, not one of ``states``, stacked on a function that ``states`` patch:
    restoring ``states`` would stop at it. None when every one of them can be restored now."""
    with _LOCK:
        mine = [s for s in states if not s.restored]
        ids = {id(s) for s in mine}
        for fn in dict.fromkeys(s.target_fn for s in mine):
            count = sum(1 for s in mine if s.target_fn is fn)
            stack = _STACKS.get(fn, [])
            if len(stack) < count or any(id(s) not in ids for s in stack[-count:]):
                return next((s for s in reversed(stack) if id(s) not in ids), None)
        return None


def restore_all(states: Iterable[PatchState]) -> None:
    """Restore ``states`` (applied in this order) newest first, all or none: when another patch
    sits on top of one of them, raise before touching anything."""
    states = list(states)
    with _LOCK:
        blocker = blocking_state(states)
        if blocker is not None:
            blocked = next(s for s in states if s.target_fn is blocker.target_fn)
            raise PatchStateError(
                f"cannot restore {blocked.describe()}: {blocker.describe()} was applied on top of it "
                "later; restore that first (last in, first out)"
            )
        for state in reversed(states):
            state.restore()


def _with_extra_imports(config: PatchConfig, extra_imports: Sequence[str]) -> tuple[PatchSpec, ...]:
    block = "\n".join(extra_imports)
    return tuple(
        PatchSpec(
            target=spec.target,
            edits=spec.edits,
            preamble=block + "\n" + spec.preamble if spec.preamble.strip() else block,
        )
        for spec in config.patches
    )


def apply_patches_from_config(
    yaml_content: str,
    *,
    extra_imports: Sequence[str] | None = None,
    allowed_prefixes: Iterable[str] | None = None,
    source: str = "<yaml>",
) -> list[PatchState]:
    """Parse sglang-schema YAML and apply every patch, atomically. Returns restorable states."""
    config = parse_patch_config(yaml_content, source=source)
    specs = _with_extra_imports(config, extra_imports) if extra_imports else config.patches
    return apply_specs(specs, allowed_prefixes=allowed_prefixes)


def patch_function(
    *,
    target: Any,
    edits: Sequence[EditSpec | dict],
    preamble: str = "",
    allowed_prefixes: Iterable[str] | None = None,
) -> PatchState:
    """Patch one function given as an object (sglang's call shape) or a dotted path."""
    if isinstance(target, str):
        name = target
    else:
        fn = inspect.unwrap(
            target.__func__ if isinstance(target, (staticmethod, classmethod, types.MethodType)) else target
        )
        if not isinstance(fn, types.FunctionType):
            raise TargetError(f"patch_function: {target!r} is not a Python function")
        name = f"{fn.__module__}.{fn.__qualname__}"
        if "<locals>" in name:
            raise TargetError(f"patch_function: {name} is a local function; patch its enclosing function")
    spec = PatchSpec(target=name, edits=tuple(edits), preamble=preamble)
    (state,) = apply_specs([spec], allowed_prefixes=allowed_prefixes)
    return state


class CodePatcher:
    """Context manager: patches on enter (atomically), restores in reverse order on exit."""

    def __init__(self, *, patches: Sequence[PatchSpec | dict], allowed_prefixes: Iterable[str] | None = None) -> None:
        self._patches = tuple(p if isinstance(p, PatchSpec) else PatchSpec(**dict(p)) for p in patches)
        self._allowed = tuple(allowed_prefixes) if allowed_prefixes is not None else None
        self._states: list[PatchState] = []

    @property
    def states(self) -> list[PatchState]:
        return list(self._states)

    def __enter__(self) -> CodePatcher:
        self._states = apply_specs(self._patches, allowed_prefixes=self._allowed)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        restore_all(self._states)
        self._states.clear()
