"""``sglfix search``: find a scenario no one wrote that shows a bug (on the code as it is), a
revert (--revert), a patch's effect (--apply) or a mutant of ``sglfix mutate`` (--mutant, a kill),
and shrink it to the smallest that still does. The space is
``sglfix.search``'s, the run ``sglfix.execution.search``'s, the report ``sglfix.report.search``'s."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

import sglfix.cli.mutate_cmd  # noqa: F401  (declares --function, which --mutant shares)
from sglfix.cli.common import revert_ids, target
from sglfix.cli.context import err, options, out
from sglfix.cli.options import OPTIONS, takes
from sglfix.common.errors import ConfigError

DEFAULT_EXAMPLES = 200

# Options of search alone, declared where every option is (``OPTIONS``) so that ``takes`` finds them.
OPTIONS.update(
    {
        "search_target": (
            Annotated[
                str,
                typer.Option(
                    "--target",
                    metavar="WHAT",
                    help="baseline: a cell that fails on the code as it is (a live bug; a known divergence is none). "
                    "revert (with --revert): a cell that fails with it and passes without. apply (with --apply) "
                    "and mutant (with --mutant): a cell whose verdict the patch moves, as mutate kills a mutant.",
                ),
            ],
            "baseline",
        ),
        "family": (
            Annotated[
                str | None,
                typer.Option(
                    "--family", metavar="F", help="Only this backend (triton, flashinfer, ...) or probes: the probes."
                ),
            ],
            None,
        ),
        "mode": (
            Annotated[str | None, typer.Option("--mode", metavar="M", help="Only scenarios of this forward mode.")],
            None,
        ),
        "examples": (
            Annotated[
                int,
                typer.Option("--examples", metavar="N", min=1, help="Try at most this many examples."),
            ],
            DEFAULT_EXAMPLES,
        ),
        "seconds": (
            Annotated[
                float | None,
                typer.Option(
                    "--time", metavar="S", min=1, help="Start no new batch of examples after this many seconds."
                ),
            ],
            None,
        ),
        "seed": (
            Annotated[
                int,
                typer.Option(
                    "--seed", metavar="K", min=0, help="The examples drawn (the same seed, the same examples)."
                ),
            ],
            0,
        ),
        "mutant": (
            Annotated[
                str | None,
                typer.Option(
                    "--mutant",
                    metavar="ID",
                    help="Kill this mutant of sglfix mutate (an id of its report): a scenario whose verdict it "
                    "moves. --function narrows where its id is looked up (faster); --apply FIX.patch beside it runs every "
                    "cell atop that fix (a campaign of mutate --apply's survivors).",
                ),
            ],
            None,
        ),
        "seeds": (
            Annotated[
                str | None,
                typer.Option(
                    "--seeds",
                    metavar="FROM",
                    help="builtin: start from the code base's built-in scenarios of the space (the default with "
                    "--mutant: a survivor is what no built-in scenario kills, so look next to them); none: the "
                    "generic space alone (the default otherwise).",
                ),
            ],
            None,
        ),
        "where": (
            Annotated[
                list[str],
                typer.Option(
                    "--where",
                    metavar="KEY=VALUE",
                    help="Every drawn scenario holds this key at this value (a dotted key of the scenario "
                    "schema, e.g. spec.topk=1; repeatable): look past a failure you know of.",
                ),
            ],
            [],
        ),
        "resume": (
            Annotated[
                str | None,
                typer.Option(
                    "--resume",
                    metavar="REPORT.json",
                    help="Go on from an earlier search's --json report: the examples it tried are not run again "
                    "(the same options, seed and code base).",
                ),
            ],
            None,
        ),
        "output": (
            Annotated[
                str | None,
                typer.Option(
                    "--output", "-o", metavar="FILE", help="Write the shrunk scenario here (a scenario YAML)."
                ),
            ],
            None,
        ),
    }
)

SEARCH_OPTIONS = (
    "search_target",
    "revert",
    "apply",
    "mutant",
    "function",
    "family",
    "mode",
    "examples",
    "seconds",
    "seed",
    "seeds",
    "where",
    "resume",
    "output",
    "device",
    "jobs",
    "timeout",
    "json_file",
    "memory_budget",
    "devices",
    "executor",
    "ray_address",
    "cache",
    "no_cache",
)


@takes(*SEARCH_OPTIONS)
def search_cmd(ctx: typer.Context, **given: Any) -> None:
    from sglfix.execution.known import known_of
    from sglfix.execution.planner import Plan
    from sglfix.execution.runner import Runner
    from sglfix.execution.search import Budget, Guide, SearchTarget, run_search
    from sglfix.execution.settings import Settings
    from sglfix.report.outcome import Known, Rules
    from sglfix.report.output import write_json
    from sglfix.search.space import parse_pins, space_for

    opts = options(ctx)
    kind = _target_kind(given)
    seeds_from = _seeds_from(given["seeds"], kind=kind)  # refused before the mutant is looked up
    ids = revert_ids(given["revert"])
    _check_output(given["output"])
    pins = parse_pins(given["where"])
    resume = _resumed(given["resume"], given) if given["resume"] else []
    known = known_of(opts.active_profile())
    fixes = _known_fixes(opts, known) if kind == "baseline" else {}
    mutant = _mutant(opts, given["mutant"], functions=given["function"]) if kind == "mutant" else None
    scope = target(opts, apply=list(fixes) or given["apply"])
    if mutant is not None:
        scope = _with_mutant(scope, mutant)
    family = given["family"]
    inferred = family is None and mutant is not None
    if inferred:
        family = _family_of(mutant, scope.codebase)
    # A backend's file is run by the probes too (a verify probe builds its input on the backend's
    # buffers): a mutant's own family is searched with them unless --family names one.
    space = space_for(scope.codebase, family=family, mode=given["mode"], pins=pins, with_probes=inferred)
    patch = kind in ("apply", "mutant")
    # A patch's cells digest what they built: where it is alive (built other metadata, moved no
    # verdict) the search looks next (``sglfix.execution.search._Lines``).
    runner = Runner(Settings.of(given, fingerprint=patch), scope, what="search")
    base = tuple(runner.env)
    applied = tuple(c.id for c in scope.candidates) if kind in ("apply", "mutant") else ()
    if mutant is not None and len(applied) > 1:
        # --apply beside --mutant: every cell runs atop those fixes (as mutate --apply runs its
        # campaign), and the search looks for what the mutant alone moves there.
        base, applied = (*base, *applied[:-1]), applied[-1:]
    goal = SearchTarget(
        base=base,
        revert=tuple(ids),
        apply=applied,
        kind=kind,
        known_fixes=tuple(
            (c.id, fixes[os.path.realpath(c.path)]) for c in scope.candidates if os.path.realpath(c.path) in fixes
        ),
    )
    if goal.change:
        from sglfix.execution.planner import merge_sets
        from sglfix.search.space import examples

        if ids:
            merge_sets(base, ids, registry=scope.registry, what="--revert")
        # Every change the search applies, checked against the installed source before any worker.
        probe = examples(space, count=1, seed=given["seed"])
        runner.precheck(Plan(scenarios=[s for _, s in probe], sets=goal.sets))
        if runner.drifted:
            rid, why = next(iter(runner.drifted.items()))
            raise ConfigError(f"{why}; search for a change that still applies (without {rid})")
    rules = Rules(mode="findings", known=tuple(Known.of(known)), base=base)

    def say(line: str) -> None:
        err.print(line, highlight=False, markup=False)

    outcome = run_search(
        runner,
        space=space,
        target=goal,
        rules=rules,
        budget=Budget(count=given["examples"], seed=given["seed"], seconds=given["seconds"]),
        say=say,
        resume=resume,
        guide=Guide(seeds=tuple(_seeds(runner, space)) if seeds_from == "builtin" else (), near=patch),
    )
    written = None
    final = outcome.shrunk_failure or outcome.found
    if final is not None and given["output"] is not None:
        written = _write_scenario(given["output"], final)
    report = _report(opts, given, outcome, goal=goal, runner=runner, written=written, family=family, mutant=mutant)
    if given["json_file"] is not None:
        write_json(given["json_file"], report.to_json())
    shown = err if given["json_file"] == "-" else out
    _show(report, shown)
    if outcome.errors:
        raise typer.Exit(1)
    raise typer.Exit(1 if outcome.found is not None else 0)


def _said(error: Any) -> str:
    """An ERROR cell's message in one line (a worker's error record or a finding's message)."""
    if isinstance(error, dict):
        text = str(error.get("message") or error.get("type") or error)
    else:
        text = str(error or "")
    return " ".join(text.split())[:300] or "no message"


_KINDS = ("baseline", "revert", "apply", "mutant")
_SEEDS = ("builtin", "none")


def _seeds_from(given: str | None, *, kind: str) -> str:
    if given is None:
        return "builtin" if kind == "mutant" else "none"
    value = given.strip().lower()
    if value not in _SEEDS:
        from sglfix.common.schema import nearest

        raise ConfigError(f"--seeds {given}: no such source{nearest(value, _SEEDS)}; give builtin or none")
    return value


def _seeds(runner: Any, space: Any) -> list:
    """The built-in scenarios of the space's kinds, as nodes the search moves from."""
    from sglfix.search.near import seeds

    return seeds(runner.scenarios(), space=space)


def _target_kind(given: dict) -> str:
    """The target the options name: --revert, --apply or --mutant each name their own, one at a
    time; --target, when given, must agree."""
    # With --mutant, --apply names the fixes every cell runs atop, not a target of its own.
    apply = given["apply"] and not given["mutant"]
    named = [k for k, on in (("revert", given["revert"]), ("apply", apply), ("mutant", given["mutant"])) if on]
    asked = given["search_target"]
    if asked not in _KINDS:
        raise ConfigError(f"--target {asked}: give one of {', '.join(_KINDS)}")
    if len(named) > 1:
        raise ConfigError(f"--{named[0]} and --{named[1]}: a search looks for one change at a time; give one")
    if named and asked not in ("baseline", named[0]):
        raise ConfigError(f"--target {asked} with --{named[0]}: leave --target out (--{named[0]} names the target)")
    if not named and asked != "baseline":
        option = {"revert": "--revert IDS", "apply": "--apply FIX.patch", "mutant": "--mutant ID"}[asked]
        raise ConfigError(f"--target {asked} looks for what a change shows: name it with {option}")
    if given["function"] and not given["mutant"]:
        raise ConfigError("--function narrows where --mutant's id is looked up: give --mutant ID, or leave it out")
    return named[0] if named else "baseline"


def _mutant(opts: Any, mid: str, *, functions: Any) -> Any:
    """Mutant ``mid`` of the installed code base (as ``mutate --show`` finds it)."""
    from sglfix.common.schema import nearest
    from sglfix.execution.mutate import check_function_patterns, mutants_on_surface

    codebase = opts.codebase()
    mid = mid.lstrip("+")
    found = mutants_on_surface(codebase=codebase, functions=check_function_patterns(functions))
    hit = next((m for m in found if m.id == mid), None)
    if hit is None:
        where = " of the functions --function names" if functions else ""
        raise ConfigError(
            f"--mutant {mid}: no mutant{where} of {codebase.package} has that id"
            f"{nearest(mid, [m.id for m in found])}; give an id from a campaign's report (its code may have changed since)"
        )
    return hit


def _with_mutant(scope: Any, mutant: Any) -> Any:
    """``scope`` with the mutant's diff loaded as a candidate fix (what ``mutate`` runs)."""
    import dataclasses

    from sglfix.execution.mutate import load_mutants

    loaded, errors = load_mutants([mutant], codebase=scope.codebase)
    if errors:
        raise ConfigError(f"--mutant {mutant.id}: {errors[mutant.id]}")
    (cand,) = loaded
    # The mutant last: the fixes --apply gives (if any) are what every cell runs atop.
    return dataclasses.replace(
        scope, registry=scope.registry.with_candidates([cand]), candidates=(*scope.candidates, cand)
    )


def _family_of(mutant: Any, codebase: Any) -> str | None:
    """The backend family a mutant's file is, where the code base has that backend (else the
    whole space: common code serves every backend and the probes)."""
    from sglfix.report.mutation import family_of

    family = family_of(mutant.path)
    return family if family in codebase.adapters else None


def _resumed(path: str, given: dict) -> list[str]:
    """The examples an earlier search (its --json report) tried, in order; refused where it
    searched another target, space or seed."""
    from sglfix.report.search import load_search_report

    earlier = load_search_report(path, option="--resume")
    same = (
        ("seed", given["seed"]),
        ("mode", given["mode"]),
        ("where", list(given["where"])),
        ("revert", list(given["revert"])),
        ("mutant", given["mutant"].lstrip("+") if given["mutant"] else None),
    )
    for key, now in same:
        if getattr(earlier, key) != now:
            raise ConfigError(
                f"--resume {path}: it searched with {key} {getattr(earlier, key)}, not {now}; give the same"
            )
    return list(earlier.record)


def _known_fixes(opts: Any, known: Any) -> dict[str, str]:
    """path -> the known divergence it clears, for each candidate fix the profile keeps beside its
    known divergences that applies to this code base (one that does not is left out)."""
    from sglfix.execution.known import fix_path
    from sglfix.toggling.candidate import load_candidate

    profile = opts.active_profile()
    out: dict[str, str] = {}
    for k in known:
        if not k.cleared_by:
            continue
        path = os.path.realpath(fix_path(profile, k.cleared_by))
        try:
            load_candidate(path, codebase=opts.codebase())
        except ConfigError:
            continue
        out.setdefault(path, f"{k.scenario} ({k.cleared_by} clears it)")
    return out


def _check_output(path: str | None) -> None:
    if path is None:
        return
    from pathlib import Path

    parent = Path(path).parent
    if not parent.is_dir():
        raise ConfigError(f"-o {path}: the folder {parent} does not exist; create it or write elsewhere")


def _write_scenario(path: str, failure: Any) -> str:
    """The failing scenario as a file the matrix runs (``--scenario-file``), named for it."""
    import yaml

    from sglfix.common.atomic import write_atomic

    node = {"name": failure.scenario.name, "description": f"found by sglfix search: {failure.why}", **failure.node}
    write_atomic(path, yaml.safe_dump(node, sort_keys=False))
    return path


def _found(failure: Any) -> Any:
    from sglfix.report.context import key_figure
    from sglfix.report.search import FoundCell

    if failure is None:
        return None
    # A patch that clears a failure (FIXED) is shown by the failure it clears: its base cell's.
    shown = failure.base_cell if failure.meaning == "FIXED" and failure.base_cell is not None else failure.cell
    return FoundCell(
        name=failure.scenario.name,
        node=failure.node,
        verdict=str(failure.cell.get("verdict", "")),
        check=failure.same[1],
        key_figure=key_figure(shown),
        base_verdict=failure.base_cell.get("verdict") if failure.base_cell is not None else None,
        meaning=failure.meaning,
        said=failure.said,
    )


def _report(
    opts: Any,
    given: dict,
    outcome: Any,
    *,
    goal: Any,
    runner: Any,
    written: str | None,
    family: str | None,
    mutant: Any,
) -> Any:
    from sglfix.report.bisect import now
    from sglfix.report.context import key_figure
    from sglfix.report.search import SearchReport, ShrinkRecord

    shrunk = outcome.shrunk
    return SearchReport(
        schema=1,
        tool="sglfix search",
        command=" ".join(opts.argv),
        date=now(),
        device=outcome.info.get("device") or runner.device,
        codebase=runner.target.codebase.name,
        installed=_installed(runner.target.codebase),
        target=goal.name,
        revert=list(goal.revert),
        base=list(goal.base),
        family=family,
        # A mutant's own family (no --family) is searched with the probes (``space_for``).
        with_probes=given["family"] is None and mutant is not None and family is not None,
        mutant=mutant.id if mutant is not None else None,
        where=list(given["where"]),
        mode=given["mode"],
        seed=given["seed"],
        examples=given["examples"],
        tried=outcome.tried,
        examples_per_s=round(outcome.tried / outcome.search_s, 2) if outcome.search_s else 0.0,
        search_s=outcome.search_s,
        wall_s=outcome.wall_s,
        stopped=outcome.budget_hit,
        skipped=outcome.skipped,
        errors=[
            {"scenario": e.get("scenario"), "toggles": e.get("toggles"), "error": e.get("error") or key_figure(e)}
            for e in outcome.errors
        ],
        found=_found(outcome.found),
        shrunk=_found(outcome.shrunk_failure),
        known=outcome.known,
        shrink=None
        if shrunk is None
        else ShrinkRecord(
            steps=shrunk.steps, asked=shrunk.asked, refused=shrunk.refused, rounds=shrunk.rounds, minimal=shrunk.minimal
        ),
        written=written,
        applied=list(goal.apply),
        timeouts=outcome.timeouts,
        record=list(outcome.record),
        focus=list(outcome.focus),
        flaky=list(outcome.flaky),
        seeds=outcome.seeds,
        neighbours=outcome.neighbours,
        alive=outcome.alive,
        origin=outcome.origin,
    )


def _installed(codebase: Any) -> str | None:
    from sglfix.codebases.installed import installed

    found = installed(codebase)
    return f"{found.distribution} {found.version}" if found is not None else None


def _show(report: Any, console: Any) -> None:
    on = report.codebase if report.installed is None else f"{report.installed} (profile {report.codebase})"
    said = f"sglfix search on {on} ({report.device}): {report.tried} examples in {report.search_s:.1f} s"
    said += f" ({report.examples_per_s:.2f}/s)"
    console.print(said, highlight=False, markup=False)
    if report.seeds or report.neighbours:
        console.print(
            f"guided: {report.seeds} seed(s), {report.alive} example(s) where the change built something else and "
            f"moved no verdict, {report.neighbours} neighbour(s) of them queued",
            highlight=False,
            markup=False,
        )
    if report.errors:
        console.print(
            f"ERROR: sglfix itself failed on {len(report.errors)} cell(s), e.g. {report.errors[0]['scenario']}: "
            f"{_said(report.errors[0]['error'])}",
            highlight=False,
            markup=False,
        )
    if report.flaky:
        console.print(
            f"{len(report.flaky)} example(s) showed it once and not when run again (cells that differ run to run), "
            f"e.g. {report.flaky[0]}: no find",
            highlight=False,
            markup=False,
        )
    if report.found is None:
        console.print(f"nothing found: {report.stopped}", highlight=False, markup=False)
        return
    f, s = report.found, report.shrunk or report.found
    console.print(f"found: {f.name}: {f.verdict} {f.key_figure}", highlight=False, markup=False)
    if report.origin:
        console.print(f"from: {report.origin}", highlight=False, markup=False)
    if f.said:
        console.print(f"{f.meaning}: {f.said}", highlight=False, markup=False)
    if report.shrink is not None:
        steps = ", ".join(report.shrink.steps) or "nothing smaller fails the same way"
        console.print(
            f"shrunk in {report.shrink.rounds} round(s), {report.shrink.asked} smaller scenario(s) run: {steps}",
            highlight=False,
            markup=False,
        )
    console.print(f"smallest: {s.name}: {s.verdict} {s.key_figure}", highlight=False, markup=False)
    if report.target == "baseline":
        said = f"known divergence {report.known}" if report.known else "new: no known divergence's fix clears it"
        console.print(said, highlight=False, markup=False)
    if report.written:
        console.print(
            f"written: {report.written} (sglfix run --scenario-file {report.written})", highlight=False, markup=False
        )


def register(app: typer.Typer) -> None:
    app.command(
        "search",
        help="Find a scenario no one wrote that fails on the code as it is (--target baseline) or with a revert "
        "(--revert IDS), drawn from the scenario schema, and shrink it to the smallest that still fails the same way.",
    )(search_cmd)
