"""Verdicts and their severity: a cell gets the most severe of its findings.

ERROR means sglfix itself (or the harness) failed in the cell: its result is unknown, and it
counts as a failure, never as a skip. SKIP is only for "cannot run here", with the reason.
"""

from __future__ import annotations

from enum import Enum
from typing import Iterable

__all__ = ["Verdict", "SEVERITY", "VERDICTS", "FAILING", "worst"]


class Verdict(str, Enum):
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

    def __str__(self) -> str:
        return self.value

    @property
    def severity(self) -> int:
        """0 is the most severe; SKIP ranks below PASS (it is no finding)."""
        return _ORDER.index(self)

    @property
    def failed(self) -> bool:
        return self not in (Verdict.PASS, Verdict.SKIP)


_ORDER = tuple(Verdict)
# Most severe first; the names as plain strings, for reports and YAML.
SEVERITY: tuple[str, ...] = tuple(v.value for v in _ORDER if v is not Verdict.SKIP)
VERDICTS: tuple[str, ...] = tuple(v.value for v in _ORDER)
FAILING: frozenset[str] = frozenset(v.value for v in _ORDER if v.failed)


def worst(verdicts: Iterable[str]) -> str:
    """The most severe verdict named; PASS for none; SKIP only when nothing else was found."""
    ranked = [Verdict(v) for v in verdicts]
    if not ranked:
        return Verdict.PASS.value
    return min(ranked, key=lambda v: v.severity).value
