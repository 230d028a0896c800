"""Revert a set of toggles atomically, remember what is reverted, restore in reverse order."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from sglfix.common.errors import PatchStateError
from sglfix.patching.patcher import PatchState, apply_specs, restore_all
from sglfix.toggling.registry import Registry, Selection, load_registry, parse_toggle_ids

__all__ = ["Reverted", "revert", "reverted_ids", "restore_everything"]

_LOCK = threading.RLock()
_ACTIVE: dict[str, "Reverted"] = {}  # part id -> the Reverted that holds it


@dataclass(eq=False)
class Reverted:
    """A set of reverted parts; ``restore()`` puts every function back (LIFO)."""

    selections: list[Selection]
    states: list[PatchState] = field(default_factory=list)
    restored: bool = False

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.selections]

    def restore(self) -> None:
        with _LOCK:
            if self.restored:
                return
            restore_all(self.states)
            for sel in self.selections:
                _ACTIVE.pop(sel.id, None)
            self.restored = True

    def __enter__(self) -> "Reverted":
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


def revert(
    ids: Iterable[str] | Sequence[Selection],
    *,
    registry: Registry | None = None,
    allowed_prefixes: Iterable[str] | None = None,
    what: str = "revert",
) -> Reverted:
    """Apply the revert patches of ``ids`` (``27460``, ``27460:sizing``): all or nothing."""
    items = list(ids)
    if items and all(isinstance(i, Selection) for i in items):
        selections = items
    else:
        selections = parse_toggle_ids([str(i) for i in items], registry=registry or load_registry(), what=what)
    with _LOCK:
        for sel in selections:
            if sel.id in _ACTIVE:
                raise PatchStateError(
                    f"{what}: {sel.id} is already reverted in this process; restore it before reverting it again"
                )
        specs = [p for sel in selections for p in sel.part.patches]
        labels = [f"revert {sel.id}" for sel in selections for _ in sel.part.patches]
        states = apply_specs(specs, allowed_prefixes=allowed_prefixes, labels=labels)
        result = Reverted(selections=list(selections), states=states)
        for sel in selections:
            _ACTIVE[sel.id] = result
        return result


def reverted_ids() -> list[str]:
    with _LOCK:
        return list(_ACTIVE)


def restore_everything() -> None:
    with _LOCK:
        for held in reversed(list(dict.fromkeys(_ACTIVE.values()))):
            held.restore()
