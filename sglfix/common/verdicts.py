"""Verdicts and their severity: a cell gets the most severe of its findings.

ERROR means sglfix itself (or the harness) failed in the cell: its result is unknown, and it
counts as a failure, never as a skip. SKIP is only for "cannot run here", with the reason.
NOT_REACHED is a mark, not a finding: the scenario's baseline never executes a function the
cell's toggle set reverts, so the cell is provably its baseline and was not run. Toggle files
cannot name it; expectations judge such a cell by its baseline's verdict.

How each verdict is shown is one table too (``LOOKS``): its letter, its console style, its
colour in a picture and what it means. The console grid, the heatmap and Markdown read it at the
time they draw, so a verdict looks the same everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any, NamedTuple

__all__ = [
    "FAILING",
    "LOOKS",
    "MARKS",
    "NOT_REACHED",
    "NOT_RUN",
    "SEVERITY",
    "VERDICTS",
    "Look",
    "Verdict",
    "letter_of",
    "look_of",
    "stands_for",
    "style_of",
    "worst",
]


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


class Look(NamedTuple):
    """How a verdict is shown: one ``letter`` (the compact console grid, the heatmap's cells,
    Markdown's PASS mark; failures are capitals), a rich ``style`` (the console), a matplotlib
    ``colour`` (a heatmap cell) with the ``ink`` its letter is drawn in there, and a ``description``."""

    letter: str
    style: str
    colour: str
    ink: str
    description: str


LOOKS: dict[str, Look] = {
    Verdict.ERROR: Look(
        "E", "bold white on red", "#1f4e9c", "white", "sglfix itself or the harness failed: the result is unknown"
    ),
    Verdict.FAULT: Look(
        "F", "bold red", "#222222", "white", "the worker process died (a segfault, an illegal address)"
    ),
    Verdict.TIMEOUT: Look("T", "bold red", "#8c564b", "white", "the cell ran past its time limit"),
    Verdict.CRASH: Look("C", "bold red", "#f57c00", "black", "the backend raised an exception"),
    Verdict.INVARIANT: Look(
        "I", "magenta", "#7b52ab", "white", "the metadata is malformed, or a write went past a buffer's end"
    ),
    Verdict.NAN: Look("N", "red", "#e7298a", "white", "the output is not finite"),
    Verdict.DIVERGE: Look("D", "red", "#d7301f", "white", "the output differs from the reference beyond tolerance"),
    Verdict.SYNC: Look("Y", "yellow", "#f2c62f", "black", "a device-to-host sync in a path declared sync-free"),
    Verdict.PASS: Look(".", "green", "#cde8c4", "black", "the output matches the reference and every check held"),
    Verdict.SKIP: Look("s", "dim", "#d9d9d9", "black", "cannot run here (the reason is given)"),
    Verdict.NOT_REACHED: Look(
        "-", "dim cyan", "#eef2f7", "black", "the reverted code never ran: the cell stands for its baseline's verdict"
    ),
}
# A cell of the grid with no result (not in the report).
NOT_RUN = Look("?", "", "#ffffff", "black", "not run")


def look_of(verdict: str | None) -> Look | None:
    """The verdict's look; ``NOT_RUN`` for none (no result); None for a name the table does not know."""
    return NOT_RUN if verdict is None else LOOKS.get(verdict)


def letter_of(verdict: str | None) -> str:
    """The verdict's letter; ``NOT_RUN``'s for none or a name the table does not know."""
    look = look_of(verdict)
    return look.letter if look else NOT_RUN.letter


def style_of(verdict: str | None) -> str:
    """The verdict's console style; none for a name the table does not know."""
    look = look_of(verdict)
    return look.style if look else ""


def worst(verdicts: Iterable[str]) -> str:
    """The most severe verdict named; PASS for none; SKIP only when nothing else was found."""
    ranked = [Verdict(v) for v in verdicts]
    if not ranked:
        return Verdict.PASS.value
    return min(ranked, key=lambda v: v.severity).value


def stands_for(verdict: str, findings: Iterable[Any] | None) -> str:
    """The verdict a cell stands for: its own, or for NOT_REACHED its baseline's (the ``same_as``
    its mark carries; PASS when none). Expectations judge cells by it, in a run and in a merge."""
    if verdict != NOT_REACHED:
        return verdict
    return next((f.get("same_as") for f in findings or () if isinstance(f, dict) and f.get("same_as")), "PASS")
