"""The bisect report (``sglfix bisect --json``) as pydantic models: each group's culprits and the
masking pairs the search found (``sglfix.execution.bisection``), what it counted, and with
``--apply`` the search without and with the candidate fixes compared.

The models are closed (an unknown key is an error) and typed as ``sglfix.report.schema`` types a
run's report, whose code base, plan and candidate rows they share. ``BisectReport.to_json`` is
the file: the keys in the order of the fields, ``shard``, ``store`` and ``apply`` only when they
hold something.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field

from sglfix.common.schema import ClosedModel
from sglfix.report.schema import (
    CandidateRow,
    Codebase,
    Count,
    Duration,
    PlanIdentity,
    Shard,
    StoreUse,
    ToggleIds,
    Verdict,
)

__all__ = [
    "TOOL",
    "Answer",
    "BisectReport",
    "Culprit",
    "CulpritRow",
    "FixComparison",
    "FlatCulprit",
    "Group",
    "LeftOut",
    "Masking",
    "answer_of",
    "compare_with_fix",
    "now",
]

TOOL: Final = "sglfix bisect"


class Culprit(ClosedModel):
    """A minimal set of candidates that makes some of its group's scenarios fail reverted: the
    worst verdict they show, the scenarios, the key figure of a cell that gave that verdict, and
    whether the search or the masking sweep found it."""

    ids: ToggleIds
    verdict: Verdict
    scenarios: list[str]
    key_figure: str
    key_scenario: str
    found_by: Literal["search", "masking sweep"]


class FlatCulprit(Culprit):
    """A culprit as the report's top-level list names it: with its group."""

    group: str


class Masking(ClosedModel):
    """A culprit that fails alone but passes reverted together with ``masked_by``, on
    ``scenarios`` (``all``: every scenario it fails alone)."""

    group: str
    culprit: str
    masked_by: str
    scenarios: list[str]
    all: bool


class Group(ClosedModel):
    """One scenario group's search (scenarios of one base name): its culprits, the candidates
    none of its baselines reaches (left out of the search), how many were searched, the distinct
    sets the search asked about and how many candidates the masking sweep ran alone."""

    group: str
    scenarios: Count
    culprits: list[Culprit]
    unreachable: list[str]
    searched: Count
    runs: Count
    swept: Count


class LeftOut(ClosedModel):
    """Scenarios left out of the search: those that SKIP here, and those whose baseline shows a
    known divergence (that verdict is not counted against any set)."""

    skip: list[str]
    known: list[str]


class CulpritRow(ClosedModel):
    """A culprit as the comparison of two searches lists it."""

    group: str
    ids: list[str]
    verdict: Verdict


class FixComparison(ClosedModel):
    """``--apply``: the search without and with the candidate fixes. ``same`` is false when a
    culprit found without the fix is not found with it (the fix hides its regression)."""

    candidates: list[CandidateRow]
    same: bool
    outcome: str
    # The culprits found without the fix; the line saying why there are none when the baseline
    # failed without it.
    without_fix: str | list[CulpritRow]
    only_without_fix: list[CulpritRow]
    only_with_fix: list[CulpritRow]


class BisectReport(ClosedModel):
    """``sglfix bisect --json``."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    schema_: Literal[2] = Field(alias="schema")
    tool: Literal["sglfix bisect"]
    command: str
    date: str
    wall_s: Duration
    device: str | None
    device_name: str | None
    codebase: Codebase | None
    candidates: Count
    # Distinct toggle sets that ran (the baseline, nothing reverted, is not one of them): those
    # the search asked about, those only the masking checks did, and both.
    runs: Count
    masking_runs: Count
    sets_run: Count
    reachability: bool
    cells: Count
    culprits: list[FlatCulprit]
    masking: list[Masking]
    left_out: LeftOut
    groups: list[Group]
    worker_replacements: list[str]
    shard: Shard | None = None
    # The result store, when the search read it: its folder, cells served from it, cells run.
    store: StoreUse | None = None
    plan: PlanIdentity
    apply: FixComparison | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as written: every field given, in order (``shard`` and ``apply`` are left
        out unless given; a code base, plan or candidate keeps the keys it was read with)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def now() -> str:
    """A report's ``date``: UTC, to the second."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class Answer(ClosedModel):
    """A search's answer as the comparison reads it: each group's culprits as (group, ids joined
    with ",", verdict), or why the search could not run (its baseline failed)."""

    culprits: list[tuple[str, str, str]] = []
    failing_baseline: str | None = None


def answer_of(groups: Sequence[Group]) -> Answer:
    return Answer(culprits=sorted({(g.group, ",".join(c.ids), c.verdict) for g in groups for c in g.culprits}))


def compare_with_fix(
    fixes: Sequence[str], *, unfixed: Answer, fixed: Answer, candidates: Sequence[CandidateRow]
) -> FixComparison:
    """The search without and with the candidate fixes: which reverts fail only with or only
    without the fix. A culprit lost with the fix (a historical regression it hides) fails."""
    before, after = set(unfixed.culprits), set(fixed.culprits)

    def rows(found: set[tuple[str, str, str]]) -> list[CulpritRow]:
        return [CulpritRow(group=g, ids=i.split(","), verdict=v) for g, i, v in sorted(found)]

    label = ",".join(fixes)
    if unfixed.failing_baseline is not None:
        outcome = f"{label}: without it the baseline fails ({unfixed.failing_baseline}); with it the search ran"
        same = True
    elif before == after:
        outcome = f"{label}: the same {len(after)} culprit(s) with and without the fix: it changes no revert's verdict"
        same = True
    elif before <= after:
        # A revert that fails only with the fix applied: a scenario the fix clears now shows it.
        outcome = (
            f"{label}: every culprit found without the fix is found with it, and {len(after - before)} more "
            f"(scenarios the fix clears now show them)"
        )
        same = True
    else:
        outcome = (
            f"{label}: {len(before - after)} culprit(s) found without the fix are not found with it (the fix "
            f"hides their regression), {len(after - before)} only with it"
        )
        same = False
    return FixComparison(
        candidates=list(candidates),
        same=same,
        outcome=outcome,
        without_fix=unfixed.failing_baseline or rows(before),
        only_without_fix=rows(before - after),
        only_with_fix=rows(after - before),
    )
