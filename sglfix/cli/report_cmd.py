"""``sglfix report ...``: work on JSON reports already written (no cell runs).

``compare OLD NEW`` is a CI gate (exit 1 on any changed verdict); ``merge A B ... -o OUT`` joins
shards into one report. Every subcommand is one function decorated with ``@subcommand(name)``;
``register`` mounts them all under ``sglfix report``.
"""

from __future__ import annotations

from collections.abc import Callable

import typer
from rich.text import Text

from sglfix.cli.common import JunitFile, MarkdownFile, verdict_text
from sglfix.cli.context import add_group, err, options, out
from sglfix.cli.layout import named_rows
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
    device = report.get("device") or "?"
    name = report.get("device_name")
    where = f"{device} ({name})" if name and name != device else device
    return f"{path}: {len(report['cells'])} cells on {where}, schema {report['schema']}"


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
) -> None:
    """Compare two reports cell by cell: exit 1 if any cell's verdict changed (a CI regression gate)."""
    from sglfix.report.compare import compare_reports
    from sglfix.report.load import load_report
    from sglfix.report.output import check_output_path, write_json

    check_output_path(json_file, option="--json")
    old, new = load_report(old_path), load_report(new_path)
    result = compare_reports(old, new)
    if result.common == 0:
        # Nothing was compared: a gate that passes here would pass on any pair of files.
        raise ConfigError(
            f"{old_path} ({len(old['cells'])} cells) and {new_path} ({len(new['cells'])} cells) have no cell in "
            f"common; compare reports of the same scenarios and toggle sets (cells match by toggle set and scenario)"
        )
    if json_file is not None:
        write_json(json_file, result.to_json(old_path, old, new_path, new))
    if json_file != "-":
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
                        verdict_text(c.old),
                        verdict_text(c.new),
                        figure,
                    ]
                )
            headers = ["scenario", "toggle set", "old", "new", "key figure (new)"]
            title = f"{len(result.changed)} cell(s) changed verdict"
            for part in named_rows(headers, rows, title=title, width=out.width):
                out.print(part)
        out.print(
            f"{result.common} common cells: {result.same} same verdict, {len(result.changed)} changed; "
            f"{len(result.only_old)} only in {old_path}, {len(result.only_new)} only in {new_path}"
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
) -> None:
    """Merge reports (shards) into one: the cells' union; a cell with two different verdicts is an error."""
    from sglfix.cli.common import Outputs, write_outputs
    from sglfix.report.load import load_report
    from sglfix.report.merge import merge_reports
    from sglfix.report.output import check_output_path

    check_output_path(output, option="--output")
    outputs = Outputs(json=output, junit=junit, markdown=markdown)
    outputs.check()
    inputs = [(path, load_report(path)) for path in reports]
    merged = merge_reports(inputs, command=options(ctx).argv)
    shards = merged.get("shards")
    if partial:
        if shards is None:
            raise ConfigError("--partial accepts a partial set of shards, but no input is a shard (matrix --shard I/N)")
        shards["partial_allowed"] = True
        shards["problems"] = [p for p in shards["problems"] if "missing" not in p]
    write_outputs(merged, outputs, gate=True)
    given = sum(len(r["cells"]) for _, r in inputs)
    kept = len(merged["cells"])
    note = f"; {given - kept} duplicate cell(s) kept once" if given > kept else ""
    (err if output == "-" else out).print(
        f"merged {len(inputs)} report(s) into {output}: {kept} cells ({_summary_text(merged['summary'])}){note}"
    )
    if gate:
        failing = _gate_failures(merged)
        for line in failing:
            (err if output == "-" else out).print(line)
        if failing:
            raise typer.Exit(1)


def _gate_failures(report: dict) -> list[str]:
    """What fails the matrix's gate in a (merged) report: unmet expectations, stray verdicts, ERROR cells."""
    lines = [
        f"UNMET expect revert {','.join(e['revert'])} on {e['scenario']} -> {'|'.join(e['wanted'])}; "
        f"got {sorted(set(e['got'].values()))}"
        for e in report.get("expectations", [])
        if isinstance(e, dict) and e.get("met") is False
    ]
    lines += [
        f"unexpected {','.join(s.get('toggles') or []) or 'baseline'} on {s.get('scenario')}: {s.get('verdict')}"
        for s in report.get("stray", [])
        if isinstance(s, dict)
    ]
    lines += [
        f"ERROR {c.get('scenario')} ({','.join(c.get('toggles') or []) or 'baseline'})"
        for c in report.get("cells", [])
        if c.get("verdict") == "ERROR"
    ]
    lines += [f"SHARDS {p}" for p in ((report.get("shards") or {}).get("problems") or [])]
    return lines


def register(app: typer.Typer) -> None:
    add_group(app, name="report", help="Compare and merge JSON reports (runs no cells).", commands=_SUBCOMMANDS)
