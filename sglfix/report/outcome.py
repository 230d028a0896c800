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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sglfix.common.verdicts import NOT_REACHED, stands_for

# Its own parts (tests/test_judgement.py holds them all to importing only sglfix.common and each other).
from sglfix.report.claim import TEST_OUTCOMES, Claim, judge_claim
from sglfix.report.codebase import codebase_identity, codebase_label
from sglfix.report.context import _base_of, _expects_of, _key_figure, _mode_of
from sglfix.report.expectations import Check, Expect, Known, KnownHit, NotChecked
from sglfix.report.meaning import BASELINE, ENV_VAR, CellMeaning, Meaning, _cell_id, set_label

__all__ = [
    "BASELINE",
    "ENV_VAR",
    "TEST_OUTCOMES",
    "CellMeaning",
    "Check",
    "Claim",
    "Expect",
    "Judgement",
    "Known",
    "KnownHit",
    "Meaning",
    "NotChecked",
    "Rules",
    "codebase_identity",
    "codebase_label",
    "effective",
    "judge",
    "judge_claim",
    "set_label",
]


def effective(cell: dict) -> str:
    """The verdict a cell stands for: its own, or for NOT_REACHED its baseline's."""
    return stands_for(cell.get("verdict"), cell.get("findings"))


@dataclass(frozen=True)
class Rules:
    """The context a cell is judged in.

    ``mode``: ``gate`` (matrix: expectations judge toggle cells; a verdict nothing explains is
    unexpected) or ``findings`` (run, bisect: every verdict that is not a pass fails unless it is
    a known divergence or its baseline's own). ``base``: the plan's baseline set (what
    SGLANG_DEBUG_REVERT_PR selected; empty for the code as installed)."""

    mode: str = "gate"
    expects: tuple[Expect, ...] = ()
    known: tuple[Known, ...] = ()
    base: tuple[str, ...] = ()

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

    def meaning(self, cell: dict, baseline: dict | None) -> tuple[Meaning, str]:
        """The meaning of ``cell`` and why; ``baseline``: the same scenario's cell of the base set
        (None when the plan has none, or ``cell`` is it)."""
        verdict = cell.get("verdict")
        if verdict == "ERROR":
            return Meaning.ERROR, "sglfix itself failed: the cell's result is unknown"
        if verdict == "SKIP":
            return Meaning.SKIPPED, "cannot run here"
        v = effective(cell)
        unreached = verdict == NOT_REACHED
        if v == "SKIP":  # not reached, where the baseline itself could not run
            return Meaning.SKIPPED, "cannot run here (its baseline SKIPs: never run)"
        if v == "PASS":
            return Meaning.PASSED, "not reached: same as its baseline, which passed" if unreached else "passed"
        k = self.known_for(cell, v)
        if k is not None:
            return Meaning.KNOWN, f"known divergence ({k.scenario} -> {'|'.join(k.verdict)})"
        is_base = tuple(cell.get("toggles") or ()) == self.base
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
        return bool(self.failing) or bool(self.drifted)

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
        return out

    def explained_note(self) -> str:
        """The non-PASS cells that fail nothing, and the cells not run here, counted."""
        parts = []
        for meaning, what in (
            (Meaning.EXPECTED, "expected"),
            (Meaning.KNOWN, "known divergence(s)"),
            (Meaning.SAME_AS_BASELINE, "same as baseline"),
            (Meaning.COVERED, "other verdict(s) within an expectation"),
            (Meaning.UNCHECKED, "unchecked over the environment's baseline"),
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
            m = self.by_id.get(_cell_id(cell))
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
) -> Judgement:
    """The judgement of a report dict (``build_report``'s, or one loaded from a file). What is
    not given is read from the report itself, so a saved or merged report judges the same."""
    cells = list(report.get("cells") or ())
    rules = Rules(
        mode=mode or _mode_of(report),
        expects=tuple(expects if expects is not None else _expects_of(report)),
        known=tuple(Known.of(known if known is not None else report.get("known_divergences") or ())),
        base=tuple(base if base is not None else _base_of(report)),
    )
    device = report.get("device")
    sharded = report.get("shard") is not None
    baselines = {c["scenario"]: c for c in cells if tuple(c.get("toggles") or ()) == rules.base}
    meanings: list[CellMeaning] = []
    for c in cells:
        base_cell = baselines.get(c["scenario"])
        meaning, why = rules.meaning(c, None if base_cell is c else base_cell)
        meanings.append(
            CellMeaning(
                id=_cell_id(c),
                toggles=tuple(c.get("toggles") or ()),
                scenario=c["scenario"],
                verdict=c.get("verdict"),
                stands_for=effective(c),
                meaning=meaning,
                why=why,
                key_figure=_key_figure(c),
            )
        )
    drifted = {d["id"]: d["why"] for d in report.get("drifted") or () if isinstance(d, dict)}
    absent = {d["id"]: d["why"] for d in report.get("not_applicable") or () if isinstance(d, dict)}
    out = Judgement(rules=rules, cells=meanings, sharded=sharded, device=device, drifted=drifted, not_applicable=absent)
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
        if k.device != "any" and device not in (None, "mixed", k.device):
            status = f"{k.device} only, not expected on {device}"
        elif seen:
            status = "seen"
        elif not base_cells:
            status = "its scenarios did not run"
        elif all(c.get("verdict") == "SKIP" for c, _ in base_cells):
            status = "its scenarios SKIP here"
        else:
            status = "not seen (fixed?)"
        hits.append(KnownHit(k, seen, status))
    return hits
