"""The result store as a layer around the worker pool: ``StoredPool`` has the pool's interface
(``run(cells, on_result=, feed=)``), answers the cells the store holds, hands the others to the
pool, and files each result that comes back with what it depends on.

Whoever runs cells (``Runner.run``, through reachability or not; ``bisect``'s search) runs them on
a ``StoredPool`` as on a pool, and knows nothing of the store. The pool itself is opened at the
first cell the store misses: a run the store answers whole starts no worker.

What a cell is looked up and filed with, it says itself: a cell that records which functions it
enters (``RecordingCell``, a baseline) is served only an entry that recorded at least those, and
is filed with its record; its scenario's unreached cells (NOT_REACHED, which run nothing of their
own) are filed with what its entry depends on. A cell that carries its answer (``answer``, a
cell settled without a worker) is served from the store when it holds one, else filed as it is.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sglfix.execution.store import ResultStore
from sglfix.harness.result import CellResult

if TYPE_CHECKING:
    from sglfix.execution.pool import Cell, Pool
    from sglfix.toggling.registry import Registry

__all__ = ["StoredPool"]


class StoredPool:
    """The pool's interface over ``store``: ``open_pool(cells)`` (a context manager; ``cells`` the
    most workers worth starting, None: as many as the run allows) gives the workers when a cell
    misses. ``reachability``: a stored NOT_REACHED mark may answer a cell; ``fingerprint``: only
    an entry that digested what it built may (``mutate``). ``expected``: how many cells the run
    will hand over (the pool is never made larger than those the store has not answered)."""

    def __init__(
        self,
        store: ResultStore,
        *,
        open_pool: Callable[[int | None], contextlib.AbstractContextManager[Pool]],
        registry: Registry,
        reachability: bool,
        fingerprint: bool,
        served_info: Callable[[], dict],
        expected: int | None = None,
    ) -> None:
        self.store = store
        self._open_pool, self._registry = open_pool, registry
        self._reachability, self._fingerprint = reachability, fingerprint
        self._served_info = served_info
        self._expected = expected
        self.pool: Pool | None = None  # the workers, once a cell missed
        self.served = 0  # cells answered from the store
        self._stack = contextlib.ExitStack()
        self._keys: dict[tuple[str, tuple[str, ...]], str] = {}
        self._served_from: dict[tuple[str, tuple[str, ...]], Any] = {}  # cell -> the entry it was served
        self._base_deps: dict[str, Any] = {}  # scenario -> what its baseline's entry depends on

    def __enter__(self) -> StoredPool:
        return self

    def __exit__(self, kind: Any, *exc: object) -> None:
        # The workers first, then the store. Cut short (Ctrl-C, SIGTERM: not an Exception), what
        # is queued for it is dropped; a search that stopped on an answer (a failing baseline)
        # keeps what it ran.
        try:
            self._stack.close()
        finally:
            self.store.close(wait=kind is None or issubclass(kind, Exception))

    # -- what the pool says of itself --------------------------------------------------------------

    @property
    def info(self) -> dict:
        """The workers' own facts; when none started, ``served_info()`` (an earlier run's)."""
        return dict(self.pool.info) if self.pool is not None else self._served_info()

    @property
    def replacements(self) -> list:
        return list(getattr(self.pool, "replacements", []))

    @property
    def reran_alone(self) -> list:
        return list(getattr(self.pool, "reran_alone", []))

    # -- running -------------------------------------------------------------------------------------

    def run(
        self,
        cells: Iterable[Cell],
        *,
        on_result: Callable[[CellResult], None] | None = None,
        feed: Callable[[Cell, CellResult], Iterable[Cell]] | None = None,
    ) -> list[CellResult]:
        """As ``WorkerPool.run``: every cell, results in cell order (those ``feed`` adds after);
        the store's answers given at once, the other cells run on the pool."""
        out: list[CellResult | None] = []
        places: dict[int, deque[int]] = {}  # id of a cell handed to the pool -> its places in ``out``
        handed: list[Cell] = []  # keeps every cell handed over alive, so that ids stay unique

        def settle(i: int, cell: Cell, result: CellResult) -> Iterable[Cell]:
            out[i] = result
            if on_result is not None:
                on_result(result)
            return feed(cell, result) if feed is not None else ()

        def take(batch: Iterable[Cell]) -> list[Cell]:
            """The cells of ``batch`` (and those their answers feed) the pool must run."""
            rest, todo = [], deque(batch)
            while todo:
                cell = todo.popleft()
                i = len(out)
                out.append(None)
                answer = self._look_up(cell)
                if answer is None and (carried := getattr(cell, "answer", None)) is not None:
                    answer = carried
                    self._keep(cell, answer)
                if answer is None:
                    places.setdefault(id(cell), deque()).append(i)
                    handed.append(cell)
                    rest.append(cell)
                    continue
                todo.extend(settle(i, cell, answer))
            return rest

        def came_back(cell: Cell, result: CellResult) -> list[Cell]:
            self._keep(cell, result)
            return take(settle(places[id(cell)].popleft(), cell, result))

        rest = take(cells)
        if rest:
            self._workers().run(rest, feed=came_back)
        return [r for r in out if r is not None]

    def fresh(self, cells: list[Cell]) -> list[CellResult]:
        """``cells`` run on the pool as they are, through no store (``--verify-store``)."""
        return self._workers(len(cells)).run(cells)

    def drop(self, result: CellResult) -> None:
        """Remove the entry ``result`` was served from (a fresh run says otherwise)."""
        cell = (result.scenario, tuple(result.toggles))
        if cell in self._served_from:
            self.store.drop(self._keys[cell], self._served_from.pop(cell))

    def _workers(self, at_least: int = 0) -> Pool:
        if self.pool is None:
            cells = None if self._expected is None else max(1, at_least, self._expected - self.served)
            self.pool = self._stack.enter_context(self._open_pool(cells))
        return self.pool

    # -- the store -----------------------------------------------------------------------------------

    def _key(self, cell: Cell) -> str:
        from sglfix.execution.store.keys import cell_key

        name = (cell.scenario.name, tuple(cell.toggles))
        if name not in self._keys:
            self._keys[name] = cell_key(
                self.store.context, scenario=cell.scenario, toggles=cell.toggles, registry=self._registry
            )
        return self._keys[name]

    def _look_up(self, cell: Cell) -> CellResult | None:
        """The store's answer for ``cell``, or None."""
        record = getattr(cell, "record", None)
        name = (cell.scenario.name, tuple(cell.toggles))
        hit = self.store.get(
            self._key(cell),
            record=record,
            reachability=self._reachability,
            scenario=name[0],
            toggles=name[1],
        )
        if hit is None:
            return None
        result, deps = hit
        if self._fingerprint and result.fingerprint is None and result.verdict != "NOT_REACHED":
            return None  # kept by a run that did not digest what it built: run again
        self.served += 1
        self._served_from[name] = deps
        if record is not None:
            self._base_deps[name[0]] = deps
        return result

    def _keep(self, cell: Cell, result: CellResult) -> None:
        """File a result that came back from a worker, or that a cell carried."""
        if result.stored is not None:
            return
        deps = self.store.deps_of(result.deps)
        result.deps = None  # the report never holds it
        record = getattr(cell, "record", None)
        if record is not None:
            self._base_deps[cell.scenario.name] = deps
        elif result.verdict == "NOT_REACHED":
            deps = self._base_deps.get(cell.scenario.name)
        self.store.put(self._key(cell), result, deps=deps, record=record or None)
