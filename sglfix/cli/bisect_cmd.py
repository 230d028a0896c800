"""``sglfix bisect``: which reverted parts make which scenarios fail, and which mask each other.

Scenarios are grouped by their base name (before ``@``); each group whose scenarios fail with every
candidate reverted is searched on its own (``sglfix.execution.bisect``), on one warm worker pool.
A cell (toggle set x scenario) is run at most once whatever group or question asks for it; the
report's ``runs`` counts the distinct toggle sets executed. A culprit that is a whole PR with
several parts narrows to the parts; masking is looked for among a culprit's sibling parts and the
other culprits of its group.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from sglfix.cli.common import (
    BackendName,
    Device,
    EnvBaseline,
    Jobs,
    JsonFile,
    JunitFile,
    MarkdownFile,
    MemoryBudget,
    NoReachability,
    Outputs,
    ScenarioFiles,
    ScenarioGlobs,
    ShowAll,
    Timeout,
    check_device,
    check_env_baseline,
    check_env_knobs,
    check_jobs,
    env_ids,
    load_selected,
    precheck_plan,
    report_replacements,
    revert_ids,
    write_outputs,
)
from sglfix.cli.complete import toggle_ids
from sglfix.cli.context import _has_cuda_device, err, options, out
from sglfix.cli.layout import named_rows
from sglfix.common.errors import ConfigError

# Progress of a search: silent for a quick one, then a line at most this often (--all: per set).
_QUIET_S = 5.0
_EVERY_S = 15.0


def _group(name: str) -> str:
    return name.split("@", 1)[0]


class _Cells:
    """Runs (set, scenario) cells through the pool on demand, each once."""

    def __init__(self, pool, scenarios, env: tuple[str, ...], *, every_set: bool = False, clock=None):
        import time

        from sglfix.execution.planner import PlannedCell

        self._pool, self._env, self._planned = pool, env, PlannedCell
        # A line per toggle set is a few hundred lines for a full search: by default one line at
        # most every ``_EVERY_S`` seconds, after the first ``_QUIET_S`` (``every_set``: each set).
        self._every_set, self._clock = every_set, clock or time.perf_counter
        self._start = self._clock()
        self._last: float | None = None
        self.rank: dict[str, int] = {}  # candidate -> position: the order every set is applied in
        self.by_name = {s.name: s for s in scenarios}
        self.results: dict[tuple[tuple[str, ...], str], Any] = {}
        self.sets: set[tuple[str, ...]] = set()
        self.context = "baseline"  # what the progress lines say the search is busy with

    def run(self, ids: tuple[str, ...], names: list[str], *, record: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The cells of ``ids`` reverted on ``names``; ``record``: also report which of these
        target functions each run enters (reachability)."""
        from sglfix.execution.reach import RecordingCell

        ids = tuple(sorted(dict.fromkeys(ids), key=lambda c: (self.rank.get(c, len(self.rank)), c)))
        toggles = tuple(self._env) + ids  # one order per set: (a, b) and (b, a) run once
        todo = [n for n in names if (toggles, n) not in self.results]
        if todo:
            self.sets.add(ids)
            self._progress(ids, len(todo))
            if record is None:
                cells = [self._planned(self.by_name[n], toggles) for n in todo]
            else:
                cells = [RecordingCell(self.by_name[n], toggles, record) for n in todo]
            for cell, result in zip(cells, self._pool.run(cells)):
                self.results[(toggles, cell.scenario.name)] = result
        return {n: self.results[(toggles, n)] for n in names}

    def _progress(self, ids: tuple[str, ...], todo: int) -> None:
        now = self._clock()
        if not self._every_set:
            if now - self._start < _QUIET_S or (self._last is not None and now - self._last < _EVERY_S):
                return
            self._last = now
            err.print(
                f"bisect [{self.context}]: {len(self.sets)} toggle set(s), {len(self.results)} cell(s) run, "
                f"{now - self._start:.0f} s",
                highlight=False,
                markup=False,
            )
            return
        shown = ",".join(ids[:4]) + (f",... ({len(ids)} parts)" if len(ids) > 4 else "") if ids else "nothing"
        err.print(f"bisect [{self.context}]: {todo} cell(s) with {shown} reverted", highlight=False, markup=False)


def bisect_cmd(
    ctx: typer.Context,
    revert: list[str] = typer.Option(
        [],
        "--revert",
        "-r",
        metavar="ID",
        autocompletion=toggle_ids,
        help="Candidate toggles or parts (repeatable; comma lists too); default every registered part.",
    ),
    scenario: ScenarioGlobs = [],
    scenario_file: ScenarioFiles = [],
    backend: BackendName = None,
    device: Device = "auto",
    jobs: Jobs = None,
    timeout: Timeout = 300.0,
    json_file: JsonFile = None,
    junit: JunitFile = None,
    markdown: MarkdownFile = None,
    memory_budget: MemoryBudget = None,
    no_reachability: NoReachability = False,
    env_baseline: EnvBaseline = False,
    show_all: ShowAll = False,
) -> None:
    """Find the reverted parts that make each scenario group fail (delta debugging) and the masking pairs."""
    from sglfix.common.verdicts import worst
    from sglfix.execution.bisect import Oracle, find_culprits
    from sglfix.execution.known import load_known
    from sglfix.execution.planner import Plan
    from sglfix.execution.pool import WorkerConfig, WorkerPool, signals_raise
    from sglfix.report.outcome import ENV_VAR, Known, Meaning, Rules
    from sglfix.report.output import write_json

    opts = options(ctx)
    check_env_knobs()
    Outputs(json=json_file, junit=junit, markdown=markdown).check()
    known = load_known(opts.active_profile().known_file)
    registry = opts.registry()
    given = revert_ids(revert)
    if given:
        seen: dict[str, str] = {}  # part -> the candidate that names it
        for rid in given:
            for sel in registry.select(rid):  # an unknown id is a one-line error before anything runs
                if sel.id in seen:
                    raise ConfigError(
                        f"-r {rid}: {seen[sel.id]} already names {sel.id}; give each part once "
                        f"(a whole toggle, or some of its parts)"
                    )
                seen[sel.id] = rid
        candidates = list(dict.fromkeys(given))
    else:
        candidates = [rid for t in registry for rid in (t.ids[1:] if len(t.parts) > 1 else t.ids[:1])]
    check_device(device)
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
    check_env_baseline(env, env_baseline, what="bisect")
    chosen = load_selected(opts, scenario, scenario_file, backend, memory_budget)
    # Every revert the search may apply, checked against the installed source before any worker
    # starts (as run and matrix do): a match that is not in the code is one line, exit 2.
    precheck_plan(
        Plan(scenarios=chosen[:1], sets=[tuple(env) + (c,) for c in candidates]),
        registry=registry,
        codebase=codebase,
        allowed_prefixes=opts.allowed_prefixes(),
    )
    # What a cell means is judged as everywhere (sglfix.report.outcome): a known divergence of the
    # profile, or the verdict its baseline shows too, is no failure of the set reverted.
    rules = Rules(mode="findings", known=tuple(Known.of(known)), base=tuple(env))

    from sglfix.toggling.ids import ToggleId

    def toggle_of(rid: str):
        return registry.toggles[ToggleId.parse(rid).pr]

    def parts_of(rid: str) -> list[str]:
        toggle = toggle_of(rid)
        return toggle.ids[1:] if ":" not in rid and len(toggle.parts) > 1 else []

    def siblings(rid: str) -> list[str]:
        return [i for i in toggle_of(rid).ids[1:] if i != rid] if ":" in rid else []

    import datetime
    import time

    started = time.perf_counter()
    groups_out, masking_out, masking_sets = [], [], set()
    with signals_raise(), WorkerPool(config, jobs=check_jobs(jobs, device)) as pool:
        _ = pool.info  # the workers' handshake (a device they cannot use) before any progress line
        cells = _Cells(pool, chosen, env, every_set=show_all)
        cells.rank = {c: i for i, c in enumerate(candidates)}
        names = [s.name for s in chosen]
        from sglfix.execution.reach import targets_of

        targets = {c: targets_of([c], registry=registry) for c in candidates}
        record = None if no_reachability else tuple(sorted(set().union(*targets.values())))
        baseline = cells.run((), names, record=record)
        base_json = {n: r.to_json() for n, r in baseline.items()}
        judged = {n: rules.meaning(base_json[n], None) for n in names}
        skipped = [n for n in names if judged[n][0] is Meaning.SKIPPED]
        known_base = [n for n in names if judged[n][0] is Meaning.KNOWN]
        bad = {n: baseline[n] for n in names if judged[n][0].fails}
        if bad:
            first = next(iter(bad.values()))
            what = f"{ENV_VAR}={','.join(env)}" if env else "nothing reverted"
            err.print(
                f"sglfix: error: the baseline ({what}) "
                f"fails {len(bad)} scenario(s), e.g. "
                f"{first.scenario}: {first.verdict} {first.key_figure}; bisect needs a passing baseline",
                highlight=False,
                markup=False,
            )
            raise typer.Exit(1)
        if skipped or known_base:
            err.print(
                "bisect: "
                + "; ".join(
                    text
                    for text in (
                        f"{len(skipped)} scenario(s) SKIP here, left out ({', '.join(skipped[:3])}"
                        f"{', ...' if len(skipped) > 3 else ''})"
                        if skipped
                        else "",
                        f"{len(known_base)} scenario(s) show a known divergence in the baseline: that verdict "
                        f"is not counted ({', '.join(known_base[:3])}{', ...' if len(known_base) > 3 else ''})"
                        if known_base
                        else "",
                    )
                    if text
                ),
                highlight=False,
                markup=False,
            )
        names = [n for n in names if n not in skipped]

        def failing(results: dict) -> list[str]:
            """The scenarios whose cell fails, as the judgement means it (never a known
            divergence, never the baseline's own verdict)."""
            return sorted(n for n, r in results.items() if rules.meaning(r.to_json(), base_json.get(n))[0].fails)

        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(_group(n), []).append(n)
        for number, (group, members) in enumerate(groups.items(), 1):
            cells.context = f"group {number}/{len(groups)} {group}"
            asked: set[frozenset] = set()  # the distinct sets this group's search asks about

            def fails(ids, members=members, asked=asked):
                asked.add(frozenset(ids))
                return bool(failing(cells.run(tuple(ids), members)))

            # Candidates none of whose functions the group's baselines enter cannot change its
            # cells alone; they are left out of the search unless only they explain the failure.
            reached = [baseline[n].reached for n in members]
            searched, unreachable = list(candidates), []
            if record is not None and all(r is not None for r in reached):
                entered = set().union(*map(set, reached))
                searched = [c for c in candidates if targets[c] & entered]
                unreachable = [c for c in candidates if c not in searched]
            oracle = Oracle(fails, order=candidates)
            culprits = find_culprits(searched, oracle)
            if not culprits and unreachable and fails(candidates):
                # Only a combination with the unreached candidates explains it: search them all.
                searched, unreachable = list(candidates), []
                culprits = find_culprits(searched, oracle)
            narrowed = []
            for culprit in culprits:
                if len(culprit) == 1 and parts_of(culprit[0]):
                    narrowed += find_culprits(parts_of(culprit[0]), oracle) or [culprit]
                else:
                    narrowed.append(culprit)
            search_runs = len(asked)
            search_sets = set(cells.sets)
            # Masking breaks the premise of every group question (a passing set is clean): sweep,
            # alone, the candidates a search can have missed. With no culprit found, every
            # searched candidate; otherwise the parts of a toggle with another part among the
            # candidates (parts of one fix are where masking lives: 26651's fixture and Triton).
            alone_asked = {next(iter(k)) for k in asked if len(k) == 1}
            found_ids = {c for culprit in narrowed for c in culprit}
            sweep = [
                c
                for c in (
                    searched if not narrowed else [c for c in searched if any(sib in candidates for sib in siblings(c))]
                )
                if c not in alone_asked and c not in found_ids
            ]
            swept = []
            if sweep:
                cells.context = f"group {number}/{len(groups)} {group}: masking sweep"
            for c in sweep:
                if fails([c]):
                    narrowed.append([c])
                    swept.append(c)
            found = []
            for culprit in narrowed:
                results = cells.run(tuple(culprit), members)
                bad_names = failing(results)
                if not bad_names:
                    continue
                verdict = worst([results[n].verdict for n in bad_names])
                # The figure of a cell that gave the verdict shown, never another scenario's.
                shown = next(n for n in bad_names if results[n].verdict == verdict)
                found.append(
                    {
                        "ids": list(culprit),
                        "verdict": verdict,
                        "scenarios": bad_names,
                        "key_figure": results[shown].key_figure,
                        "key_scenario": shown,
                        "found_by": "masking sweep" if culprit[0] in swept else "search",
                    }
                )
            others = [c[0] for c in narrowed if len(c) == 1]
            for culprit in found:
                if len(culprit["ids"]) != 1:
                    continue
                (c,) = culprit["ids"]
                partners = siblings(c) + [o for o in others if o != c]
                if culprit["found_by"] == "masking sweep":
                    partners += [o for o in searched if o != c]  # something in the search hid it
                for partner in dict.fromkeys(partners):
                    # On the scenarios the culprit fails alone: which pass with both reverted?
                    both = cells.run((c, partner), culprit["scenarios"])
                    hidden = sorted(set(both) - set(failing(both)))
                    if hidden:
                        masking_out.append(
                            {
                                "group": group,
                                "culprit": c,
                                "masked_by": partner,
                                "scenarios": hidden,
                                "all": len(hidden) == len(culprit["scenarios"]),
                            }
                        )
                        if culprit["found_by"] == "masking sweep":
                            break  # named: the search's premise failed here
            masking_sets.update(cells.sets - search_sets)
            groups_out.append(
                {
                    "group": group,
                    "scenarios": len(members),
                    "culprits": found,
                    "unreachable": unreachable,
                    "searched": len(searched),
                    "runs": search_runs,
                    "swept": len(sweep),
                }
            )

    groups_out = [g for g in groups_out if g["culprits"] or g["unreachable"]]
    culprits_flat = [{**c, "group": g["group"]} for g in groups_out for c in g["culprits"]]
    report = {
        "schema": 2,
        "tool": "sglfix bisect",
        "command": " ".join(opts.argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started, 2),
        "device": pool.info.get("device"),
        "device_name": pool.info.get("device_name"),
        "codebase": pool.info.get("codebase"),
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
        "worker_replacements": report_replacements(pool),
    }
    if json_file is not None:
        write_json(json_file, report)
    _write_ci_reports(report, cells, info=pool.info, junit=junit, markdown=markdown)
    if json_file != "-":
        from sglfix.report.outcome import codebase_label

        title = (
            f"sglfix bisect on {report['device']} ({report['device_name'] or report['device']}): "
            f"{len(candidates)} candidates, the baseline and {report['sets_run']} toggle "
            f"sets ({report['runs']} searched, {report['masking_runs']} for masking), "
            f"{report['cells']} cells in {report['wall_s']:.1f} s; code base: {codebase_label(report)}"
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
    raise typer.Exit(1 if culprits_flat else 0)


def _write_ci_reports(report: dict, cells: _Cells, *, info: dict, junit: str | None, markdown: str | None) -> None:
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


def register(app: typer.Typer) -> None:
    app.command("bisect")(bisect_cmd)
