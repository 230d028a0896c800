"""``sglfix bisect --releases A..B``: which release broke it (``sglfix.execution.release_bisect``):
the selected scenarios, with the given reverts, on each release the search asks for, each in a
process of its own; then the functions the differing cells reached that changed between the last
release like the oldest and the first unlike it, with their diffs."""

from __future__ import annotations

import datetime
import os
import tempfile
import time
from typing import Any

import typer

from sglfix.cli.context import Options, err, out
from sglfix.common.errors import ConfigError

# Options of bisect that mean something only for a search over reverts, or that the runs of
# each release cannot honour (one process per release, one machine).
_NOT_HERE = {
    "devices": "--devices",
    "shard": "--shard",
    "shard_costs": "--shard-costs",
    "ray_address": "--ray-address",
    "ray_keep": "--ray-keep",
    "junit": "--junit",
    "markdown": "--markdown",
    "memory_budget": "--memory-budget",
}


def bisect_releases(opts: Options, given: dict[str, Any]) -> None:
    from sglfix.codebases import profiles
    from sglfix.execution.release_bisect import ReleaseSearch, parse_range, releases_between, run_release
    from sglfix.report.output import check_output_path, write_json

    for name, flag in _NOT_HERE.items():
        if given.get(name):
            raise ConfigError(f"{flag} does not apply to bisect --releases (each release runs in one local process)")
    if given.get("executor", "local") != "local":
        raise ConfigError("--executor ray does not apply to bisect --releases (each release runs in one local process)")
    if opts.toggles is not None and opts.profile is None:
        raise ConfigError("bisect --releases runs an engine's releases: give --profile, not --toggles")
    json_file = given["json_file"]
    check_output_path(json_file, option="--json")
    lo, hi = parse_range(given["releases"])
    engines = sorted({r.distribution for r in profiles().values() if r.distribution})
    if len(engines) != 1:
        raise ConfigError(f"--releases: the profiles name {len(engines)} engines ({', '.join(engines)}); expected one")
    releases = releases_between(engines[0], lo, hi, wheels=opts.wheels)
    args = _run_args(opts, given)
    started = time.perf_counter()
    search = ReleaseSearch(
        releases,
        run=lambda v: run_release(v, args=args, wheels=opts.wheels),
        say=lambda line: err.print(f"bisect: {line}", highlight=False, markup=False),
    )
    err.print(
        f"bisect: {len(releases)} releases of {engines[0]} from {lo} to {hi} ({', '.join(releases)}); at most "
        f"{search.budget} release runs",
        highlight=False,
        markup=False,
    )
    result = search.search()
    if result["first_bad"] is not None:
        result["changed_reached"] = _what_changed(opts, search, result, args)
    report = {
        "schema": 1,
        "tool": "sglfix bisect --releases",
        "command": " ".join(opts.argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started, 1),
        "distribution": engines[0],
        **result,
    }
    if json_file is not None:
        write_json(json_file, report)
    if json_file != "-":
        _print(report)
    raise typer.Exit(1 if result["first_bad"] is not None else 0)


def _run_args(opts: Options, given: dict[str, Any]) -> list[str]:
    """The ``sglfix run`` arguments each release gets: what the user selected, and the reverts."""
    args: list[str] = []
    if opts.profile is not None:
        args += ["--profile", getattr(opts.profile, "asked", "") or opts.profile.name]
    for glob in given["scenario"] or ():
        args += ["-s", glob]
    for path in given["scenario_file"] or ():
        args += ["--scenario-file", os.path.abspath(path)]
    if given["backend"]:
        args += ["--backend", given["backend"]]
    args += ["--device", str(given["device"])]
    if given["jobs"]:
        args += ["--jobs", str(given["jobs"])]
    args += ["--timeout", str(given["timeout"])]
    for rid in given["candidates"] or ():
        args += ["-r", rid]
    return args


def _what_changed(opts: Options, search: Any, result: dict, args: list[str]) -> dict:
    """The functions of the modules a worker imports that changed between the last good and the
    first bad release, and of those, the ones the differing cells entered (their scenarios run
    once more on the first bad release, recording entry into each changed function)."""
    import importlib

    from sglfix.codebases import get_codebase
    from sglfix.execution.release_bisect import changed_functions, reached_diff, run_release

    good, bad = search.ran[result["last_good"]], search.ran[result["first_bad"]]
    profile = opts.profile or get_codebase("sglang")
    modules = list(profile.preload)
    if profile.kit:
        modules += list(getattr(importlib.import_module(profile.kit), "KIT_MODULES", ()))
    from pathlib import Path

    changed = changed_functions(Path(good.path).parent, Path(bad.path).parent, modules)
    scenarios = sorted({c["cell"].split("::", 1)[1] for c in result["differing_cells"] if "::" in c["cell"]})
    out_info = {"modules": len(modules), "changed_functions": len(changed), "functions": []}
    if not changed or not scenarios:
        return out_info
    with tempfile.TemporaryDirectory(prefix="sglfix-reach-") as tmp:
        reach = os.path.join(tmp, "reach.txt")
        with open(reach, "w") as fh:
            fh.write("\n".join(sorted(changed)) + "\n")
        select = [a for i, a in enumerate(args) if a != "-s" and (i == 0 or args[i - 1] != "-s")]
        for name in scenarios:
            select += ["-s", name]
        again = run_release(bad.version, args=[*select, "--reach-file", reach], wheels=opts.wheels)
    reached = sorted({f for fs in again.reached.values() for f in fs})
    out_info["functions"] = reached_diff(good, bad, changed, reached)
    return out_info


def _print(report: dict) -> None:
    first, last = report["first_bad"], report["last_good"]
    runs = f"{report['release_runs']} release runs (at most {report['budget']})"
    if first is None:
        out.print(
            f"no release differs: every release run from {report['reference']} to {report['releases'][-1]} gives "
            f"{report['reference']}'s verdicts; {runs}",
            highlight=False,
            markup=False,
        )
        return
    out.print(
        f"first release unlike {report['reference']}: {first} (the last like it: {last}); {runs}",
        highlight=False,
        markup=False,
    )
    if report.get("untested_between"):
        out.print(f"not testable between them: {', '.join(report['untested_between'])}", highlight=False, markup=False)
    for c in report["differing_cells"][:20]:
        out.print(f"  {c['cell']}: {c['reference']} -> {c[first]}", highlight=False, markup=False)
    info = report.get("changed_reached") or {}
    functions = info.get("functions") or []
    out.print(
        f"{info.get('changed_functions', 0)} function(s) of the {info.get('modules', 0)} modules a worker imports "
        f"changed from {last} to {first}; the differing cells reached {len(functions)} of them:",
        highlight=False,
        markup=False,
    )
    for f in functions:
        out.print(f"{f['function']} ({f['file']}:{f['line']})", highlight=False, markup=False)
        out.print(f["diff"], highlight=False, markup=False, end="")
