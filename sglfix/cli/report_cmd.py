"""``sglfix report ...``: work on JSON reports already written (no cell runs).

``compare OLD NEW`` is a CI gate (exit 1 on any changed verdict); ``merge A B ... -o OUT`` joins
shards into one report. Every subcommand is one function decorated with ``@subcommand(name)``;
``register`` mounts them all under ``sglfix report``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from rich.text import Text

from sglfix.cli.common import verdict_text
from sglfix.cli.context import add_group, err, options, out
from sglfix.cli.layout import named_rows
from sglfix.cli.options import JunitFile, MarkdownFile
from sglfix.common.errors import ConfigError

_SUBCOMMANDS: list[tuple[str, Callable]] = []
# How many cells present in one report only are listed on the terminal (--json lists them all).
_LIST_AT_MOST = 40


def subcommand(name: str) -> Callable[[Callable], Callable]:
    """Add a function as ``sglfix report NAME`` (its docstring is the help)."""

    def add(fn: Callable) -> Callable:
        _SUBCOMMANDS.append((name, fn))
        return fn

    return add


def _where(path: str, report: dict) -> str:
    from sglfix.report.outcome import codebase_label

    device = report.get("device") or "?"
    name = report.get("device_name")
    where = f"{device} ({name})" if name and name != device else device
    return f"{path}: {len(report['cells'])} cells of {codebase_label(report)} on {where}, schema {report['schema']}"


def _stands(verdict: str, stands_for: str) -> Text:
    """A verdict, and for NOT_REACHED the baseline's it stands for."""
    text = verdict_text(verdict or stands_for)
    if verdict and verdict != stands_for:
        text.append(f" (= {stands_for})", style="dim")
    return text


def _summary_text(counts: dict) -> str:
    return ", ".join(f"{v} {n}" for v, n in counts.items()) or "no cells"


@subcommand("compare")
def compare_cmd(
    old_path: str = typer.Argument(..., metavar="OLD.json", help="The reference report (e.g. the last good run)."),
    new_path: str = typer.Argument(..., metavar="NEW.json", help="The report to check against it."),
    strict: bool = typer.Option(False, "--strict", help="Also exit 1 when a cell is in one report only."),
    json_file: str | None = typer.Option(
        None, "--json", metavar="FILE", help="Write the comparison as JSON (- for stdout, instead of the table)."
    ),
    across_codebases: bool = typer.Option(
        False,
        "--across-codebases",
        help="Compare reports of different code bases (the reproduction and real sglang, or two sglang versions); refused otherwise.",
    ),
) -> None:
    """Compare two reports cell by cell: exit 1 if what any cell stands for changed (a CI regression gate)."""
    from sglfix.report.compare import check_codebases, compare_reports
    from sglfix.report.load import load_report
    from sglfix.report.output import check_output_path, write_json

    check_output_path(json_file, option="--json")
    old, new = load_report(old_path), load_report(new_path)
    across = check_codebases(old, new, across=across_codebases, old_path=old_path, new_path=new_path)
    result = compare_reports(old, new, across=across)
    if result.common == 0:
        # Nothing was compared: a gate that passes here would pass on any pair of files.
        raise ConfigError(
            f"{old_path} ({len(old['cells'])} cells) and {new_path} ({len(new['cells'])} cells) have no cell in "
            f"common; compare reports of the same scenarios and toggle sets (cells match by toggle set and scenario)"
        )
    if json_file is not None:
        write_json(json_file, result.to_json(old_path, old, new_path, new))
    if json_file != "-":
        if across:
            out.print(f"across code bases, as asked: {across}", highlight=False, markup=False)
        out.print(f"old {_where(old_path, old)}")
        out.print(f"new {_where(new_path, new)}")
        if result.changed:
            rows = []
            for c in result.changed:
                figure = (
                    Text(c.new_key_figure)
                    if c.new_key_figure
                    else Text(f"was: {c.old_key_figure}", style="dim")
                    if c.old_key_figure
                    else Text("")
                )
                rows.append(
                    [
                        Text(c.scenario),
                        Text(",".join(c.toggles) or "baseline"),
                        _stands(c.old_verdict, c.old),
                        _stands(c.new_verdict, c.new),
                        figure,
                    ]
                )
            headers = ["scenario", "toggle set", "old", "new", "key figure (new)"]
            title = f"{len(result.changed)} cell(s) changed verdict"
            for part in named_rows(headers, rows, title=title, width=out.width):
                out.print(part)
        out.print(
            f"{result.common} common cells: {result.same} same verdict, {len(result.changed)} changed"
            + (f", {len(result.skipped)} skipped on one side only (not compared)" if result.skipped else "")
            + f"; {len(result.only_old)} only in {old_path}, {len(result.only_new)} only in {new_path}"
        )
        if result.skipped:
            sides = {
                "old": sum(c.old == "SKIP" for c in result.skipped),
                "new": sum(c.new == "SKIP" for c in result.skipped),
            }
            out.print(
                f"skipped on one side: {sides['old']} cell(s) SKIP in {old_path}, {sides['new']} in {new_path} "
                "(they could not run there; --json FILE lists them, --strict fails on them)"
            )
        for path, ids in ((old_path, result.only_old), (new_path, result.only_new)):
            if ids:
                out.print(Text(f"only in {path}:", style="bold"))
                for cid in ids[:_LIST_AT_MOST]:
                    out.print(f"  {cid}")
                if len(ids) > _LIST_AT_MOST:
                    out.print(f"  ... and {len(ids) - _LIST_AT_MOST} more (--json FILE lists every one)")
    if result.failed(strict=strict):
        raise typer.Exit(1)


@subcommand("merge")
def merge_cmd(
    ctx: typer.Context,
    reports: list[str] = typer.Argument(
        ..., metavar="REPORT.json", help="Reports to merge (e.g. the shards of one matrix)."
    ),
    output: str = typer.Option(
        ..., "--output", "-o", metavar="FILE", help="Where to write the merged report (- for stdout)."
    ),
    junit: JunitFile = None,
    markdown: MarkdownFile = None,
    gate: bool = typer.Option(
        False,
        "--gate",
        help="Exit 1 as the matrix does: an unmet expectation, a stray verdict or an ERROR cell in the merged report; and, for shards, a shard missing or given twice.",
    ),
    partial: bool = typer.Option(
        False,
        "--partial",
        help="With --gate: accept a set of shards with some missing (the report records it as partial); a shard given twice still fails.",
    ),
    unchecked_plans: bool = typer.Option(
        False,
        "--unchecked-plans",
        help="With --gate: gate on shards that record no plan (written before reports recorded one) although "
        "whether they are of one plan cannot be checked (the report lists them).",
    ),
) -> None:
    """Merge reports (shards) into one: the cells' union; a cell with two different verdicts is an error."""
    from sglfix.cli.common import Outputs, write_outputs
    from sglfix.report.load import load_report
    from sglfix.report.merge import merge_judged
    from sglfix.report.output import check_output_path

    if unchecked_plans and not gate:
        raise ConfigError("--unchecked-plans lets --gate judge shards that record no plan: give --gate with it")
    check_output_path(output, option="--output")
    outputs = Outputs(json=output, junit=junit, markdown=markdown)
    outputs.check()
    inputs = [(path, load_report(path)) for path in reports]
    merged, judgement = merge_judged(inputs, command=options(ctx).argv, gate=gate, unchecked_plans=unchecked_plans)
    if merged.get("shards") and merged["shards"].get("no_plan"):
        unknown = merged["shards"]["no_plan"]
        err.print(
            f"sglfix: note: {', '.join(unknown)} record{'s' if len(unknown) == 1 else ''} no plan: not checked to be "
            "shards of one plan",
            highlight=False,
            markup=False,
        )
    shards = merged.get("shards")
    if partial:
        if shards is None:
            raise ConfigError("--partial accepts a partial set of shards, but no input is a shard (matrix --shard I/N)")
        shards["partial_allowed"] = True
        shards["problems"] = [p for p in shards["problems"] if "missing" not in p]
    write_outputs(merged, outputs, judgement=judgement)
    given = sum(len(r["cells"]) for _, r in inputs)
    kept = len(merged["cells"])
    note = f"; {given - kept} duplicate cell(s) kept once" if given > kept else ""
    (err if output == "-" else out).print(
        f"merged {len(inputs)} report(s) into {output}: {kept} cells ({_summary_text(merged['summary'])}){note}"
    )
    if gate:
        failing = _gate_failures(merged, judgement)
        for line in failing:
            (err if output == "-" else out).print(line, highlight=False, markup=False)
        outcome = judgement.outcome()
        if failing and not outcome.startswith("gate failed"):
            outcome = "gate failed: the set of shards is not the whole run"
        (err if output == "-" else out).print(f"merged report: {outcome}", highlight=False, markup=False)
        if failing:
            raise typer.Exit(1)


def _gate_failures(report: dict, judgement: Any) -> list[str]:
    """What fails the matrix's gate in a (merged) report, as its ``judgement`` says
    (``sglfix.report.outcome``): unmet expectations, unexpected verdicts, ERROR cells, cells a
    candidate fix breaks and what it was expected to clear and did not; and shards missing or
    given twice."""
    from sglfix.report.outcome import Meaning

    lines = [
        f"UNMET expect {c.expect.text} -> {'|'.join(c.expect.wanted)}; got {sorted(set(c.got.values()))}"
        for c in judgement.unmet
    ]
    lines += [
        f"unexpected {','.join(c.toggles) or 'baseline'} on {c.scenario}: {c.verdict} ({c.why})"
        for c in judgement.with_meaning(Meaning.UNEXPECTED, Meaning.FAILED)
    ]
    lines += [
        f"ERROR {c.scenario} ({','.join(c.toggles) or 'baseline'}): {c.key_figure}"
        for c in judgement.with_meaning(Meaning.ERROR)
    ]
    lines += [f"BROKEN {c.id}: {c.why}" for c in judgement.with_meaning(Meaning.BROKEN)]
    lines += [f"--expect-fixes {c.pattern}: {c.why}" for c in judgement.fix_checks if c.checked and not c.met]
    lines += [f"SHARDS {p}" for p in ((report.get("shards") or {}).get("problems") or [])]
    return lines


@subcommand("finding")
def finding_cmd(
    ctx: typer.Context,
    report_path: str = typer.Argument(..., metavar="REPORT.json", help="A run or matrix report (--json)."),
    cell_id: str = typer.Argument(..., metavar="CELL", help="The cell, as the report names it: TOGGLES::SCENARIO."),
    output: str | None = typer.Option(None, "--output", "-o", metavar="FILE.md", help="Write here (default: stdout)."),
    scenario_file: list[str] = typer.Option(
        [], "--scenario-file", metavar="PATH", help="The scenario file the report ran (default: the profile's)."
    ),
    no_rerun: bool = typer.Option(
        False,
        "--no-rerun",
        help="Do not run the cell again (nor fetch the report's release) to list the functions of the code base it entered.",
    ),
) -> None:
    """Write what an upstream issue needs about one failing cell, as Markdown: code base and versions
    (sglfix's commit among them), device, the scenario, how to install exactly what ran and the command
    that reproduces it (a --release report: on that release), observed and expected figures, the
    functions it ran (file and line), and the candidate fix that clears it, if the profile keeps one."""
    import sys

    from sglfix.cli.common import progress
    from sglfix.execution.finding import gather_finding, pick_cell
    from sglfix.report.finding import render_finding
    from sglfix.report.load import load_report
    from sglfix.report.output import check_output_path, write_atomic
    from sglfix.toggling.profiles import resolve_profile

    opts = options(ctx)
    check_output_path(output, option="--output")
    report = load_report(report_path)
    pick_cell(report_path, report, cell_id)  # nothing to write up: one line before any profile, fetch or cell
    if opts.profile is not None:
        profile = opts.active_profile()
    else:  # the profile the report ran
        cb = report.get("codebase")
        name = cb.get("name") if isinstance(cb, dict) else None
        profile = resolve_profile(option=name).profile if name else opts.active_profile()
    finding = gather_finding(
        report_path,
        report,
        cell_id,
        profile=profile,
        scenario_files=tuple(scenario_file),
        rerun=not no_rerun,
        progress=progress,
    )
    text = render_finding(finding)
    if output is None or output == "-":
        sys.stdout.write(text)
    else:
        write_atomic(output, text)
        err.print(f"sglfix report finding: {cell_id} -> {output}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    add_group(
        app,
        name="report",
        help="Compare and merge JSON reports; write one cell up as an upstream finding.",
        commands=_SUBCOMMANDS,
    )
