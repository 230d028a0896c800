"""``sglfix search --json``: what a search tried, what it found and the scenario it shrank it to."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from sglfix.common.schema import ClosedModel

__all__ = ["FoundCell", "SearchReport", "ShrinkRecord", "load_search_report"]


class FoundCell(ClosedModel):
    """One failing example: its scenario as a file spells it, the failing cell's verdict, its check
    (the key finding, numbers left out) and key figure, and the base cell's verdict for a revert."""

    name: str
    node: dict[str, Any]
    verdict: str
    check: str
    key_figure: str
    base_verdict: str | None = None
    # A patch's find (--apply, --mutant): what it did to the cell (BROKEN, CHANGED or FIXED, as
    # mutate kills a mutant) and the judgement's sentence.
    meaning: Literal["BROKEN", "CHANGED", "FIXED"] | None = None
    said: str | None = None


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
    installed: str | None = None  # the code base as installed (distribution and version): a --release's
    target: Literal["baseline", "revert", "apply", "mutant"]
    revert: list[str]
    applied: list[str] = Field(default_factory=list)  # the patch's candidate id (--apply, --mutant)
    mutant: str | None = None
    base: list[str]  # the environment's reverts every cell ran with (and, with --mutant, the --apply fixes)
    family: str | None
    # The probes' kinds were searched beside ``family`` (a mutant's own backend, --family not given).
    with_probes: bool = False
    mode: str | None
    where: list[str] = Field(default_factory=list)  # --where KEY=VALUE pins every drawn scenario held
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
    timeouts: int = Field(default=0, ge=0)  # examples whose cell ran out of time (no find either way)
    # Every example run, in order, up to the find: what --resume skips (with the same seed, the
    # space draws them again first).
    record: list[str] = Field(default_factory=list)
    # A change's search: the kinds (backend or probe / mode) whose examples entered its functions,
    # which every other example went to once seen (empty: no focus).
    focus: list[str] = Field(default_factory=list)
    # Examples that showed the target once and not when run again through no store (their cells
    # differ run to run: memory nothing wrote): never a find.
    flaky: list[str] = Field(default_factory=list)
    # A patch's search (--apply, --mutant): the seeds it started from (--seeds builtin), the
    # neighbours it queued around examples where the patch was alive (it built other metadata there
    # and moved no verdict), how many such examples it saw, and where the find came from (None:
    # drawn from the space; "the built-in scenario X"; "EXAMPLE by STEPS": a neighbour).
    seeds: int = Field(default=0, ge=0)
    neighbours: int = Field(default=0, ge=0)
    alive: int = Field(default=0, ge=0)
    origin: str | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def load_search_report(path: str, *, option: str) -> SearchReport:
    """The search report in ``path``; a one-line ConfigError naming the file and the field else."""
    from pydantic import ValidationError

    from sglfix.common.errors import ConfigError
    from sglfix.report.load import read_json_report

    fix = "give a report sglfix search --json wrote"
    data = read_json_report(path, kind="search report", fix=fix)
    if not isinstance(data, dict) or data.get("tool") != "sglfix search":
        raise ConfigError(f'{option} {path}: not a search report (no "tool": "sglfix search"); {fix}')
    try:
        return SearchReport.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        raise ConfigError(f"{option} {path}: {where}: {e['msg']}; {fix}") from None
