"""``sglfix bisect --releases A..B``: which release broke it (``sglfix.execution.release_bisect``):
the selected scenarios, with the given reverts, on each release the search asks for, each in a
process of its own; then the functions the differing cells reached that changed between the last
release like the oldest and the first unlike it, with their diffs."""

from __future__ import annotations

import os
import tempfile
import time
from typing import TYPE_CHECKING, Any

import typer

from sglfix.cli.context import Options, err, out
from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError

if TYPE_CHECKING:
    from sglfix.execution.release_bisect import ReleaseSearch
    from sglfix.report.release_bisect import ChangedReached, ReleaseBisectReport, ReleaseFound

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
}


def bisect_releases(opts: Options, given: dict[str, Any]) -> None:
    from sglfix.execution.release_bisect import ReleaseSearch, run_release
    from sglfix.report.bisect import now
    from sglfix.report.output import write_json
    from sglfix.report.release_bisect import ReleaseBisectReport

    engine, releases, args = check_release_bisect(opts, given)
    lo, hi = releases[0], releases[-1]
    json_file = given["json_file"]
    started = time.perf_counter()
    search = ReleaseSearch(
        releases,
        run=lambda v: run_release(v, args=args, wheels=opts.wheels),
        say=lambda line: err.print(f"bisect: {line}", highlight=False, markup=False),
    )
    err.print(
        f"bisect: {len(releases)} releases of {engine} from {lo} to {hi} ({', '.join(releases)}); at most "
        f"{search.budget} release runs",
        highlight=False,
        markup=False,
    )
    found = search.search()
    changed = _what_changed(opts, search, found, args, engine=engine) if found.first_bad is not None else None
    report = ReleaseBisectReport.of(
        found,
        command=" ".join(opts.argv),
        date=now(),
        wall_s=round(time.perf_counter() - started, 1),
        distribution=engine,
        changed_reached=changed,
    )
    if json_file is not None:
        write_json(json_file, report.to_json())
    if json_file != "-":
        _print(report, show_all=given["show_all"])
    raise typer.Exit(1 if report.first_bad is not None else 0)


def check_release_bisect(opts: Options, given: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    """Every option of ``bisect --releases`` checked, in one line each, before any release is
    fetched: those it cannot honour refused, the others checked as the run of each release will
    check them (the range against the profiles, the reverts and scenarios against the profile's
    files, a fix's diff, the variable's reverts); the engine, the releases of the range (oldest
    first) and the ``sglfix run`` arguments each release gets."""
    from sglfix.cli.common import revert_ids
    from sglfix.execution.release_bisect import parse_range, releases_between
    from sglfix.report.output import check_output_path

    for name, flag in _NOT_HERE.items():
        if given.get(name):
            raise ConfigError(f"{flag} does not apply to bisect --releases (each release runs in one local process)")
    if given.get("executor", "local") != "local":
        raise ConfigError("--executor ray does not apply to bisect --releases (each release runs in one local process)")
    if given.get("no_reachability"):
        raise ConfigError(
            "--no-reachability does not apply to bisect --releases: the run of each release runs every cell already"
        )
    if opts.toggles is not None and opts.profile is None:
        raise ConfigError("bisect --releases runs an engine's releases: give --profile, not --toggles")
    check_output_path(given["json_file"], option="--json")
    lo, hi = parse_range(given["releases"])
    engine, profile = _engine_profile(opts, lo, hi)
    registry = _registry(profile)
    candidates = revert_ids(given["candidates"])
    for rid in candidates:
        registry.select(rid)  # an unknown id is one line, as the run of each release would say it
    _check_scenarios(profile, given)
    _check_run_settings(given)
    env = _env_reverts(registry, accepted=given["env_baseline"])
    for path in given["apply"] or ():
        _check_diff(path)
    releases = releases_between(engine, lo, hi, wheels=opts.wheels)
    args = _run_args(opts, given, candidates=list(dict.fromkeys(candidates)))
    if env:
        err.print(
            f"bisect: {envs.REVERT_PR.name}={','.join(env)} (--env-baseline): every release runs with it reverted",
            highlight=False,
            markup=False,
        )
    return engine, releases, args


def _engine_profile(opts: Options, lo: str, hi: str) -> tuple[str, Any]:
    """The engine and the profile its releases run with; the range's oldest release must be one
    it can run (the reference of the search), and a profile given must be an engine's."""
    from packaging.version import Version

    from sglfix.codebases import profiles

    records = [r for r in profiles().values() if r.distribution]
    engines = sorted({r.distribution for r in records})
    if len(engines) != 1:
        raise ConfigError(f"--releases: the profiles name {len(engines)} engines ({', '.join(engines)}); expected one")
    engine = engines[0]
    given = opts.profile
    if given is not None and given.is_reproduction:
        raise ConfigError(
            f"bisect --releases runs releases of {engine}, but --profile {given.name} replays the reproduction; "
            f"drop --profile (the releases pick their {engine} profile) or give an {engine} profile"
        )
    if given is not None and not given.asked:
        if not given.covers(lo):
            raise ConfigError(
                f"--releases {lo}..{hi}: --profile {given.name} is written for {engine} "
                f"{given.versions or given.version}, not the oldest release {lo}; give a range it covers"
            )
        return engine, given
    oldest = min(records, key=lambda r: Version(r.version))
    if not any(r.covers(lo) for r in records) and Version(lo) < Version(oldest.version):
        raise ConfigError(
            f"--releases {lo}..{hi}: no profile covers {engine} {lo} (the oldest, {oldest.name}, covers "
            f"{oldest.versions or oldest.version}); start the range at a release it covers"
        )
    newest = next((r for r in sorted(records, key=lambda r: Version(r.version), reverse=True) if r.covers(lo)), None)
    return engine, newest or max(records, key=lambda r: Version(r.version))


def _registry(profile: Any) -> Any:
    from sglfix.toggling.registry import load_registry

    return load_registry(profile.toggles_dir, own=True)


def _check_scenarios(profile: Any, given: dict[str, Any]) -> None:
    from sglfix.execution.runner import choose_scenarios

    choose_scenarios(
        profile=profile,
        globs=given["scenario"] or (),
        files=given["scenario_file"] or (),
        backend=given["backend"],
        memory_budget=given["memory_budget"],
    )


def _check_run_settings(given: dict[str, Any]) -> None:
    """What each release's run would refuse of --device, --jobs, --timeout, --mps and --cache."""
    import math

    from sglfix.execution.devices import check_device
    from sglfix.execution.mps import check_mps

    check_device(given["device"])
    jobs = given["jobs"]
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs {jobs} must be at least 1")
    t = given["timeout"]
    if not math.isfinite(t) or t <= 0:
        raise ConfigError(f"--timeout {t:g}: must be a finite number of seconds > 0; pass e.g. --timeout 300")
    check_mps(given["mps"], device=given["device"], executor="local")
    from sglfix.execution.runner import check_store
    from sglfix.execution.settings import Settings

    check_store(Settings(cache=given["cache"], no_cache=given["no_cache"]))


def _env_reverts(registry: Any, *, accepted: bool) -> tuple[str, ...]:
    """REVERT_PR's reverts, which each release's run inherits: refused unless
    --env-baseline says they are the baseline, as for a bisect of reverts."""
    from sglfix.execution.runner import check_env_baseline
    from sglfix.toggling import selects_nothing
    from sglfix.toggling.envvalue import parse_env_value

    value = envs.REVERT_PR.get()
    parse_env_value(value, registry=registry)
    env = () if selects_nothing(value) else tuple(t.strip() for t in value.split(","))
    check_env_baseline(env, accepted, what="bisect")
    return env


def _check_diff(path: str) -> None:
    """A --apply file each release's run will apply: readable, a unified diff, not binary."""
    from sglfix.common.yamlio import read_text_file
    from sglfix.toggling.candidate import reverse_diff
    from sglfix.toggling.fromdiff import MAX_DIFF_BYTES

    reverse_diff(read_text_file(path, what="--apply file", max_bytes=MAX_DIFF_BYTES), where=f"--apply {path}")


def _run_args(opts: Options, given: dict[str, Any], *, candidates: list[str]) -> list[str]:
    """The ``sglfix run`` arguments each release gets: what the user selected, the reverts, the
    candidate fixes and how the cells run."""
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
    if given["memory_budget"]:
        args += ["--memory-budget", given["memory_budget"]]
    if given["mps"] != "auto":
        args += ["--mps", str(given["mps"])]
    if given["cache"] is not None:  # each release's run checks it (a blank one is refused there)
        cache = given["cache"]
        args += ["--cache", os.path.abspath(os.path.expanduser(cache)) if cache.strip() else cache]
    if given["no_cache"]:
        args += ["--no-cache"]
    for rid in candidates:
        args += ["-r", rid]
    for path in given["apply"] or ():
        args += ["--apply", os.path.abspath(path)]
    return args


def _what_changed(
    opts: Options, search: ReleaseSearch, found: ReleaseFound, args: list[str], *, engine: str
) -> ChangedReached:
    """The functions of the modules a worker imports that changed between the last good and the
    first bad release, and of those, the ones the differing cells entered (their scenarios run
    once more on the first bad release, recording entry into each changed function)."""
    import importlib
    from pathlib import Path

    from sglfix.codebases.releases import fetch_release
    from sglfix.execution.release_bisect import changed_functions, reached_diff, run_release
    from sglfix.report.release_bisect import ChangedReached

    assert found.first_bad is not None
    good, bad = search.ran[found.last_good], search.ran[found.first_bad]
    _, profile = _engine_profile(opts, good.version, bad.version)
    modules = list(profile.preload)
    if profile.kit:
        modules += list(getattr(importlib.import_module(profile.kit), "KIT_MODULES", ()))
    # Both are in the cache: the runs fetched them (the reports' paths may be written relative).
    roots = [
        Path(fetch_release(engine, r.version, wheels=opts.wheels, package=profile.package).path) for r in (good, bad)
    ]
    changed = changed_functions(roots[0], roots[1], modules)
    scenarios = sorted({c.cell.split("::", 1)[1] for c in found.differing_cells or () if "::" in c.cell})
    if not changed or not scenarios:
        return ChangedReached(modules=len(modules), changed_functions=len(changed), functions=[])
    from sglfix.codebases.releases import owned_tempdir

    with owned_tempdir(tempfile.gettempdir(), prefix="sglfix-reach-") as tmp:
        reach = os.path.join(tmp, "reach.txt")
        with open(reach, "w") as fh:
            fh.write("\n".join(sorted(changed)) + "\n")
        select = [a for i, a in enumerate(args) if a != "-s" and (i == 0 or args[i - 1] != "-s")]
        for name in scenarios:
            select += ["-s", name]
        again = run_release(bad.version, args=[*select, "--reach-file", reach], wheels=opts.wheels)
    reached = sorted({f for fs in again.reached.values() for f in fs})
    return ChangedReached(
        modules=len(modules), changed_functions=len(changed), functions=reached_diff(good, bad, changed, reached)
    )


def _print(report: ReleaseBisectReport, *, show_all: bool = False) -> None:
    first, last = report.first_bad, report.last_good
    runs = f"{report.release_runs} release runs (at most {report.budget})"
    if first is None:
        out.print(
            f"no release differs: every release run from {report.reference} to {report.releases[-1]} gives "
            f"{report.reference}'s verdicts; {runs}",
            highlight=False,
            markup=False,
        )
        return
    out.print(
        f"first release unlike {report.reference}: {first} (the last like it: {last}); {runs}",
        highlight=False,
        markup=False,
    )
    if report.untested_between:
        out.print(f"not testable between them: {', '.join(report.untested_between)}", highlight=False, markup=False)
    differing = report.differing_cells or []
    for c in differing if show_all else differing[:20]:
        out.print(f"  {c.cell}: {c.reference} -> {c.verdict}", highlight=False, markup=False)
    if len(differing) > 20 and not show_all:
        out.print(f"  ... and {len(differing) - 20} more (--all shows every one)", highlight=False, markup=False)
    info = report.changed_reached
    functions = info.functions if info is not None else []
    out.print(
        f"{info.changed_functions if info else 0} function(s) of the {info.modules if info else 0} modules a worker "
        f"imports changed from {last} to {first}; the differing cells reached {len(functions)} of them:",
        highlight=False,
        markup=False,
    )
    for f in functions:
        out.print(f"{f.function} ({f.file}:{f.line})", highlight=False, markup=False)
        out.print(f.diff, highlight=False, markup=False, end="")
