"""A Markdown summary of a report dict: one summary line, the toggle x scenario grid, and for a
matrix the unmet expectations and unexpected verdicts. GitHub renders it as a job summary
(``append_step_summary`` adds it to ``$GITHUB_STEP_SUMMARY``)."""

from __future__ import annotations

import os
import re
from typing import Any

from sglfix.common.verdicts import MARKS, letter_of, worst
from sglfix.report.grid import Grid
from sglfix.report.outcome import Meaning, codebase_label
from sglfix.report.output import check_output_file, write_atomic

__all__ = [
    "GROUP_ROWS_OVER",
    "SUFFIXES",
    "append_step_summary",
    "check_markdown_path",
    "code_span",
    "escape",
    "render_markdown",
    "write_markdown",
]

SUFFIXES = (".md", ".markdown")
STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
GROUP_ROWS_OVER = 40  # more scenarios than this: one grid row per base name (before '@')
FULL_COLUMNS_UP_TO = 8  # more toggle sets than this: short column ids and a legend
LIST_AT_MOST = 50  # entries per list (unmet, unexpected, failing cells)


def check_markdown_path(path: str | None, *, option: str = "--markdown") -> None:
    """Exit 2 now if ``path`` is not a writable ``.md`` file path."""
    check_output_file(path, option=option, suffixes=SUFFIXES)


def escape(text: object) -> str:
    """``text`` as plain Markdown text: no Markdown or HTML read into it, one line."""
    return re.sub(r"([\\`*_{}\[\]<>#+!|~])", r"\\\1", " ".join(str(text).split()))


def code_span(text: object, *, in_table: bool = False) -> str:
    """``text`` as one line of inline code, whatever backticks it holds (``in_table``: its ``|``
    escaped, as a table's cell needs)."""
    text = " ".join(str(text).split())
    ticks = "`" * (max((len(m) for m in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    span = f"{ticks}{pad}{text}{pad}{ticks}"
    return span.replace("|", "\\|") if in_table else span


# sglfix's own options before the command, and those that take a value (sglfix.cli.app).
_GLOBAL_WITH_VALUE = ("--toggles", "--profile", "--release", "--wheels", "--codebase-version", "--allow-target")
_GROUPS = ("report", "toggle")  # commands whose first argument is a subcommand


def _command(report: dict) -> str:
    """``sglfix matrix`` (``sglfix report merge``): the command of the report's command line,
    past sglfix's own options (``--profile NAME``, ``--debug``, ...)."""
    words = str(report.get("command") or "").split()
    if not words or words[0] != "sglfix":
        return "sglfix"
    rest = iter(words[1:])
    for word in rest:
        if word in _GLOBAL_WITH_VALUE:
            next(rest, None)
        elif not word.startswith("-"):
            sub = next(rest, "") if word in _GROUPS else ""
            return " ".join(["sglfix", word] + ([sub] if sub and not sub.startswith("-") else []))
    return "sglfix"


def _counts(report: dict) -> str:
    summary: dict[str, int] = {}
    for cell in report.get("cells") or ():
        summary[cell.get("verdict", "?")] = summary.get(cell.get("verdict", "?"), 0) + 1
    order = ["PASS", *[v for v in MARKS if v != "PASS"]]
    order += [v for v in summary if v not in order]
    return ", ".join(f"{summary[v]} {v}" for v in order if summary.get(v))


def _summary_line(report: dict, judgement) -> str:
    cells = len(report.get("cells") or ())
    device = report.get("device") or "?"
    name = report.get("device_name") or device
    where = device if name == device else f"{device} ({name})"
    wall = report.get("wall_s")
    took = f" in {float(wall):.1f} s" if isinstance(wall, (int, float)) else ""
    counts = _counts(report) or "no cells"
    env = (
        f"; SGLANG\\_DEBUG\\_REVERT\\_PR={escape(report['env_revert'])} in every cell"
        if report.get("env_revert") not in (None, "", "0")
        else ""
    )
    base = judgement.baseline_note()
    return (
        f"**{cells} cell{'s' * (cells != 1)}** of {escape(codebase_label(report))} on {escape(where)}{took}: "
        f"{counts}{env}" + (f"; {escape(base)}" if base else "")
    )


def _mark(verdict: str | None) -> str:
    """A grid cell: PASS (the most of a grid) and no result by their letters, so that the
    findings stand out by name (``sglfix.common.verdicts.LOOKS``)."""
    return letter_of(verdict) if verdict is None or verdict == "PASS" else verdict


def _grid_lines(grid: Grid) -> list[str]:
    if not grid.columns:
        return []
    full = len(grid.columns) <= FULL_COLUMNS_UP_TO
    heads = [code_span(c, in_table=True) for c in grid.columns] if full else [f"t{i}" for i in range(len(grid.columns))]
    grouped = len(grid.rows) > GROUP_ROWS_OVER
    lines = [
        "| " + " | ".join(["scenario group" if grouped else "scenario", *heads]) + " |",
        "|" + "---|" * (len(heads) + 1),
    ]
    if grouped:
        for group, rows in grid.groups:
            label = code_span(group + ("@*" if any("@" in r for r in rows) else ""), in_table=True) + f" ({len(rows)})"
            marks = []
            for col in grid.columns:
                verdicts = [grid.verdict(col, s) for s in rows]
                ran = [v for v in verdicts if v is not None]
                # NOT_REACHED is no verdict of the code: counted apart, never as the worst one's.
                unreached = sum(v == "NOT_REACHED" for v in ran)
                bad = [v for v in ran if v not in ("PASS", "NOT_REACHED")]
                also = f", {unreached} not reached" if unreached else ""
                if not ran:
                    marks.append(letter_of(None))
                elif unreached == len(ran):
                    marks.append("NOT_REACHED" if len(ran) == len(rows) else f"NOT_REACHED {len(ran)}/{len(rows)}")
                elif not bad:
                    passed = len(ran) - unreached
                    mark = letter_of("PASS")
                    marks.append((mark if passed == len(rows) else f"{mark} {passed}/{len(rows)}") + also)
                else:
                    marks.append(f"{worst(bad)} {len(bad)}/{len(rows)}{also}")
            lines.append("| " + " | ".join([label, *marks]) + " |")
    else:
        for s in grid.rows:
            lines.append(
                "| "
                + " | ".join([code_span(s, in_table=True), *(_mark(grid.verdict(c, s)) for c in grid.columns)])
                + " |"
            )
    legend = f"{code_span(letter_of('PASS'))} PASS" + (
        ", a group cell: the worst verdict and how many of its scenarios showed it "
        "or another failing verdict, then how many were not reached"
        if grouped
        else ""
    )
    lines += ["", legend + "."]
    if not full:
        lines.append("Columns: " + ", ".join(f"t{i} {code_span(c)}" for i, c in enumerate(grid.columns)) + ".")
    return lines


def _capped(items: list[str]) -> list[str]:
    more = len(items) - LIST_AT_MOST
    return items[:LIST_AT_MOST] + ([f"- ... and {more} more (see the JSON report)"] if more > 0 else [])


def _gate_lines(report: dict, judgement) -> list[str]:
    checks = judgement.checks
    unmet = judgement.unmet if not judgement.sharded else []
    stray = judgement.stray()
    errors = judgement.with_meaning(Meaning.ERROR)
    not_checked = judgement.not_checked_summary() or "0 not checked"
    lines = [
        f"**Gate: {'passed' if not judgement.failed else 'FAILED'}**: {len(checks) - len(judgement.unmet)}/"
        f"{len(checks)} expectations met, {len(stray)} unexpected verdict(s), {len(errors)} ERROR cell(s), "
        f"{escape(not_checked)}{_drift_count(judgement)}."
    ]
    if unmet:
        lines += ["", "Unmet expectations:", ""]
        lines += _capped(
            [
                f"- revert {code_span(','.join(c.expect.revert))} on {code_span(c.expect.scenario)}: wanted "
                f"{escape('|'.join(c.expect.wanted))}, got {escape(', '.join(sorted(set(c.got.values()))))}"
                for c in unmet
            ]
        )
    if stray:
        lines += ["", "Unexpected verdicts:", ""]
        lines += _capped(
            [
                f"- {code_span(','.join(s.get('toggles') or ()) or 'baseline')} on {code_span(s.get('scenario'))}: "
                f"{escape(s.get('verdict'))} ({escape(s.get('why', ''))})"
                for s in stray
            ]
        )
    if errors:
        lines += ["", "ERROR cells (sglfix could not judge them):", ""]
        lines += _capped([f"- {code_span(c.id)}: {escape(c.key_figure)}" for c in errors])
    if judgement.not_checked:
        lines += ["", "Expectations not checked:", ""]
        lines += _capped([f"- {code_span(n.expect.text)}: {escape(n.reason)}" for n in judgement.not_checked])
    return lines + _drift_lines(judgement) + _known_lines(judgement)


def _drift_count(judgement) -> str:
    n = len(judgement.drifted)
    return f", {n} revert(s) no longer apply" if n else ""


def _drift_lines(judgement) -> list[str]:
    """The reverts that no longer apply to the code followed beyond its profile (they fail)."""
    if not judgement.drifted:
        return []
    lines = ["", "Reverts that no longer apply here (their sets did not run):", ""]
    return lines + _capped([f"- {code_span(rid)}: {escape(why)}" for rid, why in judgement.drifted.items()])


def _known_lines(judgement) -> list[str]:
    if not judgement.known:
        return []
    lines = ["", "Known divergences (confirmed upstream bugs; they fail no gate):", ""]
    for hit in judgement.known:
        k = hit.known
        lines.append(
            f"- {code_span(k.scenario)} -> {escape('|'.join(k.verdict))}: {escape(hit.status)}"
            + (f" on {len(hit.seen_on)} baseline cell(s)" if hit.seen_on else "")
            + f"; reproduce: {code_span(k.reproduce)}"
        )
    return lines


def _failing_lines(report: dict, judgement) -> list[str]:
    bad = judgement.failing
    explained = [c for c in judgement.cells if c.meaning.explained]
    lines = []
    if bad:
        lines += [
            "",
            "Not passing:",
            "",
            *_capped([f"- {code_span(c.id)}: **{escape(c.verdict)}** {escape(c.key_figure)}" for c in bad]),
        ]
    if explained:
        lines += [
            "",
            "Not passing, and failing nothing:",
            "",
            *_capped([f"- {code_span(c.id)}: {escape(c.verdict)}: {escape(c.why)}" for c in explained]),
        ]
    return lines


def _bisect_lines(report: dict) -> list[str]:
    culprits, masking = report.get("culprits") or [], report.get("masking") or []
    lines = [
        f"**{len(culprits)} culprit(s)** among {report.get('candidates', '?')} candidates: "
        f"the baseline and {report.get('sets_run', '?')} toggle sets ({report.get('runs', '?')} searched, "
        f"{report.get('masking_runs', 0)} for masking).",
        "",
    ]
    if culprits:
        lines += ["| group | culprit | verdict | scenarios | key figure |", "|---|---|---|---|---|"]
        lines += [
            f"| {code_span(c.get('group'), in_table=True)} | {code_span(','.join(c.get('ids') or ()), in_table=True)} | "
            f"{escape(c.get('verdict'))} | {len(c.get('scenarios') or ())} | "
            f"{escape(c.get('key_figure', ''))} |"
            for c in culprits
        ]
        lines.append("")
    if masking:
        lines += ["Masking:", ""]
        lines += _capped(
            [
                f"- in {code_span(m.get('group'))}: {code_span(m.get('culprit'))} fails alone but passes reverted together "
                f"with {code_span(m.get('masked_by'))} on {'all' if m.get('all') else len(m.get('scenarios') or ())} "
                f"of the scenarios it fails"
                for m in masking
            ]
        )
        lines.append("")
    return lines


def _fix_lines(judgement: Any) -> list[str]:
    """With --apply: what the candidate fixes clear and break, cell by cell."""
    out = [f"**Candidate fix** {escape(judgement.fix_summary())}", ""]
    for meaning, what in ((Meaning.FIXED, "clears"), (Meaning.BROKEN, "BREAKS"), (Meaning.CHANGED, "changes")):
        for c in judgement.with_meaning(meaning):
            out.append(f"- {what} {code_span(c.id)}: {escape(c.why)}")
    return out


def render_markdown(report: dict, *, gate: bool | None = None, judgement=None) -> str:
    """The Markdown summary. ``gate`` (default: the report's own mode, a matrix's gate): report the
    matrix's gate instead of listing every cell that did not pass. Every cell's meaning is read
    from ``judgement`` (``sglfix.report.outcome.judge`` of the report, made here when not given)."""
    from sglfix.report.outcome import judge

    if judgement is None:
        judgement = judge(report, mode=None if gate is None else "gate" if gate else "findings")
    gate = judgement.mode == "gate"
    lines = [f"### {escape(_command(report))}", "", _summary_line(report, judgement), ""]
    if judgement.rules.fixes:
        lines += _fix_lines(judgement) + [""]
    bisect = "culprits" in report
    if bisect:
        lines += _bisect_lines(report)
    elif gate:
        lines += _gate_lines(report, judgement) + [""]
    lines += _grid_lines(Grid.of(report))
    if not gate and not bisect:
        lines += _failing_lines(report, judgement) + _drift_lines(judgement) + _known_lines(judgement)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_markdown(report: dict, path: str, *, gate: bool | None = None, judgement=None) -> None:
    write_atomic(path, render_markdown(report, gate=gate, judgement=judgement))


def append_step_summary(text: str) -> str | None:
    """Append ``text`` to the file ``$GITHUB_STEP_SUMMARY`` names, when it names one; the path or None."""
    path = os.environ.get(STEP_SUMMARY)
    if not path:
        return None
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text if text.endswith("\n") else text + "\n")
    return path
