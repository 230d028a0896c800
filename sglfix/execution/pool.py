"""A pool of worker processes that runs plans of cells, and the signal guard the CLI wraps it in.

The pool starts its workers when it is built, so they boot (torch import, kernels) while the
caller plans; it keeps them across plans and kills every one of them, with the children of the
code under test, when it exits. It is single-threaded on purpose: one poll loop over every
worker's pipes, so Ctrl-C and SIGTERM land in the thread that owns the workers.

Cells of one toggle set go to the same worker where possible: switching sets costs a restore
and an apply, and a worker that held a set may have to be replaced before the next one.

Workers that share a GPU can make a cell fail that did nothing wrong: it runs out of the memory
the others hold, or, under MPS (``sglfix.execution.mps``), its GPU context is lost to another
worker's fault. Such a cell is never reported as it came back: once every other cell is done, it
runs again alone while the others idle with their memory given back (one that lost its context,
and any after a fault under MPS, in a worker started outside MPS), and that result is the cell's
(``reran_alone`` says which and why).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import signal
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sglfix.common.errors import ConfigError
from sglfix.common.signals import Terminated, signals_raise
from sglfix.execution.devices import deal_devices
from sglfix.execution.mps import LOG_ENV, PIPE_ENV, Daemon, users_daemon
from sglfix.execution.worker import Event, Worker, WorkerConfig, WorkerStartError, raise_for_start, wait_fds
from sglfix.harness.result import CellResult

if TYPE_CHECKING:
    from sglfix.scenario.models import Scenario

__all__ = [
    "Cell",
    "CellLine",
    "Pool",
    "Terminated",
    "WorkerConfig",
    "WorkerPool",
    "WorkerStartError",
    "check_pool_size",
    "checked_reply",
    "signals_raise",
]

# A worker that asks to be replaced (the set it held left state behind) is replaced by a fresh one
# that runs the waiting cell first: nothing held, nothing to restore. A cell that even fresh
# workers ask to be replaced for (a worker that cannot start clean) ends as ERROR after this many
# fresh starts rather than looping; replacements after other cells never count against it.
MAX_REPLACEMENTS = 2
_LOST = "its GPU context was lost under MPS"
_TICK = 0.5  # longest poll wait: bounds how late a deadline is noticed without a pidfd


class Cell(Protocol):
    """A cell as the pool reads it (``PlannedCell``, ``RecordingCell``, ...): a scenario and a toggle
    set. ``extra`` (what the worker is to record) and ``answer`` (a result known without a worker)
    are read where a cell has them."""

    @property
    def scenario(self) -> Scenario: ...

    @property
    def toggles(self) -> Sequence[str]: ...


class Pool(Protocol):
    """What runs cells: ``WorkerPool``, ``RayPool``, and the result store's ``StoredPool`` around either."""

    @property
    def info(self) -> dict: ...

    def run(
        self,
        cells: Iterable[Cell],
        *,
        on_result: Callable[[CellResult], None] | None = None,
        feed: Callable[[Cell, CellResult], Iterable[Cell]] | None = None,
    ) -> list[CellResult]: ...


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back while killing workers: a second Ctrl-C must not leave some alive."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    except (AttributeError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _Queue:
    """Cells waiting to run, grouped by toggle set, in plan order."""

    def __init__(self, keys: Sequence[tuple[str, ...]]) -> None:
        self.groups: dict[tuple[str, ...], deque[int]] = {}
        for i, key in enumerate(keys):
            self.groups.setdefault(key, deque()).append(i)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def add(self, i: int, key: tuple[str, ...]) -> None:
        """Last in line (a cell that a result made known while the plan runs)."""
        self.groups.setdefault(key, deque()).append(i)

    def put_back(self, i: int, key: tuple[str, ...]) -> None:
        """First in line again: the cell was taken but never ran."""
        group = self.groups.pop(key, deque())
        group.appendleft(i)
        self.groups = {key: group, **self.groups}

    def take(self, *, held: tuple[str, ...] | None, elsewhere: set) -> int:
        """The set this worker holds; else a set no other worker holds; else the largest."""
        key: tuple[str, ...] | None = held if held is not None else ()
        if key not in self.groups:
            key = next((k for k in self.groups if k not in elsewhere), None)
        if key is None:
            key = max(self.groups, key=lambda k: len(self.groups[k]))
        group = self.groups[key]
        i = group.popleft()
        if not group:
            del self.groups[key]
        return i


class CellLine:
    """One ``run``'s cells in cell order, their results, and the queue of those still to run.
    ``settle`` records a result, tells ``on_result``, and adds whatever cells ``feed(cell,
    result)`` returns (they join the end of the line, their results the end of the list). A cell
    that carries its result (``answer``: known without a worker) is settled as it joins."""

    def __init__(
        self,
        cells: Iterable[Cell],
        *,
        on_result: Callable[[CellResult], None] | None,
        feed: Callable[[Cell, CellResult], Iterable[Cell]] | None,
    ) -> None:
        self.cells = list(cells)
        self.keys = [tuple(c.toggles) for c in self.cells]
        self.queue = _Queue(())
        self.results: list[CellResult | None] = [None] * len(self.cells)
        self.left = len(self.cells)  # cells without a result yet
        self._on_result, self._feed = on_result, feed
        answered: list[tuple[int, CellResult]] = []
        for i, cell in enumerate(self.cells):
            if (answer := getattr(cell, "answer", None)) is not None:
                answered.append((i, answer))
            else:
                self.queue.add(i, self.keys[i])
        for i, answer in answered:
            self.settle(i, answer)

    def settle(self, i: int, result: CellResult) -> None:
        self.results[i] = result
        self.left -= 1
        if self._on_result is not None:
            self._on_result(result)
        for cell in self._feed(self.cells[i], result) if self._feed is not None else ():
            self.cells.append(cell)
            self.keys.append(tuple(cell.toggles))
            self.results.append(None)
            self.left += 1
            if (answer := getattr(cell, "answer", None)) is not None:
                self.settle(len(self.cells) - 1, answer)
            else:
                self.queue.add(len(self.cells) - 1, self.keys[-1])

    def finished(self) -> list[CellResult]:
        return [r for r in self.results if r is not None]


def checked_reply(result: CellResult, *, cell: Cell, key: tuple[str, ...]) -> CellResult:
    """A worker's reply for ``cell`` (run with toggle set ``key``), trusted only when it names
    that cell; else an ERROR of sglfix for the cell."""
    if result.scenario == cell.scenario.name and tuple(result.toggles) == key:
        return result
    wrong = CellResult(scenario=cell.scenario.name, toggles=list(key), device=result.device)
    wrong.add("ERROR", f"sglfix failed: the reply names {result.scenario} [{','.join(result.toggles)}], not this cell")
    return wrong.finish()


def check_pool_size(jobs: object) -> None:
    """A pool's ``jobs`` (local or Ray): a whole number of workers, at least one."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs {jobs!r} must be at least 1")


def _own_memory(result: CellResult, how: str) -> CellResult:
    """A cell out of GPU memory where ``how`` says no other worker of the run was the cause:
    its ERROR says so, and what to do, instead of leaving the reader to blame ``--jobs``."""
    for f in result.findings:
        if f["verdict"] == "ERROR" and f.get("out_of_memory"):
            f["message"] += (
                f"; {how}: the cell needs more than the GPU had free (free it of other processes, "
                "or run the scenario on a GPU with more memory)"
            )
    return result


class WorkerPool:
    """``jobs`` long-lived workers sharing one ``WorkerConfig``.

    Workers are started from the thread that builds the pool or calls ``run``; on Linux a
    worker dies with that thread (``PR_SET_PDEATHSIG``), so keep the pool in one thread.
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        jobs: int | None = None,
        devices: Sequence[str] | None = None,
        mps: bool = False,
        mps_required: bool = False,
    ) -> None:
        """``jobs`` workers (default: one per device of ``devices``, else one); with ``mps``,
        those sharing a GPU share it through an MPS daemon (the user's if the workers would
        reach one anyway, else one of this pool's own; one that does not come up is one line,
        exit 2, if ``mps_required``, else the workers go without)."""
        jobs = (len(devices) if devices else 1) if jobs is None else jobs
        check_pool_size(jobs)
        self.config = config
        self.mps = mps
        self.replacements: list[str] = []  # why a worker was replaced between toggle sets
        self.reran_alone: list[str] = []  # which cells ran again alone, why, and what they gave
        self._served: dict[Worker, Any] = {}  # each worker's process that was last sent a cell
        self._info: dict | None = None
        self._closed = False
        self._daemon: Daemon | None = None
        self._outside: str | None = None  # the pipe folder of no daemon: a worker there is outside MPS
        self._solo: Worker | None = None  # the worker cells run again alone in
        self._faulted = False  # a GPU context was lost under MPS: an MPS worker may hold a dead one
        self.workers: list[Worker] = []
        try:
            client: dict[str, str] = {}
            if mps and users_daemon() is None:
                try:
                    self._daemon = Daemon().start()
                except ConfigError:
                    if mps_required:
                        raise
                    self.mps = False
                else:
                    client, self._outside = dict(self._daemon.env), self._daemon.empty
            elif mps:
                self._outside = tempfile.mkdtemp(prefix="sglfix-no-mps-")
            if devices:
                # The GPUs in turn, each worker seeing only its own (CUDA_VISIBLE_DEVICES): a fault
                # or a timeout takes one worker, and cells keep flowing to the others.
                self.workers = [
                    Worker(config, extra_env={"CUDA_VISIBLE_DEVICES": d, **client}) for d in deal_devices(devices, jobs)
                ]
            else:
                self.workers = [Worker(config, extra_env=client) for _ in range(jobs)]
            for w in self.workers:
                w.start()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- introspection ------------------------------------------------------------------------

    @property
    def info(self) -> dict:
        """Device, device name, torch and triton versions, as the first worker to boot found them."""
        while self._info is None:
            self._check_open()
            if all(w.state == "down" for w in self.workers):
                self.workers[0].start()
            for _w, event in self._wait():
                raise_for_start(event)
        return dict(self._info)

    @property
    def pids(self) -> list[int]:
        """Every worker process this pool started (live or not), for callers that must check."""
        return [pid for w in self._all() for pid in w.pids]

    @property
    def live_pids(self) -> list[int]:
        return [w.pid for w in self._all() if w.pid is not None]

    def _all(self) -> list[Worker]:
        return [*self.workers, *([self._solo] if self._solo is not None else [])]

    def trim(self, jobs: int) -> None:
        """Stop the workers past the first ``jobs`` (a pool started before its plan was known
        that holds more workers than the plan has cells); the first ones hold every device."""
        self._check_open()
        extra, self.workers = self.workers[max(1, jobs) :], self.workers[: max(1, jobs)]
        with _signals_held():
            for w in extra:
                w.signal_kill()
            for w in extra:
                w.kill()

    # -- running ------------------------------------------------------------------------------

    def run(
        self,
        cells: Iterable[Cell],
        *,
        on_result: Callable[[CellResult], None] | None = None,
        feed: Callable[[Cell, CellResult], Iterable[Cell]] | None = None,
    ) -> list[CellResult]:
        """Run every cell (``.scenario`` with ``.name``/``.to_json()``, ``.toggles``); results in cell order.
        ``feed(cell, result)``, called as each result arrives, may return more cells to run (they
        join the end of the line, and their results the end of the list)."""
        self._check_open()
        line = CellLine(cells, on_result=on_result, feed=feed)
        cells, keys, queue = line.cells, line.keys, line.queue  # grown in place as ``feed`` adds
        running: dict[Worker, int] = {}
        first: set[Worker] = set()  # workers whose running cell is the first of their process
        reserved: dict[Worker, int] = {}  # a replaced worker's fresh process runs this cell first
        replaced: Counter[int] = Counter()  # fresh processes that asked to be replaced for a cell
        alone: list[tuple[int, str]] = []  # cells to run again alone, and why
        while line.left:
            if alone and not queue and not running and not reserved:
                self._run_alone(line, alone)
                alone = []
                continue
            self._dispatch(queue, cells, running, reserved=reserved, first=first)
            for w, event in self._wait():
                if self._refused_by_mps(w, event):
                    continue  # it starts again outside MPS at the next dispatch
                raise_for_start(event)
                i = running.pop(w, None) if event.kind in ("reply", "lost", "restart", "died", "timeout") else None
                if i is None:
                    continue
                if event.kind == "restart" and w in first:
                    replaced[i] += 1  # not even a fresh worker could run it
                first.discard(w)
                result = self._outcome(w, event, cells[i], keys[i], replaced=replaced[i])
                if result is None:
                    if event.kind == "restart":
                        reserved[w] = i
                    else:
                        queue.put_back(i, keys[i])
                    continue
                why = self._casualty(w, event, result)
                if why is not None:
                    alone.append((i, why))
                    continue
                line.settle(i, _own_memory(result, "no other worker of this run shared its GPU"))
        return line.finished()

    def _casualty(self, w: Worker, event: Event, result: CellResult) -> str | None:
        """Why the result may be the other workers' doing rather than the cell's, or None."""
        if event.kind == "lost" and self._under_mps(w):
            self._leave_mps(w)
            return f"{_LOST} ({event.data['why']}): a fault of any worker on that GPU reaches every one"
        if event.kind in ("timeout", "died") and self._under_mps(w):
            # A client that ends with work in flight can leave the daemon refusing new clients,
            # and a kernel that never ends holds the SMs every client of that GPU shares.
            self._leave_mps(w)
            what = f"it timed out ({event.data:g} s)" if event.kind == "timeout" else "its worker died"
            return f"{what} under MPS: a kernel left running there stalls or faults every worker on that GPU"
        if not any(f.get("out_of_memory") for f in result.findings if f["verdict"] == "ERROR"):
            return None
        beside = sum(1 for x in self.workers if _gpu(x) == _gpu(w)) - 1
        return f"it ran out of GPU memory beside {beside} other worker{'s' if beside > 1 else ''}" if beside else None

    def _refused_by_mps(self, w: Worker, event: Event) -> bool:
        """Whether ``event`` is a fresh worker under MPS that found no GPU after this pool's
        workers had one: a daemon that refuses new clients after a fault, not the machine's
        setup. Its GPU leaves MPS and the worker starts again outside it."""
        if event.kind != "config_error" or self._info is None or not self._under_mps(w):
            return False
        self._leave_mps(w)
        self.replacements.append(f"a fresh worker under MPS found no GPU ({event.data}); it started outside MPS")
        return True

    def _under_mps(self, w: Worker) -> bool:
        """Whether ``w``'s process (as it was started) is a client of the MPS daemon."""
        return self.mps and w.started_env.get(PIPE_ENV) != self._outside

    def _leave_mps(self, w: Worker) -> None:
        """The workers of ``w``'s GPU start outside MPS from now on: after a fatal fault the
        daemon takes no new client there until every one it had has gone."""
        self._faulted = True
        for x in self.workers:
            if _gpu(x) == _gpu(w):
                x.extra_env[PIPE_ENV] = str(self._outside)
                x.extra_env.pop(LOG_ENV, None)

    def _run_alone(self, line: CellLine, alone: list[tuple[int, str]]) -> None:
        """Each cell again, one at a time, the other workers idle with their cached memory given
        back; these results stand. A cell that lost its context under MPS runs outside MPS (in a
        worker started outside it, else one of its own); one that ran out of memory runs in any
        idle worker, warm, unless a context was lost under MPS: an idle MPS worker may not know
        yet that its own is gone."""
        for w in self.workers:
            if w.state == "idle":
                w.idle()
        for i, why in alone:
            cell, key = line.cells[i], line.keys[i]
            w = self._alone_worker(outside=self._faulted)
            result = checked_reply(
                w.run(
                    scenario_json=cell.scenario.to_json(),
                    scenario_name=cell.scenario.name,
                    toggles=key,
                    extra=getattr(cell, "extra", None),
                ),
                cell=cell,
                key=key,
            )
            label = f"{','.join(key) or 'baseline'}::{cell.scenario.name}"
            self.reran_alone.append(f"{label}: {why}; alone it gave {result.verdict}")
            line.settle(i, _own_memory(result, "it ran out again alone, the other workers idle"))

    def _alone_worker(self, *, outside: bool) -> Worker:
        for w in self.workers:
            if w.state == "idle" and not (outside and self._under_mps(w)):
                return w
        if self._solo is None:
            env = {k: v for k, v in self.workers[0].extra_env.items() if k not in (PIPE_ENV, LOG_ENV)}
            if self.mps:
                env[PIPE_ENV] = str(self._outside)
            self._solo = Worker(self.config, extra_env=env)
        return self._solo

    def _outcome(
        self, w: Worker, event: Event, cell: Cell, key: tuple[str, ...], *, replaced: int
    ) -> CellResult | None:
        """The cell's result, or None when it never ran and goes back in line."""
        if event.kind == "died" and not event.data["pending"]:
            return None  # it died between cells
        if event.kind == "restart":  # the last set left state behind: a fresh worker runs this cell
            w.retire()
            self.replacements.append(event.data)
            if replaced <= MAX_REPLACEMENTS:
                return None
            result = CellResult(scenario=cell.scenario.name, toggles=list(key), device=self.config.device)
            result.add(
                "ERROR",
                f"sglfix failed: {replaced} fresh workers in a row asked to be replaced before this cell "
                f"could run: {event.data}",
            )
            return result.finish()
        if event.kind == "lost":  # the worker ended after its reply: every later cell would fail
            w.retire()
        return checked_reply(w.result_for(event, scenario=cell.scenario.name, toggles=key), cell=cell, key=key)

    def _dispatch(
        self, queue: _Queue, cells: list, running: dict[Worker, int], *, reserved: dict[Worker, int], first: set[Worker]
    ) -> None:
        for w in self.workers:
            if not queue and w not in reserved:
                continue
            if w.state == "down":
                w.start()
            if w.state != "idle" or w in running:
                continue
            if w in reserved:  # the cell it was replaced for, before any other
                i = reserved.pop(w)
            else:
                elsewhere = {
                    x.toggles for x in self.workers if x is not w and x.state != "down" and x.toggles is not None
                }
                i = queue.take(held=w.toggles, elsewhere=elsewhere)
            if self._served.get(w) is not w.proc:  # its process's first cell
                self._served[w] = w.proc
                first.add(w)
            else:
                first.discard(w)
            w.send(
                scenario_json=cells[i].scenario.to_json(),
                toggles=tuple(cells[i].toggles),
                extra=getattr(cells[i], "extra", None),
            )
            running[w] = i

    def _wait(self) -> list[tuple[Worker, Event]]:
        """Wait (at most one tick, or to the nearest deadline) and collect every worker's events."""
        now = time.monotonic()
        nearest = min((w.deadline for w in self.workers), default=math.inf)
        timeout = max(0.0, min(_TICK, nearest - now))
        wait_fds([fd for w in self.workers for fd in w.fds()], timeout=timeout)
        now = time.monotonic()
        events = []
        for w in self.workers:
            while (event := w.service(now=now)) is not None:
                if event.kind == "ready" and self._info is None:
                    self._info = {
                        k: event.data.get(k)
                        for k in ("device", "device_name", "torch", "triton", "interpreter", "codebase", "boot_s")
                    }
                events.append((w, event))
        return events

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this WorkerPool is closed; make a new one")

    def close(self) -> None:
        """Kill every worker's process group and reap the workers (bounded)."""
        self._closed = True
        with _signals_held():
            for w in self._all():
                w.signal_kill()
            for w in self._all():
                w.kill()
            if self._daemon is not None:
                self._daemon.stop()  # after its clients: it waits for them to go
            elif self._outside is not None:
                shutil.rmtree(self._outside, ignore_errors=True)


def _gpu(w: Worker) -> str | None:
    return w.extra_env.get("CUDA_VISIBLE_DEVICES")
