"""``sglfix bisect``: which reverted parts make which scenarios fail, and which mask each other
(the search is ``sglfix.execution.bisection``, on the runner run and matrix use)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer
from rich.text import Text

from sglfix.cli.common import Outputs, header, report_replacements, revert_ids, target, write_outputs
from sglfix.cli.context import err, options, out
from sglfix.cli.layout import named_rows
from sglfix.cli.options import SCALE, SELECT, takes
from sglfix.common.errors import ConfigError

if TYPE_CHECKING:
    from sglfix.execution.bisection import Found, Search
    from sglfix.report.bisect import Answer, BisectReport

BISECT_OPTIONS = (
    "candidates",
    "apply",
    *SELECT,
    *SCALE,
    "no_reachability",
    "env_baseline",
    "cache",
    "no_cache",
    "show_all",
    "releases",
)


def _candidates(registry, given: list[str]) -> list[str]:
    """The candidate ids (default: every registered part, or the whole toggle of one part); a
    part named twice (alone and by its toggle) is one line, exit 2."""
    if not given:
        return [rid for t in registry for rid in (t.ids[1:] if len(t.parts) > 1 else t.ids[:1])]
    seen: dict[str, str] = {}  # part -> the candidate that names it
    for rid in given:
        for sel in registry.select(rid):  # an unknown id is a one-line error before anything runs
            if sel.id in seen:
                raise ConfigError(
                    f"-r {rid}: {seen[sel.id]} already names {sel.id}; give each part once "
                    f"(a whole toggle, or some of its parts)"
                )
            seen[sel.id] = rid
    return list(dict.fromkeys(given))


@takes(*BISECT_OPTIONS)
def bisect_cmd(ctx: typer.Context, **given: Any) -> None:
    """Find the reverted parts that make each scenario group fail (delta debugging) and the masking pairs;
    with --apply, the search runs with a candidate fix applied too, and the two are compared."""
    import time

    from sglfix.execution.bisection import Search, report_of, shard_groups
    from sglfix.execution.known import known_of
    from sglfix.execution.planner import Plan
    from sglfix.execution.runner import Runner
    from sglfix.execution.settings import Settings
    from sglfix.report.bisect import answer_of, compare_with_fix
    from sglfix.report.outcome import Known, Rules
    from sglfix.report.output import write_json
    from sglfix.report.schema import CandidateRow

    opts = options(ctx)
    if given["releases"] is not None:
        from sglfix.cli.release_bisect_cmd import bisect_releases

        bisect_releases(opts, given)
        return
    if opts.wheels is not None:
        raise ConfigError("--wheels DIR holds the wheels of --release VERSION or bisect --releases A..B: give one")
    json_file = given["json_file"]
    outputs = Outputs(json=json_file, junit=given["junit"], markdown=given["markdown"])
    outputs.check()
    known = known_of(opts.active_profile())
    scope = target(opts, apply=given["apply"])
    fixes = tuple(c.id for c in scope.candidates)
    candidates = _candidates(scope.registry, revert_ids(given["candidates"]))
    runner = Runner(Settings.of(given), scope, what="bisect")
    every = runner.scenarios()
    chosen = shard_groups(every, runner.shard, timings=runner.timings)
    if not chosen:
        raise ConfigError(f"--shard {runner.shard}: no scenario group falls to this shard; give fewer shards")
    env = runner.env
    # Every revert the search may apply, checked against the installed source before any worker
    # starts (as run and matrix do): a match that is not in the code is one line, exit 2.
    sets = [tuple(env) + (c,) for c in candidates]
    runner.precheck(Plan(scenarios=chosen[:1], sets=sets + [(*fixes, *s) for s in sets] if fixes else sets))
    if runner.conflicts:
        label, why = next(iter(runner.conflicts.items()))
        raise ConfigError(f"{label}: {why}; bisect the candidates that do not touch the fix's lines (-r IDS)")
    if runner.drifted:
        # Followed beyond its profile's range, the runner leaves a drifted revert out of a plan; the
        # search has no plan to leave it out of, so it is refused here as before, naming the fix.
        rid, why = next(iter(runner.drifted.items()))
        raise ConfigError(f"{why}; bisect the candidates that still apply: sglfix bisect -r IDS without {rid}")

    # What a cell means is judged as everywhere (sglfix.report.outcome): a known divergence of the
    # profile, or the verdict its baseline shows too, is no failure of the set reverted.
    def search(base: tuple[str, ...]) -> Search:
        rules = Rules(mode="findings", known=tuple(Known.of(known)), base=base)
        return Search(runner, candidates=candidates, rules=rules, reachability=not given["no_reachability"], base=base)

    def say(line: str) -> None:
        err.print(line, highlight=False, markup=False)

    started = time.perf_counter()
    found, unfixed = _searches(search, fixes=fixes, env=tuple(env), chosen=chosen, say=say, every_set=given["show_all"])
    if found.skipped or found.known_base:
        say("bisect: " + _left_out(found.skipped, found.known_base))
    report_replacements(found.replacements)
    report = report_of(
        found,
        command=" ".join(opts.argv),
        wall_s=round(time.perf_counter() - started, 2),
        candidates=len(candidates),
        shard=None if runner.shard is None else str(runner.shard),
        plan=_plan(runner, scope, given, candidates=candidates, env=env, scenarios=every),
        apply=None
        if unfixed is None
        else compare_with_fix(
            fixes,
            unfixed=unfixed,
            fixed=answer_of(found.groups),
            candidates=[CandidateRow.model_validate(c.to_json()) for c in scope.candidates],
        ),
    )
    data = report.to_json()
    if json_file is not None:
        write_json(json_file, data)
    _write_ci_reports(data, found.cells, info=found.info, junit=given["junit"], markdown=given["markdown"])
    if json_file != "-":
        _show(report, found, candidates=candidates, env=env)
    if report.apply is not None:
        (err if json_file == "-" else out).print(report.apply.outcome, highlight=False, markup=False)
        raise typer.Exit(0 if report.apply.same else 1)
    raise typer.Exit(1 if report.culprits else 0)


def _show(report: BisectReport, found: Found, *, candidates: list[str], env: Any) -> None:
    """The console's view of a bisect: the culprits table and the masking lines."""
    title = header(
        what=f"bisect of {len(candidates)} candidates (the baseline and {report.sets_run} toggle sets: "
        f"{report.runs} searched, {report.masking_runs} for masking)",
        info=found.info,
        env=env,
        wall=report.wall_s,
        cells=report.cells,
        report=report.to_json(),
    )
    rows = [
        [
            Text(c.group),
            Text(",".join(c.ids)),
            Text(c.verdict),
            Text(str(len(c.scenarios))),
            Text(c.key_figure),
        ]
        for c in report.culprits
    ]
    headers = ["group", "culprit", "verdict", "scenarios", "key figure"]
    for part in named_rows(headers, rows, title=title, width=out.width):
        out.print(part)
    for m in report.masking:
        where = "all" if m.all else f"{len(m.scenarios)}"
        out.print(
            Text(
                f"masking in {m.group}: {m.culprit} fails alone but passes reverted together with "
                f"{m.masked_by} on {where} of the scenarios it fails ({', '.join(m.scenarios[:3])}"
                f"{', ...' if len(m.scenarios) > 3 else ''})"
            )
        )


def _searches(
    search: Callable[[tuple[str, ...]], Search],
    *,
    fixes: tuple[str, ...],
    env: tuple[str, ...],
    chosen: Any,
    say: Callable[[str], None],
    every_set: bool,
) -> tuple[Found, Answer | None]:
    """The search (with the candidate fixes applied, if any) and, with fixes, the same search on
    the code without them first, as its answer: what the fix changes is the answer."""
    from sglfix.execution.bisection import FailingBaseline
    from sglfix.report.bisect import Answer, answer_of

    unfixed: Answer | None = None
    if fixes:
        say(f"bisect: without {','.join(fixes)}")
        try:
            unfixed = answer_of(search(env).run(chosen, say=say, every_set=every_set).groups)
        except FailingBaseline as exc:
            unfixed = Answer(failing_baseline=str(exc))
        say(f"bisect: with {','.join(fixes)} applied")
    try:
        return search((*fixes, *env)).run(chosen, say=say, every_set=every_set), unfixed
    except FailingBaseline as exc:
        err.print(f"sglfix: error: {exc}", highlight=False, markup=False)
        raise typer.Exit(1) from None


def _plan(runner: Any, scope: Any, given: dict, *, candidates: list[str], env: Any, scenarios: list) -> dict:
    """The search's plan identity (``sglfix.execution.shards.plan_identity``): its cells are each
    candidate on each scenario of the whole selection, over the baseline ``env``."""
    from sglfix.execution.shards import plan_identity

    base = ",".join(env)
    return plan_identity(
        command="bisect",
        options=given,
        cells=[f"{base}+{c}::{s.name}" for c in candidates for s in scenarios],
        profile=scope.codebase,
        registry_dir=str(scope.registry.directory),
        candidates=scope.candidates,
        timings=runner.timings,
    )


def _write_ci_reports(
    report: dict[str, Any], cells: Any, *, info: dict, junit: str | None, markdown: str | None
) -> None:
    """JUnit (one testcase per cell the search ran; every non-PASS cell fails, as for ``run``) and
    the Markdown summary (culprits, masking, the grid), also appended to $GITHUB_STEP_SUMMARY."""
    import os

    from sglfix.report.markdown import STEP_SUMMARY

    if not (junit or markdown or os.environ.get(STEP_SUMMARY)):
        return
    from sglfix.common.environ import envs
    from sglfix.execution.planner import set_label
    from sglfix.report.jsonreport import build_report

    keys = list(cells.results)
    ci = build_report(
        command=report["command"].split(),
        info=info,
        results=[cells.results[k] for k in keys],
        cell_ids=[f"{set_label(t)}::{n}" for t, n in keys],
        wall_s=report["wall_s"],
        env_revert=envs.REVERT_PR.get(),
    )
    ci.update({k: report[k] for k in ("candidates", "runs", "masking_runs", "sets_run", "culprits", "masking")})
    write_outputs(ci, Outputs(junit=junit, markdown=markdown), gate=False)


def _left_out(skipped: list[str], known_base: list[str]) -> str:
    """The scenarios the search left out: those that SKIP here, and those whose baseline shows a
    known divergence (that verdict is not counted against any set)."""
    parts = []
    if skipped:
        parts.append(
            f"{len(skipped)} scenario(s) SKIP here, left out ({', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''})"
        )
    if known_base:
        parts.append(
            f"{len(known_base)} scenario(s) show a known divergence in the baseline: that verdict is not counted "
            f"({', '.join(known_base[:3])}{', ...' if len(known_base) > 3 else ''})"
        )
    return "; ".join(parts)


def register(app: typer.Typer) -> None:
    app.command("bisect")(bisect_cmd)
