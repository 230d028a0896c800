"""What a search's stand-in pool hands back for a cell: its report dict, as a worker's result
gives it (``to_json``). The tests' pools stand in for the workers only."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Result:
    cell: dict

    def to_json(self) -> dict:
        return dict(self.cell)
