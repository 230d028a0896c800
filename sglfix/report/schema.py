"""The JSON report's schema as pydantic models: ``Report`` (the top level) and ``Cell`` (one cell).

Every field a run, a matrix or ``report merge`` writes is here with its type, for schema 2
(``build_report`` and the judgement's keys) and schema 1 (a subset of the same keys). A report
read back (``sglfix.report.load``) is checked against these models before anything merges,
compares or balances shards by it; ``check_report`` turns the first problem into one line naming
the field, and the cell for a cell's field.

The schema is closed: an unknown key is refused as damage rather than ignored, so that a field
misspelt by a hand edit or a tool never passes for absent. Only a finding's own data (what each
check measured) is open.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WrapValidator,
    model_validator,
)

from sglfix.common.errors import ConfigError
from sglfix.common.schema import ClosedModel, model_in, nearest, show
from sglfix.common.verdicts import MARKS
from sglfix.report.jsonreport import SCHEMA
from sglfix.report.outcome import BASELINE, Meaning

__all__ = [
    "MIXED",
    "Cell",
    "Damaged",
    "Report",
    "cell_label",
    "check_report",
    "dotted",
    "model_at",
    "model_keys",
    "problem_words",
    "value_at",
]

# What ``report merge`` writes for a field its inputs disagree on (sglfix.report.merge.MIXED).
MIXED = "mixed"


class Damaged(ValueError):
    """A validator's own words for a bad value.

    ``text`` follows the field and its value (``"shard" is '0/2', <text>``); with ``whole`` it
    is everything after the file or the cell (``cell 3 (s) <text>``), for wording that names the
    field itself."""

    def __init__(self, text: str, *, whole: bool = False) -> None:
        super().__init__(text)
        self.text, self.whole = text, whole


def cell_label(toggles: list[str], scenario: str) -> str:
    """A cell's id: ``<toggle set>::<scenario>``, ``baseline`` for no toggle."""
    return f"{','.join(toggles) or BASELINE}::{scenario}"


def _is_duration(value: Any) -> bool:
    # JSON written by Python may hold NaN or Infinity: neither is a time.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _duration(value: Any) -> Any:
    if _is_duration(value):
        return value
    raise Damaged("not a duration in seconds (finite, at least 0)")


def _shard(value: Any) -> Any:
    i, sep, n = value.partition("/") if isinstance(value, str) else ("", "", "")
    if sep and i.isascii() and i.isdigit() and n.isascii() and n.isdigit() and 1 <= int(i) <= int(n):
        return value
    raise Damaged("not I/N with 1 <= I <= N")


def _or_mixed(value: Any, handler: Any) -> Any:
    return value if value == MIXED else handler(value)


Count = Annotated[int, Field(ge=0)]
Duration = Annotated[float, BeforeValidator(_duration)]
if TYPE_CHECKING:
    # Literals built from the vocabularies at run time, where pydantic checks them; a checker
    # cannot read a computed Literal and sees text.
    Verdict = str
    MeaningName = str
else:
    Verdict = Literal[MARKS]
    MeaningName = Literal[tuple(m.value for m in Meaning)]
Verdicts = Annotated[list[Verdict], Field(min_length=1)]
Device = Literal["any", "cpu", "cuda"]
ToggleIds = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
Shard = Annotated[str, BeforeValidator(_shard)]


# --- a cell --------------------------------------------------------------------------------------


class Finding(BaseModel):
    """A verdict and its message; the rest is what the check measured, different for each check."""

    model_config = ConfigDict(extra="allow", strict=True)

    verdict: Verdict
    message: str = ""


class Comparison(ClosedModel):
    """The output against the reference (sglfix.harness.reference.Comparison); NaN and infinite
    errors are results, not damage."""

    max_abs_err: float
    max_rel_err: float
    bad_rows: Count
    rows: Count
    bad_fraction: float
    first_bad_request: int | None
    first_bad_row: int | None
    nonfinite: Count
    bad_at: str = ""  # the bad rows as ranges ("0-2,5"); absent from reports before it was kept


class Kernels(ClosedModel):
    """Interpreted kernel launches of the cell and how many the launch memo answered."""

    launches: Count
    hits: Count


def _scenario(value: Any) -> Any:
    if isinstance(value, str) and value:
        return value
    raise Damaged('has no "scenario" name', whole=True)


def _toggles(value: Any) -> Any:
    if isinstance(value, list) and all(isinstance(t, str) and t for t in value):
        return value
    raise Damaged('has no "toggles" list of toggle ids', whole=True)


def _timings(value: Any) -> Any:
    if value is None:
        return value
    if isinstance(value, dict):
        bad = next((v for v in value.values() if v is not None and not _is_duration(v)), None)
        if bad is None:
            return value
    else:
        bad = value
    raise Damaged(f'has "timings_ms" that are not durations (finite, at least 0): {show(bad)}', whole=True)


class Fingerprint(ClosedModel):
    """Digests of the metadata a cell built and of its output (sglfix.harness.fingerprint)."""

    metadata: str | None = None  # None: nothing was built (the cell failed first, or a probe)
    output: str | None = None
    views: int = 0
    # Metadata fields no kernel of the cell read (field -> why), left out of ``metadata``.
    unread: dict[str, str] | None = None


class Cell(ClosedModel):
    """One cell: a toggle set on a scenario, its verdict and findings, and (schema 2, judged)
    what the verdict means. The fields that identify it are checked first, in the words that
    name them."""

    id: str | None = None
    scenario: Annotated[str, BeforeValidator(_scenario)] = Field(None, validate_default=True)
    toggles: Annotated[list[str], BeforeValidator(_toggles)] = Field(None, validate_default=True)
    device: str | None = None
    verdict: Verdict = Field(None, validate_default=True)
    findings: list[Finding] = []
    error: Comparison | None = None
    timings_ms: Annotated[dict[str, float | None] | None, BeforeValidator(_timings)] = None
    revert_env: str | None = None
    kernels: Kernels | None = None
    reached: list[str] | None = None
    reached_at: dict[str, str] | None = None
    # Served by the result store: when the run that made it ran (absent: it ran in this run).
    stored: str | None = None
    # What the cell built and wrote, as digests (sglfix mutate; absent unless asked for).
    fingerprint: Fingerprint | None = None
    meaning: MeaningName | None = None
    why: str | None = None

    @model_validator(mode="after")
    def _id_is_its_key(self) -> Cell:
        made = cell_label(self.toggles, self.scenario)
        if self.id is not None and self.id != made:
            raise Damaged(f"has id {self.id!r} but its toggles and scenario make {made!r}", whole=True)
        return self


# --- the judgement's keys ------------------------------------------------------------------------


class ExpectRow(ClosedModel):
    """An ``expect:`` row of a toggle file: what the judgement reads again from a saved report."""

    toggle: str | None = None
    revert: ToggleIds
    scenario: str
    wanted: Verdicts
    device: Device = "any"


class Check(ExpectRow):
    """An expectation judged over the cells that ran."""

    met: bool = True
    got: dict[str, Verdict]


class NotChecked(ExpectRow):
    reason: str


class Stray(ClosedModel):
    """A cell whose verdict nothing explains."""

    toggles: list[str]
    scenario: str
    verdict: Verdict
    why: str


class KnownSeen(ClosedModel):
    """A profile's known divergence and the baseline cells that showed it (``status`` since the
    judgement has a home)."""

    scenario: str
    verdict: Verdicts
    reason: str = ""
    reproduce: str = ""
    device: Device = "any"
    seen_on: list[str] = []
    status: str | None = None
    cleared_by: str = ""


class FixCheckRow(ClosedModel):
    """One --expect-fixes pattern and whether the candidate fix cleared it."""

    pattern: str
    met: bool
    checked: bool
    why: str
    fixed: list[str] = []


class Judged(ClosedModel):
    mode: Literal["gate", "findings"]
    baseline: list[str]
    passed: bool
    exit_code: int
    outcome: str
    counts: dict[MeaningName, Count]
    # --apply: the candidate fixes' ids, what they must clear, and what they did.
    fixes: list[str] = []
    expect_fixes: list[str] = []
    fix_checks: list[FixCheckRow] = []
    fix_summary: str = ""


class CandidateRow(ClosedModel):
    """A candidate fix a run applied (sglfix.toggling.candidate)."""

    id: str
    path: str
    sha256: str
    title: str
    url: str = ""
    functions: list[str]
    notes: list[str] = []


class Conflict(ClosedModel):
    set: str
    why: str


class Applied(ClosedModel):
    """What --apply gave: the candidate fixes, the scenarios they must clear, and the sets whose
    fix and reverts change the same lines (not built)."""

    candidates: list[CandidateRow]
    over: list[str] = []
    expect_fixes: list[str] = []
    conflicts: list[Conflict] = []


# --- what ran where ------------------------------------------------------------------------------


class Codebase(ClosedModel):
    """The code the cells replayed through (a worker's boot, sglfix.execution.serve)."""

    name: str
    distribution: str | None = None
    version: str | None = None
    path: str | None = None
    standins: list[str] = []
    modules_loaded: Count | None = None
    reproduction_modules_loaded: Count | None = None
    # Chosen by following what is installed (--profile sglang): the name asked for, and the
    # installed version beyond the profile's range it was stretched to (None: covered).
    followed: str | None = None
    beyond_range: str | None = None
    release: str | None = None  # fetched as --release VERSION into sglfix's cache (None: as installed)


class SglfixSource(ClosedModel):
    """The sglfix that wrote the report (sglfix.common.version.source): its version, the git
    commit of its source (None: not known), how many of its shipped files differed from that
    commit, and a public address of its repository (None: none recorded)."""

    version: str
    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")] | None = None
    modified: Count | None = None
    url: str | None = None


class Drifted(ClosedModel):
    """A revert that no longer applies to the code followed beyond its profile's range."""

    id: str
    why: str


class Kept(ClosedModel):
    """Kept Ray actors a run took warm and started (sglfix.execution.ray_keep)."""

    keep_s: float = Field(gt=0, allow_inf_nan=False)
    identity: str
    reused: Count
    started: Count
    declined: dict[str, Count]
    evicted: Count


class Executor(ClosedModel):
    name: Literal["local", "ray"]
    kept: Kept | None = None
    mps: bool = False  # the local workers shared their GPUs through an MPS daemon


class KernelMemo(ClosedModel):
    """Interpreted launches and memo hits over a CPU run."""

    memo: bool
    launches: Count
    hits: Count


class Shards(ClosedModel):
    """Which shards a merged report joined (sglfix.report.merge)."""

    count: Count
    given: list[int]
    missing: list[int]
    repeated: list[int]
    problems: list[str]
    partial_allowed: bool
    # Shards that record no plan (written before reports did): not checked to be of one plan.
    no_plan: list[str] = []


class PlanIdentity(ClosedModel):
    """What makes a run's plan this plan (sglfix.execution.shards.plan_identity): what chose its
    cells and what they mean. ``report merge`` joins only shards whose plans agree, field by field
    (sglfix.report.merge.PLAN_OPTIONS names each as the command line does)."""

    command: Literal["run", "matrix", "bisect"]
    profile: str
    release: str | None = None  # the --release the code base was fetched as
    codebase: str | None = None  # "distribution version"
    toggles: str  # the toggle files (and variants), by name and content
    scenario: list[str] = []
    scenario_file: list[str] = []  # "name@digest"
    backend: str | None = None
    memory_budget: str | None = None
    parts: bool = False
    revert: list[str] = []  # run's -r; bisect's candidates
    no_reachability: bool = False
    env_baseline: bool = False
    reach_file: list[str] = []  # the functions each cell records
    apply: list[str] = []  # "id@digest" of each candidate fix
    expect_fixes: list[str] = []
    shard_costs: str | None = None  # the timings that dealt the shards, by content
    cells: str  # "N cells, digest": the whole plan's cell ids, before any shard took its part


class MergedFrom(ClosedModel):
    """One input of a merged report, as ``sglfix.report.load.describe`` records it."""

    file: str
    schema_: int | None = Field(None, alias="schema")
    date: str | None = None
    command: str | None = None
    device: str | None = None
    device_name: str | None = None
    wall_s: Duration | None = None
    cells: Count | None = None
    summary: dict[Verdict, Count] = {}
    host: str | None = None


class StoreUse(ClosedModel):
    """The result store a run read: its folder, the cells it served and the cells that ran (and,
    with --verify-store, how many served cells were run again and found the same)."""

    path: str
    served: Count
    ran: Count
    verified: Count | None = None
    failed: str | None = None


class Report(ClosedModel):
    """A run's, a matrix's or a merge's report. Only ``tool`` and ``cells`` are required:
    schema 1 and hand-made reports leave the rest out."""

    tool: Literal["sglfix"]
    schema_: int = Field(1, alias="schema", ge=1, le=SCHEMA)
    date: str | None = None
    command: str | None = None
    device: str | None = None
    device_name: str | None = None
    host: str | None = None
    python: str | None = None
    torch: str | None = None
    triton: str | None = None
    flashinfer: str | None = None
    sglfix: str | None = None
    # The exact sglfix: its version and commit (absent from reports written before it was recorded).
    sglfix_source: Annotated[SglfixSource | None, WrapValidator(_or_mixed)] = None
    env_revert: str | None = None
    # A merge of reports whose code bases differ only in where they were installed says so.
    codebase: Annotated[Codebase | None, WrapValidator(_or_mixed)] = None
    wall_s: Duration | None = None
    workers: Count | None = None
    # The first worker's boot (the engine's imports, the device): the time before any cell could
    # start, which ``wall_s`` leaves out.
    boot_s: Duration | None = None
    executor: Executor | None = None
    kernel_memo: KernelMemo | None = None
    cells: list[Cell]
    summary: dict[Verdict, Count] = {}
    expectations: list[Check] = []
    stray: list[Stray] = []
    not_run: list[str] = []
    known_divergences: list[KnownSeen] = []
    worker_replacements: list[str] = []
    # Cells whose first result may have been the other workers' doing (out of the memory they
    # held, a GPU context lost under MPS), run again alone: which, why, and what alone gave.
    reran_alone: list[str] = []
    drifted: list[Drifted] = []
    # Reverts with no variant at the engine version run (the release predates the fix): left out.
    not_applicable: list[Drifted] = []
    shard: Shard | None = None
    # The plan the cells are of (absent from reports written before it was recorded, and from a
    # merge of reports of different plans).
    plan: PlanIdentity | None = None
    shards: Shards | None = None
    store: StoreUse | None = None
    merged_from: list[MergedFrom] = []
    judged: Judged | None = None
    apply: Applied | None = None
    expect: list[ExpectRow] = []
    not_checked: list[NotChecked] = []

    @model_validator(mode="after")
    def _each_cell_once(self) -> Report:
        seen: dict[str, int] = {}
        for i, cell in enumerate(self.cells):
            key = cell_label(cell.toggles, cell.scenario)
            if key in seen:
                raise Damaged(
                    f"cell {key} appears twice (cells {seen[key]} and {i}); a report holds each cell once", whole=True
                )
            seen[key] = i
        return self


# --- one line per damaged report -----------------------------------------------------------------


def check_report(data: Any, *, where: str, fix: str) -> Report:
    """``data`` as a ``Report``; else a one-line ConfigError: ``where: "<field>" is <value>,
    <what is wrong>; the file is damaged: <fix>`` (``cell N (scenario) has <field> ...`` for a cell's)."""
    try:
        return Report.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_explain(exc, data)}; the file is damaged: {fix}") from None


_PROBLEMS = {
    "string_type": "not text",
    "list_type": "not a list",
    "dict_type": "not an object",
    "model_type": "not an object",
    "model_attributes_type": "not an object",
    "bool_type": "not true or false",
    "int_type": "not a whole number",
    "float_type": "not a number",
    "finite_number": "not a finite number",
    "too_short": "empty",
}
_BOUNDS = {
    "greater_than_equal": ("below", "ge"),
    "greater_than": ("not above", "gt"),
    "less_than_equal": ("above", "le"),
}


def problem_words(err: Mapping[str, Any], value: Any) -> str:
    """What is wrong with ``value``, in words, as one pydantic error (``err``) of it says."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _PROBLEMS:
        return _PROBLEMS[kind]
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        hint = nearest(str(value), choices) if isinstance(value, str) else ""
        return f"not one of {', '.join(choices)}{hint}"
    if kind in _BOUNDS:
        word, key = _BOUNDS[kind]
        return f"{word} {ctx.get(key)}"
    return str(err["msg"]).removeprefix("Value error, ")


def value_at(data: Any, loc: tuple) -> Any:
    """The value at ``loc`` in ``data`` (None where there is none)."""
    node = data
    for key in loc:
        inside = (isinstance(node, dict) and key in node) or (
            isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)
        )
        if not inside:
            return None
        node = node[key]
    return node


def dotted(loc: tuple) -> str:
    """A pydantic error's location as the field's path: ``mutants[3].line``."""
    out = ""
    for key in loc:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def _explain(exc: ValidationError, data: Any) -> str:
    """The first error as words: the field's path (under ``cell N (scenario)`` for a cell's),
    its value, what is wrong with it."""
    errors = exc.errors(include_url=False)
    err = errors[0]
    # A misspelt key shows as the key missing and an unknown one beside it: the unknown one says why.
    err = next((e for e in errors if e["type"] == "extra_forbidden" and e["loc"][:-1] == err["loc"][:-1]), err)
    loc = tuple(err["loc"])
    model: type[BaseModel] = Report
    cell, node = None, data
    if len(loc) >= 2 and loc[0] == "cells" and isinstance(loc[1], int):
        node = value_at(data, loc[:2])
        scenario = node.get("scenario") if isinstance(node, dict) else None
        cell = f"cell {loc[1]}" + (f" ({scenario})" if isinstance(scenario, str) and scenario else "")
        loc, model = loc[2:], Cell
    value = value_at(node, loc)
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, Damaged) and cause.whole:
        return f"{cell} {cause.text}" if cell else cause.text
    if cell is not None and not loc:
        return f"{cell} is {show(value)}, not an object"
    field = dotted(loc)
    if err["type"] == "missing":
        return f"{cell} has no {field}" if cell else f'"{field}" is missing'
    if err["type"] == "extra_forbidden":
        owner, key = dotted(loc[:-1]), str(loc[-1])
        holder = model_at(model, loc[:-1])
        hint = nearest(key, model_keys(holder)) if holder else ""
        if cell:
            return f"{cell} has an unknown key {key!r}" + (f" in {owner}" if owner else "") + hint
        return f'"{owner}" has an unknown key {key!r}{hint}' if owner else f"an unknown key {key!r} at the top{hint}"
    problem = cause.text if isinstance(cause, Damaged) else problem_words(err, value)
    if loc and loc[-1] == "[key]":
        field, key = dotted(loc[:-2]), show(loc[-2])
        return (
            f"{cell} has {field} with the key {key}, {problem}" if cell else f'"{field}" has the key {key}, {problem}'
        )
    return f"{cell} has {field} {show(value)}, {problem}" if cell else f'"{field}" is {show(value)}, {problem}'


def model_keys(model: type[BaseModel]) -> list[str]:
    """The keys ``model`` accepts (a field's alias where it has one)."""
    return [info.alias or name for name, info in model.model_fields.items()]


def model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model whose keys are allowed at ``loc`` below ``model`` (None where no model is)."""
    for key in loc:
        if isinstance(key, int):
            continue
        info = next((f for name, f in model.model_fields.items() if (f.alias or name) == key), None)
        found = model_in(info.annotation) if info is not None else None
        if found is None:
            return None
        model = found
    return model
