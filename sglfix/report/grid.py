"""The toggle-set x scenario grid of a report dict, as the JUnit, Markdown and heatmap writers read it.

Works on the JSON report (``build_report``'s dict, or one loaded from a file), never on live
results, so every writer also runs on a saved report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BASELINE", "Grid", "group_of", "set_label"]

BASELINE = "baseline"


def set_label(toggles: Sequence[str]) -> str:
    """As the planner labels a toggle set (the report package does not import the planner)."""
    return ",".join(toggles) or BASELINE


def group_of(scenario: str) -> str:
    """The scenario's base name: what comes before the first ``@`` of a grid-expanded name."""
    return scenario.split("@", 1)[0]


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
