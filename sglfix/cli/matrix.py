"""``sglfix matrix``: baseline and each toggle (with --parts, each part) over the scenarios."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from sglfix.cli.common import (
    Outputs,
    check_expect_fixes,
    check_expect_fixes_match,
    header,
    judge_ran,
    name_lines,
    print_known,
    run_plan,
    summary_line,
    verdict_text,
    write_outputs,
)
from sglfix.cli.context import err, options, out
from sglfix.cli.options import SCALE, SELECT, takes
from sglfix.common.verdicts import SEVERITY, letter_of, style_of

# The compact grid's key, in its order: the three that are no finding, then the failures from
# the least severe (each verdict's letter and style: sglfix.common.verdicts.LOOKS).
KEY_ORDER = ("PASS", "NOT_REACHED", "SKIP", *reversed([v for v in SEVERITY if v != "PASS"]))


# What a grid row or column needs to be shown by default: a cell that is a finding (not a PASS,
# nor a cell that never ran the reverted code, nor one that cannot run on this device).
_QUIET = frozenset({"PASS", "NOT_REACHED", "SKIP"})


def _grid(plan, results, *, title: str, width: int, show_all: bool = False) -> list:
    """The toggle x scenario grid. With full names and verdicts when it fits ``width``; else
    compact: a legend numbering the toggle sets, then one line per scenario, one mark per set
    and the name last and whole (never cut, piped or not, at any width). Findings first: unless
    ``show_all``, only the scenarios and toggle sets with a cell that is not PASS, NOT_REACHED
    or SKIP (the baseline column always), and a line saying what was left out."""
    verdicts = {(tuple(r.toggles), r.scenario): r.verdict for r in results}
    scenarios, sets, note = list(plan.scenarios), list(plan.sets), None
    if not show_all:
        loud = {(t, n) for (t, n), v in verdicts.items() if v not in _QUIET}
        scenarios = [s for s in plan.scenarios if any((t, s.name) in loud for t in plan.sets)]
        sets = [t for i, t in enumerate(plan.sets) if i == 0 or any((t, s.name) in loud for s in plan.scenarios)]
        hidden = (len(plan.scenarios) - len(scenarios), len(plan.sets) - len(sets))
        if any(hidden):
            note = Text(
                f"not shown: {hidden[0]} scenario(s), {hidden[1]} toggle set(s) with only PASS, NOT_REACHED or "
                "SKIP (--all shows the whole grid)",
                style="dim",
            )
        if not scenarios:
            return [Text(title, style="italic"), note] if note else [Text(title, style="italic")]
    parts = _draw(plan, verdicts, scenarios, sets, title=title, width=width)
    return parts + ([note] if note else [])


def _draw(plan, verdicts, scenarios, sets, *, title: str, width: int) -> list:
    from sglfix.execution.planner import set_label

    set_labels = [set_label(t) for t in sets]
    names = [s.name for s in scenarios]
    need = max(map(len, names)) + sum(max(len(lbl), 9) + 3 for lbl in set_labels) + 4
    if need <= width:
        table = Table("scenario", *set_labels, title=Text(title))
        for s in scenarios:
            table.add_row(Text(s.name), *[verdict_text(verdicts.get((t, s.name), "?")) for t in sets])
        return [table]
    parts: list = [Text(title, style="italic"), Text("toggle sets (one mark each, in this order):")]
    parts += [Text(f"  {i:>3}  {lbl}") for i, lbl in enumerate(set_labels)]
    key = Text("marks: ")
    for verdict in KEY_ORDER:
        key.append(letter_of(verdict), style=style_of(verdict))
        key.append(f" {verdict}  ")
    key.append(f"{letter_of(None)} not run")
    parts.append(key)

    def grouped(chars: list[Text]) -> Text:
        line = Text()
        for i, ch in enumerate(chars):
            if i and i % 5 == 0:
                line.append(" ")
            line.append_text(ch)
        return line

    n = len(sets)
    if n > 10:  # a ruler over the marks: tens, then ones
        parts.append(grouped([Text(str(i // 10) if i % 10 == 0 else " ") for i in range(n)]))
    parts.append(grouped([Text(str(i % 10)) for i in range(n)]))
    for s in scenarios:
        marks = []
        for t in sets:
            verdict = verdicts.get((t, s.name), "?")
            marks.append(Text(letter_of(verdict), style=style_of(verdict)))
        line = grouped(marks)
        line.append("  ")
        line.append(s.name)
        parts.append(line)
    return parts


MATRIX_OPTIONS = (
    "parts",
    "apply",
    "expect_fixes",
    *SELECT,
    "heatmap",
    *SCALE,
    "no_reachability",
    "cache",
    "no_cache",
    "verify_store",
    "env_baseline",
    "show_all",
)


@takes(*MATRIX_OPTIONS)
def matrix_cmd(ctx: typer.Context, **given: Any) -> None:
    """Baseline plus each registered toggle (and part) over the scenarios: the toggle x scenario grid; with
    --apply, every set also with a candidate fix applied, judged against the same set without it."""
    from sglfix.execution.known import known_of
    from sglfix.execution.planner import plan_matrix
    from sglfix.execution.settings import Settings
    from sglfix.report.outcome import Expect

    opts = options(ctx)
    json_file, show_all = given["json_file"], given["show_all"]
    outputs = Outputs(json=json_file, junit=given["junit"], markdown=given["markdown"], heatmap=given["heatmap"])
    known = known_of(opts.active_profile())  # a bad list is one line before any cell
    expect_fixes = check_expect_fixes(given["expect_fixes"], given["apply"])

    def build_plan(chosen, *, registry, env_ids):
        check_expect_fixes_match(expect_fixes, chosen)
        return plan_matrix(chosen, registry=registry, parts=given["parts"], env_ids=env_ids)

    settings = Settings.of(given, reachability=not given["no_reachability"])
    ran = run_plan(
        opts, settings, outputs=outputs, build_plan=build_plan, what="matrix", apply=given["apply"], given=given
    )
    plan, results, env, info, wall = ran.plan, ran.results, ran.env, ran.info, ran.wall
    report, judgement = judge_ran(
        opts, ran, mode="gate", expects=Expect.of_registry(ran.registry), known=known, expect_fixes=expect_fixes
    )
    write_outputs(report, outputs, judgement=judgement)
    what = "matrix" if ran.shard is None else f"matrix shard {ran.shard}"
    if json_file != "-":
        title = header(what=what, info=info, env=env, wall=wall, cells=len(results), report=report)
        if judgement.baseline_note():
            title += f"; {judgement.baseline_note()}"
        for part in _grid(plan, results, width=out.width, title=title, show_all=show_all):
            out.print(part)
        _print_sets(plan, judgement, show_all=show_all)
        for c in judgement.checks:
            out.print(Text("met   " if c.met else "UNMET ", style="green" if c.met else "red"), end="")
            out.print(
                f"expect {c.expect.text} -> {'|'.join(c.expect.wanted)}"
                + ("" if c.met else f"; got {sorted(set(c.got.values()))}"),
                highlight=False,
                markup=False,
            )
        print_known(judgement, device=info.get("device", settings.device))
        for s in judgement.stray():
            out.print(Text("unexpected ", style="red"), end="")
            out.print(
                f"{','.join(s['toggles']) or 'baseline'} on {s['scenario']}: {s['verdict']} ({s['why']})",
                highlight=False,
                markup=False,
            )
        if judgement.not_checked:
            out.print(judgement.not_checked_summary().replace(" not checked", " expectation(s) not checked", 1))
        # A shard sees only some of an expectation's scenarios: whether it is met is decided on the
        # merged report (`sglfix report merge --gate`); stray verdicts and errors are per cell.
        if judgement.unmet and judgement.sharded:
            out.print(
                f"shard {ran.shard}: {len(judgement.unmet)} expectation(s) not met by this shard's scenarios "
                "alone; `sglfix report merge --gate` judges them over all shards"
            )
    (err if json_file == "-" else out).print(
        summary_line(what, results, wall=ran.wall, outcome=judgement.outcome(), outputs=outputs)
    )
    if judgement.failed:
        raise typer.Exit(1)


# How many scenario names a toggle set's line shows by default (--all: every one).
_NAMES = 6

# What a toggle set's line counts as its effect: a verdict the toggle set caused, met or not.
_EFFECT = frozenset({"expected", "covered", "unexpected", "unmet", "unchecked"})


def _print_sets(plan, judgement, *, show_all: bool = False) -> None:
    """One line per toggle set: the scenarios it changes (never a cell showing its baseline's own
    verdict or a known divergence), or why it changes none here (not reached, skipped). The names
    wrap at the terminal's width; unless ``show_all``, the first few and how many more."""
    from sglfix.execution.planner import set_label
    from sglfix.toggling.ids import is_candidate_id

    by_set: dict[tuple, list] = {}
    for c in judgement.cells:
        by_set.setdefault(c.toggles, []).append(c)
    for t in plan.sets[1:]:
        cells = by_set.get(t, [])
        out.print(Text(f"{set_label(t)}: ", style="bold"), end="")
        if any(is_candidate_id(i) for i in t):
            _print_patched(cells, show_all=show_all, width=out.width - len(set_label(t)) - 2)
            continue
        changed = [c for c in cells if c.meaning.value in _EFFECT and c.stands_for != "PASS"]
        # A cell standing for SKIP (its own, or not reached where its baseline SKIPs) was not run here.
        skipped = sum(c.stands_for == "SKIP" for c in cells)
        unreached = sum(c.verdict == "NOT_REACHED" and c.stands_for != "SKIP" for c in cells)
        as_before = sum(c.meaning.value in ("same-as-baseline", "known") and c.verdict != "NOT_REACHED" for c in cells)
        if cells and skipped == len(cells):
            out.print(f"every scenario SKIPs here ({len(cells)}): nothing tested on this device")
            continue
        if cells and unreached + skipped == len(cells):
            out.print(
                f"nothing tested here: {skipped} scenario(s) SKIP on this device, the other {unreached} never run "
                "the functions it reverts"
                if skipped
                else "not reached: these scenarios never run the functions it reverts"
            )
            continue
        notes = [
            f"{n} {what}"
            for n, what in ((unreached, "not reached"), (skipped, "SKIP here"), (as_before, "as baseline or known"))
            if n
        ]
        aside = f" ({', '.join(notes)})" if notes else ""
        if not changed:
            out.print("no effect on these scenarios" + aside, highlight=False, markup=False)
            continue
        from collections import Counter

        counts = Counter(c.verdict for c in changed)
        what = ", ".join(f"{n} {v}" for v, n in counts.most_common())
        lead = f"differs on {len(changed)} ({what}{'; ' + ', '.join(notes) if notes else ''}): "
        lines = name_lines(
            # Each name with its verdict only where the verdicts differ.
            [c.scenario if len(counts) == 1 else f"{c.scenario} ({c.verdict})" for c in changed],
            lead=lead,
            width=out.width - len(set_label(t)) - 2,
            limit=None if show_all else _NAMES,
        )
        for line in lines:
            out.print(line, highlight=False, markup=False)


def _print_patched(cells, *, show_all: bool, width: int) -> None:
    """A set with a candidate fix, against the same set without it: what it clears and breaks."""
    fixed = [c for c in cells if c.meaning.value == "fixed"]
    broken = [c for c in cells if c.meaning.value == "broken"]
    rest = len(cells) - len(fixed) - len(broken)
    if not fixed and not broken:
        out.print(f"the fix changes nothing here ({rest} cell(s) as without it)", highlight=False, markup=False)
        return

    def shown(c) -> str:  # "name (known divergence, INVARIANT -> PASS)", "name (PASS to DIVERGE)"
        if c.meaning.value == "fixed":
            known = "known divergence, " if "known divergence" in c.why else ""
            return f"{c.scenario} ({known}{c.why.rsplit('(', 1)[-1].rstrip(')')})"
        return f"{c.scenario} ({c.why.split(' changes ', 1)[-1]})"

    for what, group in (("clears", fixed), ("BREAKS", broken)):
        if group:
            lead = f"{what} {len(group)}: "
            for line in name_lines(
                [shown(c) for c in group], lead=lead, width=width, limit=None if show_all else _NAMES
            ):
                out.print(line, highlight=False, markup=False)
    out.print(f"  {rest} cell(s) as without the fix", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("matrix")(matrix_cmd)
