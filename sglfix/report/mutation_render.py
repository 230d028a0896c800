"""A mutation report (``sglfix.report.mutation``) for people and CI, survivors first everywhere:
the console (rich), Markdown for a pull request's comment, and JUnit XML with one testcase per
mutant. Each reads the statuses, hints and scores the report holds; none re-derives them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from sglfix.report.junit import xml_text
from sglfix.report.markdown import LIST_AT_MOST, code_span, escape
from sglfix.report.mutation import ORDER, Status
from sglfix.report.output import write_atomic

__all__ = [
    "build_junit",
    "junit_xml",
    "render_console",
    "render_markdown",
    "summary_line",
    "write_junit",
    "write_markdown",
]

# The score table's columns: a Score's counts, in the order of ORDER, then the score.
_COUNTS = (
    ("killed", "killed"),
    ("survived", "survived"),
    ("equivalent", "equivalent"),
    ("not_reached", "not reached"),
    ("timeout", "timeout"),
    ("error", "error"),
)


def _of(report: dict, status: Status) -> list[dict]:
    return [m for m in report.get("mutants") or () if m.get("status") == status.value]


def _where(m: dict) -> str:
    return f"{m['path']}:{m['line']}"


def _line(text: str) -> str:
    """A changed line as one line (the first, with '...' when there are more)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    if not lines:
        return "(removed)"
    return lines[0] + (" ..." if len(lines) > 1 else "")


def _pct(score: Any) -> str:
    return "-" if score is None else f"{100 * float(score):.1f}%"


def _reached(m: dict) -> str:
    by = m.get("reached_by") or []
    if not by:
        return "-"
    return ", ".join(by[:3]) + (f" (+{len(by) - 3})" if len(by) > 3 else "")


def _evidence(m: dict) -> str:
    ev = m.get("evidence") or {}
    if ev.get("reviewed"):
        return f"reviewed: {ev['reviewed']}"
    outputs = {True: "outputs identical too", False: "outputs differ", None: "outputs not fingerprinted"}
    if ev.get("schedule"):
        rounded = {
            True: "outputs identical",
            False: "outputs rounded otherwise, no verdict moved",
            None: "no verdict moved",
        }
        return (
            f"changed only how the kernels split the work ({', '.join(ev['schedule'])}) in {ev.get('cells', '?')} "
            f"cell(s); {rounded[ev.get('outputs_identical')]}"
        )
    return f"built metadata identical in {ev.get('cells', '?')} cell(s); {outputs[ev.get('outputs_identical')]}"


def _killers(m: dict) -> str:
    return "; ".join(
        f"{k['cell']}: {k['baseline']} -> {k['verdict']}" + (f" ({k['key_figure']})" if k.get("key_figure") else "")
        for k in m.get("killed_by") or ()
    )


def _not_judged(m: dict) -> str:
    return "; ".join(f"{k['cell']}: {k['verdict']} (baseline {k['baseline']})" for k in m.get("not_judged") or ())


def summary_line(report: dict) -> str:
    """``mutation score 72.5% (29 killed / 40); 11 survived, 3 not reached, ... of 47 mutants in 81.2 s``."""
    o = report["scores"]["overall"]
    judged = o["killed"] + o["survived"]
    head = (
        f"mutation score {_pct(o['score'])} ({o['killed']} killed / {judged})"
        if judged
        else "no mutation score (no mutant was killed or survived)"
    )
    words = dict(_COUNTS)
    rest = [f"{o[key]} {words[key]}" for key, _ in _COUNTS[1:] if o.get(key)]
    total = len(report.get("mutants") or ())
    wall = report.get("wall_s")
    took = f" in {float(wall):.1f} s" if isinstance(wall, (int, float)) else ""
    return f"{head}; " + (", ".join(rest) + " " if rest else "") + f"of {total} mutant(s){took}"


def _score_rows(report: dict) -> list[tuple[str, dict]]:
    scores = report["scores"]
    rows = [(f"family {k}", v) for k, v in scores.get("families", {}).items()]
    rows += [(k, v) for k, v in scores.get("functions", {}).items()]
    return rows + [("overall", scores["overall"])]


# --- console --------------------------------------------------------------------------------------


# The console lists this many rows of a kind (the JSON and Markdown reports hold every mutant).
CONSOLE_AT_MOST = 40


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    if len(rows) > CONSOLE_AT_MOST:
        title += f" (the first {CONSOLE_AT_MOST}: --json or --markdown for all {len(rows)})"
        rows = rows[:CONSOLE_AT_MOST]
    table = Table(title=Text(title), title_justify="left")
    table.add_column(headers[0], no_wrap=True)
    for h in headers[1:]:
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*(Text(str(c)) for c in r))
    return table


def _by_function(mutants: Sequence[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for m in mutants:
        out.setdefault(m["function"], []).append(m)
    return out


def render_console(report: dict) -> list[Any]:
    """What ``sglfix mutate`` prints: survivors (where, operator, mutated line, cells that reached
    it, hint), not-reached grouped by function, errors and timeouts, suspected equivalents with
    their evidence, the scores per family, per function and overall, and one summary line: rich
    renderables, each printed in turn."""
    parts: list[Any] = []
    survivors = _of(report, Status.SURVIVED)
    if survivors:
        parts.append(
            _table(
                f"{len(survivors)} survivor(s): reached, no cell changed",
                ("where", "operator", "mutated line", "reached by", "hint"),
                [(_where(m), m["operator"], _line(m["mutated"]), _reached(m), m.get("hint", "")) for m in survivors],
            )
        )
    unreached = _of(report, Status.NOT_REACHED)
    if unreached:
        parts.append(
            _table(
                f"{len(unreached)} not reached: no selected cell runs their function",
                ("function", "mutants", "lines", "hint"),
                [
                    (fn, str(len(ms)), ", ".join(str(m["line"]) for m in ms), ms[0].get("hint", ""))
                    for fn, ms in _by_function(unreached).items()
                ],
            )
        )
    unjudged = _of(report, Status.ERROR) + _of(report, Status.TIMEOUT)
    if unjudged:
        parts.append(
            _table(
                f"{len(unjudged)} not judged (ERROR or TIMEOUT: never counted as killed)",
                ("where", "status", "operator", "cells"),
                [(_where(m), m["status"], m["operator"], _not_judged(m)) for m in unjudged],
            )
        )
    equivalent = _of(report, Status.EQUIVALENT)
    if equivalent:
        parts.append(
            _table(
                f"{_equivalent_title(equivalent)} (not scored)",
                ("where", "operator", "change", "evidence"),
                [(_where(m), m["operator"], m["description"], _evidence(m)) for m in equivalent],
            )
        )
    parts.append(
        _table(
            "scores (killed / (killed + survived))",
            ("scope", *(w for _, w in _COUNTS), "score"),
            [(name, *(str(s.get(k, 0)) for k, _ in _COUNTS), _pct(s.get("score"))) for name, s in _score_rows(report)],
        )
    )
    rows = report.get("catalogue") or []
    if rows:
        parts.append(
            _table(
                f"the catalogue as a check of the operators: {_catalogue_counts(rows)}",
                ("toggle", "match", "mutant", "the revert's change"),
                [
                    (r["toggle"], r["match"], r.get("mutant") or "-", _line(r.get("change", "")))
                    for r in sorted(rows, key=lambda r: ("none", "close", "exact").index(r["match"]))
                    if r["match"] != "exact"
                ],
            )
        )
    parts += [Text(line, style="bold red") for line in review_lines(report)]
    parts.append(Text(summary_line(report), style="bold"))
    return parts


def _equivalent_title(equivalent: Sequence[dict]) -> str:
    reviewed = sum(1 for m in equivalent if (m.get("evidence") or {}).get("reviewed"))
    if not reviewed:
        return f"{len(equivalent)} suspected equivalent"
    return f"{len(equivalent)} equivalent ({reviewed} reviewed, {len(equivalent) - reviewed} suspected)"


def review_lines(report: dict) -> list[str]:
    """One line per reviewed-equivalent mark the campaign contradicts (a cell killed its mutant:
    the mark is wrong) and one for the stale ones (their function no longer makes the mutant)."""
    reviews = report.get("reviews") or {}
    lines = [
        f"{m['id']} is marked equivalent in {reviews['file']} but {', '.join(m['killed_by'][:3])} killed it: "
        f"drop the mark (its reason: {m['why']})"
        for m in reviews.get("contradicted") or ()
    ]
    stale = reviews.get("stale") or ()
    if stale:
        ids = ", ".join(m["id"] for m in stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        lines.append(
            f"{len(stale)} mark(s) of {reviews['file']} name a mutant the code no longer makes ({ids}): "
            "its function changed; review it again and renew or drop the mark"
        )
    return lines


def _catalogue_counts(rows: Sequence[dict]) -> str:
    """``11 exact, 5 close, 1 none`` of the toggles' reverts against the generated mutants."""
    n = {k: sum(r.get("match") == k for r in rows) for k in ("exact", "close", "none")}
    return f"{n['exact']} of {len(rows)} reverts made exactly by a mutant, {n['close']} close, {n['none']} by none"


# --- Markdown -------------------------------------------------------------------------------------


def _capped(rows: list[str], *, what: str = "rows") -> list[str]:
    more = len(rows) - LIST_AT_MOST
    # A blank line first: a line right below a table's rows would be read as one more row.
    return rows[:LIST_AT_MOST] + (["", f"... and {more} more {what} (see the JSON report)"] if more > 0 else [])


def _details(summary: str, lines: list[str]) -> list[str]:
    return ["", "<details>", f"<summary>{escape(summary)}</summary>", "", *lines, "", "</details>"]


def _md_scores(rows: list[tuple[str, dict]], first: str) -> list[str]:
    head = f"| {first} | " + " | ".join(w for _, w in _COUNTS) + " | score |"
    lines = [head, "|" + "---|" * (len(_COUNTS) + 2)]
    for name, s in rows:
        lines.append(f"| {name} | " + " | ".join(str(s.get(k, 0)) for k, _ in _COUNTS) + f" | {_pct(s.get('score'))} |")
    return lines


def render_markdown(report: dict) -> str:
    """Markdown for a pull request's comment: the summary line, a score table per backend family,
    the survivors' table, then collapsed lists of the not reached, the unjudged, the suspected
    equivalents, the killed and the scores per function."""
    scores = report["scores"]
    cb = report.get("codebase") or {}
    on = " ".join(str(x) for x in (cb.get("distribution") or cb.get("name"), cb.get("version")) if x)
    where = ", ".join(x for x in (on, report.get("device")) if x)
    lines = [
        "### sglfix mutate",
        "",
        f"**{escape(summary_line(report))}**" + (f" ({escape(where)})" if where else ""),
        "",
    ]
    lines += [f"- **{escape(line)}**" for line in review_lines(report)] + ([""] if review_lines(report) else [])
    families = [(code_span(k, in_table=True), v) for k, v in scores.get("families", {}).items()]
    lines += _md_scores([*families, ("**overall**", scores["overall"])], "family")
    survivors = _of(report, Status.SURVIVED)
    if survivors:
        lines += ["", f"**{len(survivors)} survivor(s)** (reached, no cell changed):", ""]
        lines += ["| where | operator | change | reached by | hint |", "|---|---|---|---|---|"]
        lines += _capped(
            [
                f"| {code_span(_where(m), in_table=True)} | {escape(m['operator'])} | "
                f"{code_span(_line(m['original']), in_table=True)} → {code_span(_line(m['mutated']), in_table=True)} | "
                f"{escape(_reached(m))} | {escape(m.get('hint', ''))} |"
                for m in survivors
            ],
            what="survivors",
        )
    unreached = _of(report, Status.NOT_REACHED)
    if unreached:
        rows = [
            f"- {code_span(fn)}: {len(ms)} mutant(s), lines {', '.join(str(m['line']) for m in ms)}: "
            f"{escape(ms[0].get('hint', ''))}"
            for fn, ms in _by_function(unreached).items()
        ]
        lines += _details(f"{len(unreached)} not reached (no selected cell runs their function)", _capped(rows))
    unjudged = _of(report, Status.ERROR) + _of(report, Status.TIMEOUT)
    if unjudged:
        rows = [
            f"- {m['status']} {code_span(_where(m))} {escape(m['description'])}: {escape(_not_judged(m))}"
            for m in unjudged
        ]
        lines += _details(f"{len(unjudged)} not judged (ERROR or TIMEOUT, never counted as killed)", _capped(rows))
    equivalent = _of(report, Status.EQUIVALENT)
    if equivalent:
        rows = [f"- {code_span(_where(m))} {escape(m['description'])}: {escape(_evidence(m))}" for m in equivalent]
        lines += _details(f"{_equivalent_title(equivalent)} (not scored)", _capped(rows))
    killed = _of(report, Status.KILLED)
    if killed:
        rows = [f"- {code_span(_where(m))} {escape(m['description'])}: {escape(_killers(m))}" for m in killed]
        lines += _details(f"{len(killed)} killed", _capped(rows))
    catalogue = report.get("catalogue") or []
    if catalogue:
        rows = [
            f"- {escape(r['toggle'])} {r['match']}: {escape(r.get('change', ''))}"
            + (f" ({code_span(r['mutant'])}, {escape(r.get('operator') or '')})" if r.get("mutant") else "")
            for r in catalogue
        ]
        lines += _details(f"the catalogue as a check of the operators: {_catalogue_counts(catalogue)}", _capped(rows))
    functions = [(code_span(k, in_table=True), v) for k, v in scores.get("functions", {}).items()]
    if functions:
        lines += _details("scores per function", _md_scores(functions, "function"))
    return "\n".join(lines).rstrip("\n") + "\n"


def write_markdown(report: dict, path: str) -> None:
    write_atomic(path, render_markdown(report))


# --- JUnit ----------------------------------------------------------------------------------------


def build_junit(report: dict):
    """The ``junitparser.JUnitXml``: one testsuite per backend family, one testcase per mutant
    (classname: its function; name: its id and description). Killed passes (system-out names the
    cells), survived fails (the hint), not reached and suspected equivalent are skipped (with the
    evidence), timeout and error are errors."""
    from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

    suites: dict[str, TestSuite] = {}
    order = {s.value: i for i, s in enumerate(ORDER)}
    for m in sorted(report.get("mutants") or (), key=lambda m: order.get(m["status"], len(order))):
        family = m.get("family", "common")
        suite = suites.get(family)
        if suite is None:
            suite = suites[family] = TestSuite(xml_text(f"mutate {family}"))
            if report.get("date"):
                suite.timestamp = report["date"]
            for key in ("command", "device", "profile"):
                if report.get(key) is not None:
                    suite.add_property(key, xml_text(report[key]))
        case = TestCase(xml_text(f"{m['id']} {m['description']}"), xml_text(m["function"]))
        where = f"{_where(m)} [{m['operator']}]: {_line(m['original'])} -> {_line(m['mutated'])}"
        status = m["status"]
        if status == Status.KILLED:
            case.system_out = xml_text(f"{where}\nkilled by {_killers(m)}")
        elif status == Status.SURVIVED:
            failure = Failure(xml_text(m.get("hint") or "survived"), "SURVIVED")
            failure.text = xml_text(f"{where}\nreached by {', '.join(m.get('reached_by') or ())}")
            case.result = [failure]
        elif status == Status.NOT_REACHED:
            case.result = [Skipped(xml_text(f"not reached: {m.get('hint') or 'no selected cell runs its function'}"))]
        elif status == Status.EQUIVALENT:
            said = (
                _evidence(m) if (m.get("evidence") or {}).get("reviewed") else f"suspected equivalent: {_evidence(m)}"
            )
            case.result = [Skipped(xml_text(said))]
        else:
            error = Error(xml_text(f"{status}: {_not_judged(m)}"), status.upper())
            error.text = xml_text(where)
            case.result = [error]
        suite.add_testcase(case)
    xml = JUnitXml("sglfix mutate")
    for suite in suites.values():
        suite.update_statistics()
        xml.add_testsuite(suite)
    xml.update_statistics()
    return xml


def junit_xml(report: dict) -> str:
    from xml.dom.minidom import parseString

    return parseString(build_junit(report).tostring()).toprettyxml(indent="\t", encoding="utf-8").decode("utf-8")


def write_junit(report: dict, path: str) -> None:
    """JUnit XML of the mutation report to ``path``, atomically."""
    write_atomic(path, junit_xml(report))
