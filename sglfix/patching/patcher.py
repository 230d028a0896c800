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

This module prepares and installs; the pieces it stands on each have a module of their own:
``state`` (the stacks and restoring), ``shown`` (the shown source), ``source`` (reading a
function's source) and ``recompile`` (the edited source back into code).
"""

from __future__ import annotations

import inspect
import textwrap
import types
from collections.abc import Iterable, Sequence
from typing import Any

from sglfix.common.errors import TargetError
from sglfix.patching.editor import SourceOrigin, apply_edits
from sglfix.patching.recompile import compile_edited
from sglfix.patching.shown import real_filename, show, shown_file, shown_name
from sglfix.patching.source import source_block
from sglfix.patching.state import (
    LOCK,
    PatchState,
    PreparedPatch,
    blocking_state,
    is_patched,
    push,
    restore_all,
    stack_of,
)
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


def _origin(fn: types.FunctionType) -> tuple[str, int, str]:
    """The unpatched function's file, how many lines its source spans there, and the indentation
    the edited (dedented) text must get back to read as the file does."""
    stack = stack_of(fn)
    if stack:
        filename, text = stack[0].original_code.co_filename, stack[0].source_before
    else:
        filename, text = fn.__code__.co_filename, current_source(fn)[0]
    first = text.split("\n", 1)[0]
    return filename, len(text.splitlines()), first[: len(first) - len(first.lstrip())]


def current_source(fn: types.FunctionType) -> tuple[str, int]:
    """The function's effective source (patched text if patched) and its first file line."""
    stack = stack_of(fn)
    if stack:
        return stack[-1].source_after, stack[0].original_code.co_firstlineno
    # Code objects compare by value, not by file: the file is part of the key.
    key = (fn.__code__, fn.__code__.co_filename)
    known = _SOURCES.get(key)
    if known is not None:
        return known
    fast = source_block(fn)
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
            compile_edited(
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
    shown = shown_file(fn=fn, filename=filename, first_lineno=first_lineno, span=span, text=dedented, margin=margin)
    name = shown_name(
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
            below = [s.label for s in stack_of(fn)]
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
    push(state)
    if item.shown_lines:
        show(item.new_code.co_filename, item.shown_lines)
    return state


def install_prepared(prepared: Sequence[PreparedPatch]) -> list[PatchState]:
    """Install all or nothing: on a failure, everything installed so far is restored."""
    with LOCK:
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
    with LOCK:
        return install_prepared(prepare_specs(specs, allowed_prefixes=allowed_prefixes, labels=labels))


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
