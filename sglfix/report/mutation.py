"""What a mutation campaign (``sglfix mutate``) found, decided once: each mutant's status from the
one judgement of its cells (``sglfix.report.outcome``), the scores, the ``--fail-under`` gate,
and the JSON report's schema. Rendering is ``sglfix.report.mutation_render``'s.

A mutant runs as a candidate fix (``+m-...``) over the cells whose baseline entered its function,
and each of its cells is judged against the same scenario's baseline cell
(``Rules.fix_meaning``). Its status, by precedence:

- ``killed``: some cell's verdict moved (BROKEN, CHANGED or FIXED) to a verdict of the code (FAULT
  included: the worker died of the change), against a baseline that ran to one; a failure of
  the baseline's verdict on other rows, or with a check more or less, is CHANGED
  (``outcome.fails_otherwise``);
- ``error``: no kill, and some cell is ERROR (its own, or its baseline's): sglfix failed, so what
  that cell would have said is unknown. Shown before ``timeout``: it is sglfix's failure to fix;
- ``timeout``: no kill, and some cell (or its baseline) ran out of time;
- ``not-reached``: no cell ran (none selected enters the function, or every one SKIPs here);
- ``equivalent`` (suspected): no cell moved, and every cell that ran built metadata whose digest
  (``fingerprint.metadata``) equals its baseline's, with no output digest differing: the change
  built nothing different, shown apart with that evidence. Without fingerprints on both sides of
  every cell it cannot be shown, and the mutant is a survivor. Also equivalent (by schedule, with
  the fields as evidence): every difference of every cell in fields the adapter declares to
  choose only how the kernels split the work (``MetadataFields.schedule``: a split-K count, a
  grid bound) and in the output's rounding, no verdict moved;
- ``survived``: it ran, no verdict moved, and it was not shown equivalent.

Timeouts and errors are never kills. The score is killed / (killed + survived): not-reached,
equivalent, timeout and error mutants are counted apart, never in its denominator.
"""

from __future__ import annotations

import datetime
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, Protocol

from pydantic import ConfigDict, Field, ValidationError, model_validator

from sglfix.common.errors import ConfigError
from sglfix.common.schema import ClosedModel, nearest, show
from sglfix.report.meaning import FIX_PREFIX, CellMeaning, Meaning
from sglfix.report.schema import (
    Codebase,
    Count,
    Damaged,
    Duration,
    SglfixSource,
    StoreUse,
    dotted,
    model_at,
    model_keys,
    problem_words,
    value_at,
)

__all__ = [
    "COMMON",
    "FAMILIES",
    "ORDER",
    "SCHEMA",
    "TOOL",
    "Classified",
    "MutantResult",
    "MutationReport",
    "ScenarioRun",
    "Status",
    "build_mutation_report",
    "check_fail_under",
    "check_mutation_report",
    "classify",
    "classify_report",
    "fail_under",
    "family_of",
    "hint",
    "load_mutation_report",
    "mode_of",
    "scores_of",
]

TOOL = "sglfix mutate"
# The mutation report's format version (its own line of versions, apart from a run's report).
SCHEMA = 1


class Status(StrEnum):
    KILLED = "killed"
    SURVIVED = "survived"
    EQUIVALENT = "equivalent"  # suspected: the built metadata identical in every cell that ran
    NOT_REACHED = "not-reached"
    TIMEOUT = "timeout"
    ERROR = "error"


# The order every list and table shows them in: what asks for work first.
ORDER = (Status.SURVIVED, Status.NOT_REACHED, Status.ERROR, Status.TIMEOUT, Status.EQUIVALENT, Status.KILLED)

# A cell's meaning when its verdict moved against its baseline's.
_MOVED = (Meaning.BROKEN, Meaning.CHANGED, Meaning.FIXED)
# Verdicts that say nothing of the mutant's effect: sglfix failed, or time ran out. FAULT is not
# here: a worker that dies of the change is the change seen.
_NO_VERDICT = {"ERROR": Status.ERROR, "TIMEOUT": Status.TIMEOUT}
_NOT_RUN = ("SKIP", "NOT_REACHED")

# --- backend families and modes -------------------------------------------------------------------

COMMON = "common"
# A mutant's family is its file's module name in this table; any other file (the speculative
# input builders, forward_batch_info, memory pools, sizing, the kernels) serves every backend.
FAMILIES: dict[str, str] = {
    "triton_backend": "triton",
    "flashinfer_backend": "flashinfer",
    "flashinfer_mla_backend": "flashinfer_mla",
    "trtllm_mla_backend": "trtllm_mla",
    "deepseek_v4_backend": "deepseek_v4",
    "flashattention_backend": "fa3",
    "torch_native_backend": "torch_native",
    "flashmla_backend": "flashmla",
    "hybrid_linear_attn_backend": "hybrid_linear",
    "gdn_backend": "hybrid_linear",
}

# Words of a function's name and the scenario mode they serve, the first that matches wins
# (draft_extend before extend, draft_decode before decode). Prefill is FlashInfer's word for extend.
_MODE_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("verify", ("TARGET_VERIFY",)),
    ("draft_extend", ("DRAFT_EXTEND", "DRAFT_EXTEND_V2")),
    ("draft_decode", ("DRAFT_DECODE",)),
    ("decode", ("DECODE",)),
    ("extend", ("EXTEND",)),
    ("prefill", ("EXTEND",)),
)
_GRAPH_WORDS = ("capture", "replay", "cuda_graph", "out_graph", "in_graph")


def family_of(path: str) -> str:
    """The backend family of a file (``FAMILIES``; ``common`` for any other file)."""
    return FAMILIES.get(PurePosixPath(path.replace("\\", "/")).stem, COMMON)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def mode_of(function: str) -> tuple[tuple[str, ...], bool]:
    """The scenario modes a function's name says it serves (``()``: the name does not say) and
    whether it is CUDA-graph code (capture or replay). The method's name is read first, then its
    class's (``FlashInferIndicesUpdaterDecode.update``)."""
    parts = [_snake(p) for p in function.split(".")[-2:]][::-1]
    graph = any(w in parts[0] for w in _GRAPH_WORDS)
    for part in parts:
        for word, modes in _MODE_WORDS:
            if word in part:
                return modes, graph
    return (), graph


class Mutant(Protocol):
    """What is read of a ``sglfix.mutation.model.Mutant`` here (this package stands on
    ``sglfix.common`` alone, so it names the model's fields instead of importing it;
    ``MutantResult`` repeats them, and tests/report/test_mutation_report.py holds the two to one list)."""

    id: str
    function: str
    path: str
    line: int
    original: str
    mutated: str
    description: str

    def model_dump(self) -> dict[str, Any]: ...


# --- one mutant's status --------------------------------------------------------------------------


class ScenarioRun(NamedTuple):
    """A selected scenario as a hint reads it."""

    name: str
    backend: str | None  # None: a probe (no attention backend)
    mode: str
    cuda_graph: bool


@dataclass
class Classified:
    """One mutant's status and what shows it."""

    status: Status
    killed_by: list[dict] = field(default_factory=list)  # CellRef rows
    not_judged: list[dict] = field(default_factory=list)  # the TIMEOUT / ERROR cells, CellRef rows
    reached_by: list[str] = field(default_factory=list)  # scenarios whose cell ran
    skipped: list[str] = field(default_factory=list)  # scenarios whose cell SKIPs here
    cells: int = 0
    evidence: dict | None = None  # equivalent: {"cells": N, "outputs_identical": bool | None}
    output_changed: int = 0  # cells whose output digest differs from the baseline's, no verdict moved
    # A survivor: what it built differently from the baselines (``built_differently``), each with
    # the number of its cells where it did.
    built_different: dict[str, int] = field(default_factory=dict)


def _ref(cell: dict, meaning: CellMeaning | None, baseline: dict | None) -> dict:
    return {
        "cell": meaning.id if meaning is not None else str(cell.get("id") or cell.get("scenario")),
        "scenario": cell["scenario"],
        "verdict": str(cell.get("verdict")),
        "baseline": None if baseline is None else str(baseline.get("verdict")),
        "key_figure": meaning.key_figure if meaning is not None else "",
    }


def _digest(cell: dict | None, key: str) -> str | None:
    fp = (cell or {}).get("fingerprint")
    value = fp.get(key) if isinstance(fp, dict) else None
    return value if isinstance(value, str) and value else None


def built_same(cell: dict, baseline: dict | None) -> bool:
    """Whether ``cell`` built what its baseline built, by the digests (``fingerprint``): the same
    metadata digest (one there to compare) and no output digest that differs. A mutant whose every
    cell did is a suspected equivalent."""
    meta = _digest(cell, "metadata")
    out, was = _digest(cell, "output"), _digest(baseline, "output")
    return meta is not None and meta == _digest(baseline, "metadata") and not (out and was and out != was)


# What ``built_differently`` names where the digests say more than the fields do.
NO_DIGEST = "(no metadata digest)"
VIEWS = "(the views' phases or rows)"
OUTPUT = "(output)"


def built_differently(cell: dict, baseline: dict | None) -> list[str]:
    """What ``cell`` built that its baseline did not, by the fingerprints' per-field digests: the
    metadata fields (a probe's observed objects as ``observed:<label>``) whose digests differ,
    ``(output)`` when the output digests differ, ``(no metadata digest)`` when either side has
    none to compare, and ``(the views' phases or rows)`` when the metadata digests differ and no
    field does. Empty: it built the same (``built_same``)."""
    meta, was = _digest(cell, "metadata"), _digest(baseline, "metadata")
    out: list[str] = []
    if meta is None or was is None:
        out.append(NO_DIGEST)
    elif meta != was:
        mine, theirs = _field_digests(cell), _field_digests(baseline)
        named = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
        out.extend(named or [VIEWS])
    o, w = _digest(cell, "output"), _digest(baseline, "output")
    if o and w and o != w:
        out.append(OUTPUT)
    return out


def schedule_only(ran: Sequence[tuple[dict, dict | None]], diffs: Sequence[Sequence[str]]) -> list[str] | None:
    """The schedule fields a mutant changed, where those are all it changed in every cell that ran
    (``ran``: its cells with their baselines, no verdict moved; ``diffs``: each one's
    ``built_differently``): fields both sides' fingerprints declare to choose only how the kernels
    split the work (``MetadataFields.schedule``), and the output, whose bits a split of the sums in
    another order rounds otherwise. None: some cell built something else differently, or its
    output differs with no schedule change to explain it."""
    changed: set[str] = set()
    for (cell, base), named in zip(ran, diffs):
        diff = set(named)
        if not diff:
            continue
        declared = set(_declared_schedule(cell)) & set(_declared_schedule(base))
        if diff - declared - {OUTPUT} or not diff & declared:
            return None
        changed |= diff & declared
    return sorted(changed) if changed else None


def _declared_schedule(cell: dict | None) -> list[str]:
    fp = (cell or {}).get("fingerprint")
    names = fp.get("schedule") if isinstance(fp, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else []


def _field_digests(cell: dict | None) -> dict[str, str]:
    fp = (cell or {}).get("fingerprint")
    fields = fp.get("fields") if isinstance(fp, dict) else None
    return dict(fields) if isinstance(fields, dict) else {}


def classify(
    *,
    cells: Sequence[dict],
    meanings: Sequence[CellMeaning],
    baselines: Mapping[str, dict],
) -> Classified:
    """The status of one mutant from its cells (report dicts), their judged meanings (paired by
    scenario: a mutant has one cell per scenario) and the baseline cells by scenario. No cell:
    not reached. A cell without a baseline cell, or whose baseline SKIPs, cannot be compared: it
    counts as an ERROR."""
    by_scenario = {m.scenario: m for m in meanings}
    out = Classified(status=Status.NOT_REACHED, cells=len(cells))
    ran: list[tuple[dict, dict | None]] = []
    worst_unjudged: Status | None = None
    for cell in cells:
        scenario = cell["scenario"]
        meaning = by_scenario.get(scenario)
        base = baselines.get(scenario)
        verdict = cell.get("verdict")
        if verdict in _NOT_RUN:
            if verdict == "SKIP":
                out.skipped.append(scenario)
            continue
        out.reached_by.append(scenario)
        base_verdict = None if base is None else base.get("verdict")
        unjudged = (
            _NO_VERDICT.get(str(verdict))
            or _NO_VERDICT.get(str(base_verdict))
            or (Status.ERROR if base is None or meaning is None or base_verdict == "SKIP" else None)
        )
        if unjudged is not None:
            out.not_judged.append(_ref(cell, meaning, base))
            if worst_unjudged is not Status.ERROR:
                worst_unjudged = unjudged
            continue
        assert meaning is not None  # a cell without a meaning is not judged (above)
        if meaning.meaning in _MOVED:
            out.killed_by.append(_ref(cell, meaning, base))
        ran.append((cell, base))
    out.reached_by.sort()
    out.skipped.sort()
    if out.killed_by:
        out.status = Status.KILLED
    elif worst_unjudged is not None:
        out.status = worst_unjudged
    elif not ran:
        out.status = Status.NOT_REACHED
    else:
        out.status = Status.SURVIVED
        outputs = [(_digest(c, "output"), _digest(b, "output")) for c, b in ran]
        out.output_changed = sum(o is not None and w is not None and o != w for o, w in outputs)
        if all(built_same(c, b) for c, b in ran):
            identical = True if all(o is not None and o == w for o, w in outputs) else None
            out.status = Status.EQUIVALENT
            out.evidence = {"cells": len(ran), "outputs_identical": identical}
            return out
        diffs = [built_differently(c, b) for c, b in ran]
        schedule = schedule_only(ran, diffs)
        if schedule is not None:
            compared = all(o is not None and w is not None for o, w in outputs)
            identical = False if out.output_changed else True if compared else None
            out.status = Status.EQUIVALENT
            out.evidence = {"cells": len(ran), "outputs_identical": identical, "schedule": schedule}
        else:
            out.built_different = dict(Counter(name for named in diffs for name in named))
    return out


def apply_marks(
    classified: dict[str, Classified], *, mutants: Sequence[Mutant], marks: Mapping[str, Any], functions: Sequence[str]
) -> dict:
    """The reviewed equivalents (``sglfix.mutation.reviewed.Mark`` by id) over a campaign's
    statuses, in place: a marked survivor (or suspected equivalent) becomes equivalent with the
    reviewer's reason as its evidence; a marked mutant a cell killed stays killed, and the mark is
    contradicted; a mark of a function the campaign mutated whose mutant it did not make is
    stale. Marks of functions the campaign did not mutate say nothing here. Returns the
    ``Reviews`` fields but the file."""
    made = {m.id for m in mutants}
    mutated = set(functions)
    marked, contradicted, stale = 0, [], []
    for mid, mark in sorted(marks.items()):
        row = {"id": mid, "function": mark.function, "why": mark.why}
        if mid not in made:
            if mark.function in mutated:
                stale.append(row)
            continue
        c = classified.get(mid)
        if c is None:
            continue
        if c.status is Status.KILLED:
            contradicted.append({**row, "killed_by": [k["cell"] for k in c.killed_by]})
        elif c.status in (Status.SURVIVED, Status.EQUIVALENT):
            evidence = dict(c.evidence or {"cells": len(c.reached_by), "outputs_identical": None})
            c.status, c.evidence = Status.EQUIVALENT, {**evidence, "reviewed": mark.why}
            marked += 1
    return {"marked": marked, "contradicted": contradicted, "stale": stale}


def classify_report(*, report: dict, mutants: Sequence[Mutant], judgement: Any = None) -> dict[str, Classified]:
    """Every mutant's status from one report of baseline cells (no toggle) and mutant cells (toggle
    ``+<mutant id>``), judged here (``judge(mode="findings")`` with every mutant as a candidate fix)
    when ``judgement`` is not given. A mutant with no cell is not reached."""
    from sglfix.report.outcome import judge

    if judgement is None:
        fixes = [FIX_PREFIX + m.id for m in mutants]
        judgement = judge(report, mode="findings", fixes=fixes, expect_fixes=[])
    cells = report.get("cells") or ()
    baselines = {c["scenario"]: c for c in cells if not c.get("toggles")}
    own: dict[str, list[tuple[dict, CellMeaning]]] = {}
    for c, m in zip(cells, judgement.cells):
        for t in c.get("toggles") or ():
            if str(t).startswith(FIX_PREFIX):
                own.setdefault(str(t)[len(FIX_PREFIX) :], []).append((c, m))
    out = {}
    for m in mutants:
        pairs = own.get(m.id, [])
        out[m.id] = classify(cells=[c for c, _ in pairs], meanings=[j for _, j in pairs], baselines=baselines)
    return out


# --- the hint -------------------------------------------------------------------------------------

# Words of the changed line and the scenario property that makes them matter (the first few
# found are named), for a survivor's hint.
_DEPENDS = (
    ("page", "page size > 1"),
    ("topk", "topk > 1"),
    ("window", "a sliding window"),
    ("num_draft", "several draft tokens"),
    ("draft_token", "several draft tokens"),
    ("prefix", "requests with a cached prefix"),
    ("bs]", "padded rows (graph batch size > batch size)"),
    ("[:bs", "padded rows (graph batch size > batch size)"),
    ("raw_bs", "padded rows (graph batch size > batch size)"),
    ("num_tokens", "padded rows (graph batch size > batch size)"),
    ("kv_indptr", "requests of different lengths"),
    ("seq_lens", "requests of different lengths"),
    ("split", "a KV long enough to be split"),
)


def _short(function: str) -> str:
    return ".".join(function.split(".")[-2:])


def _modes_word(runs: Sequence[ScenarioRun]) -> str:
    modes = sorted({r.mode for r in runs})
    graph = {r.cuda_graph for r in runs}
    how = "eager and graph" if graph == {True, False} else "graph" if True in graph else "eager"
    return f"{', '.join(modes)}; {how}"


def hint(
    *,
    mutant: Mutant,
    status: Status | str,
    reached: Sequence[ScenarioRun],
    selected: Sequence[ScenarioRun],
    skipped: Sequence[str] = (),
    output_changed: int = 0,
    built_different: Mapping[str, int] | None = None,
) -> str:
    """One line for a survivor or a not-reached mutant: what scenario would reach or kill it.
    ``reached``: the selected scenarios whose cell ran it; ``selected``: every selected one;
    ``skipped``: the scenarios whose cell of it SKIPs here. Derived from the function's name (the
    mode it serves, graph code) and its file's family; other statuses get ''."""
    status = Status(status)
    family = family_of(mutant.path)
    modes, graph = mode_of(mutant.function)
    on = "" if family == COMMON else f" on {family}"
    if status is Status.SURVIVED:
        words = f"{mutant.original} {mutant.mutated}"
        wants = list(dict.fromkeys(w for key, w in _DEPENDS if key in words))[:3]
        if graph and reached and not any(r.cuda_graph for r in reached):
            wants.insert(0, "a CUDA graph")
        also = f", e.g. with {', '.join(wants)}" if wants else ""
        by = f"reached by {len(reached)} cell(s) ({_modes_word(reached)})" if reached else "reached"
        seen = (
            f"; its output changed in {output_changed} cell(s) yet no check failed: a tighter check would see it"
            if output_changed
            else ""
        )
        fields = {k: n for k, n in (built_different or {}).items() if k not in (OUTPUT, NO_DIGEST)}
        if fields:
            top = sorted(fields.items(), key=lambda kv: (-kv[1], kv[0]))[:4]
            named = ", ".join(f"{k} in {n}" for k, n in top) + (
                f" and {len(fields) - 4} more" if len(fields) > 4 else ""
            )
            seen += f"; it built {named} cell(s) differently, which nothing judged: judge what reads them, or show they are unread"
        return (
            f"{by}, none changed: a scenario whose output or metadata depends on this change "
            f"({mutant.description}) would see it{also}{seen}"
        )
    if status is not Status.NOT_REACHED:
        return ""
    if skipped:
        return f"its {len(skipped)} cell(s) SKIP here (e.g. {skipped[0]}): run them where they can run"
    pool = [r for r in selected if family == COMMON or r.backend == family]
    if not pool:
        return f"no selected scenario runs the {family} backend" if on else "no scenario is selected"
    graph_word = " under a CUDA graph" if graph else ""
    if modes:
        in_mode = [r for r in pool if r.mode in modes]
        if not in_mode:
            return f"no selected scenario runs {modes[0]}{on}"
        pool = in_mode
    if graph:
        under = [r for r in pool if r.cuda_graph]
        if not under:
            return f"no selected scenario runs {modes[0] if modes else 'any mode'}{on}{graph_word}"
        pool = under
    path = "a batch that takes its path (a layout, a model shape, a page size) would"
    if modes or on or graph:
        what = f"{modes[0] if modes else 'the ' + family + ' backend' if on else 'a mode'}{on if modes else ''}{graph_word}"
        return f"{len(pool)} selected scenario(s) run {what} (e.g. {pool[0].name}), yet none entered {_short(mutant.function)}: {path}"
    return f"none of the {len(pool)} selected scenario(s) entered {_short(mutant.function)}: {path}"


# --- the schema -----------------------------------------------------------------------------------

if TYPE_CHECKING:
    StatusName = str  # a Literal computed from Status, which a checker cannot read
else:
    StatusName = Literal[tuple(s.value for s in Status)]


class CellRef(ClosedModel):
    """A mutant's cell: its id, scenario, verdict and its baseline's, and the key figure."""

    cell: str
    scenario: str
    verdict: str
    baseline: str | None
    key_figure: str = ""


class Evidence(ClosedModel):
    """Why a mutant is a suspected equivalent: the cells whose built metadata was identical to
    their baseline's, and whether their outputs were too (None: outputs not fingerprinted)."""

    cells: Annotated[int, Field(ge=1)]
    outputs_identical: bool | None
    # Equivalent by schedule: the fields, declared to choose only how the kernels split the work,
    # that it changed (its outputs then differ by rounding at most, and no verdict moved).
    schedule: list[str] = []
    # Equivalent by review: why a person found that no input can tell it (the profile's
    # ``equivalent_mutants``, ``sglfix.mutation.reviewed``); the cells are those it survived.
    reviewed: str | None = None


class MutantResult(ClosedModel):
    """A mutant (every field of ``sglfix.mutation.model.Mutant``, as it names them) and what its
    cells said."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    id: str
    function: str
    path: str
    line: int
    end_line: int
    operator: str
    original: str
    mutated: str
    description: str
    diff: str

    family: str
    status: StatusName
    cells: Count
    # The selected cells whose baseline entered its function (None: not recorded); ``cells``
    # counts those it ran: a survivor or an equivalent is one over the cells it ran.
    reaching: Count | None = None
    reached_by: list[str] = []
    skipped: list[str] = []
    killed_by: list[CellRef] = []
    not_judged: list[CellRef] = []
    evidence: Evidence | None = None
    # A survivor: what it built differently from the baselines (metadata fields, ``(output)``, ...:
    # ``built_differently``) -> the number of its cells where it did.
    built_different: dict[str, Count] = {}
    hint: str = ""

    @model_validator(mode="after")
    def _status_shown(self) -> MutantResult:
        killed = self.status == Status.KILLED
        if killed != bool(self.killed_by):
            raise Damaged(
                f'mutant {self.id} is {self.status} with {len(self.killed_by)} "killed_by" cell(s); '
                "a killed mutant names the cells that killed it, no other does",
                whole=True,
            )
        if (self.status == Status.EQUIVALENT) != (self.evidence is not None):
            raise Damaged(
                f'mutant {self.id} is {self.status} {"without" if self.evidence is None else "with"} "evidence"; '
                "a suspected equivalent carries its evidence, no other mutant does",
                whole=True,
            )
        return self


class Score(ClosedModel):
    """Counts of each status, and killed / (killed + survived) as a fraction (None: neither)."""

    killed: Count = 0
    survived: Count = 0
    equivalent: Count = 0
    not_reached: Count = 0
    timeout: Count = 0
    error: Count = 0
    score: Annotated[float, Field(ge=0, le=1)] | None = None

    @model_validator(mode="after")
    def _score_is_its_counts(self) -> Score:
        judged = self.killed + self.survived
        want = self.killed / judged if judged else None
        if (want is None) != (self.score is None) or (
            want is not None and self.score is not None and not math.isclose(want, self.score)
        ):
            raise Damaged(f"its score is not its {self.killed} killed / ({self.killed} + {self.survived} survived)")
        return self


class Scores(ClosedModel):
    overall: Score
    families: dict[str, Score] = {}
    functions: dict[str, Score] = {}


class Selection(ClosedModel):
    """What chose the mutants, by the options' names: the scenario globs (``-s``), the
    ``--function`` patterns, the ``--operators``."""

    scenario: list[str] = []
    function: list[str] = []
    operators: list[str] = []


class Phases(ClosedModel):
    """Where the campaign's time and cells went."""

    baseline_s: Duration | None = None  # the baseline cells (with their reach and fingerprints)
    mutants_s: Duration | None = None  # the mutant cells
    baseline_cells: Count = 0
    mutant_cells: Count = 0  # planned: each mutant over the cells that reach its function
    ran: Count = 0  # mutant cells run in this campaign
    served: Count = 0  # mutant cells the result store served


class AppliedFix(ClosedModel):
    """A candidate fix (``--apply``) every cell of the campaign ran atop, baselines included."""

    id: str
    title: str | None = None
    sha256: str


class CatalogueEntry(ClosedModel):
    """One function of one toggle part against the generated mutants (the fields of
    ``sglfix.mutation.catalogue.CatalogueRow``, as it names them)."""

    toggle: str
    function: str
    match: Literal["exact", "close", "none"]
    mutant: str | None = None
    operator: str | None = None
    change: str
    at: str | None = None


class ReviewedMark(ClosedModel):
    """A mark of the profile's equivalent_mutants the campaign could not honour: killed (the
    cells that killed it) or stale (its function was mutated, the mutant no longer made)."""

    id: str
    function: str
    why: str
    killed_by: list[str] = []


class Reviews(ClosedModel):
    """The profile's reviewed equivalents in this campaign: the file (relative to the profile's
    folder), how many survivors it marked equivalent, the marks a kill contradicts and the stale."""

    file: str
    marked: Count = 0
    contradicted: list[ReviewedMark] = []
    stale: list[ReviewedMark] = []


class MutationReport(ClosedModel):
    """``sglfix mutate --json``: the campaign, every mutant (survivors first), the scores."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    tool: Literal["sglfix mutate"]
    schema_: Literal[1] = Field(alias="schema")
    date: str | None = None
    command: str
    sglfix_source: SglfixSource | None = None
    codebase: Codebase | None = None
    device: str | None = None
    device_name: str | None = None
    profile: str | None = None
    selection: Selection = Selection()
    wall_s: Duration
    phases: Phases = Phases()
    store: StoreUse | None = None
    mutants: list[MutantResult]
    scores: Scores
    catalogue: list[CatalogueEntry] = []
    # "i/N": the share of the campaign's mutants this report holds (absent: all, or merged).
    shard: str | None = None
    merged_from: list[str] = []  # the shards merged into this report
    notes: list[str] = []
    # The candidate fixes every cell ran atop: the code judged is the code base with them applied.
    applied: list[AppliedFix] = []
    # The profile's reviewed equivalents, where it has any (absent: none were read).
    reviews: Reviews | None = None

    @model_validator(mode="after")
    def _scores_are_the_mutants(self) -> MutationReport:
        seen: set[str] = set()
        for m in self.mutants:
            if m.id in seen:
                raise Damaged(f"mutant {m.id} appears twice; a report holds each mutant once", whole=True)
            seen.add(m.id)
        made = _scores([(m.status, m.family, m.function) for m in self.mutants])
        if made != self.scores.model_dump():
            raise Damaged('"scores" do not count the mutants listed: the file was edited or cut', whole=True)
        return self


# --- scores ---------------------------------------------------------------------------------------

_FIELD = {s: s.value.replace("-", "_") for s in Status}


def _score(statuses: Sequence[str]) -> dict:
    counts = dict.fromkeys(_FIELD.values(), 0)
    for s in statuses:
        counts[_FIELD[Status(s)]] += 1
    judged = counts["killed"] + counts["survived"]
    return {**counts, "score": counts["killed"] / judged if judged else None}


def _scores(rows: Sequence[tuple[str, str, str]]) -> dict:
    families: dict[str, list[str]] = {}
    functions: dict[str, list[str]] = {}
    for status, family, function in rows:
        families.setdefault(family, []).append(status)
        functions.setdefault(function, []).append(status)
    return {
        "overall": _score([r[0] for r in rows]),
        "families": {k: _score(v) for k, v in sorted(families.items())},
        "functions": {k: _score(v) for k, v in sorted(functions.items())},
    }


def scores_of(mutants: Sequence[dict]) -> dict:
    """The scores of mutant rows (``status``, ``family``, ``function``): overall, per family, per function."""
    return _scores([(m["status"], m["family"], m["function"]) for m in mutants])


# --- the report -----------------------------------------------------------------------------------


def _order(status: str) -> int:
    return ORDER.index(Status(status))


def build_mutation_report(
    *,
    facts: Mapping[str, Any],
    mutants: Sequence[Mutant],
    classified: Mapping[str, Classified],
    scenarios: Sequence[ScenarioRun] = (),
    hints: Mapping[str, str] | None = None,
    reaching: Mapping[str, int] | None = None,
) -> dict:
    """The mutation report as a dict, checked against ``MutationReport``. ``facts``: the campaign's
    own keys of the report (``command`` as text or words, ``wall_s``, and optionally ``date``,
    ``sglfix_source`` (default: this sglfix), ``codebase``, ``device``, ``device_name``,
    ``profile``, ``selection``, ``phases``, ``store``, ``catalogue``, ``notes``, ``applied``). A mutant missing
    from ``classified`` is not reached. Each survivor's and not-reached mutant's hint is made from
    ``scenarios`` (every selected scenario; those in its ``reached_by`` reached it) unless
    ``hints`` gives one. Mutants are listed survivors first (``ORDER``), then by file and line."""
    from sglfix.common.version import source

    runs = {r.name: r for r in scenarios}
    rows = []
    for m in mutants:
        c = classified.get(m.id) or Classified(status=Status.NOT_REACHED)
        said = (hints or {}).get(m.id)
        if said is None:
            reached = [runs[s] for s in c.reached_by if s in runs]
            said = hint(
                mutant=m,
                status=c.status,
                reached=reached,
                selected=scenarios,
                skipped=c.skipped,
                output_changed=c.output_changed,
                built_different=c.built_different,
            )
        rows.append(
            {
                **m.model_dump(),
                "family": family_of(m.path),
                "status": c.status.value,
                "cells": c.cells,
                "reaching": (reaching or {}).get(m.id),
                "reached_by": list(c.reached_by),
                "skipped": list(c.skipped),
                "killed_by": list(c.killed_by),
                "not_judged": list(c.not_judged),
                "evidence": c.evidence,
                "built_different": dict(sorted(c.built_different.items())),
                "hint": said,
            }
        )
    rows.sort(key=lambda r: (_order(r["status"]), r["path"], r["line"], r["id"]))
    command = facts.get("command")
    data = {
        "tool": TOOL,
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "sglfix_source": source(),
        **facts,
        "command": command if isinstance(command, str) or command is None else " ".join(command),
        "mutants": rows,
        "scores": scores_of(rows),
    }
    if isinstance(data.get("wall_s"), float):
        data["wall_s"] = round(data["wall_s"], 2)
    try:
        return MutationReport.model_validate(data).model_dump(mode="json", by_alias=True)
    except ValidationError as exc:  # a bug of the caller's, not a user's damaged file: say which field
        raise ValueError(f"mutation report: {_explain(exc, data)}") from None


_FIX = "give a report written by sglfix mutate --json"


def check_mutation_report(data: Any, *, where: str, fix: str = _FIX) -> MutationReport:
    """``data`` as a ``MutationReport``; else one line naming the field: ``where: <problem>; the
    file is damaged: <fix>``."""
    try:
        return MutationReport.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_explain(exc, data)}; the file is damaged: {fix}") from None


def load_mutation_report(path: str) -> dict:
    """The mutation report in ``path``, checked whole; ConfigError (one line naming the file) else."""
    from sglfix.report.load import read_json_report

    data = read_json_report(path, kind="mutation report", fix=_FIX)
    if not isinstance(data, dict) or data.get("tool") != TOOL:
        tool = data.get("tool") if isinstance(data, dict) else None
        was = f' ("tool" is {show(tool)})' if tool is not None else ""
        raise ConfigError(f'{path} is not a mutation report (no "tool": "{TOOL}" at the top){was}; {_FIX}')
    if data.get("schema") != SCHEMA:
        raise ConfigError(
            f'{path}: "schema" is {show(data.get("schema"))}; this sglfix reads mutation report schema {SCHEMA}; {_FIX}'
        )
    check_mutation_report(data, where=path)
    return data


def _explain(exc: ValidationError, data: Any) -> str:
    """The first error as words: the field's path (``mutants[3].line``), its value, what is wrong."""
    errors = exc.errors(include_url=False)
    err = errors[0]
    err = next((e for e in errors if e["type"] == "extra_forbidden" and e["loc"][:-1] == err["loc"][:-1]), err)
    loc = tuple(err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, Damaged) and cause.whole:
        return cause.text
    field_ = dotted(loc)
    if err["type"] == "missing":
        return f'"{field_}" is missing'
    if err["type"] == "extra_forbidden":
        owner, key = dotted(loc[:-1]), str(loc[-1])
        holder = model_at(MutationReport, loc[:-1])
        hint_ = nearest(key, model_keys(holder)) if holder else ""
        return f'"{owner}" has an unknown key {key!r}{hint_}' if owner else f"an unknown key {key!r} at the top{hint_}"
    value = value_at(data, loc)
    problem = cause.text if isinstance(cause, Damaged) else problem_words(err, value)
    return f'"{field_}" is {show(value)}, {problem}'


# --- the gate -------------------------------------------------------------------------------------


def check_fail_under(value: Any, *, option: str = "--fail-under") -> float | None:
    """A ``--fail-under`` value as a percentage from 0 to 100 (None: not given); else one line."""
    if value is None:
        return None
    try:
        number = float(str(value).strip().removesuffix("%")) if not isinstance(value, bool) else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or not 0 <= number <= 100:
        raise ConfigError(
            f"{option} {value}: not a mutation score from 0 to 100 (a percentage of the killed "
            f"among killed and survived); give e.g. {option} 80"
        )
    return number


def _pct(killed: int, judged: int, against: float) -> str:
    """killed/judged as a percentage, with as many decimals as it takes for the shown figure to
    sit on the same side of ``against`` as the exact one."""
    exact_under = killed * 100 < against * judged
    for places in range(1, 7):
        shown = math.floor(killed * 100 * 10**places / judged) / 10**places
        if (shown < against) == exact_under:
            return f"{shown:.{places}f}%"
    return f"{killed * 100 / judged}%"


def fail_under(report: Mapping[str, Any], score: float) -> tuple[bool, str]:
    """Whether the report's overall score meets ``score`` (a percentage), and one line saying so.
    The denominator is killed + survived; with none of either there is no score, and the gate fails."""
    overall = report["scores"]["overall"]
    killed, survived = int(overall["killed"]), int(overall["survived"])
    judged = killed + survived
    apart = [
        f"{overall[key]} {word}"
        for key, word in (
            ("not_reached", "not reached"),
            ("equivalent", "equivalent"),
            ("timeout", "timeout"),
            ("error", "error"),
        )
        if overall.get(key)
    ]
    aside = f" (not scored: {', '.join(apart)})" if apart else ""
    limit = f"--fail-under {score:g}"
    if not judged:
        return False, f"no mutant was killed or survived{aside}: no mutation score to hold to {limit}"
    ok = killed * 100 >= score * judged
    figure = f"mutation score {_pct(killed, judged, score)} ({killed} killed / {judged})"
    return ok, f"{figure} {'meets' if ok else 'is under'} {limit}{aside}"


# What names a code base; the rest of its record (stand-ins, modules loaded) is what one shard's
# workers saw, and a shard whose first worker reported late has none of it.
_CODEBASE_IDENTITY = ("name", "distribution", "version", "path", "release")


def _campaign_identity(key: str, value: Any) -> Any:
    if key == "codebase" and isinstance(value, Mapping):
        return {k: value.get(k) for k in _CODEBASE_IDENTITY}
    if key == "applied":
        return value or []  # a report from before --apply ran atop none
    return value


def _sglfix_commit(report: Mapping[str, Any]) -> str | None:
    """The short commit of the sglfix that wrote a report, None where it recorded none."""
    commit = (report.get("sglfix_source") or {}).get("commit")
    return commit[:10] if isinstance(commit, str) else None


def _shard_key(spec: str) -> tuple[int, int]:
    """Shards in the order of the first mutants they hold: 1/2 before 2/4 before 4/4."""
    i, n = (int(x) for x in spec.split("/"))
    return (i - 1, n)


def _check_cover(shards: Sequence[tuple[str, str]]) -> None:
    """Refuse shards (``(i/N, report name)``) that do not deal every mutant exactly once. A mutant
    falls to shard ``i/N`` when its id hashes to ``i - 1`` modulo ``N`` (``execution.mutate._share``),
    so over the least common multiple ``L`` of the counts, shard ``i/N`` holds the residues ``x`` with
    ``x % N == i - 1``."""
    parsed: list[tuple[int, int, str, str]] = []
    for spec, name in shards:
        index, count = spec.split("/")
        parsed.append((int(index), int(count), spec, name))
    lcm = math.lcm(*(n for _, n, _, _ in parsed))
    if lcm > 4096:
        counts = ", ".join(sorted({str(n) for _, n, _, _ in parsed}, key=int))
        raise ConfigError(f"shards of counts {counts} do not nest; merge shards of splits that divide each other")
    owner: dict[int, tuple[str, str]] = {}
    for i, n, spec, name in parsed:
        for x in range(i - 1, lcm, n):
            if x in owner:
                other_spec, other = owner[x]
                if other_spec == spec:
                    raise ConfigError(f"{name} and {other} are both shard {spec}; give each shard once")
                raise ConfigError(
                    f"{name} (shard {spec}) and {other} (shard {other_spec}) hold some mutants both; "
                    "give shards that do not overlap"
                )
            owner[x] = (spec, name)
    missing = [f"{x + 1}/{lcm}" for x in range(lcm) if x not in owner]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ConfigError(f"shard(s) {shown} missing; give shards that together cover every mutant")


def _merged_reviews(reports: Sequence[Mapping[str, Any]]) -> dict:
    """The shards' reviews as one: marks counted over every shard, each contradicted mark once,
    a mark stale only where no shard made its mutant (a shard makes its share of the mutants)."""
    given = [r["reviews"] for r in reports if r.get("reviews")]
    if not given:
        return {}
    made = {m["id"] for r in reports for m in r["mutants"]}
    contradicted = {m["id"]: m for g in given for m in g.get("contradicted") or ()}
    stale = {m["id"]: m for g in given for m in g.get("stale") or () if m["id"] not in made}
    return {
        "reviews": {
            "file": given[0]["file"],
            "marked": sum(g.get("marked", 0) for g in given),
            "contradicted": [contradicted[k] for k in sorted(contradicted)],
            "stale": [stale[k] for k in sorted(stale)],
        }
    }


def merge_mutation_reports(reports: Sequence[Mapping[str, Any]], *, names: Sequence[str]) -> dict:
    """The shards of one campaign as one report: every mutant once, the scores counted again, the
    phases and walls summed. Shards may be of different splits where they nest (a shard i/N is the
    union of shards i/2N and (i+N)/2N, so a shard too long for its machine can be run again as
    those two). Shards of different campaigns (another code base, device or selection), shards
    that overlap or leave mutants out, and shards another sglfix commit wrote, are refused in one
    line naming them."""
    if not reports:
        raise ConfigError("give the shards' reports to merge")
    first = reports[0]
    shards = []
    for name, r in zip(names, reports):
        for key in ("codebase", "device", "selection", "profile", "applied"):
            if _campaign_identity(key, r.get(key)) != _campaign_identity(key, first.get(key)):
                raise ConfigError(f"{name}: its {key} differs from {names[0]}'s; merge the shards of one campaign only")
        ours, theirs = _sglfix_commit(r), _sglfix_commit(first)
        if ours != theirs:
            # Another sglfix judges by other rules: its shards are another campaign's.
            raise ConfigError(
                f"{name}: written by sglfix {ours or 'of an unknown commit'}, {names[0]} by {theirs or 'an unknown commit'};"
                " merge the shards one sglfix commit wrote (run the others again at it)"
            )
        shard = r.get("shard")
        if shard is None:
            raise ConfigError(f"{name}: not a shard of a campaign (no shard recorded); give the --shard i/N reports")
        shards.append((shard, name))
    _check_cover(shards)
    mutants = [m for r in reports for m in r["mutants"]]
    mutants.sort(key=lambda r: (_order(r["status"]), r["path"], r["line"], r["id"]))
    phases: dict[str, Any] = {}
    for r in reports:
        for k, v in (r.get("phases") or {}).items():
            if v is not None:
                phases[k] = round(phases.get(k, 0) + v, 2) if isinstance(v, float) else phases.get(k, 0) + v
    data = {
        **{
            k: v
            for k, v in first.items()
            if k not in ("mutants", "scores", "shard", "phases", "wall_s", "notes", "reviews")
        },
        **_merged_reviews(reports),
        "wall_s": round(sum(r.get("wall_s", 0.0) for r in reports), 2),
        "phases": phases,
        "notes": list(dict.fromkeys(n for r in reports for n in r.get("notes") or ())),
        "mutants": mutants,
        "scores": scores_of(mutants),
        "merged_from": [s for s, _ in sorted(shards, key=lambda p: _shard_key(p[0]))],
    }
    check_mutation_report(data, where="the merged report")
    return data
