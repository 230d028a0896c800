"""What ``run`` and ``matrix`` share: scenario selection, the env toggle, the worker pool, tables."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.text import Text

from sglfix.cli.complete import scenario_names
from sglfix.cli.context import Options, _has_cuda_device, err
from sglfix.common.errors import ConfigError

ScenarioGlobs = Annotated[
    list[str],
    typer.Option(
        "--scenario",
        "-s",
        metavar="GLOB",
        autocompletion=scenario_names,
        help="Only scenarios whose name matches (repeatable).",
    ),
]
ScenarioFiles = Annotated[
    list[str],
    typer.Option("--scenario-file", metavar="PATH", help="Scenario YAML file (repeatable); replaces the built-in set."),
]
BackendName = Annotated[str | None, typer.Option("--backend", metavar="NAME", help="Only scenarios of this backend.")]


class DeviceChoice(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class ExecutorChoice(StrEnum):
    local = "local"
    ray = "ray"


def _plain(value: Any) -> Any:
    # Typer hands an Enum member; the commands, workers and reports deal in plain strings.
    return value.value if isinstance(value, StrEnum) else value


Device = Annotated[
    DeviceChoice,
    typer.Option(
        "--device",
        help="Where cells run: auto takes cuda when a GPU is visible.",
        callback=_plain,
        case_sensitive=False,
    ),
]
Jobs = Annotated[
    int | None,
    typer.Option(
        "--jobs", "-j", help="Worker processes (default on a GPU: from its memory and the cores, up to 8; 2 on CPU)."
    ),
]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds per cell before TIMEOUT (finite, > 0).")]
JsonFile = Annotated[
    str | None, typer.Option("--json", metavar="FILE", help="Write the report as JSON (- for stdout).")
]
JunitFile = Annotated[
    str | None,
    typer.Option(
        "--junit", metavar="FILE", help="Also write JUnit XML (.xml): one testcase per cell, for CI test views."
    ),
]
MarkdownFile = Annotated[
    str | None,
    typer.Option(
        "--markdown",
        metavar="FILE",
        help="Also write a Markdown summary (.md); it is appended to $GITHUB_STEP_SUMMARY whenever that is set, option or not.",
    ),
]
HeatmapFile = Annotated[
    str | None,
    typer.Option(
        "--heatmap",
        metavar="FILE",
        help="Also draw the grid coloured by verdict (.png or .svg; pip install 'sglfix[plot]').",
    ),
]
NoReachability = Annotated[
    bool,
    typer.Option(
        "--no-reachability",
        help="Run every cell, also those whose reverted functions the scenario's baseline never enters (otherwise marked NOT_REACHED, not run).",
    ),
]
ShowAll = Annotated[
    bool,
    typer.Option(
        "--all",
        help="Show every cell (the whole table or grid) and every name; by default the console shows what did not pass and the counts. The reports keep everything either way.",
    ),
]
EnvBaseline = Annotated[
    bool,
    typer.Option(
        "--env-baseline",
        help="Judge against the set SGLANG_DEBUG_REVERT_PR selects as the baseline (otherwise a set variable is "
        "refused: the baseline must be the code as installed); the header and the gate name it, and no "
        "expectation is checked.",
    ),
]
DeviceList = Annotated[
    str | None,
    typer.Option(
        "--devices", metavar="LIST", help="One worker per GPU: cuda:0,cuda:1 (or 0,1), or all; implies --device cuda."
    ),
]
Executor = Annotated[
    ExecutorChoice,
    typer.Option(
        "--executor",
        callback=_plain,
        case_sensitive=False,
        help="local: worker processes on this machine; ray: one Ray actor per worker (pip install 'sglfix[ray]').",
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDR",
        help="Join this Ray cluster (e.g. auto, ray://head:10001); default: a private local Ray instance.",
    ),
]
RayKeep = Annotated[
    float | None,
    typer.Option(
        "--ray-keep",
        metavar="SECONDS",
        help="With --ray-address: leave the actors in the cluster, idle, this long (at most 86400) for the "
        "next run to take warm; a run of the same sglfix, toggles and options claims them.",
    ),
]
ShardSpec = Annotated[
    str | None,
    typer.Option(
        "--shard",
        metavar="I/N",
        help="Run only the i-th of N shards (whole scenarios, balanced by cost); `sglfix report merge` joins the shards' reports into the whole run's.",
    ),
]
ShardCosts = Annotated[
    str | None,
    typer.Option(
        "--shard-costs",
        metavar="REPORT.json",
        help="Balance the shards by the cell timings of an earlier report (default: an estimate from each scenario's size).",
    ),
]
MemoryBudget = Annotated[
    str | None,
    typer.Option(
        "--memory-budget",
        metavar="SIZE",
        help="Refuse scenarios estimated to need more memory (e.g. 16G; env SGLFIX_MEMORY_BUDGET).",
    ),
]

VERDICT_STYLE = {
    "PASS": "green",
    "SKIP": "dim",
    "NOT_REACHED": "dim cyan",
    "SYNC": "yellow",
    "DIVERGE": "red",
    "NAN": "red",
    "INVARIANT": "magenta",
    "CRASH": "bold red",
    "TIMEOUT": "bold red",
    "FAULT": "bold red",
    "ERROR": "bold white on red",
}


def verdict_text(verdict: str) -> Text:
    return Text(verdict, style=VERDICT_STYLE.get(verdict, ""))


def check_device(device: str) -> None:
    """``--device cuda`` where no GPU is visible is one line before any worker starts. The check
    reads the device nodes and CUDA_VISIBLE_DEVICES only (this process never imports torch); a
    GPU that is there but unusable (a CPU build of torch) is still reported by the first worker."""
    if device == "cuda" and not _has_cuda_device():
        raise ConfigError("--device cuda: no CUDA device here; use --device cpu")


# What a worker holds on the GPU: up to 4 GiB of allocator cache between cells
# (sglfix.harness.allocator) plus what its current cell needs (inputs, KV pools, the graphs'
# pools, the 384 MiB FlashInfer workspace). Measured peaks of the whole GPU per worker count are
# in bench/results/workers-h100.json; eight workers with caches kept whole ran out of memory.
_GPU_GIB_PER_WORKER = 10
_MAX_GPU_WORKERS = 8


def default_gpu_workers() -> int:
    """Workers sharing one GPU when --jobs is not given. A cell is host-bound (Python, kernel
    launches, metadata building), so several workers keep one GPU busy: half the cores this
    process may use (the rest serve the parent and the kernel compilers), no more than the GPU's
    memory holds at what one worker keeps, and at most 8."""
    import subprocess

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    by_cores = max(1, cores // 2)
    try:
        probe = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        mib = min(int(line) for line in probe.stdout.split())
    except (OSError, ValueError, subprocess.SubprocessError):
        return min(by_cores, 2)  # memory unknown: the two that fit any GPU sglfix runs on
    return max(1, min(by_cores, mib // (_GPU_GIB_PER_WORKER * 1024), _MAX_GPU_WORKERS))


def max_jobs() -> int:
    """The most worker processes sglfix starts here: 4 per core this process may use, and no more
    than one per GiB of the machine's memory (a worker holds torch and the code base; past that
    the machine swaps instead of running cells)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**30
    except (ValueError, OSError, AttributeError):
        gib = 4 * cores
    return max(1, min(4 * cores, gib))


def check_jobs(jobs: int | None, device: str) -> int:
    if jobs is None:
        if device == "cuda" or (device == "auto" and _has_cuda_device()):
            return default_gpu_workers()
        return max(1, min(2, os.cpu_count() or 1))
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs} must be at least 1")
    ceiling = max_jobs()
    if jobs > ceiling:
        raise ConfigError(
            f"--jobs {jobs} is more workers than this machine can run at once (at most {ceiling}: 4 per core, "
            f"one per GiB of memory); give --jobs {ceiling} or fewer"
        )
    return jobs


def parse_devices(text: str) -> list[str]:
    """``cuda:0,cuda:1`` / ``0,1`` / ``all`` -> CUDA device indices, checked (exit 2 if bad)."""
    value = text.strip()
    if value == "all":
        count = _cuda_device_count()
        if count < 1:
            raise ConfigError("--devices all: no CUDA device here; run on a GPU machine or use --jobs N on CPU")
        return [str(i) for i in range(count)]
    out: list[str] = []
    for item in value.split(","):
        item = item.strip()
        index = item[len("cuda:") :] if item.startswith("cuda:") else item
        # ASCII digits only: str.isdigit() also takes superscripts ("²"), which int() refuses.
        if not (index.isascii() and index.isdigit()) or len(index) > 4:
            raise ConfigError(f"--devices {text!r}: {item!r} is not a CUDA device; give cuda:0,cuda:1 (or 0,1) or all")
        if index in out:
            raise ConfigError(f"--devices {text!r}: cuda:{index} is listed twice")
        out.append(str(int(index)))
    return out


def _cuda_device_count() -> int:
    """How many GPUs a worker would see, asked of a fresh interpreter (this process never imports torch)."""
    import subprocess
    import sys

    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        return int(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ConfigError(
            f"--devices all: could not count the GPUs ({(probe.stderr or probe.stdout).strip()[-200:]})"
        ) from None


def revert_ids(revert: Sequence[str]) -> list[str]:
    """``-r a,b -r c`` -> [a, b, c]; an empty id is an error, never 'nothing'."""
    from sglfix.toggling.ids import ToggleId

    return [str(i) for i in ToggleId.parse_list(list(revert), what="--revert")]


def env_ids(registry) -> tuple[str, ...]:
    """What SGLANG_DEBUG_REVERT_PR selects, as the ids the user wrote (validated: exit 2 if bad)."""
    from sglfix.toggling import ENV_VAR, selects_nothing
    from sglfix.toggling.env import parse_env_value

    value = os.environ.get(ENV_VAR)
    parse_env_value(value, registry=registry)
    if selects_nothing(value):
        return ()
    return tuple(t.strip() for t in value.split(","))


def load_selected(
    opts: Options,
    scenario_globs: Sequence[str],
    scenario_files: Sequence[str],
    backend: str | None,
    memory_budget: str | None = None,
):
    """The profile's built-in scenarios, or only the given files when --scenario-file is used;
    sizes, the memory estimate and what the profile's code base can run checked at load (exit 2
    before any cell runs)."""
    from sglfix.codebases import check_scenarios_runnable, get_codebase
    from sglfix.scenario import load_scenarios, select_scenarios
    from sglfix.scenario.memory import check_memory, parse_size

    profile = opts.active_profile()
    budget = parse_size(memory_budget, what="--memory-budget") if memory_budget is not None else None
    scenarios = load_scenarios(
        list(scenario_files), builtin=not scenario_files, check_budget=False, builtin_dir=profile.scenarios_dir
    )
    chosen = select_scenarios(scenarios, globs=list(scenario_globs), backend=backend)
    # The budget is what a worker will hold: only the scenarios that run are measured against it.
    check_memory(chosen, budget_bytes=budget)
    check_scenarios_runnable(chosen, get_codebase(profile.codebase))
    return chosen


@dataclass
class Outputs:
    """The report files asked for: all checked before any cell runs, written after the run."""

    json: str | None = None
    junit: str | None = None
    markdown: str | None = None
    heatmap: str | None = None

    def check(self) -> None:
        from sglfix.report.heatmap import check_heatmap_path
        from sglfix.report.junit import check_junit_path
        from sglfix.report.markdown import check_markdown_path
        from sglfix.report.output import check_output_path

        check_output_path(self.json, option="--json")
        check_junit_path(self.junit, option="--junit")
        check_markdown_path(self.markdown, option="--markdown")
        check_heatmap_path(self.heatmap, option="--heatmap")


@dataclass
class Ran:
    """A plan run through the worker pool, with what the report and the tables need."""

    registry: Any
    env: tuple[str, ...]
    plan: Any
    info: dict
    results: list
    wall: float
    shard: Any = None  # the Shard this run was, if --shard
    replacements: list = field(default_factory=list)  # why each worker was replaced between sets


def run_plan(
    opts: Options,
    *,
    build_plan: Callable[..., Any],
    scenario: Sequence[str],
    scenario_file: Sequence[str],
    backend: str | None,
    device: str,
    jobs: int | None,
    timeout: float,
    outputs: Outputs,
    memory_budget: str | None,
    reachability: bool = False,
    shard: str | None = None,
    shard_costs: str | None = None,
    devices: str | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    ray_keep: float | None = None,
    env_baseline: bool | None = None,
) -> Ran:
    """Every option checked first (exit 2 before any cell runs: the worker config checks device
    and timeout), then the workers boot while the scenarios load and the plan is built.
    ``build_plan(scenarios, registry=, env_ids=)`` makes the plan. ``reachability``: run the plan's
    baseline first and mark the cells whose reverted functions it never enters NOT_REACHED."""
    from sglfix.execution.pool import WorkerConfig, WorkerPool, signals_raise
    from sglfix.execution.shards import parse_shard

    outputs.check()
    if executor not in ("local", "ray"):
        raise ConfigError(f"--executor {executor!r}: use local or ray")
    if ray_address is not None and executor != "ray":
        raise ConfigError("--ray-address joins a Ray cluster: give --executor ray with it")
    check_ray_keep(ray_keep, executor=executor, address=ray_address)
    gpus = None
    if devices is not None:
        if device not in ("auto", "cuda"):
            raise ConfigError(f"--devices {devices} runs on GPUs; drop --device {device} (or use --jobs N on CPU)")
        if jobs is not None:
            raise ConfigError("--devices starts one worker per GPU; give --devices or --jobs, not both")
        gpus = parse_devices(devices)
        device = "cuda"
    part = parse_shard(shard) if shard is not None else None
    if shard_costs is not None and part is None:
        raise ConfigError("--shard-costs balances shards: give --shard I/N with it")
    timings = None
    if shard_costs is not None:
        from sglfix.report.load import cell_costs, load_report

        timings = cell_costs(load_report(shard_costs))
    if gpus is not None and not _has_cuda_device():
        # Name CUDA_VISIBLE_DEVICES only when the user set it: it may be what hides the GPU.
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        hidden = f" (CUDA_VISIBLE_DEVICES={shown} is set)" if shown is not None else ""
        raise ConfigError(
            f"--devices {devices}: this machine has no CUDA device{hidden}; run it on a GPU machine, "
            "or use --device cpu (--jobs N for several workers)"
        )
    check_device(device)
    check_env_knobs()
    registry = opts.registry()
    codebase = opts.codebase()
    if device == "cpu" or (device == "auto" and not _has_cuda_device()):
        from sglfix.codebases import check_interpreter

        check_interpreter(codebase, what=f"--profile {opts.active_profile().name}")
    config = WorkerConfig(
        device=device,
        timeout=timeout,
        allowed_prefixes=opts.allowed_prefixes(),
        toggles_dir=str(registry.directory) if opts.toggles is not None else None,
        codebase=codebase.name,
    )
    env = env_ids(registry)
    check_env_baseline(env, env_baseline, what="matrix")
    pool_class, where = WorkerPool, {}
    if executor == "ray":
        from sglfix.execution.ray_pool import RayPool

        # Ray takes seconds to start or join: an address that answers nothing is refused instead
        # of waited on.
        check_ray_address(ray_address)
        quiet_ray_logs()
        pool_class, where = RayPool, {"address": ray_address, "keep": ray_keep}
    jobs = check_jobs(jobs, device)
    # Everything a cell would meet first is checked before any worker starts: the scenarios, the
    # plan, and every revert of every set against the code base's installed source.
    plan = _plan(opts, build_plan, scenario, scenario_file, backend, memory_budget, registry, env, part, timings)
    precheck_plan(plan, registry=registry, codebase=codebase, allowed_prefixes=opts.allowed_prefixes())
    # Never more workers than cells: a worker costs a process start and its memory for nothing.
    jobs = max(1, min(jobs, len(plan.cells)))
    with signals_raise(), pool_class(config, jobs=jobs, devices=gpus, **where) as pool:
        info = {**pool.info, "workers": len(getattr(pool, "workers", ()) or ()) or jobs}
        results, wall = execute(pool, plan, registry=registry if reachability else None)
        replacements = report_replacements(pool)
    return Ran(
        registry=registry,
        env=env,
        plan=plan,
        info=info,
        results=results,
        wall=wall,
        shard=part,
        replacements=replacements,
    )


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


def _plan(
    opts: Options,
    build_plan: Callable[..., Any],
    scenario: Sequence[str],
    scenario_file: Sequence[str],
    backend: str | None,
    memory_budget: str | None,
    registry: Any,
    env: tuple,
    part: Any,
    timings: Any,
) -> Any:
    from sglfix.execution.shards import shard_plan

    chosen = load_selected(opts, scenario, scenario_file, backend, memory_budget)
    plan = build_plan(chosen, registry=registry, env_ids=env)
    return shard_plan(plan, part, timings=timings) if part is not None else plan


def precheck_plan(plan: Any, *, registry: Any, codebase: Any, allowed_prefixes: Any) -> None:
    """Each toggle set of ``plan`` applied on paper to the installed source of ``codebase``:
    a revert that would fail in every worker (its match not in the code, its target not allowed,
    its replacement not Python) is one line before any worker starts."""
    from sglfix.toggling.doctor import precheck_selections

    for toggles in dict.fromkeys(tuple(c.toggles) for c in plan.cells):
        selections = [sel for rid in toggles for sel in registry.select(rid)]
        if selections:
            precheck_selections(selections, package=codebase.package, allowed_prefixes=allowed_prefixes)


def check_ray_address(address: str | None) -> None:
    """``--ray-address``: ``auto``, or ``[ray://]host:port`` that answers as a Ray head (gRPC)
    within a few seconds (one line otherwise, before Ray is imported)."""
    if address is None or address == "auto":
        return
    from sglfix.execution.ray_probe import probe_ray

    text = address.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {address!r}: give auto or host:port (e.g. 10.0.0.5:6379)")
    try:
        why = probe_ray(host.strip("[]"), int(port), connect_s=3.0)
    except OSError as exc:
        raise ConfigError(
            f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); start the Ray "
            f"head (ray start --head) or give its address"
        ) from None
    # Ray's own join would wait a minute or more on a server that is not Ray before it gives up.
    if why is not None:
        raise ConfigError(
            f"--ray-address {address} is not a Ray head: {why}; give the address ray start --head "
            f"prints (e.g. 10.0.0.5:6379) or ray://head:10001"
        )


def quiet_ray_logs() -> None:
    """Ray's own warnings (token authentication on or off, and the like) are not this command's
    output: the CLI keeps Ray's loggers at ERROR. A library user of RayPool keeps theirs."""
    import logging

    logging.getLogger("ray").setLevel(logging.ERROR)


def check_ray_keep(keep: float | None, *, executor: str, address: str | None) -> None:
    """``--ray-keep``: seconds in (0, 86400], only for a run joined to a cluster."""
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
    raw = os.environ.get("SGLFIX_KERNEL_MEMO_MB")
    if raw is not None:
        try:
            ok = float(raw) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(
                f"SGLFIX_KERNEL_MEMO_MB={raw!r}: give the kernel memo's size in MiB (e.g. 256; 0 "
                f"turns it off), or unset it"
            )


def report_replacements(pool: Any) -> list[str]:
    """Each worker replaced between toggle sets (a restore that failed, or a set that left the
    code's state changed), one line on stderr each; the list goes into the report."""
    whys = list(getattr(pool, "replacements", []))
    for why in whys:
        err.print(f"sglfix: warning: a worker was replaced: {why}")
    return whys


def judge_ran(
    opts: Options, ran: Ran, *, mode: str, expects: Sequence[Any] = (), known: Sequence[Any] = ()
) -> tuple[dict, Any]:
    """The report of ``ran`` and its judgement (``sglfix.report.outcome``): every cell's meaning,
    the expectations checked and not, the known divergences seen. The console, the exit code and
    every report file read this one judgement."""
    from sglfix.report.jsonreport import build_report
    from sglfix.report.outcome import judge
    from sglfix.toggling import ENV_VAR

    report = build_report(
        command=opts.argv,
        info=ran.info,
        results=ran.results,
        cell_ids=[c.id for c in ran.plan.cells],
        wall_s=ran.wall,
        env_revert=os.environ.get(ENV_VAR),
    )
    if ran.shard is not None:
        report["shard"] = str(ran.shard)
    report["worker_replacements"] = list(ran.replacements)
    judgement = judge(report, mode=mode, expects=expects, known=known, base=ran.env)
    judgement.annotate(report)
    return report, judgement


def write_outputs(report: dict, outputs: Outputs, *, gate: bool | None = None, judgement: Any = None) -> None:
    """``report`` to every file ``outputs`` names, and its Markdown to the step summary; the
    JUnit and Markdown read ``judgement`` (the report's own when not given)."""
    from sglfix.report.markdown import STEP_SUMMARY
    from sglfix.report.output import write_json

    summary = os.environ.get(STEP_SUMMARY)
    if not any((outputs.json, outputs.junit, outputs.markdown, outputs.heatmap, summary)):
        return
    if judgement is None:
        from sglfix.report.outcome import judge

        judgement = judge(report, mode=None if gate is None else "gate" if gate else "findings")
    if outputs.json:
        write_json(outputs.json, report)
    if outputs.junit:
        from sglfix.report.junit import write_junit

        write_junit(report, outputs.junit, judgement=judgement)
    if outputs.heatmap:
        from sglfix.report.heatmap import write_heatmap

        write_heatmap(report, outputs.heatmap)
    if outputs.markdown or summary:
        from sglfix.report.markdown import append_step_summary, render_markdown
        from sglfix.report.output import write_atomic

        text = render_markdown(report, judgement=judgement)
        if outputs.markdown:
            write_atomic(outputs.markdown, text)
        try:
            append_step_summary(text)
        except OSError as exc:  # the run's result stands; only the CI summary is lost
            err.print(f"sglfix: warning: could not append to {STEP_SUMMARY}={summary}: {exc.strerror or exc}")


class Work:
    """How far a plan has come, by the expected cost of its cells rather than their number: a
    cell weighs its scenario's size estimate (``sglfix.execution.shards.scenario_cost``), and one
    that turns out NOT_REACHED (never run: it costs nothing) leaves the total instead of advancing,
    so the fraction tracks time even when most cells are not reached."""

    def __init__(self, cells: Sequence[Any]) -> None:
        from sglfix.execution.shards import scenario_cost

        self.weight: dict[str, float] = {}
        for cell in cells:
            scenario = getattr(cell, "scenario", None)
            if scenario is not None and scenario.name not in self.weight:
                self.weight[scenario.name] = scenario_cost(scenario)
        self.cells = len(cells)
        self.total = sum(self.weight.get(getattr(getattr(c, "scenario", None), "name", ""), 1.0) for c in cells)
        self.done = 0.0
        self.count = 0

    def settle(self, result: Any) -> float:
        """Count ``result``'s cell; returns how much work it did (0 for one not reached)."""
        self.count += 1
        weight = self.weight.get(getattr(result, "scenario", ""), 1.0)
        if result.verdict == "NOT_REACHED":
            self.total -= weight
            return 0.0
        self.done += weight
        return weight

    @property
    def fraction(self) -> float:
        return 1.0 if self.total <= 0 else min(1.0, self.done / self.total)


class LogProgress:
    """Progress for a log, not a terminal (CI): nothing for a run that ends within ``quiet_s``,
    then a plain line on stderr at each tenth of the expected work (``Work``) or every ``every_s``
    seconds, whichever comes first, so a long matrix shows it is alive and how it goes."""

    def __init__(self, work: Work, *, quiet_s: float = 5.0, every_s: float = 30.0, clock=time.perf_counter) -> None:
        from sglfix.common.verdicts import FAILING

        self.failing_verdicts = FAILING
        self.work, self.quiet_s, self.every_s, self.clock = work, quiet_s, every_s, clock
        self.start = clock()
        self.failing = 0
        self.last_line: float | None = None
        self.last_tenth = 0

    def tick(self, result: Any) -> None:
        """After ``work.settle(result)``."""
        self.failing += result.verdict in self.failing_verdicts
        now, work = self.clock(), self.work
        tenth = int(work.fraction * 10)
        if now - self.start < self.quiet_s or work.count == work.cells:
            return
        due = self.last_line is None or tenth > self.last_tenth or now - self.last_line >= self.every_s
        if due:
            self.last_line, self.last_tenth = now, tenth
            err.print(
                f"sglfix: {work.count}/{work.cells} cells, {100 * work.fraction:.0f}% of the work, "
                f"{now - self.start:.0f} s, {self.failing} not passing so far"
            )


def execute(pool, plan, *, registry=None) -> tuple[list, float]:
    """Run the plan with a progress bar on a terminal, progress lines in a log (``LogProgress``),
    both by expected work (``Work``); with ``registry``, through reachability."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.perf_counter()
    work = Work(plan.cells)
    log = None if err.is_terminal else LogProgress(work)
    with Progress(
        TextColumn("cells"),
        BarColumn(),
        TextColumn("{task.fields[count]} {task.percentage:>3.0f}%", markup=False),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}", markup=False),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        task = progress.add_task("", total=work.total, last="", count=f"0/{work.cells}")

        def tick(result) -> None:
            work.settle(result)
            progress.update(
                task,
                completed=work.done,
                total=work.total,
                last=f"{result.scenario} {result.verdict}",
                count=f"{work.count}/{work.cells}",
            )
            if log is not None:
                log.tick(result)

        if registry is not None and len(plan.sets) > 1:
            from sglfix.execution.reach import run_reaching

            results = run_reaching(pool, plan.cells, base=plan.sets[0], registry=registry, on_result=tick)
        else:
            results = pool.run(plan.cells, on_result=tick)
    return results, time.perf_counter() - start


def summary_line(what: str, results: Sequence[Any], *, wall: float, outcome: str, outputs: Outputs) -> Text:
    """The last line of ``run`` and ``matrix``: counts by verdict (most severe first), the
    outcome (what the exit code says) and the report files written."""
    from collections import Counter

    from sglfix.common.verdicts import MARKS

    counts = Counter(r.verdict for r in results)
    text = Text(f"sglfix {what}: {len(results)} cells in {wall:.1f} s: ", style="bold")
    for i, verdict in enumerate(v for v in MARKS if counts[v]):
        if i:
            text.append(", ")
        text.append(f"{counts[verdict]} {verdict}", style=VERDICT_STYLE.get(verdict, ""))
    text.append(f"; {outcome}")
    files = [p for p in (outputs.json, outputs.junit, outputs.markdown, outputs.heatmap) if p and p != "-"]
    if files:
        text.append("; report: " + ", ".join(files))
    return text


def header(*, what: str, info: dict, env: Sequence[str], wall: float, cells: int, report: dict | None = None) -> str:
    from sglfix.report.outcome import codebase_label

    where = info.get("device_name") or info.get("device") or "?"
    text = f"sglfix {what} on {info.get('device', '?')} ({where}): {cells} cells in {wall:.1f} s"
    if report is not None:
        text += f"; code base: {codebase_label(report)}"
    if env:
        text += f"; SGLANG_DEBUG_REVERT_PR={','.join(env)} applied to every cell"
    return text


# How a table marks a non-PASS verdict that fails nothing (its meaning, sglfix.report.outcome).
MEANING_MARK = {
    "expected": "expected",
    "covered": "within an expectation",
    "known": "known",
    "same-as-baseline": "as baseline",
    "unchecked": "unchecked",
}


def verdict_cell(verdict: str, meaning: Any = None) -> Text:
    """The verdict, and for one that fails nothing, why in brackets (``INVARIANT (known)``)."""
    text = verdict_text(verdict)
    mark = MEANING_MARK.get(getattr(getattr(meaning, "meaning", None), "value", ""))
    if mark and verdict not in ("PASS", "NOT_REACHED", "SKIP"):
        text.append(f" ({mark})", style="dim")
    return text


def cells_table(results, *, title: str, width: int, judgement: Any = None, show_all: bool = False) -> list:
    """One row per cell, the scenario name whole at any width (``sglfix.cli.layout``); with
    ``judgement``, a verdict that fails nothing says why. Findings first: unless ``show_all``,
    only the cells that did not PASS, and one line counting those left out."""
    from sglfix.cli.layout import named_rows
    from sglfix.execution.planner import set_label

    shown = list(results) if show_all else [r for r in results if r.verdict != "PASS"]
    rows = [
        [
            Text(r.scenario),
            Text(",".join(r.toggles) or "-"),
            verdict_cell(r.verdict, judgement.of(f"{set_label(r.toggles)}::{r.scenario}") if judgement else None),
            Text(r.key_figure),
        ]
        for r in shown
    ]
    parts: list = (
        named_rows(["scenario", "toggles", "verdict", "key figure"], rows, title=title, width=width)
        if rows
        else [Text(title, style="italic")]
    )
    left_out = len(results) - len(shown)
    if left_out:
        every = "every cell" if not shown else f"{left_out} cell(s)"
        parts.append(Text(f"{every} passed, not listed; --all lists every cell", style="dim"))
    return parts


def name_lines(names: Sequence[str], *, lead: str, width: int, limit: int | None) -> list[str]:
    """``lead`` then the names, comma separated and wrapped at ``width`` (a name is never cut),
    the lines after the first indented; past ``limit`` names, how many more and how to see them."""
    import textwrap

    names = list(names)
    more = len(names) - limit if limit is not None and len(names) > limit else 0
    items = [f"{n}," for n in names[: len(names) - more]]
    if items:
        items[-1] = items[-1][:-1]
    if more:
        items[-1] += ","
        items.append(f"... and {more} more (--all lists them)")
    width = max(40, width)
    wrap = dict(width=width, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
    lines = textwrap.wrap(" ".join(items), initial_indent=lead, **wrap) or [lead.rstrip()]
    if len(lines[0]) > width:  # the first name does not fit beside the lead: the names start below it
        lines = [lead.rstrip(), *textwrap.wrap(" ".join(items), initial_indent="    ", **wrap)]
    return lines


def print_known(judgement: Any, *, device: str | None, only_shown: bool = False) -> None:
    """One line per known divergence of the profile: where it was seen, or why not (``only_shown``:
    only those some cell showed). The reason's first sentence; the reports keep it whole."""
    from sglfix.cli.context import out

    for hit in judgement.known:
        k = hit.known
        shown = [
            c
            for c in judgement.cells
            if c.meaning.value == "known" and k.matches(scenario=c.scenario, verdict=c.stands_for, device=device)
        ]
        if only_shown and not shown:
            continue
        seen = f"seen on {len(hit.seen_on)} baseline cell(s)" if hit.seen_on else hit.status
        if shown and not hit.seen_on:
            seen = f"shown by {len(shown)} cell(s)"
        reason = " ".join(k.reason.split())
        if len(reason) > 160:
            reason = reason[:157].rsplit(" ", 1)[0] + " ..."
        out.print(Text("known ", style="yellow"), end="")
        out.print(
            f"{k.scenario} -> {'|'.join(k.verdict)}: {seen}; {reason} (reproduce: {k.reproduce})",
            highlight=False,
            markup=False,
        )
