"""Verdicts and their severity: a cell gets the most severe of its findings.

ERROR means sglfix itself (or the harness) failed in the cell: its result is unknown, and it
counts as a failure, never as a skip. SKIP is only for "cannot run here", with the reason.
NOT_REACHED is a mark, not a finding: the scenario's baseline never executes a function the
cell's toggle set reverts, so the cell is provably its baseline and was not run. Toggle files
cannot name it; expectations judge such a cell by its baseline's verdict.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

__all__ = ["FAILING", "MARKS", "NOT_REACHED", "SEVERITY", "VERDICTS", "Verdict", "stands_for", "worst"]


class Verdict(StrEnum):
    ERROR = "ERROR"
    FAULT = "FAULT"
    TIMEOUT = "TIMEOUT"
    CRASH = "CRASH"
    INVARIANT = "INVARIANT"
    NAN = "NAN"
    DIVERGE = "DIVERGE"
    SYNC = "SYNC"
    PASS = "PASS"
    SKIP = "SKIP"
    NOT_REACHED = "NOT_REACHED"

    @property
    def severity(self) -> int:
        """0 is the most severe; SKIP and NOT_REACHED rank below PASS (they are no finding)."""
        return _ORDER.index(self)

    @property
    def failed(self) -> bool:
        return self not in (Verdict.PASS, Verdict.SKIP, Verdict.NOT_REACHED)


_ORDER = tuple(Verdict)
# Most severe first; the names as plain strings, for reports and YAML.
SEVERITY: tuple[str, ...] = tuple(v.value for v in _ORDER if v not in (Verdict.SKIP, Verdict.NOT_REACHED))
# What a toggle file's expectation may name.
VERDICTS: tuple[str, ...] = tuple(v.value for v in _ORDER if v is not Verdict.NOT_REACHED)
# What a report's cell may hold.
MARKS: tuple[str, ...] = tuple(v.value for v in _ORDER)
NOT_REACHED = Verdict.NOT_REACHED.value
FAILING: frozenset[str] = frozenset(v.value for v in _ORDER if v.failed)


def worst(verdicts: Iterable[str]) -> str:
    """The most severe verdict named; PASS for none; SKIP only when nothing else was found."""
    ranked = [Verdict(v) for v in verdicts]
    if not ranked:
        return Verdict.PASS.value
    return min(ranked, key=lambda v: v.severity).value


def stands_for(verdict: str, findings: Iterable[Any]) -> str:
    """The verdict a cell stands for: its own, or for NOT_REACHED its baseline's (the ``same_as``
    its mark carries; PASS when none). Expectations judge cells by it, in a run and in a merge."""
    if verdict != NOT_REACHED:
        return verdict
    return next((f.get("same_as") for f in findings or () if isinstance(f, dict) and f.get("same_as")), "PASS")
