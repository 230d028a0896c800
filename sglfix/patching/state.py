"""Installed patches: one LIFO stack per function, under one lock, and restoring them (one, or a
set all or none)."""

from __future__ import annotations

import threading
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sglfix.common.errors import PatchStateError
from sglfix.patching.shown import unshow
from sglfix.patching.targets import ResolvedTarget
from sglfix.patching.types import PatchSpec

__all__ = ["LOCK", "PatchState", "PreparedPatch", "blocking_state", "is_patched", "push", "restore_all", "stack_of"]

# Held by every install and restore: the stacks change under it alone.
LOCK = threading.RLock()
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
        with LOCK:
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
            unshow(self.new_code.co_filename)

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


def is_patched(fn: types.FunctionType) -> bool:
    return bool(_STACKS.get(fn))


def stack_of(fn: types.FunctionType) -> Sequence[PatchState]:
    """The patches installed on ``fn``, oldest first (empty when none); not to be changed."""
    return _STACKS.get(fn, ())


def push(state: PatchState) -> None:
    """Record ``state``, whose code its function now runs, as the newest patch on it (under ``LOCK``)."""
    _STACKS.setdefault(state.target_fn, []).append(state)


def blocking_state(states: Iterable[PatchState]) -> PatchState | None:
    """The newest patch, not one of ``states``, stacked on a function that ``states`` patch:
    restoring ``states`` would stop at it. None when every one of them can be restored now."""
    with LOCK:
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
    with LOCK:
        blocker = blocking_state(states)
        if blocker is not None:
            blocked = next(s for s in states if s.target_fn is blocker.target_fn)
            raise PatchStateError(
                f"cannot restore {blocked.describe()}: {blocker.describe()} was applied on top of it "
                "later; restore that first (last in, first out)"
            )
        for state in reversed(states):
            state.restore()
