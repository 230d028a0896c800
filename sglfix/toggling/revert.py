"""Revert a set of toggles atomically, keep the record of what is reverted true, restore exactly.

``revert()`` installs every patch of the set or none. ``Reverted.restore()`` restores every
function of the set or none (another set stacked on top of one of them must go first), and
puts back the module state the reverted code changed while it ran. ``reverted_ids()`` lists
exactly the sets whose patches are installed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from sglfix.common.errors import PatchStateError
from sglfix.patching.patcher import PatchState, blocking_state, install_prepared, prepare_specs, restore_all
from sglfix.patching.targets import effective_prefixes, resolve_target
from sglfix.toggling.ids import ToggleId
from sglfix.toggling.modstate import ModuleSnapshot
from sglfix.toggling.registry import Registry, Selection, load_registry, parse_toggle_ids

if TYPE_CHECKING:
    from sglfix.toggling.candidate import CandidateSelection

__all__ = [
    "Reverted",
    "import_target_modules",
    "register_reverted",
    "restore_everything",
    "revert",
    "reverted_ids",
    "target_code",
]

_LOCK = threading.RLock()
_ACTIVE: dict[str, Reverted] = {}  # part id -> the Reverted that holds it, oldest first


@dataclass(eq=False)
class Reverted:
    """A set of reverted parts; ``restore()`` puts every function and module back (LIFO)."""

    selections: list[Selection | CandidateSelection]
    states: list[PatchState] = field(default_factory=list)
    snapshot: ModuleSnapshot = field(default_factory=lambda: ModuleSnapshot({}))
    restored: bool = False

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.selections]

    def restore(self) -> None:
        """All or nothing: refused, with the blocking set named, while a set reverted later
        is stacked on one of this set's functions; then nothing changes."""
        with _LOCK:
            if self.restored:
                return
            blocker = blocking_state(self.states)
            if blocker is not None:
                holder = _holder_of(blocker)
                name = f"revert {','.join(holder.ids)}" if holder else blocker.describe()
                raise PatchStateError(
                    f"cannot restore {','.join(self.ids)}: {name} was applied later on top of "
                    f"{blocker.target}; restore {','.join(holder.ids) if holder else 'it'} first (last in, first out)"
                )
            restore_all(self.states)
            newer = _next_newer(self)
            if newer is None:
                self.snapshot.restore()
            else:
                # Changes made while both sets were active cannot be told apart: the newer set
                # now restores to this set's (older) point in time when it goes.
                newer.snapshot = self.snapshot.older_than(newer.snapshot)
            for sel in self.selections:
                _ACTIVE.pop(sel.id, None)
            self.restored = True

    def __enter__(self) -> Reverted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


def _held() -> list[Reverted]:
    """Active sets, oldest first."""
    return list(dict.fromkeys(_ACTIVE.values()))


def _holder_of(state: PatchState) -> Reverted | None:
    return next((r for r in _held() if any(s is state for s in r.states)), None)


def _next_newer(reverted: Reverted) -> Reverted | None:
    held = _held()
    later = held[held.index(reverted) + 1 :] if reverted in held else []
    return later[0] if later else None


def revert(
    ids: Iterable[str | ToggleId] | Sequence[Selection | CandidateSelection],
    *,
    registry: Registry | None = None,
    allowed_prefixes: Iterable[str] | None = None,
    what: str = "revert",
) -> Reverted:
    """Apply the revert patches of ``ids`` (``27460``, ``27460:sizing``): all or nothing."""
    items = list(ids)
    # Selected parts, or candidate fixes (sglfix.toggling.candidate), which select as parts do.
    selections: Sequence[Selection | CandidateSelection]
    if items and all(isinstance(i, Selection) or getattr(i, "verb", None) == "apply" for i in items):
        # Each one checked above: a Selection, or a candidate fix's (its verb "apply").
        selections = cast("list[Selection | CandidateSelection]", items)
    else:
        selections = parse_toggle_ids(
            cast("list[str | ToggleId]", items), registry=registry or load_registry(), what=what
        )
    allowed = effective_prefixes(allowed_prefixes)
    with _LOCK:
        for sel in selections:
            if sel.id in _ACTIVE:
                raise PatchStateError(
                    f"{what}: {sel.id} is already reverted in this process; restore it before reverting it again"
                )
        specs = [p for sel in selections for p in sel.part.patches]
        labels = [f"{getattr(sel, 'verb', 'revert')} {sel.id}" for sel in selections for _ in sel.part.patches]
        prepared = prepare_specs(specs, allowed_prefixes=allowed, labels=labels)
        # After prepare (which may import the targets), before the first patched call.
        snapshot = ModuleSnapshot.take(prefixes=allowed, namespaces=[p.resolved.function.__globals__ for p in prepared])
        states = install_prepared(prepared)
        result = Reverted(selections=list(selections), states=states, snapshot=snapshot)
        for sel in selections:
            _ACTIVE[sel.id] = result
        return result


def register_reverted(part_id: str, record: Reverted, *, replace: bool = True) -> None:
    """Count part ``part_id`` as held by ``record``, whose patches were installed without
    ``revert`` (the import hook installs a set module by module): ``reverted_ids`` lists it and
    ``record.restore()`` drops it. ``replace=False`` keeps a holder already counted."""
    if replace:
        _ACTIVE[part_id] = record
    else:
        _ACTIVE.setdefault(part_id, record)


def reverted_ids() -> list[str]:
    """Ids of the parts whose patches are installed now, in the order they were reverted."""
    with _LOCK:
        for held in _held():
            # Restored state by state behind the set's back (PatchState.restore): record it.
            if held.states and all(s.restored for s in held.states):
                held.restore()
        return list(_ACTIVE)


def restore_everything() -> None:
    with _LOCK:
        for held in reversed(_held()):
            held.restore()


def target_code(target: str, *, allowed_prefixes: Iterable[str] | None = None):
    """The code object a toggle target runs now (what a profiler sees when it is entered)."""
    return resolve_target(target, allowed_prefixes=allowed_prefixes).function.__code__


def import_target_modules(toggles_dir: str) -> None:
    """Import the module of every target the registry's parts patch at the installed version (a
    worker does at boot: a variant may patch a module its profile's preload does not name)."""
    from sglfix.patching.targets import split_module
    from sglfix.toggling.registry import load_registry

    for toggle in load_registry(toggles_dir):
        for part in toggle.parts.values():
            for target in part.targets:
                try:
                    split_module(target)
                except Exception:  # a target that does not resolve is the precheck's finding
                    pass
