"""The words of a cell's judgement: what one cell can mean in its context (``Meaning``), a cell's
meaning with its why (``CellMeaning``), and how a cell and its toggle set are named. Part of the
one judgement (``sglfix.report.outcome``, where ``Rules.meaning`` decides them); imports nothing
of sglfix but the leaf that names the environment variables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sglfix.common.environ import envs

__all__ = ["BASELINE", "ENV_VAR", "FIX_PREFIX", "CellMeaning", "Meaning", "cell_id", "set_label", "unpatched"]

ENV_VAR = envs.REVERT_PR.name
BASELINE = "baseline"
FIX_PREFIX = "+"  # a candidate fix's id in a toggle set (sglfix.toggling.candidate)


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
    # --apply: a cell with the candidate fix, against the same cell without it.
    FIXED = "fixed"  # passes with the fix where it did not without (a known divergence included)
    BROKEN = "broken"  # the fix changes its verdict other than to PASS: what the fix breaks
    CLEARED = "cleared"  # a failure of the code without the fix, which the fix clears
    CHANGED = "changed"  # fails with and without the fix, otherwise: another verdict, rows or check

    @property
    def fails(self) -> bool:
        return self in (Meaning.FAILED, Meaning.UNEXPECTED, Meaning.UNMET, Meaning.ERROR, Meaning.BROKEN)

    @property
    def explained(self) -> bool:
        """A non-PASS verdict that fails nothing, and why (shown, never hidden)."""
        return self in (
            Meaning.EXPECTED,
            Meaning.COVERED,
            Meaning.KNOWN,
            Meaning.SAME_AS_BASELINE,
            Meaning.UNCHECKED,
            Meaning.CLEARED,
            Meaning.CHANGED,
        )


def set_label(toggles: Sequence[str]) -> str:
    return ",".join(toggles) or BASELINE


def unpatched(toggles: Sequence[str]) -> tuple[str, ...]:
    """A set without its candidate fixes: the set a patched cell is compared with."""
    return tuple(t for t in toggles if not str(t).startswith(FIX_PREFIX))


def cell_id(cell: dict) -> str:
    """A cell dict's id: its own ``id``, else ``<toggle set>::<scenario>`` (as the planner names it)."""
    return cell.get("id") or f"{set_label(cell.get('toggles') or ())}::{cell['scenario']}"


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
