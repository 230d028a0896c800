"""The adapters' per-init reports, read back once after the run: a judge that runs after every
metadata init (eager, capture, replay) keeps one report per init on the backend ("" where the
init was right), and the cell is told of the first wrong one, or of how many were right."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["init_reports", "keep_report"]


def keep_report(backend: Any, key: str, report: str) -> None:
    """Keep one init's report ("" for a right init) on ``backend`` under ``key``."""
    backend.__dict__.setdefault(key, []).append(report)


def init_reports(backend: Any, key: str, *, what: str, passed: Callable[[int], str]) -> list[tuple[str, str]]:
    """[] where no init was judged; the first wrong init's report as a DIVERGE ("metadata
    reference: {what}metadata init i of n: ..."); else one PASS row, ``passed(n)``."""
    reports = backend.__dict__.get(key, [])
    wrong = next(((i, r) for i, r in enumerate(reports, 1) if r), None)
    if wrong is not None:
        at, first = wrong
        return [("DIVERGE", f"metadata reference: {what}metadata init {at} of {len(reports)}: {first}")]
    if not reports:
        return []
    return [("PASS", passed(len(reports)))]
