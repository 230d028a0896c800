"""Every option of the commands that run cells, declared once. A command takes the ones it
needs by name (``takes``) and receives them as keyword arguments; ``sglfix.execution.settings``
turns those into the one ``Settings`` the runner checks."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

import typer

from sglfix.cli.complete import scenario_names, toggle_ids
from sglfix.common.environ import envs

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


class MpsChoice(StrEnum):
    auto = "auto"
    on = "on"
    off = "off"


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


def _at_least_one(value: int | None) -> int | None:
    # Said here, not by the runner's check, so that a value from SGLFIX_JOBS is named as such.
    if value is not None and value < 1:
        raise typer.BadParameter(f"{value} must be at least 1")
    return value


Jobs = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        envvar=envs.SGLFIX_JOBS.name,
        callback=_at_least_one,
        help="Worker processes (default on a GPU: from its memory and the cores, up to 8; 2 on CPU).",
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
CacheDir = Annotated[
    str | None,
    typer.Option(
        "--cache",
        metavar="DIR",
        help="Keep each cell's result in this folder and serve it again while nothing it ran changed (default: "
        f"{envs.SGLFIX_STORE.name}, else ~/.cache/sglfix/results; share one folder between CI jobs).",
    ),
]
NoCache = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        help=f"Run every cell, and keep nothing: the result store is neither read nor written ({envs.SGLFIX_STORE.name}=0 does the same).",
    ),
]
VerifyStore = Annotated[
    int,
    typer.Option(
        "--verify-store",
        metavar="N",
        help="Run N of the cells the result store served again, fresh, and fail (exit 1, naming each) if any "
        "verdict differs from the served one; those entries are dropped.",
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
        help=f"Judge against the set {envs.REVERT_PR.name} selects as the baseline (otherwise a set variable is "
        "refused: the baseline must be the code as installed); the header and the gate name it, and no "
        "expectation is checked.",
    ),
]
DeviceList = Annotated[
    str | None,
    typer.Option(
        "--devices",
        metavar="LIST",
        help="The GPUs to run on, workers dealt over them in turn: cuda:0,cuda:1 (or 0,1), or all; implies "
        "--device cuda. --jobs N is then the total (at least one a GPU).",
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
Mps = Annotated[
    MpsChoice,
    typer.Option(
        "--mps",
        callback=_plain,
        case_sensitive=False,
        help="Local workers sharing a GPU do so through a CUDA MPS daemon of the run's own (auto: where "
        "nvidia-cuda-mps-control is installed). A cell whose GPU context is lost under MPS runs again alone "
        "outside it, so a fault is only ever its own cell's.",
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
        help=f"Refuse scenarios estimated to need more memory (e.g. 16G; env {envs.SGLFIX_MEMORY_BUDGET.name}).",
    ),
]

Releases = Annotated[
    str | None,
    typer.Option(
        "--releases",
        metavar="A..B",
        help="Bisect releases, not reverts: the first sglang release from A to B whose verdicts differ from A's, and what changed there.",
    ),
]
ReachFile = Annotated[
    str | None,
    typer.Option(
        "--reach-file",
        metavar="FILE",
        help="Also record which of these functions (one dotted path per line) each cell entered: the report's reached.",
    ),
]

Apply = Annotated[
    list[str],
    typer.Option(
        "--apply",
        metavar="FIX.patch",
        help="Apply this candidate fix (a unified diff in the code base's repository paths: git show, git "
        "format-patch, a PR's .patch, diff -u) in every worker, and set each cell beside the same cell "
        "without it (repeatable: the files apply together). Exit 0 only when it breaks no cell.",
    ),
]
ExpectFixes = Annotated[
    list[str],
    typer.Option(
        "--expect-fixes",
        metavar="GLOB",
        help="With --apply: the fix must clear the failing or known verdict of a scenario this matches "
        "(repeatable); part of the gate.",
    ),
]


def _reverts(help: str) -> Any:
    """``--revert/-r ID`` (repeatable, ids completed); ``help`` says what the command does with them."""
    return Annotated[list[str], typer.Option("--revert", "-r", metavar="ID", autocompletion=toggle_ids, help=help)]


Revert = _reverts(
    f"Revert this toggle or part (repeatable; comma lists too); added to what {envs.REVERT_PR.name} selects."
)
Candidates = _reverts("Candidate toggles or parts (repeatable; comma lists too); default every registered part.")
Parts = Annotated[
    bool,
    typer.Option(
        "--parts",
        help="Also revert each part of each toggle alone, and the part combinations expectations name (checks those expectations).",
    ),
]

# name -> (annotation, default): the parameter a command function receives for each option.
OPTIONS: dict[str, tuple[Any, Any]] = {
    "revert": (Revert, []),
    "candidates": (Candidates, []),
    "parts": (Parts, False),
    "scenario": (ScenarioGlobs, []),
    "scenario_file": (ScenarioFiles, []),
    "backend": (BackendName, None),
    "device": (Device, "auto"),
    "jobs": (Jobs, None),
    "timeout": (Timeout, 300.0),
    "json_file": (JsonFile, None),
    "junit": (JunitFile, None),
    "markdown": (MarkdownFile, None),
    "heatmap": (HeatmapFile, None),
    "memory_budget": (MemoryBudget, None),
    "devices": (DeviceList, None),
    "executor": (Executor, "local"),
    "mps": (Mps, "auto"),
    "ray_address": (RayAddress, None),
    "ray_keep": (RayKeep, None),
    "shard": (ShardSpec, None),
    "shard_costs": (ShardCosts, None),
    "no_reachability": (NoReachability, False),
    "cache": (CacheDir, None),
    "no_cache": (NoCache, False),
    "verify_store": (VerifyStore, 0),
    "env_baseline": (EnvBaseline, False),
    "show_all": (ShowAll, False),
    "reach_file": (ReachFile, None),
    "releases": (Releases, None),
    "apply": (Apply, []),
    "expect_fixes": (ExpectFixes, []),
}


# The options every command that runs cells has, in --help order: what to run and the reports
# (SELECT), then where and how (SCALE).
SELECT = ("scenario", "scenario_file", "backend", "device", "jobs", "timeout", "json_file", "junit", "markdown")
SCALE = ("memory_budget", "devices", "mps", "executor", "ray_address", "ray_keep", "shard", "shard_costs")


def takes(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command written ``def cmd(ctx, **given)`` the options ``names``, in that order (the
    order of its --help): typer reads the signature set here and calls it with each by name."""
    unknown = [n for n in names if n not in OPTIONS]
    if unknown:
        raise KeyError(f"no option {unknown}")

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
        for name in names:
            annotation, default = OPTIONS[name]
            params.append(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
            )
        fn.__signature__ = inspect.Signature(params)
        return fn

    return wrap
