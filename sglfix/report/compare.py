"""Two reports cell by cell: which cells changed verdict, which are in one report only.

Cells are matched by identity (toggle set, scenario), never by position, so reports of different
layouts, devices and cell orders compare; the timings and the findings' numbers are not compared.
What is compared is what a cell stands for (``sglfix.report.outcome.effective``): a NOT_REACHED
cell stands for its baseline's verdict, so a report with reachability and one without, or a
``run`` and a ``matrix`` of the same cells, differ only where the code did. Reports of different
code bases (the reproduction and real sglang, or two sglang versions) are compared only on
request (``across_codebases``). A cell that stands for SKIP in one report and not in the other could
not run on one side (a GPU-only kernel on CPU): it is counted apart and named, never a changed
verdict; ``--strict`` fails on it as on a cell in one report only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sglfix.common.errors import ConfigError
from sglfix.report.context import key_figure
from sglfix.report.load import cell_id, cell_key, describe
from sglfix.report.outcome import codebase_identity, codebase_label, effective

__all__ = ["Change", "Comparison", "check_codebases", "compare_reports"]


@dataclass(frozen=True)
class Change:
    id: str
    toggles: tuple[str, ...]
    scenario: str
    old: str  # the verdict the old cell stands for
    new: str
    old_key_figure: str
    new_key_figure: str
    old_verdict: str = ""  # its own verdict (NOT_REACHED for a cell standing for its baseline's)
    new_verdict: str = ""

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "toggles": list(self.toggles),
            "scenario": self.scenario,
            "old": self.old,
            "new": self.new,
            "old_key_figure": self.old_key_figure,
            "new_key_figure": self.new_key_figure,
            "old_verdict": self.old_verdict or self.old,
            "new_verdict": self.new_verdict or self.new,
        }


@dataclass
class Comparison:
    common: int
    changed: list[Change] = field(default_factory=list)
    only_old: list[str] = field(default_factory=list)  # cell ids, in the old report's order
    only_new: list[str] = field(default_factory=list)  # cell ids, in the new report's order
    across: str | None = None  # "old code base vs new code base" when compared across them on request
    skipped: list[Change] = field(default_factory=list)  # cells that stand for SKIP on one side only

    @property
    def same(self) -> int:
        return self.common - len(self.changed) - len(self.skipped)

    def failed(self, *, strict: bool = False) -> bool:
        """The CI gate: any changed verdict; with ``strict``, any cell in one report only, or
        skipped on one side only, too."""
        return bool(self.changed) or (strict and bool(self.only_old or self.only_new or self.skipped))

    def to_json(self, old_path: str, old: dict, new_path: str, new: dict) -> dict:
        return {
            "tool": "sglfix",
            "kind": "compare",
            "old": describe(old_path, old),
            "new": describe(new_path, new),
            "common_cells": self.common,
            "same": self.same,
            "changed": [c.to_json() for c in self.changed],
            "skipped_on_one_side": [c.to_json() for c in self.skipped],
            "only_old": list(self.only_old),
            "only_new": list(self.only_new),
            "across_codebases": self.across,
        }


def check_codebases(old: dict, new: dict, *, across: bool, old_path: str = "OLD", new_path: str = "NEW") -> str | None:
    """None when both reports replayed one code base and version (or a report does not record
    it); with ``across``, the two code bases in words; otherwise a ConfigError (exit 2)."""
    a, b = codebase_identity(old), codebase_identity(new)
    if a is None or b is None or a == b:
        return None
    words = f"{codebase_label(old)} vs {codebase_label(new)}"
    if across:
        return words
    raise ConfigError(
        f"{old_path} and {new_path} replayed different code bases ({words}); compare reports of one code base "
        f"and version, or give --across-codebases to compare them anyway"
    )


def compare_reports(old: dict, new: dict, *, across: str | None = None) -> Comparison:
    """``old`` and ``new`` as ``load_report`` returns them (``across``: what ``check_codebases``
    said, recorded in the comparison)."""
    old_cells = {cell_key(c): c for c in old["cells"]}
    new_keys = set()
    result = Comparison(common=0, across=across)
    for c in new["cells"]:
        key = cell_key(c)
        new_keys.add(key)
        before = old_cells.get(key)
        if before is None:
            result.only_new.append(cell_id(c))
            continue
        result.common += 1
        was, now = effective(before), effective(c)
        if was != now:
            (result.skipped if "SKIP" in (was, now) else result.changed).append(
                Change(
                    id=cell_id(c),
                    toggles=tuple(c["toggles"]),
                    scenario=c["scenario"],
                    old=was,
                    new=now,
                    old_key_figure=key_figure(before),
                    new_key_figure=key_figure(c),
                    old_verdict=before["verdict"],
                    new_verdict=c["verdict"],
                )
            )
    result.only_old = [cell_id(c) for key, c in old_cells.items() if key not in new_keys]
    return result
