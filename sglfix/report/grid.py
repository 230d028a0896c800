"""The toggle-set x scenario grid of a report dict, as the JUnit, Markdown and heatmap writers read it.

Works on the JSON report (``build_report``'s dict, or one loaded from a file), never on live
results, so every writer also runs on a saved report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BASELINE", "Grid", "gate_failures", "group_of", "key_figure", "set_label"]

BASELINE = "baseline"


def set_label(toggles: Sequence[str]) -> str:
    """As the planner labels a toggle set (the report package does not import the planner)."""
    return ",".join(toggles) or BASELINE


def group_of(scenario: str) -> str:
    """The scenario's base name: what comes before the first ``@`` of a grid-expanded name."""
    return scenario.split("@", 1)[0]


def key_figure(cell: dict) -> str:
    """The first finding's message of the cell's verdict (as ``CellResult.key_figure``)."""
    return next(
        (f.get("message", "") for f in cell.get("findings") or () if f.get("verdict") == cell.get("verdict")), ""
    )


@dataclass
class Grid:
    """Columns (toggle-set labels) and rows (scenarios, grouped by base name) in report order."""

    columns: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    groups: list[tuple[str, list[str]]] = field(default_factory=list)
    cells: dict[tuple[str, str], dict] = field(default_factory=dict)  # (column, scenario) -> cell

    @classmethod
    def of(cls, report: dict) -> Grid:
        grid = cls()
        by_group: dict[str, list[str]] = {}
        for cell in report.get("cells") or ():
            col, scenario = set_label(cell.get("toggles") or ()), cell["scenario"]
            if col not in grid.columns:
                grid.columns.append(col)
            rows = by_group.setdefault(group_of(scenario), [])
            if scenario not in rows:
                rows.append(scenario)
            grid.cells[(col, scenario)] = cell
        grid.groups = list(by_group.items())
        grid.rows = [s for _, rows in grid.groups for s in rows]
        return grid

    def verdict(self, column: str, scenario: str) -> str | None:
        cell = self.cells.get((column, scenario))
        return cell.get("verdict") if cell else None


def gate_failures(report: dict) -> dict[str, str]:
    """Cell id -> why the matrix gate fails on it: a stray verdict, or a cell of an unmet
    expectation (every matching cell, since none of them showed the wanted verdict)."""
    by_key = {(set_label(c.get("toggles") or ()), c["scenario"]): c["id"] for c in report.get("cells") or ()}
    why: dict[str, str] = {}
    for s in report.get("stray") or ():
        cid = by_key.get((set_label(s.get("toggles") or ()), s.get("scenario")))
        if cid is not None:
            why[cid] = f"unexpected {s.get('verdict')}: {s.get('why', 'stray verdict')}"
    for e in report.get("expectations") or ():
        if e.get("met", True):
            continue
        label = set_label(e.get("revert") or ())
        for scenario, got in (e.get("got") or {}).items():
            cid = by_key.get((label, scenario))
            if cid is not None and cid not in why:
                why[cid] = (
                    f"expectation unmet: revert {label} on {e.get('scenario')} -> "
                    f"{'|'.join(e.get('wanted') or ())}; got {got}"
                )
    return why
