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

from sglfix.harness.result import CellResult
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
    they enter); as each baseline comes back its scenario's other cells join the line, each run
    only where its reverted targets were entered. No barrier: one scenario's cells run while
    other baselines are still running.

    A set's unreached cells need a worker only to show that the set applies there: the first
    goes to a worker, the others take its answer (one round trip per set, not per cell); where
    it did not answer NOT_REACHED, each of them goes to a worker and says for itself."""
    cells = list(cells)
    extra = {
        tuple(c.toggles): targets_of([t for t in c.toggles if t not in base], registry=registry)
        for c in cells
        if tuple(c.toggles) != base
    }
    record = tuple(sorted(set().union(*extra.values()))) if extra else ()
    results: list[CellResult | None] = [None] * len(cells)
    index: dict[int, int] = {}  # id of a cell sent to the pool -> its place in ``cells``
    sent: list[Any] = []  # keeps every sent cell alive, so that ids stay unique
    others: dict[str, list[int]] = {}
    first = []
    for i, c in enumerate(cells):
        if tuple(c.toggles) == base:
            first.append(_send(RecordingCell(c.scenario, tuple(c.toggles), record), i, index, sent))
        else:
            others.setdefault(c.scenario.name, []).append(i)
    probes: dict[tuple[str, ...], CellResult | None] = {}  # a set's probe and, once back, its answer
    held_back: dict[tuple[str, ...], list[tuple[int, UnreachedCell]]] = {}

    def settle(i: int, result: CellResult) -> None:
        results[i] = result
        if on_result is not None:
            on_result(result)

    def feed(cell: Any, result: CellResult) -> list[Any]:
        i = index[id(cell)]
        results[i] = result
        out: list[Any] = []
        if isinstance(cell, RecordingCell):
            for j in others.pop(cell.scenario.name, []):
                c = cells[j]
                targets = extra[tuple(c.toggles)]
                if result.reached is None or targets & set(result.reached):
                    out.append(_send(c, j, index, sent))
                    continue
                unreached = UnreachedCell(c.scenario, tuple(c.toggles), result.verdict, tuple(sorted(targets)))
                key = unreached.toggles
                if key not in probes:
                    probes[key] = None
                    out.append(_send(unreached, j, index, sent))
                elif probes[key] is None:
                    held_back.setdefault(key, []).append((j, unreached))
                elif probes[key].verdict == "NOT_REACHED":
                    settle(j, _like(probes[key], unreached))
                else:
                    out.append(_send(unreached, j, index, sent))
        elif isinstance(cell, UnreachedCell) and cell.toggles in probes and probes[cell.toggles] is None:
            probes[cell.toggles] = result
            for j, unreached in held_back.pop(cell.toggles, []):
                if result.verdict == "NOT_REACHED":
                    settle(j, _like(result, unreached))
                else:
                    out.append(_send(unreached, j, index, sent))
        return out

    pool.run(first, on_result=on_result, feed=feed)
    return [r for r in results if r is not None]


def _send(cell: Any, i: int, index: dict[int, int], sent: list[Any]) -> Any:
    index[id(cell)] = i
    sent.append(cell)
    return cell


def _like(probe: CellResult, cell: UnreachedCell) -> CellResult:
    """An unreached cell of the set ``probe`` (a NOT_REACHED answer from a worker) applied."""
    from sglfix.harness.cell import not_reached_result

    result = not_reached_result(
        cell.scenario.name, list(cell.toggles), device=probe.device, same_as=cell.same_as, targets=list(cell.targets)
    )
    result.revert_env = probe.revert_env
    result.kernels = dict(probe.kernels) if probe.kernels is not None else None
    return result
