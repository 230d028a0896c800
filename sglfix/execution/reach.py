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

__all__ = ["RecordingCell", "SettledCell", "UnreachedCell", "reach_record", "run_reaching", "targets_of"]


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


@dataclass(frozen=True, eq=False)
class SettledCell:
    """An unreached cell of a set whose probe a worker answered NOT_REACHED: its ``answer`` is
    known without a worker. The pool settles it as it joins the line (the result store serves
    its own entry instead when it holds one, and files this answer when not)."""

    scenario: Any
    toggles: tuple[str, ...]
    answer: CellResult


def targets_of(ids: Iterable[str], *, registry: Registry) -> frozenset[str]:
    """The target functions a toggle set's parts patch."""
    return frozenset(
        t for sel in parse_toggle_ids(list(ids), registry=registry, what="toggle set") for t in sel.part.targets
    )


def _reverted(cells: Sequence[Any], *, base: tuple[str, ...], registry: Registry) -> dict[tuple, frozenset[str]]:
    """The target functions each non-baseline set of ``cells`` reverts beyond ``base``."""
    return {
        tuple(c.toggles): targets_of([t for t in c.toggles if t not in base], registry=registry)
        for c in cells
        if tuple(c.toggles) != base
    }


def reach_record(cells: Sequence[Any], *, base: tuple[str, ...], registry: Registry) -> tuple[str, ...]:
    """The targets a baseline cell records entries of: every target the other sets revert."""
    return _record_of(_reverted(cells, base=base, registry=registry))


def _record_of(extra: dict[tuple, frozenset[str]]) -> tuple[str, ...]:
    return tuple(sorted(set().union(*extra.values()))) if extra else ()


def run_reaching(
    pool: Any,
    cells: Sequence[Any],
    *,
    base: tuple[str, ...],
    registry: Registry,
    on_result: Callable[[CellResult], None] | None = None,
    record: tuple[str, ...] | None = None,
) -> list[CellResult]:
    """Results for ``cells`` in order: the ``base`` set's cells first (recording which targets
    they enter); as each baseline comes back its scenario's other cells join the line, each run
    only where its reverted targets were entered. No barrier: one scenario's cells run while
    other baselines are still running.

    A set's unreached cells need a worker only to show that the set applies there: the first
    goes to a worker, the others take its answer (``SettledCell``: one round trip per set, not
    per cell); where it did not answer NOT_REACHED, each of them goes to a worker and says for
    itself. Every cell, answered or run, goes through ``pool`` (the result store's layer answers
    those it holds: a served baseline releases its scenario's other cells at once). ``record``:
    what the baselines record instead of the other sets' targets (a superset: every function,
    so that the result store serves a baseline to the next run whatever that one changes)."""
    line = _Reaching(list(cells), base=base, registry=registry, record=record)
    pool.run(line.start(), on_result=on_result, feed=line.feed)
    return [r for r in line.results if r is not None]


class _Reaching:
    """``run_reaching``'s line: which cell waits for which baseline, and the sets' probes."""

    def __init__(
        self, cells: list[Any], *, base: tuple[str, ...], registry: Registry, record: tuple[str, ...] | None = None
    ) -> None:
        self.cells, self.base = cells, base
        self.extra = _reverted(cells, base=base, registry=registry)
        self.record = record if record is not None else _record_of(self.extra)
        self.results: list[CellResult | None] = [None] * len(cells)
        self.index: dict[int, int] = {}  # id of a cell sent to the pool -> its place in ``cells``
        self.sent: list[Any] = []  # keeps every sent cell alive, so that ids stay unique
        self.others: dict[str, list[int]] = {}
        self.probes: dict[tuple[str, ...], CellResult | None] = {}  # a set's probe and, once back, its answer
        self.held_back: dict[tuple[str, ...], list[tuple[int, UnreachedCell]]] = {}

    def start(self) -> list[Any]:
        """The cells to send first: the baselines, recording, and the cells of scenarios with no
        baseline in the plan (nothing to decide them: they run)."""
        bases = []
        for i, c in enumerate(self.cells):
            if tuple(c.toggles) == self.base:
                bases.append(i)
            else:
                self.others.setdefault(c.scenario.name, []).append(i)
        first = [self.send(RecordingCell(self.cells[i].scenario, self.base, self.record), i) for i in bases]
        based = {self.cells[i].scenario.name for i in bases}
        for name in [n for n in self.others if n not in based]:
            first += [self.send(self.cells[j], j) for j in self.others.pop(name)]
        return first

    def send(self, cell: Any, i: int) -> Any:
        self.index[id(cell)] = i
        self.sent.append(cell)
        return cell

    def release(self, name: str, result: CellResult) -> list[Any]:
        """The cells of scenario ``name`` its baseline's ``result`` decides: sent, or (unreached)
        answered by their set's probe."""
        out: list[Any] = []
        for j in self.others.pop(name, []):
            c = self.cells[j]
            targets = self.extra[tuple(c.toggles)]
            if result.reached is None or targets & set(result.reached):
                out.append(self.send(c, j))
                continue
            unreached = UnreachedCell(c.scenario, tuple(c.toggles), result.verdict, tuple(sorted(targets)))
            key = unreached.toggles
            if key not in self.probes:
                self.probes[key] = None
                out.append(self.send(unreached, j))
            elif (probe := self.probes[key]) is None:
                self.held_back.setdefault(key, []).append((j, unreached))
            elif probe.verdict == "NOT_REACHED":
                out.append(self.send(_settled(probe, unreached), j))
            else:
                out.append(self.send(unreached, j))
        return out

    def feed(self, cell: Any, result: CellResult) -> list[Any]:
        i = self.index[id(cell)]
        self.results[i] = result
        if isinstance(cell, RecordingCell):
            return self.release(cell.scenario.name, result)
        out: list[Any] = []
        if isinstance(cell, UnreachedCell) and cell.toggles in self.probes and self.probes[cell.toggles] is None:
            self.probes[cell.toggles] = result
            for j, unreached in self.held_back.pop(cell.toggles, []):
                if result.verdict == "NOT_REACHED":
                    out.append(self.send(_settled(result, unreached), j))
                else:
                    out.append(self.send(unreached, j))
        return out


def _settled(probe: CellResult, cell: UnreachedCell) -> SettledCell:
    return SettledCell(cell.scenario, cell.toggles, _like(probe, cell))


def _like(probe: CellResult, cell: UnreachedCell) -> CellResult:
    """An unreached cell of the set ``probe`` (a NOT_REACHED answer from a worker) applied."""
    from sglfix.harness.cell import not_reached_result

    result = not_reached_result(
        cell.scenario.name, list(cell.toggles), device=probe.device, same_as=cell.same_as, targets=list(cell.targets)
    )
    result.revert_env = probe.revert_env
    result.kernels = dict(probe.kernels) if probe.kernels is not None else None
    return result
