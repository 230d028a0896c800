"""Verdict names and their severity: a cell gets the most severe of its findings."""

from __future__ import annotations

# Most severe first.
SEVERITY: tuple[str, ...] = ("FAULT", "TIMEOUT", "CRASH", "INVARIANT", "NAN", "DIVERGE", "SYNC", "PASS")
VERDICTS: tuple[str, ...] = SEVERITY + ("SKIP",)


def worst(verdicts: list[str] | tuple[str, ...]) -> str:
    ranked = [v for v in verdicts if v in SEVERITY]
    if not ranked:
        return "SKIP" if "SKIP" in verdicts else "PASS"
    return min(ranked, key=SEVERITY.index)
