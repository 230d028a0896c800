"""What ``run`` and ``matrix`` share: scenario selection, the env toggle, the worker pool, tables."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from sglfix.cli.context import Options, err
from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.common.verdicts import style_of


def verdict_text(verdict: str) -> Text:
    """The verdict's name in its style (``sglfix.common.verdicts.LOOKS``)."""
    return Text(verdict, style=style_of(verdict))


def revert_ids(revert: Sequence[str]) -> list[str]:
    """``-r a,b -r c`` -> [a, b, c]; an empty id is an error, never 'nothing'."""
    from sglfix.toggling.ids import ToggleId

    return [str(i) for i in ToggleId.parse_list(list(revert), what="--revert")]


def load_selected(
    opts: Options,
    scenario_globs: Sequence[str],
    scenario_files: Sequence[str],
    backend: str | None,
    memory_budget: str | None = None,
):
    """The scenarios of the command's profile that the options select, checked at load."""
    from sglfix.execution.runner import choose_scenarios

    return choose_scenarios(
        profile=opts.active_profile(),
        globs=scenario_globs,
        files=scenario_files,
        backend=backend,
        memory_budget=memory_budget,
    )


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


def target(opts: Options, *, apply: Sequence[str] = ()):
    """The code base and toggles this command replays, as its options resolved them; ``apply``:
    candidate fix files, each checked against the code base (one line, exit 2, before any cell)."""
    from sglfix.execution.runner import Target

    registry = opts.registry()
    codebase = opts.codebase()
    candidates: tuple = ()
    if apply:
        from sglfix.toggling.candidate import load_candidates

        candidates = load_candidates(apply, codebase=codebase)
        for c in candidates:
            for note in c.notes:
                err.print(f"sglfix: note: {c.id}: {note}", highlight=False, markup=False)
        registry = registry.with_candidates(candidates)
    return Target(
        profile=opts.active_profile(),
        registry=registry,
        codebase=codebase,
        allowed_prefixes=opts.allowed_prefixes(),
        toggles_dir=str(registry.directory) if opts.toggles is not None else None,
        candidates=candidates,
    )


def check_expect_fixes(globs: Sequence[str], apply: Sequence[str]) -> tuple[str, ...]:
    """``--expect-fixes`` says what a candidate fix must clear: without ``--apply`` it is refused."""
    if globs and not apply:
        raise ConfigError("--expect-fixes names what a candidate fix must clear: give the fix with --apply FIX.patch")
    for g in globs:
        if not g.strip():
            raise ConfigError("--expect-fixes: empty pattern; give a scenario name or glob")
    return tuple(globs)


def check_expect_fixes_match(globs: Sequence[str], chosen: Sequence[Any]) -> None:
    """Each ``--expect-fixes`` pattern names a scenario the options selected (the whole selection,
    before any shard takes its part): one that names none could never be met, and the run would
    only say so after every cell ran."""
    import fnmatch

    from sglfix.common.schema import nearest

    names = [s.name for s in chosen]
    for g in globs:
        if not any(fnmatch.fnmatchcase(n, g) for n in names):
            raise ConfigError(
                f"--expect-fixes {g}: matches none of the {len(names)} selected scenario(s){nearest(g, names)}; "
                "give the name or glob of a scenario the run selects (sglfix scenarios lists them)"
            )


def run_plan(
    opts: Options,
    settings: Any,
    *,
    outputs: Outputs,
    build_plan: Callable[..., Any],
    what: str,
    apply: Sequence[str] = (),
    given: Mapping[str, Any] | None = None,
) -> Any:
    """Every option checked first (the report paths, then the settings, by
    ``sglfix.execution.runner.Runner``: exit 2 before any cell runs), then the plan built (with
    each set also run with the candidate fixes ``apply`` names) and run with progress on
    stderr; the ``Ran``, with the plan's identity made from the command's options ``given``."""
    from sglfix.execution.planner import patched
    from sglfix.execution.runner import Runner

    outputs.check()
    tgt = target(opts, apply=apply)
    runner = Runner(settings, tgt, what=what)
    if tgt.candidates:
        fixes = [c.id for c in tgt.candidates]
        inner = build_plan

        def build_plan(chosen, **kw):
            return patched(inner(chosen, **kw), fixes)

    with runner.booting():  # the workers boot while the plan is built and prechecked
        plan = runner.plan(build_plan)
        identity = _plan_identity(runner, tgt, settings, what=what, given=given or {})
        ran = runner.run(plan, progress=progress)
    ran.plan_identity = identity
    report_replacements(ran.replacements)
    return ran


def _plan_identity(runner: Any, tgt: Any, settings: Any, *, what: str, given: Mapping[str, Any]) -> dict:
    """The identity of the plan ``runner`` built (``sglfix.execution.shards.plan_identity``)."""
    from sglfix.execution.shards import plan_identity

    return plan_identity(
        command=what,
        options=given,
        cells=runner.whole_cells,
        profile=tgt.codebase,
        registry_dir=str(tgt.registry.directory),
        candidates=tgt.candidates,
        record=settings.record,
        timings=runner.timings,
    )


def report_replacements(whys: Sequence[str]) -> list[str]:
    """Each worker replaced between toggle sets (a restore that failed, or a set that left the
    code's state changed), one line on stderr each; the list goes into the report."""
    whys = list(whys)
    for why in whys:
        err.print(f"sglfix: warning: a worker was replaced: {why}")
    return whys


def judge_ran(
    opts: Options,
    ran: Any,
    *,
    mode: str,
    expects: Sequence[Any] = (),
    known: Sequence[Any] = (),
    expect_fixes: Sequence[str] = (),
) -> tuple[dict, Any]:
    """The report of ``ran`` and its judgement (``sglfix.report.outcome``): every cell's meaning,
    the expectations checked and not, the known divergences seen. The console, the exit code and
    every report file read this one judgement."""
    from sglfix.report.jsonreport import build_report
    from sglfix.report.outcome import judge

    report = build_report(
        command=opts.argv,
        info=ran.info,
        results=ran.results,
        cell_ids=[c.id for c in ran.plan.cells],
        wall_s=ran.wall,
        env_revert=envs.REVERT_PR.get(),
    )
    if ran.shard is not None:
        report["shard"] = str(ran.shard)
    if getattr(ran, "plan_identity", None) is not None:
        report["plan"] = dict(ran.plan_identity)
    if getattr(ran, "store", None) is not None:
        report["store"] = dict(ran.store)
        if ran.store.get("failed"):
            err.print(
                f"sglfix: the result store stopped keeping results ({ran.store['failed']}); this run's stand",
                highlight=False,
                markup=False,
            )
    report["worker_replacements"] = list(ran.replacements)
    report["reran_alone"] = list(ran.reran_alone)
    for line in ran.reran_alone:
        err.print(f"sglfix: ran again alone: {line}", highlight=False, markup=False)
    report["drifted"] = [{"id": rid, "why": why} for rid, why in ran.drifted.items()]
    for rid, why in ran.drifted.items():
        err.print(f"sglfix: {rid} no longer applies at this code, left out: {why}", highlight=False, markup=False)
    report["not_applicable"] = [{"id": rid, "why": why} for rid, why in ran.not_applicable.items()]
    if ran.not_applicable:
        err.print(
            f"sglfix: {len(ran.not_applicable)} revert(s) have no variant for this version, left out: "
            + "; ".join(ran.not_applicable.values()),
            highlight=False,
            markup=False,
        )
    if ran.candidates:
        report["apply"] = {
            "candidates": [c.to_json() for c in ran.candidates],
            # The set --expect-fixes is judged on: the plan's first (the baseline, or a run's reverts).
            "over": list(ran.plan.sets[0]) if ran.plan.sets else [],
            "expect_fixes": list(expect_fixes),
            "conflicts": [{"set": label, "why": why} for label, why in ran.conflicts.items()],
        }
        for label, why in ran.conflicts.items():
            err.print(f"sglfix: {label} not built: {why}", highlight=False, markup=False)
    judgement = judge(
        report,
        mode=mode,
        expects=expects,
        known=known,
        base=ran.env,
        fixes=[c.id for c in ran.candidates],
        expect_fixes=expect_fixes,
    )
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


@contextmanager
def progress(plan: Any) -> Iterator[Callable[[Any], None]]:
    """While ``plan`` runs: a progress bar on a terminal, progress lines in a log
    (``LogProgress``), both by expected work (``Work``); yields what each result is passed to."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

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
    ) as bar:
        task = bar.add_task("", total=work.total, last="", count=f"0/{work.cells}")

        def tick(result: Any) -> None:
            work.settle(result)
            bar.update(
                task,
                completed=work.done,
                total=work.total,
                last=f"{result.scenario} {result.verdict}",
                count=f"{work.count}/{work.cells}",
            )
            if log is not None:
                log.tick(result)

        yield tick


def summary_line(what: str, results: Sequence[Any], *, wall: float, outcome: str, outputs: Outputs) -> Text:
    """The last line of ``run`` and ``matrix``: counts by verdict (most severe first), the
    outcome (what the exit code says) and the report files written."""
    from collections import Counter

    from sglfix.common.verdicts import MARKS

    counts = Counter(r.verdict for r in results)
    served = sum(1 for r in results if getattr(r, "stored", None))
    stored = f" ({served} from the result store)" if served else ""
    text = Text(f"sglfix {what}: {len(results)} cells in {wall:.1f} s{stored}: ", style="bold")
    for i, verdict in enumerate(v for v in MARKS if counts[v]):
        if i:
            text.append(", ")
        text.append(f"{counts[verdict]} {verdict}", style=style_of(verdict))
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
        text += f"; {envs.REVERT_PR.name}={','.join(env)} applied to every cell"
    return text


# How a table marks a non-PASS verdict that fails nothing (its meaning, sglfix.report.outcome).
MEANING_MARK = {
    "expected": "expected",
    "covered": "within an expectation",
    "known": "known",
    "same-as-baseline": "as baseline",
    "unchecked": "unchecked",
    "cleared": "cleared by the fix",
    "broken": "broken by the fix",
    "changed": "fails either way",
}


def verdict_cell(verdict: str, meaning: Any = None) -> Text:
    """The verdict, and for one that fails nothing, why in brackets (``INVARIANT (known)``)."""
    text = verdict_text(verdict)
    value = getattr(getattr(meaning, "meaning", None), "value", "")
    mark = MEANING_MARK.get(value)
    if mark and verdict not in ("PASS", "NOT_REACHED", "SKIP"):
        text.append(f" ({mark})", style="dim")
    elif value == "fixed":
        text.append(f" ({meaning.why})", style="green")
    return text


def cells_table(results, *, title: str, width: int, judgement: Any = None, show_all: bool = False) -> list:
    """One row per cell, the scenario name whole at any width (``sglfix.cli.layout``); with
    ``judgement``, a verdict that fails nothing says why. Findings first: unless ``show_all``,
    only the cells that did not PASS, and one line counting those left out."""
    from sglfix.cli.layout import named_rows
    from sglfix.execution.planner import set_label

    def news(r: Any) -> bool:  # a pass a candidate fix brought is news too
        m = judgement.of(f"{set_label(r.toggles)}::{r.scenario}") if judgement else None
        return r.verdict != "PASS" or (m is not None and m.meaning.value == "fixed")

    shown = list(results) if show_all else [r for r in results if news(r)]
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
