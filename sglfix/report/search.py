"""``sglfix search --json``: what a search tried, what it found and the scenario it shrank it to."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from sglfix.common.schema import ClosedModel

__all__ = ["FoundCell", "SearchReport", "ShrinkRecord"]


class FoundCell(ClosedModel):
    """One failing example: its scenario as a file spells it, the failing cell's verdict, its check
    (the key finding, numbers left out) and key figure, and the base cell's verdict for a revert."""

    name: str
    node: dict[str, Any]
    verdict: str
    check: str
    key_figure: str
    base_verdict: str | None = None


class ShrinkRecord(ClosedModel):
    """How the first find was shrunk: the reductions taken in order, the smaller scenarios run,
    the ones the schema refused, the rounds."""

    steps: list[str]
    asked: int = Field(ge=0)
    refused: int = Field(ge=0)
    rounds: int = Field(ge=0)
    minimal: bool  # no single reduction of the result still fails (the budget did not cut it short)


class SearchReport(ClosedModel):
    """``sglfix search --json``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal[1] = Field(alias="schema")
    tool: Literal["sglfix search"]
    command: str
    date: str
    device: str | None
    codebase: str
    target: Literal["baseline", "revert"]
    revert: list[str]
    base: list[str]  # the environment's reverts every cell ran with
    family: str | None
    mode: str | None
    seed: int
    examples: int = Field(ge=0)  # the budget asked for
    tried: int = Field(ge=0)
    examples_per_s: float = Field(ge=0)
    search_s: float = Field(ge=0)
    wall_s: float = Field(ge=0)
    stopped: str | None  # why the search ended without a find
    skipped: int = Field(ge=0)  # examples that cannot run here
    errors: list[dict[str, Any]]  # cells sglfix itself failed on (never a find)
    found: FoundCell | None
    shrunk: FoundCell | None
    shrink: ShrinkRecord | None
    # A baseline find that a known divergence's candidate fix clears is that divergence (its scenario
    # glob and fix); None for a revert, or a find no known fix clears (a new bug).
    known: str | None = None
    written: str | None  # the scenario file -o wrote

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
