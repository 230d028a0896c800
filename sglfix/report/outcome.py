"""What a result means, decided once: every gate, comparison, attribution and fix claim reads it.

A cell's verdict is a fact; what it *means* depends on its context: its baseline's verdict, the
profile's known divergences on this device, the expectations of its toggle set, and whether it
could run here at all. Run, matrix, ``report compare``, ``report merge --gate``, bisect, JUnit,
Markdown, the console and the pytest plugin all read the judgement made here; none re-derives it.

The same holds for a regression test's claim to guard a fix (``judge_claim``): caught only when
the test passes with the fix in place and fails with it reverted.

A leaf: imports nothing of sglfix but ``sglfix.common`` and its own parts, each a module of its
own that imports only ``sglfix.common`` and the others: ``meaning`` (the words of a cell's
meaning), ``expectations`` (expectation rows and known divergences, and their results),
``claim`` (a fix claim), ``context`` (a saved report's judgement context) and ``codebase``.
Here: the rules a cell is judged by, the judgement and its gate, and ``judge``; every name is
taken from here. It works on cells as report dicts.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from sglfix.common.verdicts import FAILING, NOT_REACHED, stands_for

# Its own parts (tests/report/test_judgement.py holds them all to importing only sglfix.common and each other).
from sglfix.report.claim import TEST_OUTCOMES, Claim, judge_claim
from sglfix.report.codebase import codebase_identity, codebase_label
from sglfix.report.context import base_of, expects_of, key_figure, mode_of
from sglfix.report.expectations import Check, Expect, Known, KnownHit, NotChecked
from sglfix.report.meaning import BASELINE, ENV_VAR, FIX_PREFIX, CellMeaning, Meaning, cell_id, set_label, unpatched

__all__ = [
    "BASELINE",
    "ENV_VAR",
    "TEST_OUTCOMES",
    "CellMeaning",
    "Check",
    "Claim",
    "Expect",
    "FixCheck",
    "Judgement",
    "Known",
    "KnownHit",
    "Meaning",
    "NotChecked",
    "Rules",
    "base_of",
    "check_of",
    "codebase_identity",
    "codebase_label",
    "divergence_moved",
    "diverges_at",
    "effective",
    "expects_of",
    "failed_checks",
    "fails_otherwise",
    "judge",
    "judge_claim",
    "mode_of",
    "set_label",
]


def diverges_at(cell: dict) -> str | None:
    """The rows a DIVERGE cell's output is wrong at ("0-2,5", the comparison's ``bad_at``), or
    None where the cell recorded none (another verdict, no output compared, an older report)."""
    for f in cell.get("findings") or ():
        if isinstance(f, dict) and f.get("verdict") == "DIVERGE" and f.get("bad_at"):
            return str(f["bad_at"])
    return None


def divergence_moved(cell: dict, other: dict) -> str | None:
    """Where two cells of one scenario both diverge, but at other rows: "rows A without, rows B
    with" (``other`` first); None when either recorded no rows or the rows are the same. A change
    that moves a known divergence onto rows it did not hit is a change the output shows."""
    at, was = diverges_at(cell), diverges_at(other)
    if at is None or was is None or at == was:
        return None
    return f"rows {was} without, rows {at} with"


_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")


def check_of(message: str) -> str:
    """A finding's message as the check it names: every number left out (the same check failing
    at other rows, sizes or errors is the same check)."""
    return _NUMBER.sub("N", message)


def failed_checks(cell: dict) -> frozenset[str]:
    """The checks a cell fails: each failing finding's verdict and ``check_of`` its message."""
    return frozenset(
        f"{f['verdict']}: {check_of(str(f.get('message', '')))}"
        for f in cell.get("findings") or ()
        if isinstance(f, dict) and f.get("verdict") in FAILING
    )


def fails_otherwise(cell: dict, other: dict) -> str | None:
    """Where two cells of one scenario fail with one verdict, how ``cell`` fails otherwise than
    ``other``: its divergence on other rows (``divergence_moved``), or a check that fails in one
    and not in the other; None where they fail alike. A change that makes a known bug's cell fail
    a further check (an allocation now short as well as past its row) is a change the cell shows,
    as much as one that moves the bug's rows. A NOT_REACHED cell records no check: it is
    provably its baseline, and fails nothing otherwise."""
    if NOT_REACHED in (cell.get("verdict"), other.get("verdict")):
        return None
    moved = divergence_moved(cell, other)
    if moved is not None:
        return f"on other rows: {moved}"
    now, was = failed_checks(cell), failed_checks(other)
    if now - was:
        return f"another check fails: {min(now - was)}"
    if was - now:
        return f"a check no longer fails: {min(was - now)}"
    return None


def effective(cell: dict) -> str:
    """The verdict a cell stands for: its own, or for NOT_REACHED its baseline's."""
    # A cell of a report always has a verdict (the report's schema says so).
    return stands_for(cast(str, cell.get("verdict")), cell.get("findings"))


@dataclass(frozen=True)
class Rules:
    """The context a cell is judged in.

    ``mode``: ``gate`` (matrix: expectations judge toggle cells; a verdict nothing explains is
    unexpected) or ``findings`` (run, bisect: every verdict that is not a pass fails unless it is
    a known divergence or its baseline's own). ``base``: the plan's baseline set (what
    REVERT_PR selected; empty for the code as installed)."""

    mode: str = "gate"
    expects: tuple[Expect, ...] = ()
    known: tuple[Known, ...] = ()
    base: tuple[str, ...] = ()
    # --apply: the candidate fixes' ids, and the scenarios (globs) they must clear.
    fixes: tuple[str, ...] = ()
    expect_fixes: tuple[str, ...] = ()

    def known_for(self, cell: dict, verdict: str) -> Known | None:
        return next(
            (k for k in self.known if k.matches(scenario=cell["scenario"], verdict=verdict, device=cell.get("device"))),
            None,
        )

    def covering(self, cell: dict) -> list[Expect]:
        toggles = tuple(cell.get("toggles") or ())
        return [
            e
            for e in self.expects
            if e.revert == toggles and e.covers(cell["scenario"]) and e.device in ("any", cell.get("device"))
        ]

    def meaning(self, cell: dict, baseline: dict | None, unfixed: dict | None = None) -> tuple[Meaning, str]:
        """The meaning of ``cell`` and why; ``baseline``: the same scenario's cell of the base set
        (None when the plan has none, or ``cell`` is it); ``unfixed``: for a cell with a candidate
        fix applied, the same cell without it (what the fix is judged against)."""
        verdict = cell.get("verdict")
        if verdict == "ERROR":
            return Meaning.ERROR, "sglfix itself failed: the cell's result is unknown"
        if verdict == "SKIP":
            return Meaning.SKIPPED, "cannot run here"
        if unfixed is not None:
            return self.fix_meaning(cell, unfixed)
        v = effective(cell)
        unreached = verdict == NOT_REACHED
        if v == "SKIP":  # not reached, where the baseline itself could not run
            return Meaning.SKIPPED, "cannot run here (its baseline SKIPs: never run)"
        if v == "PASS":
            return Meaning.PASSED, "not reached: same as its baseline, which passed" if unreached else "passed"
        is_base = tuple(cell.get("toggles") or ()) == self.base
        k = self.known_for(cell, v)
        # Where the baseline passes (a candidate fix in every set clears the divergence), the
        # same verdict in a toggle cell is the toggle's doing, not the known bug's.
        if k is not None and (is_base or baseline is None or effective(baseline) != "PASS"):
            return Meaning.KNOWN, f"known divergence ({k.scenario} -> {'|'.join(k.verdict)})"
        if not is_base and (unreached or (baseline is not None and effective(baseline) == v)):
            return Meaning.SAME_AS_BASELINE, f"same as its baseline ({v}): not caused by this toggle set"
        if self.mode == "findings":
            return Meaning.FAILED, f"{v}: did not pass"
        if is_base:
            what = "baseline" if not self.base else f"baseline ({ENV_VAR}={','.join(self.base)})"
            return Meaning.UNEXPECTED, f"{what} must PASS"
        covering = self.covering(cell)
        wanted = [e for e in covering if v in e.wanted]
        if wanted:
            return Meaning.EXPECTED, f"expected: {wanted[0].text} -> {'|'.join(wanted[0].wanted)}"
        if covering:
            return Meaning.COVERED, f"{v} where {covering[0].text} wants {'|'.join(covering[0].wanted)}"
        if self.base:
            return Meaning.UNCHECKED, f"over the baseline {ENV_VAR}={','.join(self.base)}: no expectation applies"
        return Meaning.UNEXPECTED, "not covered by any expectation of this toggle set"

    def fix_meaning(self, cell: dict, unfixed: dict) -> tuple[Meaning, str]:
        """A cell with candidate fixes applied, against the same cell without them: what the fix
        clears, what it breaks, what it leaves as it was."""
        fixes = ",".join(t for t in cell.get("toggles") or () if str(t).startswith(FIX_PREFIX))
        v, was = effective(cell), effective(unfixed)
        if v == "SKIP":  # not reached, where the baseline itself could not run
            return Meaning.SKIPPED, "cannot run here (its baseline SKIPs: never run)"
        unreached = " (not reached: the fix's functions never ran)" if cell.get("verdict") == NOT_REACHED else ""
        if unfixed.get("verdict") in ("ERROR", "SKIP"):
            if v == "PASS":
                return (
                    Meaning.PASSED,
                    f"passed with {fixes} (without it the cell did not run: {unfixed.get('verdict')})",
                )
            return Meaning.BROKEN, f"{v} with {fixes}; without it the cell did not run ({unfixed.get('verdict')})"
        if v == was:
            if v == "PASS":
                return Meaning.PASSED, f"passed, as without {fixes}{unreached}"
            otherwise = fails_otherwise(cell, unfixed)
            if otherwise is not None:
                return Meaning.CHANGED, f"{v} with and without {fixes}, {otherwise}"
            k = self.known_for(cell, v)
            if k is not None:
                return (
                    Meaning.KNOWN,
                    f"known divergence ({k.scenario} -> {'|'.join(k.verdict)}), not cleared by {fixes}",
                )
            return Meaning.SAME_AS_BASELINE, f"{v} with and without {fixes}: the fix changes nothing here{unreached}"
        if v == "PASS":
            k = self.known_for(unfixed, was)
            if k is not None:
                return Meaning.FIXED, f"{fixes} fixes known divergence {k.scenario} ({was} -> PASS)"
            over = unpatched(cell.get("toggles") or ())
            where = f" with {set_label(over)} reverted" if over else ""
            return Meaning.FIXED, f"{fixes} clears {was}{where} ({was} -> PASS)"
        if was != "PASS":
            # Already failing without the fix (a reverted fix, a known bug): which way it fails may
            # differ run to run where the code reads memory nothing wrote (NAN or DIVERGE).
            return Meaning.CHANGED, f"fails with and without {fixes}: {was} without, {v} with"
        return Meaning.BROKEN, f"{fixes} changes {was} to {v}"


@dataclass
class Judgement:
    """Every cell's meaning, the expectations checked and not checked (each with its reason), the
    known divergences seen, and the gate: what every consumer prints, writes and exits with."""

    rules: Rules
    cells: list[CellMeaning]
    checks: list[Check] = field(default_factory=list)
    not_checked: list[NotChecked] = field(default_factory=list)
    known: list[KnownHit] = field(default_factory=list)
    sharded: bool = False  # one shard of a run: its expectations are judged on the merged report
    device: str | None = None
    # Reverts that no longer apply to the code followed beyond its profile's range (id -> why):
    # each is a finding that fails the gate and the run, never a refusal of the whole run.
    drifted: dict[str, str] = field(default_factory=dict)
    # Reverts with no variant at the engine version run (a fix the release predates): no finding.
    not_applicable: dict[str, str] = field(default_factory=dict)
    # --apply: each --expect-fixes pattern and whether the fix cleared it; the sets whose fix and
    # reverts change the same lines (label -> why), which could not be built.
    fix_checks: list[FixCheck] = field(default_factory=list)
    conflicts: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_id = {c.id: c for c in self.cells}

    @property
    def mode(self) -> str:
        return self.rules.mode

    def of(self, cell_id: str) -> CellMeaning | None:
        return self.by_id.get(cell_id)

    def with_meaning(self, *meanings: Meaning) -> list[CellMeaning]:
        return [c for c in self.cells if c.meaning in meanings]

    @property
    def failing(self) -> list[CellMeaning]:
        return [c for c in self.cells if c.meaning.fails]

    @property
    def unmet(self) -> list[Check]:
        return [c for c in self.checks if not c.met]

    @property
    def failed(self) -> bool:
        return bool(self.failing) or bool(self.drifted) or any(not c.met for c in self.fix_checks if c.checked)

    @property
    def exit_code(self) -> int:
        """0 passed; 1 a check failed or a cell is ERROR; 125 every cell was skipped (cannot be
        tested here: what ``git bisect run`` reads as skip)."""
        if self.failed:
            return 1
        if self.cells and all(c.meaning is Meaning.SKIPPED for c in self.cells):
            return 125
        return 0

    def count(self, meaning: Meaning) -> int:
        return sum(c.meaning is meaning for c in self.cells)

    def baseline_note(self) -> str:
        """Said in every header and gate line when the baseline is not the code as installed."""
        if not self.rules.base:
            return ""
        return f"baseline {ENV_VAR}={','.join(self.rules.base)} (not the code as installed)"

    def not_checked_summary(self) -> str:
        """``9 not checked: 9 cuda only`` (reasons grouped, largest first), or ''."""
        if not self.not_checked:
            return ""
        by: dict[str, int] = {}
        for n in self.not_checked:
            by[n.reason] = by.get(n.reason, 0) + 1
        parts = ", ".join(f"{n} {reason}" for reason, n in sorted(by.items(), key=lambda kv: -kv[1]))
        return f"{len(self.not_checked)} not checked: {parts}"

    def problems(self) -> list[str]:
        """What fails, counted: the words of a failed gate or run."""
        out = []
        if self.mode == "gate":
            unmet = len(self.unmet) if not self.sharded else 0
            for n, what in (
                (unmet, "expectation(s) unmet"),
                (self.count(Meaning.UNEXPECTED), "unexpected verdict(s)"),
                (self.count(Meaning.ERROR), "ERROR cell(s)"),
                (len(self.drifted), f"revert(s) no longer apply ({', '.join(self.drifted)})"),
            ):
                if n:
                    out.append(f"{n} {what}")
        else:
            for n, what in (
                (self.count(Meaning.FAILED), "cell(s) did not pass"),
                (self.count(Meaning.ERROR), "ERROR cell(s): sglfix itself failed"),
                (len(self.drifted), f"revert(s) no longer apply ({', '.join(self.drifted)})"),
            ):
                if n:
                    out.append(f"{n} {what}")
        broken = self.count(Meaning.BROKEN)
        if broken:
            out.append(f"{broken} cell(s) broken by {','.join(self.rules.fixes)}")
        for c in self.fix_checks:
            if c.checked and not c.met:
                out.append(f"--expect-fixes {c.pattern}: {c.why}")
        return out

    def fix_summary(self) -> str:
        """With --apply: what the candidate fixes do, in one line (``''`` without)."""
        if not self.rules.fixes:
            return ""
        fixed = self.with_meaning(Meaning.FIXED)
        patched = [c for c in self.cells if c.toggles != unpatched(c.toggles)]
        broken = self.count(Meaning.BROKEN)
        known = sorted({c.scenario for c in fixed if "known divergence" in c.why})
        parts = []
        if known:
            parts.append(f"fixes known divergence {', '.join(known)}")
        other = len(fixed) - sum(1 for c in fixed if "known divergence" in c.why)
        if other:
            parts.append(f"clears {other} other cell(s)")
        if not fixed:
            parts.append("clears nothing")
        parts.append(f"breaks {broken} cell(s)" if broken else "breaks nothing")
        # Cells skipped here or in ERROR say nothing of the fix; the run's line counts them once,
        # over every cell (``explained_note``, ``problems``), so they are not counted again here.
        judged = [c for c in patched if c.meaning not in (Meaning.SKIPPED, Meaning.ERROR)]
        aside = (Meaning.FIXED, Meaning.BROKEN, Meaning.CHANGED)
        unchanged = sum(c.meaning not in aside for c in judged)
        which = "patched cell(s)" if len(judged) == len(patched) else "patched cell(s) that ran to a verdict"
        parts.append(f"{unchanged} of {len(judged)} {which} unchanged")
        changed = self.count(Meaning.CHANGED)
        if changed:
            parts.append(f"{changed} failing with and without it, otherwise (another verdict, rows or check)")
        if self.conflicts:
            parts.append(f"{len(self.conflicts)} set(s) not built (the fix and a revert change the same lines)")
        for c in self.fix_checks:
            if c.met or not c.checked:  # an unmet one is among the problems
                parts.append(f"--expect-fixes {c.pattern}: {'met' if c.met else c.why}")
        return f"{','.join(self.rules.fixes)}: " + "; ".join(parts)

    def explained_note(self) -> str:
        """The non-PASS cells that fail nothing, and the cells not run here, counted."""
        parts = []
        for meaning, what in (
            (Meaning.EXPECTED, "expected"),
            (Meaning.KNOWN, "known divergence(s)"),
            (Meaning.SAME_AS_BASELINE, "same as baseline"),
            (Meaning.COVERED, "other verdict(s) within an expectation"),
            (Meaning.UNCHECKED, "unchecked over the environment's baseline"),
            (Meaning.CLEARED, "cleared by the fix"),
            (Meaning.CHANGED, "failing differently with the fix"),
            (Meaning.SKIPPED, "skipped here"),
        ):
            n = self.count(meaning)
            if n:
                parts.append(f"{n} {what}")
        return ", ".join(parts)

    def outcome(self) -> str:
        """One line: the gate (matrix) or the run's result, with what it checked and did not."""
        base = self.baseline_note()
        prefix = f"{base}: " if base else ""
        if self.mode == "gate":
            met = sum(c.met for c in self.checks)
            if self.failed:
                text = "gate failed: " + ", ".join(self.problems())
            else:
                text = f"gate passed ({met} of {len(self.checks)} expectations met"
                if self.not_checked:
                    text += f", {self.not_checked_summary()}"
                text += ")"
                left = self.unmet if self.sharded else []
                if left:
                    text += f"; {len(left)} expectation(s) left to `sglfix report merge --gate`"
        else:
            code = self.exit_code
            if code == 1:
                text = "exit 1: " + ", ".join(self.problems())
            elif code == 125:
                text = "exit 125: every cell was skipped (cannot test this here)"
            else:
                text = "every cell passed" if not self.explained_note() else "no cell failed"
        if self.rules.fixes:
            text += f"; {self.fix_summary()}"
        note = self.explained_note()
        return prefix + text + (f" [{note}]" if note and self.cells else "")

    def stray(self) -> list[dict]:
        """The unexpected cells, as the report's ``stray`` list."""
        return [
            {"toggles": list(c.toggles), "scenario": c.scenario, "verdict": c.verdict, "why": c.why}
            for c in self.cells
            if c.meaning is Meaning.UNEXPECTED
        ]

    def to_report(self) -> dict:
        """The report's judgement keys (the cells' meanings go on the cells themselves)."""
        return {
            "judged": {
                "mode": self.mode,
                "baseline": list(self.rules.base),
                "fixes": list(self.rules.fixes),
                "expect_fixes": list(self.rules.expect_fixes),
                "fix_checks": [c.to_json() for c in self.fix_checks],
                "fix_summary": self.fix_summary(),
                "passed": not self.failed,
                "exit_code": self.exit_code,
                "outcome": self.outcome(),
                "counts": {m.value: self.count(m) for m in Meaning if self.count(m)},
            },
            "expect": [e.to_json() for e in self.rules.expects],
            "expectations": [c.to_json() for c in self.checks],
            "stray": self.stray(),
            "not_run": [n.text for n in self.not_checked],
            "not_checked": [n.to_json() for n in self.not_checked],
            "known_divergences": [k.to_json() for k in self.known],
        }

    def annotate(self, report: dict) -> dict:
        """``report`` with the judgement's keys and each cell's meaning (in place; returned)."""
        report.update(self.to_report())
        for cell in report.get("cells") or ():
            m = self.by_id.get(cell_id(cell))
            if m is not None:
                cell["meaning"] = m.meaning.value
                cell["why"] = m.why
        return report


def judge(
    report: dict,
    *,
    mode: str | None = None,
    expects: Sequence[Expect] | None = None,
    known: Sequence[Any] | None = None,
    base: Sequence[str] | None = None,
    fixes: Sequence[str] | None = None,
    expect_fixes: Sequence[str] | None = None,
) -> Judgement:
    """The judgement of a report dict (``build_report``'s, or one loaded from a file). What is
    not given is read from the report itself, so a saved or merged report judges the same."""
    cells = list(report.get("cells") or ())
    applied = _fixes_of(report)
    rules = Rules(
        mode=mode or mode_of(report),
        expects=tuple(expects if expects is not None else expects_of(report)),
        known=tuple(Known.of(known if known is not None else report.get("known_divergences") or ())),
        base=tuple(base if base is not None else base_of(report)),
        fixes=tuple(fixes if fixes is not None else applied.fixes),
        expect_fixes=tuple(expect_fixes if expect_fixes is not None else applied.expect_fixes),
    )
    device = report.get("device")
    sharded = report.get("shard") is not None
    baselines = {c["scenario"]: c for c in cells if tuple(c.get("toggles") or ()) == rules.base}
    # A cell with a candidate fix is judged against the same cell without it (when both ran).
    by_set = {(c["scenario"], tuple(c.get("toggles") or ())): c for c in cells}
    meanings: list[CellMeaning] = []
    for c in cells:
        base_cell = baselines.get(c["scenario"])
        toggles = tuple(c.get("toggles") or ())
        unfixed = (
            by_set.get((c["scenario"], unpatched(toggles))) if rules.fixes and unpatched(toggles) != toggles else None
        )
        meaning, why = rules.meaning(c, None if base_cell is c else base_cell, unfixed)
        meanings.append(
            CellMeaning(
                id=cell_id(c),
                toggles=tuple(c.get("toggles") or ()),
                scenario=c["scenario"],
                verdict=c.get("verdict"),
                stands_for=effective(c),
                meaning=meaning,
                why=why,
                key_figure=key_figure(c),
            )
        )
    drifted = {d["id"]: d["why"] for d in report.get("drifted") or () if isinstance(d, dict)}
    absent = {d["id"]: d["why"] for d in report.get("not_applicable") or () if isinstance(d, dict)}
    out = Judgement(rules=rules, cells=meanings, sharded=sharded, device=device, drifted=drifted, not_applicable=absent)
    if rules.fixes:
        out.conflicts = applied.conflicts
        _clear_fixed(out)
        out.fix_checks = _check_fixes(out, over=rules.base if applied.over is None else applied.over)
    if rules.mode == "gate":
        _check_expectations(out, cells, device=device)
    out.known = _known_hits(rules, cells, out, device=device)
    if not sharded:
        for check in out.unmet:
            why = (
                f"expectation unmet: {check.expect.text} -> {'|'.join(check.expect.wanted)}; "
                f"got {', '.join(sorted(set(check.got.values())))}"
            )
            for m, c in zip(out.cells, cells):
                if (
                    m.toggles == check.expect.revert
                    and c["scenario"] in check.got
                    and not m.meaning.fails
                    and m.meaning is not Meaning.SKIPPED
                ):
                    m.meaning, m.why = Meaning.UNMET, why
    return out


@dataclass
class FixCheck:
    """One ``--expect-fixes`` pattern: the fix must clear every not-passing cell of the scenarios
    it matches (on the plan's baseline set), and there must be one; not checked where each of
    them SKIPs here."""

    pattern: str
    met: bool
    why: str
    checked: bool = True
    fixed: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "pattern": self.pattern,
            "met": self.met,
            "checked": self.checked,
            "why": self.why,
            "fixed": list(self.fixed),
        }


class _Applied(NamedTuple):
    """What a saved report says --apply gave: the candidate fixes, the --expect-fixes patterns,
    the sets not built (label -> why), and the set the patterns are judged on (None: the baseline)."""

    fixes: tuple[str, ...]
    expect_fixes: tuple[str, ...]
    conflicts: dict[str, str]
    over: tuple[str, ...] | None


def _fixes_of(report: dict) -> _Applied:
    applied = report.get("apply")
    if not isinstance(applied, dict):
        return _Applied((), (), {}, None)
    over = applied.get("over")
    return _Applied(
        fixes=tuple(str(c.get("id")) for c in applied.get("candidates") or () if isinstance(c, dict)),
        expect_fixes=tuple(str(g) for g in applied.get("expect_fixes") or ()),
        conflicts={str(d.get("set")): str(d.get("why")) for d in applied.get("conflicts") or () if isinstance(d, dict)},
        over=tuple(str(t) for t in over) if isinstance(over, list) else None,
    )


def _clear_fixed(out: Judgement) -> None:
    """A failure of the code without the fix that the fix clears is what the fix is for: it fails
    nothing (``cleared``); what the fix leaves failing still fails."""
    fixed = {(m.scenario, unpatched(m.toggles)) for m in out.cells if m.meaning is Meaning.FIXED}
    for m in out.cells:
        if (
            m.toggles == unpatched(m.toggles)
            and (m.scenario, m.toggles) in fixed
            and m.meaning
            in (
                Meaning.FAILED,
                Meaning.UNEXPECTED,
            )
        ):
            m.meaning, m.why = Meaning.CLEARED, f"{m.verdict} without the fix; {','.join(out.rules.fixes)} clears it"


def _check_fixes(out: Judgement, *, over: tuple[str, ...]) -> list[FixCheck]:
    """Each --expect-fixes pattern on the cells of ``over`` (the plan's first set) with the fix."""
    rules = out.rules
    patched = [m for m in out.cells if m.toggles != unpatched(m.toggles) and unpatched(m.toggles) == over]
    checks = []
    for pattern in rules.expect_fixes:
        matched = [m for m in patched if fnmatch.fnmatchcase(m.scenario, pattern)]
        if not matched:
            checks.append(FixCheck(pattern, False, "no scenario of the run matches it"))
            continue
        ran = [m for m in matched if m.meaning is not Meaning.SKIPPED]
        if not ran:
            checks.append(FixCheck(pattern, False, "every scenario it matches SKIPs here: not checked", checked=False))
            continue
        fixed = [m for m in ran if m.meaning is Meaning.FIXED]
        left = [m for m in ran if m.stands_for != "PASS" and m.meaning is not Meaning.FIXED]
        if left:
            checks.append(
                FixCheck(
                    pattern,
                    False,
                    f"{left[0].scenario} is still {left[0].stands_for} with the fix",
                    fixed=tuple(m.scenario for m in fixed),
                )
            )
        elif not fixed:
            checks.append(FixCheck(pattern, False, "nothing to clear: it passes without the fix too"))
        else:
            checks.append(
                FixCheck(pattern, True, f"cleared on {len(fixed)} scenario(s)", fixed=tuple(m.scenario for m in fixed))
            )
    return checks


def _check_expectations(out: Judgement, cells: list[dict], *, device: str | None) -> None:
    rules = out.rules
    sets: dict[tuple[str, ...], list[int]] = {}
    for i, c in enumerate(cells):
        sets.setdefault(tuple(c.get("toggles") or ()), []).append(i)
    single_device = device not in (None, "mixed")
    for e in rules.expects:
        reason = None
        if rules.base:
            reason = "the baseline is not the code as installed"
        elif e.device != "any" and single_device and e.device != device:
            reason = f"{e.device} only"
        elif set(e.revert) & set(out.drifted):
            reason = "its revert no longer applies here"
        elif any(a == r or a.startswith(r + ":") for r in e.revert for a in out.not_applicable):
            reason = "its revert does not apply to this version"
        elif e.revert not in sets:
            reason = "part-level: run with --parts" if any(":" in r for r in e.revert) else "its toggle set did not run"
        if reason is not None:
            out.not_checked.append(NotChecked(e, reason))
            continue
        idx = [i for i in sets[e.revert] if e.covers(cells[i]["scenario"])]
        if not idx:
            where = "this shard's scenarios" if out.sharded else "the selected scenarios"
            out.not_checked.append(NotChecked(e, f"none of {where} matches"))
            continue
        on_device = [i for i in idx if e.device in ("any", cells[i].get("device"))]
        if not on_device:
            out.not_checked.append(NotChecked(e, f"{e.device} only"))
            continue
        # NOT_REACHED stands for its baseline's verdict: a SKIP there is a SKIP here.
        ran = [i for i in on_device if "SKIP" not in (cells[i].get("verdict"), out.cells[i].stands_for)]
        if not ran:
            out.not_checked.append(NotChecked(e, "every scenario it names SKIPs here"))
            continue
        met = any(_meets(out.cells[i], e) for i in ran)
        out.checks.append(Check(e, met=met, got={cells[i]["scenario"]: cells[i]["verdict"] for i in ran}))


def _meets(m: CellMeaning, e: Expect) -> bool:
    """A cell meets an expectation when it shows a wanted verdict caused by its toggle set, or,
    where PASS is wanted, when the toggle changed nothing (PASS, its baseline's verdict, a known
    upstream divergence left where it was)."""
    if "PASS" in e.wanted and m.meaning in (Meaning.PASSED, Meaning.KNOWN, Meaning.SAME_AS_BASELINE):
        return True
    if m.meaning is Meaning.ERROR:  # named by the expectation, and still a failure of sglfix
        return "ERROR" in e.wanted
    return m.meaning is Meaning.EXPECTED and m.stands_for in e.wanted


# Verdicts that say nothing of the code under test: sglfix failed, the worker died, time ran out.
_NO_VERDICT = ("ERROR", "FAULT", "TIMEOUT")


def _known_hits(rules: Rules, cells: list[dict], out: Judgement, *, device: str | None) -> list[KnownHit]:
    hits = []
    for k in rules.known:
        base_cells = [
            (c, m)
            for c, m in zip(cells, out.cells)
            if m.toggles == rules.base and fnmatch.fnmatchcase(c["scenario"], k.scenario)
        ]
        seen = sorted(
            c["scenario"]
            for c, m in base_cells
            if m.meaning is Meaning.KNOWN
            and k.matches(scenario=c["scenario"], verdict=m.stands_for, device=c.get("device"))
        )
        # "Not seen" claims the bug may be gone: only cells that ran to a verdict can say so.
        unjudged = [c for c, _ in base_cells if c.get("verdict") in _NO_VERDICT]
        if k.device != "any" and device not in (None, "mixed", k.device):
            status = f"{k.device} only, not expected on {device}"
        elif seen:
            status = "seen"
        elif not base_cells:
            status = "its scenarios did not run"
        elif all(c.get("verdict") == "SKIP" for c, _ in base_cells):
            status = "its scenarios SKIP here"
        elif unjudged:
            shown = ", ".join(sorted({c["verdict"] for c in unjudged}))
            status = f"not judged: {len(unjudged)} of its {len(base_cells)} cell(s) ran to no verdict ({shown})"
        else:
            status = "not seen (fixed?)"
        hits.append(KnownHit(k, seen, status))
    return hits
