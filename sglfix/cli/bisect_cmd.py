"""``sglfix bisect``: which reverted parts make which scenarios fail, and which mask each other
(the search is ``sglfix.execution.bisection``, on the runner run and matrix use)."""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from sglfix.cli.common import Outputs, header, report_replacements, revert_ids, target, write_outputs
from sglfix.cli.context import err, options, out
from sglfix.cli.layout import named_rows
from sglfix.cli.options import SCALE, SELECT, takes
from sglfix.common.errors import ConfigError

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
    import datetime
    import time

    from sglfix.execution.bisection import Search, shard_groups
    from sglfix.execution.known import known_of
    from sglfix.execution.planner import Plan
    from sglfix.execution.runner import Runner
    from sglfix.execution.settings import Settings
    from sglfix.report.outcome import Known, Rules
    from sglfix.report.output import write_json

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
    cells, masking_sets = found.cells, found.masking_sets
    groups_out, masking_out = found.groups, found.masking
    skipped, known_base, record = found.skipped, found.known_base, found.record
    groups_out = [g for g in groups_out if g["culprits"] or g["unreachable"]]
    culprits_flat = [{**c, "group": g["group"]} for g in groups_out for c in g["culprits"]]
    report = {
        "schema": 2,
        "tool": "sglfix bisect",
        "command": " ".join(opts.argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started, 2),
        "device": found.info.get("device"),
        "device_name": found.info.get("device_name"),
        "codebase": found.info.get("codebase"),
        "candidates": len(candidates),
        # Distinct toggle sets that ran (the baseline, nothing reverted, is not one of them).
        "runs": len(cells.sets - masking_sets - {()}),
        "masking_runs": len(masking_sets - {()}),
        "sets_run": len(cells.sets - {()}),
        "reachability": record is not None,
        "cells": len(cells.results),
        "culprits": culprits_flat,
        "masking": masking_out,
        # Scenarios left out of the search (SKIP here) and those whose baseline shows a known
        # divergence (that verdict is not counted against any set).
        "left_out": {"skip": skipped, "known": known_base},
        "groups": groups_out,
        "worker_replacements": report_replacements(found.replacements),
    }
    if runner.shard is not None:
        report["shard"] = str(runner.shard)
    if found.store is not None:
        report["store"] = found.store
    report["plan"] = _plan(runner, scope, given, candidates=candidates, env=env, scenarios=every)
    if unfixed is not None:
        report["apply"] = _compare(fixes, unfixed, _summary(found), scope.candidates)
    if json_file is not None:
        write_json(json_file, report)
    _write_ci_reports(report, cells, info=found.info, junit=given["junit"], markdown=given["markdown"])
    if json_file != "-":
        _show(report, found, candidates=candidates, env=env, culprits=culprits_flat, masking=masking_out)
    if unfixed is not None:
        applied = report["apply"]
        (err if json_file == "-" else out).print(applied["outcome"], highlight=False, markup=False)
        raise typer.Exit(0 if applied["same"] else 1)
    raise typer.Exit(1 if culprits_flat else 0)


def _show(report: dict, found: Any, *, candidates: list[str], env: Any, culprits: list, masking: list) -> None:
    """The console's view of a bisect: the culprits table and the masking lines."""
    culprits_flat, masking_out = culprits, masking
    title = header(
        what=f"bisect of {len(candidates)} candidates (the baseline and {report['sets_run']} toggle sets: "
        f"{report['runs']} searched, {report['masking_runs']} for masking)",
        info=found.info,
        env=env,
        wall=report["wall_s"],
        cells=report["cells"],
        report=report,
    )
    rows = [
        [
            Text(c["group"]),
            Text(",".join(c["ids"])),
            Text(c["verdict"]),
            Text(str(len(c["scenarios"]))),
            Text(c["key_figure"]),
        ]
        for c in culprits_flat
    ]
    headers = ["group", "culprit", "verdict", "scenarios", "key figure"]
    for part in named_rows(headers, rows, title=title, width=out.width):
        out.print(part)
    for m in masking_out:
        where = "all" if m["all"] else f"{len(m['scenarios'])}"
        out.print(
            Text(
                f"masking in {m['group']}: {m['culprit']} fails alone but passes reverted together with "
                f"{m['masked_by']} on {where} of the scenarios it fails ({', '.join(m['scenarios'][:3])}"
                f"{', ...' if len(m['scenarios']) > 3 else ''})"
            )
        )


def _searches(
    search: Any, *, fixes: tuple, env: tuple, chosen: Any, say: Any, every_set: bool
) -> tuple[Any, dict | None]:
    """The search (with the candidate fixes applied, if any) and, with fixes, the same search on
    the code without them first, summarised: what the fix changes is the answer."""
    from sglfix.execution.bisection import FailingBaseline

    unfixed: dict | None = None
    if fixes:
        say(f"bisect: without {','.join(fixes)}")
        try:
            unfixed = _summary(search(env).run(chosen, say=say, every_set=every_set))
        except FailingBaseline as exc:
            unfixed = {"failing_baseline": str(exc), "culprits": []}
        say(f"bisect: with {','.join(fixes)} applied")
    try:
        return search((*fixes, *env)).run(chosen, say=say, every_set=every_set), unfixed
    except FailingBaseline as exc:
        err.print(f"sglfix: error: {exc}", highlight=False, markup=False)
        raise typer.Exit(1) from None


def _summary(found: Any) -> dict:
    """A search's answer as the comparison reads it: each group's culprits and their verdicts."""
    return {
        "culprits": sorted(
            {(g["group"], ",".join(c["ids"]), c["verdict"]) for g in found.groups for c in g["culprits"]}
        )
    }


def _compare(fixes: tuple[str, ...], unfixed: dict, fixed: dict, candidates: Any) -> dict:
    """The search without and with the candidate fixes: which reverts fail only with or only
    without the fix. A culprit lost with the fix (a historical regression it hides) fails."""
    before = {tuple(c) for c in unfixed["culprits"]}
    after = {tuple(c) for c in fixed["culprits"]}
    rows = lambda s: [{"group": g, "ids": i.split(","), "verdict": v} for g, i, v in sorted(s)]  # noqa: E731
    label = ",".join(fixes)
    if "failing_baseline" in unfixed:
        outcome = f"{label}: without it the baseline fails ({unfixed['failing_baseline']}); with it the search ran"
        same = True
    elif before == after:
        outcome = f"{label}: the same {len(after)} culprit(s) with and without the fix: it changes no revert's verdict"
        same = True
    elif before <= after:
        # A revert that fails only with the fix applied: a scenario the fix clears now shows it.
        outcome = (
            f"{label}: every culprit found without the fix is found with it, and {len(after - before)} more "
            f"(scenarios the fix clears now show them)"
        )
        same = True
    else:
        outcome = (
            f"{label}: {len(before - after)} culprit(s) found without the fix are not found with it (the fix "
            f"hides their regression), {len(after - before)} only with it"
        )
        same = False
    return {
        "candidates": [c.to_json() for c in candidates],
        "same": same,
        "outcome": outcome,
        "without_fix": unfixed.get("failing_baseline") or rows(before),
        "only_without_fix": rows(before - after),
        "only_with_fix": rows(after - before),
    }


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


def _write_ci_reports(report: dict, cells: Any, *, info: dict, junit: str | None, markdown: str | None) -> None:
    """JUnit (one testcase per cell the search ran; every non-PASS cell fails, as for ``run``) and
    the Markdown summary (culprits, masking, the grid), also appended to $GITHUB_STEP_SUMMARY."""
    import os

    from sglfix.report.markdown import STEP_SUMMARY

    if not (junit or markdown or os.environ.get(STEP_SUMMARY)):
        return
    from sglfix.execution.planner import set_label
    from sglfix.report.jsonreport import build_report
    from sglfix.toggling import ENV_VAR

    keys = list(cells.results)
    ci = build_report(
        command=report["command"].split(),
        info=info,
        results=[cells.results[k] for k in keys],
        cell_ids=[f"{set_label(t)}::{n}" for t, n in keys],
        wall_s=report["wall_s"],
        env_revert=os.environ.get(ENV_VAR),
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
