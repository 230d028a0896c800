"""Two reports cell by cell: which cells changed verdict, which are in one report only.

Cells are matched by identity (toggle set, scenario), never by position, so reports of different
layouts, devices and cell orders compare; the timings and the findings' numbers are not compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglfix.report.load import cell_id, cell_key, describe, key_figure

__all__ = ["Change", "Comparison", "compare_reports"]


@dataclass(frozen=True)
class Change:
    id: str
    toggles: tuple[str, ...]
    scenario: str
    old: str
    new: str
    old_key_figure: str
    new_key_figure: str

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "toggles": list(self.toggles),
            "scenario": self.scenario,
            "old": self.old,
            "new": self.new,
            "old_key_figure": self.old_key_figure,
            "new_key_figure": self.new_key_figure,
        }


@dataclass
class Comparison:
    common: int
    changed: list[Change] = field(default_factory=list)
    only_old: list[str] = field(default_factory=list)  # cell ids, in the old report's order
    only_new: list[str] = field(default_factory=list)  # cell ids, in the new report's order

    @property
    def same(self) -> int:
        return self.common - len(self.changed)

    def failed(self, *, strict: bool = False) -> bool:
        """The CI gate: any changed verdict; with ``strict``, any cell in one report only too."""
        return bool(self.changed) or (strict and bool(self.only_old or self.only_new))

    def to_json(self, old_path: str, old: dict, new_path: str, new: dict) -> dict:
        return {
            "tool": "sglfix",
            "kind": "compare",
            "old": describe(old_path, old),
            "new": describe(new_path, new),
            "common_cells": self.common,
            "same": self.same,
            "changed": [c.to_json() for c in self.changed],
            "only_old": list(self.only_old),
            "only_new": list(self.only_new),
        }


def compare_reports(old: dict, new: dict) -> Comparison:
    """``old`` and ``new`` as ``load_report`` returns them."""
    old_cells = {cell_key(c): c for c in old["cells"]}
    new_keys = set()
    result = Comparison(common=0)
    for c in new["cells"]:
        key = cell_key(c)
        new_keys.add(key)
        before = old_cells.get(key)
        if before is None:
            result.only_new.append(cell_id(c))
            continue
        result.common += 1
        if before["verdict"] != c["verdict"]:
            result.changed.append(
                Change(
                    id=cell_id(c),
                    toggles=tuple(c["toggles"]),
                    scenario=c["scenario"],
                    old=before["verdict"],
                    new=c["verdict"],
                    old_key_figure=key_figure(before),
                    new_key_figure=key_figure(c),
                )
            )
    result.only_old = [cell_id(c) for key, c in old_cells.items() if key not in new_keys]
    return result
