"""Reachability: which toggle target functions a scenario's baseline executes, and which cells
that leaves nothing to run.

A revert replaces the code of its target functions and nothing else. If a scenario's baseline
run never enters any of them, the reverted run executes exactly the baseline's code with the
same inputs: the cell is provably the baseline and is not run. It is marked NOT_REACHED (never
PASS), counted in reports, and judged by its baseline's verdict where expectations look at it.
The baseline cells run first and record, with the C profiler, the code objects they enter; a
baseline that could not record (it crashed, or ERROR) makes every cell of its scenario run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sglfix.harness.cell import CellResult
from sglfix.toggling.registry import Registry, parse_toggle_ids

__all__ = ["RecordingCell", "UnreachedCell", "run_reaching", "targets_of"]


@dataclass(frozen=True)
class RecordingCell:
    """A cell that also reports which of ``record`` (target paths) its run entered."""

    scenario: Any
    toggles: tuple[str, ...]
    record: tuple[str, ...]

    @property
    def extra(self) -> dict:
        return {"record": list(self.record)}


@dataclass(frozen=True)
class UnreachedCell:
    """A cell its scenario's baseline shows to be the baseline: the worker applies its set (a
    set that fails to apply is still ERROR) and answers NOT_REACHED without running it."""

    scenario: Any
    toggles: tuple[str, ...]
    same_as: str
    targets: tuple[str, ...]

    @property
    def extra(self) -> dict:
        return {"not_reached": {"same_as": self.same_as, "targets": list(self.targets)}}


def targets_of(ids: Iterable[str], *, registry: Registry) -> frozenset[str]:
    """The target functions a toggle set's parts patch."""
    return frozenset(
        t for sel in parse_toggle_ids(list(ids), registry=registry, what="toggle set") for t in sel.part.targets
    )


def run_reaching(
    pool: Any,
    cells: Sequence[Any],
    *,
    base: tuple[str, ...],
    registry: Registry,
    on_result: Callable[[CellResult], None] | None = None,
) -> list[CellResult]:
    """Results for ``cells`` in order: the ``base`` set's cells first (recording which targets
    they enter), then the rest, each run only where its reverted targets were entered."""
    cells = list(cells)
    extra = {
        tuple(c.toggles): targets_of([t for t in c.toggles if t not in base], registry=registry)
        for c in cells
        if tuple(c.toggles) != base
    }
    record = tuple(sorted(set().union(*extra.values()))) if extra else ()
    first = [i for i, c in enumerate(cells) if tuple(c.toggles) == base]
    results: list[CellResult | None] = [None] * len(cells)
    ran = pool.run(
        [RecordingCell(cells[i].scenario, tuple(cells[i].toggles), record) for i in first], on_result=on_result
    )
    baseline: dict[str, CellResult] = {}
    for i, r in zip(first, ran):
        results[i] = r
        baseline[r.scenario] = r
    # A set's unreached cells need a worker only to show that the set applies there: the first
    # goes to a worker, the others take its answer (one round trip per set, not per cell).
    rest, queued = [], []
    held_back: dict[tuple[str, ...], list[tuple[int, UnreachedCell]]] = {}
    for i, c in enumerate(cells):
        if results[i] is not None:
            continue
        base_result = baseline.get(c.scenario.name)
        reached = None if base_result is None else base_result.reached
        targets = extra[tuple(c.toggles)]
        if reached is not None and not targets & set(reached):
            cell = UnreachedCell(c.scenario, tuple(c.toggles), base_result.verdict, tuple(sorted(targets)))
            if cell.toggles in held_back:
                held_back[cell.toggles].append((i, cell))
                continue
            held_back[cell.toggles] = []
            queued.append(cell)
        else:
            queued.append(c)
        rest.append(i)
    answered: dict[tuple[str, ...], CellResult] = {}
    for i, cell, r in zip(rest, queued, pool.run(queued, on_result=on_result)):
        results[i] = r
        if isinstance(cell, UnreachedCell):
            answered[cell.toggles] = r
    unsure = []
    for toggles, waiting in held_back.items():
        probe = answered.get(toggles)
        for i, cell in waiting:
            if probe is None or probe.verdict != "NOT_REACHED":
                unsure.append((i, cell))  # the set did not apply cleanly there: each cell says so itself
                continue
            results[i] = _like(probe, cell)
            if on_result is not None:
                on_result(results[i])
    if unsure:
        for (i, _), r in zip(unsure, pool.run([cell for _, cell in unsure], on_result=on_result)):
            results[i] = r
    return [r for r in results if r is not None]


def _like(probe: CellResult, cell: UnreachedCell) -> CellResult:
    """An unreached cell of the set ``probe`` (a NOT_REACHED answer from a worker) applied."""
    from sglfix.harness.cell import not_reached_result

    result = not_reached_result(
        cell.scenario.name, list(cell.toggles), device=probe.device, same_as=cell.same_as, targets=list(cell.targets)
    )
    result.revert_env = probe.revert_env
    result.kernels = dict(probe.kernels) if probe.kernels is not None else None
    return result
