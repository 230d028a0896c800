"""What a result means, decided once: every gate, comparison, attribution and fix claim reads it.

A cell's verdict is a fact; what it *means* depends on its context: its baseline's verdict, the
profile's known divergences on this device, the expectations of its toggle set, and whether it
could run here at all. Run, matrix, ``report compare``, ``report merge --gate``, bisect, JUnit,
Markdown, the console and the pytest plugin all read the judgement made here; none re-derives it.

The same holds for a regression test's claim to guard a fix (``judge_claim``): caught only when
the test passes with the fix in place and fails with it reverted.

A leaf: imports nothing of sglfix but ``sglfix.common``; it works on cells as report dicts.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sglfix.common.verdicts import NOT_REACHED, stands_for

__all__ = ["Claim", "judge_claim"]


class Claim(StrEnum):
    """A fix claim (``@pytest.mark.fixed_by``) checked by running the test both ways."""

    CAUGHT = "caught"  # passes with the fix, fails with it reverted: the test guards the fix
    NOT_CAUGHT = "not-caught"  # passes with the fix reverted: the test does not see the bug
    INCONCLUSIVE = "inconclusive"  # fails with the fix in place too: the revert proves nothing
    NOT_RUN = "not-run"  # skipped or xfail: it cannot show the revert either way
    ERROR = "error"  # the revert could not be applied: sglfix failed, nothing was tested

    @property
    def fails_session(self) -> bool:
        """A claim that is not caught, or could not be tried, fails the session."""
        return self in (Claim.NOT_CAUGHT, Claim.ERROR)


# What a run of the test gave: pytest's outcome of its phases taken together.
TEST_OUTCOMES = ("passed", "failed", "skipped", "xfail", "error")


def judge_claim(*, fixed: str, reverted: str) -> tuple[Claim, str]:
    """The claim's outcome and why, from the test's outcome with the fix in place (``fixed``) and
    with it reverted (``reverted``), each one of ``TEST_OUTCOMES`` (``error`` for the reverted
    run: the revert could not be applied)."""
    for name, value in (("fixed", fixed), ("reverted", reverted)):
        if value not in TEST_OUTCOMES:
            raise ValueError(f"{name}={value!r}: not one of {', '.join(TEST_OUTCOMES)}")
    if reverted == "error":
        return Claim.ERROR, "the revert could not be applied"
    if reverted in ("skipped", "xfail"):
        return Claim.NOT_RUN, f"{reverted} with the fix reverted: it cannot show the revert"
    if fixed in ("skipped", "xfail"):
        return Claim.NOT_RUN, f"{fixed} with the fix in place: it cannot show the revert"
    if reverted == "passed":
        return Claim.NOT_CAUGHT, "passed with the fix reverted"
    if fixed != "passed":
        return Claim.INCONCLUSIVE, "fails with the fix in place too: failing with it reverted proves nothing"
    return Claim.CAUGHT, "passes with the fix in place, fails with it reverted"


# --------------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------------

__all__ += [
    "ENV_VAR",
    "Check",
    "Expect",
    "Judgement",
    "Known",
    "Meaning",
    "Rules",
    "codebase_identity",
    "codebase_label",
    "effective",
    "judge",
]

ENV_VAR = "SGLANG_DEBUG_REVERT_PR"
BASELINE = "baseline"


class Meaning(StrEnum):
    """What one cell means in its context (one per cell, decided by ``Rules.meaning``)."""

    PASSED = "passed"  # PASS, or not reached where its baseline passed
    EXPECTED = "expected"  # a verdict an expectation of its toggle set wants: the revert is caught
    COVERED = "covered"  # another verdict on a scenario an expectation names (met on others)
    KNOWN = "known"  # a profile's known divergence on this device (an upstream bug, not the toggle)
    SAME_AS_BASELINE = "same-as-baseline"  # a toggle cell showing its baseline's own failing verdict
    UNCHECKED = "unchecked"  # a toggle's finding over a baseline from the environment: no expectation applies
    SKIPPED = "skipped"  # SKIP: this device or code base cannot run it
    FAILED = "failed"  # run, bisect: a verdict that is not a pass and nothing above explains
    UNEXPECTED = "unexpected"  # matrix: a verdict no expectation explains (a failing baseline too)
    UNMET = "unmet"  # a cell of an expectation that no cell met
    ERROR = "error"  # sglfix itself failed: the cell's result is unknown

    @property
    def fails(self) -> bool:
        return self in (Meaning.FAILED, Meaning.UNEXPECTED, Meaning.UNMET, Meaning.ERROR)

    @property
    def explained(self) -> bool:
        """A non-PASS verdict that fails nothing, and why (shown, never hidden)."""
        return self in (Meaning.EXPECTED, Meaning.COVERED, Meaning.KNOWN, Meaning.SAME_AS_BASELINE, Meaning.UNCHECKED)


def effective(cell: dict) -> str:
    """The verdict a cell stands for: its own, or for NOT_REACHED its baseline's."""
    return stands_for(cell.get("verdict"), cell.get("findings"))


def set_label(toggles: Sequence[str]) -> str:
    return ",".join(toggles) or BASELINE


def _cell_id(cell: dict) -> str:
    return cell.get("id") or f"{set_label(cell.get('toggles') or ())}::{cell['scenario']}"


@dataclass(frozen=True)
class Expect:
    """One ``expect:`` row of a toggle file: reverting ``revert`` gives one of ``wanted`` on the
    scenarios ``scenario`` (a glob) names, on ``device`` (any, cpu, cuda)."""

    toggle: str
    revert: tuple[str, ...]
    scenario: str
    wanted: tuple[str, ...]
    device: str = "any"

    @property
    def text(self) -> str:
        return f"revert {','.join(self.revert)} on {self.scenario}"

    def covers(self, scenario: str) -> bool:
        return fnmatch.fnmatchcase(scenario, self.scenario)

    def to_json(self) -> dict:
        return {
            "toggle": self.toggle,
            "revert": list(self.revert),
            "scenario": self.scenario,
            "wanted": list(self.wanted),
            "device": self.device,
        }

    @classmethod
    def from_json(cls, data: dict) -> Expect:
        return cls(
            toggle=str(data.get("toggle") or ",".join(data["revert"])),
            revert=tuple(data["revert"]),
            scenario=data["scenario"],
            wanted=tuple(data["wanted"]),
            device=str(data.get("device") or "any"),
        )

    @classmethod
    def of_registry(cls, registry: Iterable[Any]) -> list[Expect]:
        return [
            cls(toggle=t.id, revert=tuple(e.revert), scenario=e.scenario, wanted=tuple(e.verdicts), device=e.device)
            for t in registry
            for e in t.expect
        ]


@dataclass(frozen=True)
class Known:
    """A profile's known divergence: a baseline finding on the real engine, confirmed upstream."""

    scenario: str
    verdict: tuple[str, ...]
    reason: str = ""
    reproduce: str = ""
    device: str = "any"

    def matches(self, *, scenario: str, verdict: str, device: str | None) -> bool:
        return (
            verdict in self.verdict and self.device in ("any", device) and fnmatch.fnmatchcase(scenario, self.scenario)
        )

    def to_json(self) -> dict:
        return {
            "scenario": self.scenario,
            "verdict": list(self.verdict),
            "reason": self.reason,
            "reproduce": self.reproduce,
            "device": self.device,
        }

    @classmethod
    def from_json(cls, data: dict) -> Known:
        verdict = data.get("verdict") or ()
        return cls(
            scenario=data["scenario"],
            verdict=tuple([verdict] if isinstance(verdict, str) else verdict),
            reason=str(data.get("reason") or ""),
            reproduce=str(data.get("reproduce") or ""),
            device=str(data.get("device") or "any"),
        )

    @classmethod
    def of(cls, entries: Iterable[Any]) -> list[Known]:
        """From ``sglfix.execution.known.KnownDivergence`` models or report dicts."""
        out = []
        for k in entries:
            if isinstance(k, dict):
                out.append(cls.from_json(k))
            else:
                out.append(
                    cls(
                        scenario=k.scenario,
                        verdict=tuple(str(v) for v in k.verdict),
                        reason=k.reason,
                        reproduce=k.reproduce,
                        device=k.device,
                    )
                )
        return out


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
class CellMeaning:
    id: str
    toggles: tuple[str, ...]
    scenario: str
    verdict: str
    stands_for: str
    meaning: Meaning
    why: str
    key_figure: str = ""

    def to_json(self) -> dict:
        return {"meaning": self.meaning.value, "why": self.why}


@dataclass
class Check:
    """An expectation judged over the cells that ran: met when at least one shows what it wants."""

    expect: Expect
    met: bool
    got: dict[str, str] = field(default_factory=dict)  # scenario -> the verdict it stands for

    def to_json(self) -> dict:
        return {**self.expect.to_json(), "met": self.met, "got": dict(self.got)}


@dataclass
class NotChecked:
    expect: Expect
    reason: str

    @property
    def text(self) -> str:
        return f"{self.expect.text} ({self.reason})"

    def to_json(self) -> dict:
        return {**self.expect.to_json(), "reason": self.reason}


@dataclass
class KnownHit:
    known: Known
    seen_on: list[str]
    status: str  # seen / not seen (fixed?) / <device> only

    def to_json(self) -> dict:
        return {**self.known.to_json(), "seen_on": list(self.seen_on), "status": self.status}


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
        return bool(self.failing)

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
            ):
                if n:
                    out.append(f"{n} {what}")
        else:
            for n, what in (
                (self.count(Meaning.FAILED), "cell(s) did not pass"),
                (self.count(Meaning.ERROR), "ERROR cell(s): sglfix itself failed"),
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


def _key_figure(cell: dict) -> str:
    return next(
        (
            str(f.get("message", ""))
            for f in cell.get("findings") or ()
            if isinstance(f, dict) and f.get("verdict") == cell.get("verdict")
        ),
        "",
    )


def _base_of(report: dict) -> tuple[str, ...]:
    judged = report.get("judged")
    if isinstance(judged, dict) and isinstance(judged.get("baseline"), list):
        return tuple(judged["baseline"])
    env = report.get("env_revert")
    if env in (None, "", "0"):
        return ()
    return tuple(t.strip() for t in str(env).split(",") if t.strip())


def _mode_of(report: dict) -> str:
    judged = report.get("judged")
    if isinstance(judged, dict) and judged.get("mode") in ("gate", "findings"):
        return judged["mode"]
    words = str(report.get("command") or "").split()
    if "matrix" in words:
        return "gate"
    if "run" in words:
        return "findings"
    return "gate" if (report.get("expectations") or report.get("stray") or report.get("not_run")) else "findings"


def _expects_of(report: dict) -> list[Expect]:
    """The report's expectation rows: ``expect`` (written since the judgement has a home), else
    the rows its checks name (an older report: the unchecked ones are then only its ``not_run``)."""
    rows = report.get("expect")
    if isinstance(rows, list):
        return [Expect.from_json(r) for r in rows if isinstance(r, dict)]
    out: dict[Expect, None] = {}
    for e in report.get("expectations") or ():
        if isinstance(e, dict) and isinstance(e.get("revert"), list):
            out[Expect.from_json(e)] = None
    return list(out)


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
    out = Judgement(rules=rules, cells=meanings, sharded=sharded, device=device)
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
        ran = [i for i in on_device if cells[i].get("verdict") != "SKIP"]
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


def codebase_label(report: dict) -> str:
    """The code base a report's cells replayed through, in words: ``sglang X.Y.Z at PATH
    (stand-ins: sgl_kernel)`` or ``built-in reproduction``; ``code base not recorded`` for a
    report written before it was."""
    cb = report.get("codebase")
    if not isinstance(cb, dict):
        return "code base not recorded"
    if cb.get("name") == "reproduction":
        return "built-in reproduction"
    text = f"{cb.get('distribution') or cb.get('name')} {cb.get('version') or '?'}"
    if cb.get("path"):
        text += f" at {cb['path']}"
    if cb.get("standins"):
        text += f" (stand-ins: {', '.join(cb['standins'])})"
    return text


def codebase_identity(report: dict) -> tuple[str, str] | None:
    """(name, version) of the code base, None when the report does not record it."""
    cb = report.get("codebase")
    if not isinstance(cb, dict):
        return None
    return str(cb.get("name")), str(cb.get("version"))
