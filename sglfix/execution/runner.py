"""The one way cells are run: ``run``, ``matrix`` and ``bisect`` hand their ``Settings`` and the
code base they resolved (``Target``) to a ``Runner``, which checks every setting against the
machine and the code base before any worker starts (one line, exit 2), plans, starts the workers
(local processes, dealt over the GPUs of ``--devices``, or Ray actors) and runs cells on them.

Plan once, run many: a ``Runner`` is built and checked once; ``plan`` makes the cells of a
command's plan (scenarios chosen, shard taken, every revert prechecked against the installed
source); ``workers`` opens the pool a command runs one plan on (``run``) or many small ones on
(``bisect``'s search)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.execution.devices import check_device, check_jobs, has_cuda_device, parse_devices, uses_cuda
from sglfix.execution.settings import EVERY_FUNCTION, Settings

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from sglfix.codebases import CodeBase, Profile
    from sglfix.execution.planner import Plan
    from sglfix.execution.pool import Cell, WorkerPool
    from sglfix.execution.ray_pool import RayPool
    from sglfix.execution.shards import Shard
    from sglfix.execution.store import ResultStore
    from sglfix.execution.store.layer import StoredPool
    from sglfix.harness.result import CellResult
    from sglfix.scenario.models import Scenario
    from sglfix.toggling.candidate import Candidate
    from sglfix.toggling.registry import Registry


@dataclass(frozen=True)
class Target:
    """The code base cells replay through and the toggles they revert, as the command resolved
    them (``--profile``, ``--toggles``, ``--allow-target``)."""

    profile: Profile
    registry: Registry
    codebase: CodeBase
    allowed_prefixes: tuple[str, ...] | None = None
    toggles_dir: str | None = None  # given explicitly: every worker reads the same files
    # Candidate fixes (--apply, sglfix.toggling.candidate), checked against the code base; the
    # registry selects them by id.
    candidates: tuple[Candidate, ...] = ()


@dataclass
class Ran:
    """A plan run through the workers, with what the report and the tables need."""

    registry: Registry
    env: tuple[str, ...]
    plan: Plan
    info: dict
    results: list[CellResult]
    wall: float
    shard: Shard | None = None  # the Shard this run was, if --shard
    replacements: list = field(default_factory=list)  # why each worker was replaced between sets
    reran_alone: list = field(default_factory=list)  # cells run again alone (sglfix.execution.pool), why
    drifted: dict = field(default_factory=dict)  # revert id -> why it no longer applies here
    not_applicable: dict = field(default_factory=dict)  # revert id -> why none exists at this version
    candidates: tuple = ()  # the candidate fixes applied (--apply)
    conflicts: dict = field(default_factory=dict)  # set label -> why the fix and its reverts cannot go together
    # The result store, if the run read it: its folder, cells served from it, cells run.
    store: dict | None = None
    # What makes the plan this plan (sglfix.execution.shards.plan_identity): the report's plan.
    plan_identity: dict | None = None


class Runner:
    """Settings checked once (in the order a user meets them), then plans and workers."""

    def __init__(self, settings: Settings, target: Target, *, what: str) -> None:
        from sglfix.execution.pool import WorkerConfig
        from sglfix.execution.shards import parse_shard

        self.settings, self.target, self.what = settings, target, what
        s = settings
        if s.executor not in ("local", "ray"):
            raise ConfigError(f"--executor {s.executor!r}: use local or ray")
        if s.ray_address is not None and s.executor != "ray":
            raise ConfigError("--ray-address joins a Ray cluster: give --executor ray with it")
        check_ray_keep(s.ray_keep, executor=s.executor, address=s.ray_address)
        device, self.gpus = s.device, None
        if s.devices is not None:
            if device not in ("auto", "cuda"):
                raise ConfigError(
                    f"--devices {s.devices} runs on GPUs; drop --device {device} (or use --jobs N on CPU)"
                )
            self.gpus = parse_devices(s.devices)
            if s.jobs is not None and 1 <= s.jobs < len(self.gpus):  # before any GPU is looked for
                check_jobs(s.jobs, "cuda", gpus=len(self.gpus))
            device = "cuda"
        self.shard = parse_shard(s.shard) if s.shard is not None else None
        if s.shard_costs is not None and self.shard is None:
            raise ConfigError("--shard-costs balances shards: give --shard I/N with it")
        self.timings = None
        if s.shard_costs is not None:
            from sglfix.report.load import cell_costs, load_report

            self.timings = cell_costs(load_report(s.shard_costs))
        if self.gpus is not None and not has_cuda_device():
            # Name CUDA_VISIBLE_DEVICES only when the user set it: it may be what hides the GPU.
            shown = os.environ.get("CUDA_VISIBLE_DEVICES")
            hidden = f" (CUDA_VISIBLE_DEVICES={shown} is set)" if shown is not None else ""
            raise ConfigError(
                f"--devices {s.devices}: this machine has no CUDA device{hidden}; run it on a GPU machine, "
                "or use --device cpu (--jobs N for several workers)"
            )
        check_device(device)
        from sglfix.execution.mps import check_mps

        # Options that cannot go together come before what this machine lacks (an interpreter
        # too old for CPU runs, say): the user fixes the command line first.
        self.mps = check_mps(s.mps, device=device, executor=s.executor)
        check_env_knobs()
        if not uses_cuda(device):
            from sglfix.codebases import REPRODUCTION_NAME, check_interpreter

            name = target.profile.name
            check_interpreter(target.codebase, what="this run" if name == REPRODUCTION_NAME else f"--profile {name}")
        self.device = device
        self.store_dir = check_store(s)
        self.config = WorkerConfig(
            device=device,
            timeout=s.timeout,
            allowed_prefixes=target.allowed_prefixes,
            toggles_dir=target.toggles_dir,
            # A profile that follows what is installed is followed again in every worker.
            codebase=target.codebase.asked or target.codebase.name,
            candidates=tuple((c.id, c.text, c.sha256) for c in target.candidates),
            # A record of every function (``mutate``'s baseline) is kept as a reach record is.
            deps=self.store_dir is not None and (not s.record or s.record == (EVERY_FUNCTION,)),
            fingerprint=s.fingerprint,
        )
        self.env = env_ids(target.registry)
        check_env_baseline(self.env, s.env_baseline, what=what)
        if s.executor == "ray":
            from sglfix.execution.ray_probe import check_ray_address, quiet_ray_logs

            # Ray takes seconds to start or join: an address that answers nothing is refused
            # instead of waited on.
            check_ray_address(s.ray_address)
            quiet_ray_logs()
        self.jobs = check_jobs(s.jobs, device, gpus=len(self.gpus) if self.gpus else None, mps=self.mps)
        self.drifted: dict[str, str] = {}  # revert id -> why it no longer applies (see ``precheck``)
        self.not_applicable: dict[str, str] = {}  # revert id -> why no revert exists at this version
        self.conflicts: dict[str, str] = {}  # set label -> why its fix and reverts cannot go together
        self._booted: WorkerPool | None = None  # the pool ``booting`` started ahead, until ``workers`` takes it
        self.whole_cells: list[str] = []  # the ids of the plan ``plan`` built, before the shard

    def scenarios(self) -> list[Scenario]:
        """The scenarios the settings select, checked at load (sizes, memory, what the code base
        can run)."""
        s = self.settings
        return choose_scenarios(
            profile=self.target.profile,
            globs=s.scenario,
            files=s.scenario_file,
            backend=s.backend,
            memory_budget=s.memory_budget,
        )

    def plan(self, build_plan: Callable[..., Plan], chosen: Sequence[Scenario] | None = None) -> Plan:
        """``build_plan(scenarios, registry=, env_ids=)``'s plan, this shard of it, every revert
        of every set checked against the installed source (one line before any worker); with a
        profile followed beyond its range, the sets of reverts that no longer apply left out
        (``drifted``)."""
        from sglfix.execution.shards import shard_plan

        chosen = self.scenarios() if chosen is None else chosen
        plan = build_plan(chosen, registry=self.target.registry, env_ids=self.env)
        # The whole plan's cells, whichever shard this is: the plan identity a report carries.
        self.whole_cells = [c.id for c in plan.cells]
        if self.shard is not None:
            plan = shard_plan(plan, self.shard, timings=self.timings)
        return self.precheck(plan)

    def precheck(self, plan: Plan) -> Plan:
        """Each toggle set of ``plan`` applied on paper to the installed source of the code base:
        a revert that would fail in every worker (its match not in the code, its target not
        allowed, its replacement not Python) is one line before any worker starts; the plan.

        Following an engine beyond its profile's range (``--profile sglang`` on a checkout newer
        than every profile), the code has moved on from the profile: a revert that no longer
        applies there is a finding (``drifted``, which fails the gate), and the plan goes on
        without the sets that hold it."""
        from sglfix.common.errors import SglfixError
        from sglfix.toggling.doctor import precheck_selections

        registry = self.target.registry
        cb = self.target.codebase

        def check(ids: Sequence[str]) -> None:
            selections = [sel for rid in ids for sel in registry.select(rid)]
            if selections:
                precheck_selections(selections, package=cb.package, allowed_prefixes=self.target.allowed_prefixes)

        inherited = registry.absent(self.env)
        left_out: set[tuple[str, ...]] = set()
        for toggles in dict.fromkeys(tuple(c.toggles) for c in plan.cells):
            absent = registry.absent(toggles)
            if absent:
                # A fix this release predates (or code it does not have): no revert exists here,
                # which is no finding; the set is left out and named. Inherited, it is a baseline
                # the run cannot have: refused.
                if inherited:
                    from sglfix.toggling import ENV_VAR

                    raise ConfigError(f"{ENV_VAR}: {next(iter(inherited.values()))}")
                self.not_applicable.update(absent)
                left_out.add(toggles)
                continue
            try:
                check(toggles)
            except SglfixError as exc:
                conflict = self._conflict(toggles, check)
                if conflict is not None:
                    # The fix and a revert edit the same lines: that cell cannot be built, which
                    # says nothing of the fix; named in the report, not a refusal of the run.
                    from sglfix.execution.planner import set_label

                    self.conflicts[set_label(toggles)] = f"{conflict}: {str(exc).splitlines()[0]}"
                    left_out.add(toggles)
                    continue
                if not cb.beyond or set(toggles) & set(self.env):
                    raise
                for rid in toggles:
                    if rid not in self.drifted:
                        try:
                            check((rid,))
                        except SglfixError as one:
                            self.drifted[rid] = str(one).splitlines()[0]
                if not set(toggles) & set(self.drifted):
                    raise exc  # only together do they fail: not a revert that no longer applies
                left_out.add(toggles)
        if not left_out:
            return plan
        from sglfix.execution.planner import Plan

        return Plan(
            scenarios=plan.scenarios,
            sets=[t for t in plan.sets if t not in left_out],
            env_ids=plan.env_ids,
            cells=[c for c in plan.cells if c.toggles not in left_out],
        )

    @staticmethod
    def _conflict(toggles: Sequence[str], check: Callable[[Sequence[str]], None]) -> str | None:
        """Why a set that holds candidate fixes fails only together (each of its fixes and its
        reverts apply alone): the words of a conflict; None when it is not one."""
        from sglfix.common.errors import SglfixError
        from sglfix.toggling.candidate import split_ids

        fixes, reverts = split_ids(toggles)
        if not fixes or not reverts:
            return None
        try:
            check(fixes)
            check(reverts)
        except SglfixError:
            return None
        return f"{','.join(fixes)} and revert {','.join(reverts)} change the same lines"

    @contextmanager
    def booting(self) -> Iterator[None]:
        """Local workers started now, so that they boot (torch, the code under test, the device)
        while this process plans and prechecks; the next ``workers`` takes them, and those that
        no one took are stopped on leaving. Nothing is started ahead when the result store may
        answer the whole run (a served run starts no worker), nor for Ray: a run refused by the
        plan's checks must not have started a cluster (seconds of start and stop, processes of
        its own)."""
        from sglfix.execution.pool import signals_raise

        s = self.settings
        if s.executor != "local" or (self.store_dir is not None and not s.record):
            yield
            return
        with signals_raise(), self._local_pool(self.jobs) as pool:
            self._booted = pool
            try:
                yield
            finally:
                self._booted = None

    @contextmanager
    def workers(self, *, cells: int | None = None) -> Iterator[WorkerPool | RayPool]:
        """The pool of workers (never more than ``cells``: a worker costs a process start and its
        memory for nothing), SIGTERM turned into an exception while it is open."""
        from sglfix.execution.pool import signals_raise

        jobs = self.jobs if cells is None else max(1, min(self.jobs, cells))
        booted, self._booted = self._booted, None
        pool: WorkerPool | RayPool
        if booted is not None:
            booted.trim(jobs)
            pool = booted
        else:
            pool = self._new_pool(jobs)
        with signals_raise(), pool:
            if self.settings.executor == "local":
                self._check_same_code(pool.info)
            yield pool

    def _new_pool(self, jobs: int) -> WorkerPool | RayPool:
        s = self.settings
        if s.executor == "ray":
            from sglfix.execution.ray_pool import RayPool

            return RayPool(self.config, jobs=jobs, devices=self.gpus, address=s.ray_address, keep=s.ray_keep)
        return self._local_pool(jobs)

    def _local_pool(self, jobs: int) -> WorkerPool:
        s = self.settings
        from sglfix.execution.pool import WorkerPool

        return WorkerPool(
            self.config,
            jobs=jobs,
            devices=self.gpus,
            # One worker a GPU shares it with no one: no daemon for that.
            mps=self.mps and jobs > (len(self.gpus) if self.gpus else 1),
            mps_required=s.mps == "on",
        )

    def _check_same_code(self, info: dict) -> None:
        """The workers import the code base from where this process resolved it (a source tree on
        PYTHONPATH is not shadowed by an installed wheel), or nothing runs."""
        from sglfix.codebases import installed

        cb = self.target.codebase
        here = None if cb.is_reproduction else installed(cb)
        there = (info.get("codebase") or {}).get("path")
        if here is None or there is None or os.path.realpath(here.path) == os.path.realpath(there):
            return
        raise ConfigError(
            f"the workers import {cb.package} from {there}, but this process resolves it at {here.path}; "
            f"put the folder that holds the one to test first on PYTHONPATH"
        )

    @contextmanager
    def pool(self, *, cells: int | None = None) -> Iterator[WorkerPool | RayPool | StoredPool]:
        """What cells run on: the workers (``workers``), through the result store when it is on
        (``sglfix.execution.store.layer``: the cells it holds are answered, the workers started
        only for the others). ``cells``: how many the plan has, if known."""
        store = None
        if self.store_dir is not None and self.settings.record in ((), (EVERY_FUNCTION,)):
            store = self._open_store(self.store_dir)
        if store is None:
            with self.workers(cells=cells) as pool:
                yield pool
            return
        from sglfix.execution.store.layer import StoredPool

        @contextmanager
        def open_pool(size: int | None) -> Iterator[WorkerPool | RayPool]:
            with self.workers(cells=size) as pool:
                store.keep_info(self._pool_info(pool))  # for a later run that starts none
                yield pool

        s = self.settings
        with StoredPool(
            store,
            open_pool=open_pool,
            registry=self.target.registry,
            reachability=s.reachability,
            fingerprint=s.fingerprint,
            served_info=lambda: self._served_info(store.info()),
            expected=cells,
        ) as layer:
            yield layer

    def run(
        self, plan: Plan, *, progress: Callable[[Plan], AbstractContextManager[Callable[[CellResult], None]]]
    ) -> Ran:
        """Every cell of ``plan`` on a fresh pool (``pool``: through the result store when it is
        on, no worker at all when it holds every cell), through reachability when the settings
        ask for it. ``progress(plan)`` is a context manager giving the function each result is
        passed to. With ``--verify-store N``, N served cells are run again fresh on the same
        pool and any difference fails the run (``StoreMismatch``, its entries dropped)."""
        from sglfix.common.version import source
        from sglfix.execution.store.layer import StoredPool

        # The sglfix that runs is the tree as the run starts (read once per process): a report
        # written an hour later must not name a commit made meanwhile.
        source()
        start = time.perf_counter()
        differ: list = []
        verify: list[int] = []
        with self.pool(cells=len(plan.cells)) as pool:
            layer = pool if isinstance(pool, StoredPool) else None
            if layer is None:
                info = self._pool_info(pool)
                start = time.perf_counter()  # the workers' boot is not the run's
            with progress(plan) as tick:
                results = self._run_cells(pool, plan, on_result=tick)
            if layer is not None:
                verify = _verify_sample(
                    [i for i, r in enumerate(results) if r.stored is not None], self.settings.verify_store
                )
                differ = self._verify(layer, plan, results, verify)
                info = self._pool_info(layer.pool) if layer.pool is not None else layer.info
            replacements = list(getattr(pool, "replacements", []))
            reran = list(getattr(pool, "reran_alone", []))
            wall = time.perf_counter() - start
        said = None
        if layer is not None:
            _fail_on(differ, checked=len(verify), where=layer.store.directory)
            wall = time.perf_counter() - start  # the store's last writes are the run's
            said = {
                "path": layer.store.directory,
                "served": layer.served,
                "ran": len(plan.cells) - layer.served,
                **({"verified": len(verify)} if verify else {}),
                **({"failed": layer.store.failed} if layer.store.failed else {}),
            }
        return self._ran(
            plan, info=info, results=results, wall=wall, replacements=replacements, reran=reran, store=said
        )

    def _run_cells(
        self, pool: WorkerPool | RayPool | StoredPool, plan: Plan, *, on_result: Callable[[CellResult], None]
    ) -> list[CellResult]:
        """The plan's cells on ``pool``, results in plan order: baselines first and only the cells
        they reach (reachability), or each cell recording what the settings ask, or as they are."""
        if self.settings.reachability and len(plan.sets) > 1:
            from sglfix.execution.reach import run_reaching

            return run_reaching(
                pool, plan.cells, base=tuple(plan.sets[0]), registry=self.target.registry, on_result=on_result
            )
        cells: Sequence[Cell] = plan.cells
        if self.settings.record:  # every function (mutate's baselines), or --reach-file's targets
            from sglfix.execution.reach import RecordingCell

            record = tuple(self.settings.record)
            cells = [RecordingCell(c.scenario, tuple(c.toggles), record) for c in cells]
        return pool.run(cells, on_result=on_result)

    def _verify(self, pool: Any, plan: Any, results: list, verify: list[int]) -> list:
        """``--verify-store``: the cells at ``verify`` (served) run again fresh, through no store
        and no reachability record (a served NOT_REACHED mark is checked against the cell itself
        run); each that differs, named, its entry dropped."""
        from sglfix.report.outcome import effective

        if not verify:
            return []
        fresh = pool.fresh([plan.cells[i] for i in verify])
        differ = [
            (plan.cells[i].id, results[i], again)
            for i, again in zip(verify, fresh, strict=True)
            if effective({"verdict": results[i].verdict, "findings": results[i].findings}) != again.verdict
        ]
        for _, was, _ in differ:
            pool.drop(was)
        return differ

    def _pool_info(self, pool: Any) -> dict:
        """What the workers said of themselves, how many there are, and whether under MPS."""
        return {
            **pool.info,
            "workers": len(getattr(pool, "workers", ()) or ()) or self.jobs,
            "mps": bool(getattr(pool, "mps", False)),
        }

    def _ran(
        self,
        plan: Any,
        *,
        info: dict,
        results: list,
        wall: float,
        replacements: list,
        reran: Sequence[str] = (),
        store: Any = None,
    ) -> Ran:
        return Ran(
            registry=self.target.registry,
            env=self.env,
            plan=plan,
            info=info,
            results=results,
            wall=wall,
            shard=self.shard,
            replacements=replacements,
            reran_alone=list(reran),
            drifted=dict(self.drifted),
            not_applicable=dict(self.not_applicable),
            candidates=tuple(self.target.candidates),
            conflicts=dict(self.conflicts),
            store=store,
        )

    def _open_store(self, directory: str) -> ResultStore | None:
        """The result store for this run's context; None (one line said why) when the default
        folder cannot be used. A folder given with --cache was checked at start."""
        from sglfix.codebases import installed
        from sglfix.common.codebase import package_dir
        from sglfix.execution.store import ResultStore
        from sglfix.execution.store.keys import context_key

        cb = self.target.codebase
        device = self.device
        if device == "auto":
            device = "cuda" if has_cuda_device() else "cpu"
        root = package_dir(cb.package) if cb.is_reproduction else getattr(installed(cb), "path", None)
        if root is None:
            return None
        context, parts = context_key(device=device, codebase=cb, profile=self.target.profile, root=root)
        try:
            return ResultStore(directory, context=context, parts=parts, top=os.path.dirname(root))
        except Exception as exc:  # an unusable default folder: the run goes on without a store
            import sys

            print(
                f"sglfix: the result store at {self.store_dir} cannot be used ({type(exc).__name__}: {exc}); "
                f"running every cell (--cache DIR picks another folder, --no-cache turns it off)",
                file=sys.stderr,
            )
            return None

    def _served_info(self, kept: dict | None) -> dict:
        """The workers' facts for a run the store answered whole (no worker started): an earlier
        run's, where it kept them, with the code base as this run resolves it (its path and
        version: what this run would have imported, not what the earlier one did)."""
        from sglfix.codebases import installed

        info = {**(kept or {"device": self.device}), "workers": 0}
        cb = self.target.codebase
        here = installed(cb)
        codebase = dict(info.get("codebase") or {"name": cb.name})
        if here is not None:
            codebase.update(here.to_json())
        for key in ("modules_loaded", "reproduction_modules_loaded", "standins"):
            codebase.pop(key, None)  # what a worker's import found: none ran
        info["codebase"] = codebase
        return info


def _verify_sample(served: list[int], n: int) -> list[int]:
    """``n`` of the served cells' places, drawn at random (in plan order)."""
    if n <= 0 or not served:
        return []
    import random

    return sorted(random.SystemRandom().sample(served, min(n, len(served))))


def _fail_on(differ: list, *, checked: int, where: str) -> None:
    """``--verify-store``'s verdict: each served cell whose fresh run differs, named, exit 1."""
    if not differ:
        return
    from sglfix.execution.store import StoreMismatch

    shown = "; ".join(
        f"{cid}: served {_said(was)} (stored {was.stored}), fresh {again.verdict}" for cid, was, again in differ
    )
    raise StoreMismatch(
        f"--verify-store: {len(differ)} of {checked} served cell(s) differ from a fresh run: {shown}; "
        f"their entries are dropped from the store at {where}"
    )


def _said(result: Any) -> str:
    """A served verdict as the mismatch names it (a NOT_REACHED mark with what it stands for)."""
    from sglfix.report.outcome import effective

    if result.verdict == "NOT_REACHED":
        return f"NOT_REACHED (as its baseline: {effective({'verdict': result.verdict, 'findings': result.findings})})"
    return result.verdict


def check_store(settings: Settings) -> str | None:
    """The result store's folder for these settings (None: off). ``--cache DIR`` that cannot be
    made or written is one line before any worker starts."""
    from sglfix.execution.store import default_dir, store_disabled_by_env

    verify = settings.verify_store
    if verify < 0:
        raise ConfigError(f"--verify-store {verify}: give how many served cells to run again (e.g. --verify-store 5)")
    if settings.no_cache:
        if settings.cache is not None:
            raise ConfigError("--cache DIR keeps results and --no-cache keeps none: give one of them")
        if verify:
            raise ConfigError(
                "--verify-store checks the result store's answers and --no-cache reads none: give one of them"
            )
        return None
    if settings.record and verify:
        raise ConfigError(
            "--verify-store checks the result store's answers and --reach-file runs every cell: give one of them"
        )
    if settings.cache is None:
        if store_disabled_by_env():
            if verify:
                raise ConfigError(
                    f"--verify-store checks the result store's answers, and {envs.SGLFIX_STORE.name}=0 turns the "
                    "store off: unset it, or give --cache DIR"
                )
            return None
        return default_dir()
    if not settings.cache.strip():
        raise ConfigError(
            "--cache '': give the result store's folder (e.g. --cache ~/.cache/sglfix/results), or --no-cache"
        )
    path = os.path.abspath(os.path.expanduser(settings.cache))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--cache {settings.cache}: that is a file, not a folder; give a folder, or --no-cache")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".sglfix-write-{os.getpid()}")
        with open(probe, "w") as fh:
            fh.write("")
        os.remove(probe)
    except OSError as exc:
        raise ConfigError(
            f"--cache {settings.cache}: cannot write there ({exc.strerror or exc}); give a folder you can write, "
            "or --no-cache"
        ) from None
    from sglfix.execution.store.folder import MARKER, folder_state

    if folder_state(path).kind == "foreign":
        # A store tags its folder for backup tools to skip: never a folder that holds the user's files.
        raise ConfigError(
            f"--cache {settings.cache}: that folder holds other files and is not an sglfix result store (no {MARKER}); "
            "give a new or empty folder, or one a run made, or --no-cache"
        )
    return path


def chosen_store_folder(cache: str | None) -> str:
    """The store folder a command names: ``--cache DIR``, else ``SGLFIX_STORE``, else the default
    one under sglfix's cache, as ``check_store`` chooses it for the commands that run cells
    (``sglfix cache``: nothing is made or written here)."""
    from sglfix.execution.store import STORE_ENV, default_dir, store_disabled_by_env

    if cache is not None:
        if not cache.strip():
            raise ConfigError("--cache '': give the result store's folder (e.g. --cache ~/.cache/sglfix/results)")
        return os.path.abspath(os.path.expanduser(cache))
    if store_disabled_by_env():
        raise ConfigError(
            f"{STORE_ENV}={os.environ.get(STORE_ENV)} turns the result store off: give --cache DIR to name a "
            f"store's folder, or unset {STORE_ENV}"
        )
    return os.path.abspath(os.path.expanduser(default_dir()))


def choose_scenarios(
    *, profile: Any, globs: Sequence[str], files: Sequence[str], backend: str | None, memory_budget: str | None = None
) -> list:
    """The profile's built-in scenarios, or only ``files`` when given; those ``globs`` and
    ``backend`` select, checked (sizes, the memory estimate of each selected one, what the
    profile's code base can run) before any cell runs."""
    from sglfix.codebases import check_scenarios_runnable, get_codebase
    from sglfix.scenario import load_scenarios, select_scenarios
    from sglfix.scenario.memory import check_memory, parse_size

    budget = parse_size(memory_budget, what="--memory-budget") if memory_budget is not None else None
    scenarios = load_scenarios(list(files), builtin=not files, check_budget=False, builtin_dir=profile.scenarios_dir)
    chosen = select_scenarios(scenarios, globs=list(globs), backend=backend)
    # The budget is what a worker will hold: only the scenarios that run are measured against it.
    check_memory(chosen, budget_bytes=budget)
    check_scenarios_runnable(chosen, get_codebase(profile.codebase))
    return chosen


def env_ids(registry: Any) -> tuple[str, ...]:
    """What REVERT_PR selects, as the ids the user wrote (validated: exit 2 if bad)."""
    from sglfix.toggling import selects_nothing
    from sglfix.toggling.env import parse_env_value

    value = envs.REVERT_PR.get()
    parse_env_value(value, registry=registry)
    if value is None or selects_nothing(value):
        return ()
    return tuple(t.strip() for t in value.split(","))


def check_env_baseline(env: Sequence[str], accepted: bool | None, *, what: str) -> None:
    """A matrix or bisect judges toggles against a baseline that must be the code as installed:
    a revert inherited from the environment is refused in one line (``accepted`` None: a ``run``,
    whose reverts add to the variable's by design)."""
    if not env or accepted is None or accepted:
        return
    from sglfix.toggling import ENV_VAR

    raise ConfigError(
        f"{ENV_VAR}={','.join(env)} is set: the {what}'s baseline would not be the code as installed; "
        f"unset it (env -u {ENV_VAR} sglfix {what} ...), or give --env-baseline to judge against that set"
    )


def check_ray_keep(keep: float | None, *, executor: str, address: str | None) -> None:
    """``--ray-keep``: seconds in (0, 86400], only for a run joined to a cluster."""
    import math

    if keep is None:
        return
    from sglfix.execution.ray_pool import MAX_KEEP_S

    if executor != "ray" or address is None:
        raise ConfigError(
            "--ray-keep leaves actors in a running Ray cluster: give --executor ray --ray-address ADDR with it"
        )
    if not math.isfinite(keep) or not 0 < keep <= MAX_KEEP_S:
        raise ConfigError(f"--ray-keep {keep:g}: give seconds above 0 and at most {MAX_KEEP_S:g} (e.g. --ray-keep 600)")


def check_env_knobs() -> None:
    """The environment settings a worker reads, checked in the parent: a bad value is one line
    before any worker starts, never a silent default."""
    memo = envs.SGLFIX_KERNEL_MEMO_MB
    if memo.is_set():
        try:
            ok = memo.get() >= 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(
                f"{memo.name}={memo.raw()!r}: give the kernel memo's size in MiB (e.g. 256; 0 "
                f"turns it off), or unset it"
            )
