"""The Ray executor: cells run in Ray actors, several per GPU (or one per CPU job), on one machine or a cluster.

Each actor owns one sglfix worker process and drives it with the same ``Worker`` handle the local
pool uses, so isolation, timeouts and verdicts do not depend on where a cell ran: a segfault in
the code under test is FAULT and the actor starts a fresh worker; a hang is TIMEOUT at the same
limit; the worker applies each toggle set through ``REVERT_PR`` exactly as locally.
An actor that itself dies (its node lost, its process killed) is FAULT for the cell it held and
is replaced. Actors ask Ray for a share of a GPU on CUDA (of the ``--devices`` GPUs, else of those
Ray sees; several actors to a GPU as the local pool does; Ray then sets ``CUDA_VISIBLE_DEVICES``,
which the worker inherits) and ``num_cpus=1`` on CPU.

Without an address a private local Ray instance is started (and stopped at the end); with
``--ray-address`` (or ``auto``) the run joins that cluster, whose nodes need the same sglfix;
``--ray-keep`` then leaves the actors there, warm, for the next run (``sglfix.execution.ray_keep``).
``pip install 'sglfix[ray]'``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.execution.pool import CellLine, check_pool_size, checked_reply
from sglfix.execution.ray_actor import CellActor
from sglfix.execution.worker import WorkerConfig
from sglfix.harness.result import CellResult

__all__ = ["RayPool"]

# An actor that neither answers nor dies within the cell timeout plus this is killed and
# replaced (its worker enforces the timeout itself; this bounds a stuck actor).
ACTOR_GRACE = 120.0
# Calls queued on each actor at once, and the most cells in one call (see ``RayPool.run``).
DEPTH = 2
MAX_BATCH = 8
MAX_KEEP_S = 86400.0  # --ray-keep's documented limit (sglfix.execution.ray_keep): a day


def import_ray():
    """Ray, imported; where it is not installed, one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'sglfix[ray]'") from None
    return ray


def init_ray(ray: Any, *, shown: str, **kwargs: Any) -> None:
    """``ray.init(**kwargs)``; a cluster that cannot be started or joined is one line naming
    ``--ray-address shown``."""
    try:
        ray.init(**kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"--ray-address {shown}: cannot start or join Ray: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None


def _gpu_share(ray: Any, size: int, devices: Sequence[str] | None) -> float:
    """The GPU each actor asks Ray for: the GPUs of --devices, else those Ray sees, shared among
    the actors (four actors on one GPU ask 0.25 each), as the local pool puts several workers on
    one GPU; Ray packs the shares, so each GPU takes as many actors as its share allows. Whole
    GPUs for an actor would leave all but one of them waiting."""
    gpus = float(len(devices)) if devices else float(ray.cluster_resources().get("GPU", 0))
    if gpus <= 0:
        raise ConfigError("--executor ray --device cuda: Ray sees no GPU on this machine or cluster; use --device cpu")
    if size <= gpus:
        return 1
    return int(gpus / size * 10000) / 10000  # Ray takes GPU fractions to four decimals


class RayPool:
    """The ``WorkerPool`` interface (``run``, ``info``, ``close``) over Ray actors."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        jobs: int = 1,
        devices: Sequence[str] | None = None,
        address: str | None = None,
        keep: float | None = None,
    ) -> None:
        check_pool_size(jobs)
        if keep is not None and address is None:
            raise ConfigError("--ray-keep keeps actors in a running cluster: give --ray-address with it")
        ray = import_ray()
        self.config = config
        self.replacements: list[str] = []
        self._closed = False
        self._owns = not ray.is_initialized()
        size = jobs
        if self._owns:
            kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
            if address is None:
                # A private instance on this machine, never an ambient cluster (RAY_ADDRESS).
                kwargs.update(address="local", num_cpus=max(size, 1) + 1)
                if config.device == "cuda" and devices:
                    kwargs["num_gpus"] = len(devices)
            else:
                kwargs["address"] = address
            saved = os.environ.get("CUDA_VISIBLE_DEVICES")
            if address is None and config.device == "cuda" and devices:
                # The local instance reads the GPUs it may hand out from this variable: actors then
                # get exactly the --devices given (Ray sets each actor's CUDA_VISIBLE_DEVICES).
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
            try:
                init_ray(ray, shown=address or "local", **kwargs)
            finally:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved
        resources = (
            {"num_gpus": _gpu_share(ray, size, devices), "num_cpus": 0} if config.device == "cuda" else {"num_cpus": 1}
        )
        self._keeper = None
        self.actors: list[Any] = []
        if keep is not None:
            from sglfix.execution.ray_keep import Keeper

            self._keeper = Keeper(config, resources, keep)
            self.actors = self._keeper.claim(size)
            self._keeper.make_room(size - len(self.actors))
        else:
            self._actor_cls = ray.remote(max_restarts=0, max_task_retries=0, **resources)(CellActor)
        self.actors += [self._new_actor() for _ in range(size - len(self.actors))]
        self._info: dict | None = None
        self._boots = [a.boot.remote() for a in self.actors]

    def _new_actor(self) -> Any:
        return self._keeper.new() if self._keeper is not None else self._actor_cls.remote(self.config)

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # Kept actors are given back only after a run that ended normally; after an error or a
        # signal they may be mid-cell, so they go.
        self.close(keep=exc_type is None)

    @property
    def info(self) -> dict:
        if self._info is None:
            ray = import_ray()
            first = ray.get(self._boots[0])
            self._info = {
                k: first.get(k) for k in ("device", "device_name", "torch", "triton", "interpreter", "codebase")
            }
            self._info["executor"] = "ray"
            if self._keeper is not None:
                self._info["kept"] = self._keeper.info()
        return dict(self._info)

    @property
    def pids(self) -> list[int]:
        ray = import_ray()
        out: list[int] = []
        for a in self.actors:
            try:
                out += ray.get(a.pids.remote(), timeout=30)
            except Exception:
                continue
        return out

    def run(
        self,
        cells: Iterable[Any],
        *,
        on_result: Callable[[CellResult], None] | None = None,
        feed: Callable[[Any, CellResult], Iterable[Any]] | None = None,
    ) -> list[CellResult]:
        """Every cell, results in cell order, as ``WorkerPool.run`` (``feed`` too).

        A Ray call costs a few milliseconds, about a fast cell's run, so a call carries several
        cells of one toggle set (fewer as the queue empties, so the last cells still spread over
        every actor), and each actor has up to DEPTH calls queued. An actor runs its calls in the
        order sent: of a lost actor's calls, those that finished keep their results, the first
        unfinished one was running, the ones behind it never ran. When the running call held one
        cell, that cell is FAULT; when it held several, which one took the actor down is unknown,
        so each of them runs again alone and the loss, if it comes again, is charged to its cell.
        """
        if self._closed:
            raise RuntimeError("this RayPool is closed; make a new one")
        return _Dispatch(self, CellLine(cells, on_result=on_result, feed=feed)).run()

    def _replace(self, slot: int, why: str) -> None:
        ray = import_ray()
        try:
            ray.kill(self.actors[slot], no_restart=True)
        except Exception:
            pass
        self.replacements.append(why)
        self.actors[slot] = self._new_actor()

    def _lost(self, slot: int, cell: Any, key: tuple[str, ...], why: str) -> CellResult:
        """FAULT for the cell an actor was running when it was lost; a fresh actor takes its place."""
        self._replace(slot, why)
        result = CellResult(scenario=cell.scenario.name, toggles=list(key), device=self.config.device)
        result.add("FAULT", f"{why}; actor replaced")
        return result.finish()

    def close(self, *, keep: bool = True) -> None:
        """Stop every actor, or, kept (``--ray-keep``) and ``keep``, give them back idle to the
        cluster (those it will not keep are stopped)."""
        if self._closed:
            return
        self._closed = True
        ray = import_ray()
        actors = self.actors
        if self._keeper is not None and keep:
            try:
                actors = self._keeper.give_back(self.actors)
            except Exception:
                actors = self.actors
        # Every actor stops its worker at once (each kill waits for the worker to go).
        refs = []
        for a in actors:
            try:
                refs.append(a.close.remote())
            except Exception:
                pass
        try:
            ray.wait(refs, num_returns=len(refs), timeout=30)
        except Exception:
            pass
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        if self._owns and ray.is_initialized():
            ray.shutdown()


class _Dispatch:
    """One ``RayPool.run``: which calls each actor holds, and what a lost actor costs."""

    def __init__(self, pool: RayPool, line: CellLine) -> None:
        self.ray = import_ray()
        self.pool = pool
        self.line = line
        self.cells, self.keys, self.queue = line.cells, line.keys, line.queue  # grown in place as ``feed`` adds
        self.slots = range(len(pool.actors))
        self.held: dict[int, tuple[str, ...] | None] = dict.fromkeys(self.slots)
        self.inflight: dict[int, list[Any]] = {k: [] for k in self.slots}  # each actor's calls, in the order sent
        self.running: dict[Any, tuple[int, list[int]]] = {}  # ref -> (actor slot, cell indices)
        self.alone: set[int] = set()  # cells of a lost multi-cell call: they run one to a call
        self.per_cell = pool.config.timeout * 3 + ACTOR_GRACE  # a cell may restart its worker twice

    def run(self) -> list[CellResult]:
        while self.queue or self.running:
            for slot in self.slots:
                while self.queue and len(self.inflight[slot]) < DEPTH:
                    self._send(slot, self._take(slot))
            oldest = next(iter(self.running))
            limit = self.per_cell * len(self.running[oldest][1])
            ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=limit)
            if not ready:  # nothing came back in time: the oldest call's actor is stuck
                self._lose(self.running[oldest][0], f"the Ray actor gave no result within {limit:g} s")
                continue
            for ref in ready:
                self._collect(ref)
        return self.line.finished()

    def _take(self, slot: int) -> list[int]:
        """The next call's cells for ``slot``: several of one toggle set while the queue is long."""
        queue, keys = self.queue, self.keys
        elsewhere = {t for s, t in self.held.items() if s != slot and t is not None}
        i = queue.take(held=self.held[slot], elsewhere=elsewhere)
        batch = [i]
        if i in self.alone:
            return batch
        waiting = sum(len(g) for g in queue.groups.values())
        size = max(1, min(MAX_BATCH, waiting // (4 * len(self.pool.actors))))
        group = queue.groups.get(keys[i])
        while group and len(batch) < size and group[0] not in self.alone:
            batch.append(queue.take(held=keys[i], elsewhere=set()))
            group = queue.groups.get(keys[i])
        return batch

    def _send(self, slot: int, batch: list[int]) -> None:
        cells, keys = self.cells, self.keys
        ref = self.pool.actors[slot].run_batch.remote(
            [
                (cells[i].scenario.to_json(), cells[i].scenario.name, list(keys[i]), getattr(cells[i], "extra", None))
                for i in batch
            ]
        )
        self.held[slot] = keys[batch[0]]
        self.inflight[slot].append(ref)
        self.running[ref] = (slot, batch)

    def _collect(self, ref: Any) -> None:
        if ref not in self.running:  # settled already, by a loss of its actor
            return
        slot, batch = self.running[ref]
        try:
            self._finish(ref, batch)
        except self.ray.exceptions.RayActorError as exc:
            self._lose(slot, f"the Ray actor died: {_first_line(exc)}")
            return
        del self.running[ref]
        self.inflight[slot].remove(ref)

    def _finish(self, ref: Any, batch: list[int]) -> None:
        for i, value in zip(batch, self.ray.get(ref)):
            self.line.settle(i, checked_reply(CellResult.from_json(value), cell=self.cells[i], key=self.keys[i]))

    def _lose(self, slot: int, why: str) -> None:
        """Settle a lost actor's calls (see ``RayPool.run``) and give its slot a fresh actor."""
        refs, self.inflight[slot] = self.inflight[slot], []
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        charged = False
        for ref in refs:
            _, batch = self.running.pop(ref)
            if not charged and ref in ready and self._finished(ref, batch):
                continue
            if not charged:
                charged = True
                if self._charge(slot, batch, why):
                    continue
            for i in reversed(batch):
                self.queue.put_back(i, self.keys[i])
        if not charged:
            self.pool._replace(slot, why)
        self.held[slot] = None

    def _finished(self, ref: Any, batch: list[int]) -> bool:
        try:
            self._finish(ref, batch)
        except self.ray.exceptions.RayActorError:
            return False
        return True

    def _charge(self, slot: int, batch: list[int], why: str) -> bool:
        """The call that was running when the actor went: one cell is FAULT (True: settled); of
        several, each runs again alone (False: they go back to the queue)."""
        if len(batch) == 1:
            i = batch[0]
            self.line.settle(i, self.pool._lost(slot, self.cells[i], self.keys[i], why))
            return True
        self.alone.update(batch)
        self.pool._replace(slot, why)
        return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
