"""The release bisect report (``sglfix bisect --releases A..B --json``) as pydantic models: each
release run the search took, the first release whose verdicts differ from the oldest's and the
cells that differ there (``sglfix.execution.release_bisect``), and the changed functions those
cells reached, with their diffs.

The models are closed (an unknown key is an error). ``ReleaseBisectReport.to_json`` is the file:
the keys in the order of the fields, those that only some reports hold (a run's ``untestable`` or
``summary``, ``differing_cells``, ``changed_reached``) only where given.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, model_serializer, model_validator

from sglfix.common.schema import ClosedModel
from sglfix.report.schema import Count, Duration, Verdict

__all__ = [
    "TOOL",
    "ChangedFunction",
    "ChangedReached",
    "DifferingCell",
    "ReleaseBisectReport",
    "ReleaseFound",
    "RunRow",
]

TOOL: Final = "sglfix bisect --releases"


class RunRow(ClosedModel):
    """One release's run: its exit and time, where its package was, and its verdicts counted, or
    the line saying why it could not be tested."""

    release: str
    exit: int
    wall_s: Duration
    path: str
    untestable: str | None = None
    summary: dict[Verdict, Count] | None = None


class DifferingCell(ClosedModel):
    """A cell whose verdict on the first release unlike the reference is not the reference's
    (None: that release's run has no such cell). Written as ``{"cell": ..., "reference": ...,
    "<release>": verdict}``: the release itself is the key of its verdict."""

    cell: str
    reference: Verdict | None
    release: str
    verdict: Verdict | None

    @model_validator(mode="before")
    @classmethod
    def _as_read(cls, data: Any) -> Any:
        if isinstance(data, dict) and not {"release", "verdict"} & set(data):
            others = [k for k in data if k not in ("cell", "reference")]
            if len(others) == 1:
                return {
                    **{k: data[k] for k in ("cell", "reference") if k in data},
                    "release": others[0],
                    "verdict": data[others[0]],
                }
        return data

    @model_serializer(mode="plain")
    def _as_written(self) -> dict[str, Any]:
        return {"cell": self.cell, "reference": self.reference, self.release: self.verdict}


class ReleaseFound(ClosedModel):
    """What the search over the releases found: the releases (oldest first; the oldest is the
    reference), the runs it took and its budget, the first release unlike the reference (None:
    none) and the last like it, the releases between them that could not be tested and, when one
    differs, its differing cells."""

    releases: list[str]
    reference: str
    runs: list[RunRow]
    release_runs: Count
    budget: Count
    first_bad: str | None
    last_good: str
    untested_between: list[str]
    differing_cells: list[DifferingCell] | None = None


class ChangedFunction(ClosedModel):
    """A changed function a differing cell reached: its file and first line in the first bad
    release, and the unified diff from the last good one."""

    function: str
    file: str
    line: Count
    diff: str


class ChangedReached(ClosedModel):
    """The functions of the modules a worker imports that changed between the last good and the
    first bad release, and of those the ones the differing cells entered."""

    modules: Count
    changed_functions: Count
    functions: list[ChangedFunction]


class _Header(ClosedModel):
    """What every ``--json`` report of a release bisect starts with."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    schema_: Literal[1] = Field(alias="schema")
    tool: Literal["sglfix bisect --releases"]
    command: str
    date: str
    wall_s: Duration
    distribution: str


# ReleaseFound before _Header among the bases puts the header's fields first (pydantic lays the
# fields out from the last base of the MRO to the first), then what was found, in its order.
class ReleaseBisectReport(ReleaseFound, _Header):
    """``sglfix bisect --releases A..B --json``: the header, what the search found (the fields of
    ``ReleaseFound``, in its order) and, when a release differs, what changed there."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    changed_reached: ChangedReached | None = None

    @classmethod
    def of(
        cls,
        found: ReleaseFound,
        *,
        command: str,
        date: str,
        wall_s: float,
        distribution: str,
        changed_reached: ChangedReached | None = None,
    ) -> ReleaseBisectReport:
        given: dict[str, Any] = {k: getattr(found, k) for k in ReleaseFound.model_fields if k in found.model_fields_set}
        if changed_reached is not None:
            given["changed_reached"] = changed_reached
        return cls(schema=1, tool=TOOL, command=command, date=date, wall_s=wall_s, distribution=distribution, **given)

    def to_json(self) -> dict[str, Any]:
        """The report as written: every field given, in order."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)
