"""The bisect search on the runner: which reverted parts make which scenarios fail, and which mask
each other.

Scenarios are grouped by their base name (before ``@``); each group whose scenarios fail with a
candidate reverted is searched on its own (delta debugging, ``sglfix.execution.bisect``), on one
warm pool of the runner (local workers dealt over the GPUs, or Ray actors). A cell (toggle set x
scenario) is run at most once whatever group or question asks for it; ``runs`` counts the
distinct toggle sets executed. A culprit that is a whole PR with several parts narrows to the
parts; masking is looked for among a culprit's sibling parts and the other culprits of its group.
A shard (``--shard I/N``) searches whole groups, dealt by cost as the matrix deals scenarios.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglfix.report.bisect import TOOL, BisectReport, Culprit, FixComparison, FlatCulprit, Group, LeftOut, Masking, now
from sglfix.report.schema import PlanIdentity, StoreUse

if TYPE_CHECKING:
    from sglfix.execution.pool import Cell

# Progress of a search: silent for a quick one, then a line at most this often (every set: each).
QUIET_S = 5.0
EVERY_S = 15.0


class FailingBaseline(Exception):
    """The baseline fails some scenario: nothing can be bisected (the message says which)."""


def group_of(name: str) -> str:
    return name.split("@", 1)[0]


class CellCache:
    """Runs (set, scenario) cells through the pool on demand, each once."""

    def __init__(
        self, pool, scenarios, env: tuple[str, ...], *, say: Callable[[str], None], every_set: bool = False, clock=None
    ):
        from sglfix.execution.planner import PlannedCell

        self._pool, self._env, self._planned = pool, env, PlannedCell
        self.rank: dict[str, int] = {}  # candidate -> position: the order every set is applied in
        self.by_name = {s.name: s for s in scenarios}
        self.results: dict[tuple[tuple[str, ...], str], Any] = {}
        self.sets: set[tuple[str, ...]] = set()
        self.context = "baseline"  # what the progress lines say the search is busy with
        # A line per toggle set is a few hundred lines for a full search: by default one line at
        # most every EVERY_S seconds, after the first QUIET_S (``every_set``: each set).
        self._say, self._every_set, self._clock = say, every_set, clock or time.perf_counter
        self._start = self._clock()
        self._last: float | None = None

    def run(self, ids: tuple[str, ...], names: list[str], *, record: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The cells of ``ids`` reverted on ``names``; ``record``: also report which of these
        target functions each run enters (reachability)."""
        from sglfix.execution.reach import RecordingCell

        ids = tuple(sorted(dict.fromkeys(ids), key=lambda c: (self.rank.get(c, len(self.rank)), c)))
        toggles = tuple(self._env) + ids  # one order per set: (a, b) and (b, a) run once
        todo = [n for n in names if (toggles, n) not in self.results]
        if todo:
            self.sets.add(ids)
            self._progress(ids, len(todo))
            cells: list[Cell]
            if record is None:
                cells = [self._planned(self.by_name[n], toggles) for n in todo]
            else:
                cells = [RecordingCell(self.by_name[n], toggles, record) for n in todo]
            for cell, result in zip(cells, self._pool.run(cells)):
                self.results[(toggles, cell.scenario.name)] = result
        return {n: self.results[(toggles, n)] for n in names}

    def _progress(self, ids: tuple[str, ...], todo: int) -> None:
        now = self._clock()
        if not self._every_set:
            if now - self._start < QUIET_S or (self._last is not None and now - self._last < EVERY_S):
                return
            self._last = now
            self._say(
                f"bisect [{self.context}]: {len(self.sets)} toggle set(s), {len(self.results)} cell(s) run, "
                f"{now - self._start:.0f} s"
            )
            return
        shown = ",".join(ids[:4]) + (f",... ({len(ids)} parts)" if len(ids) > 4 else "") if ids else "nothing"
        self._say(f"bisect [{self.context}]: {todo} cell(s) with {shown} reverted")


def _store_use(pool: Any, *, cells: int) -> dict | None:
    """What the result store did for a search (None: it was off)."""
    store = getattr(pool, "store", None)
    if store is None:
        return None
    served = pool.served
    return {
        "path": store.directory,
        "served": served,
        "ran": cells - served,
        **({"failed": store.failed} if store.failed else {}),
    }


def shard_groups(chosen: Sequence[Any], shard: Any, *, timings: dict[str, float] | None = None) -> list[Any]:
    """The scenarios of the groups ``shard`` searches: whole groups, dealt by cost as the matrix
    deals scenarios (a baseline cell's timing in an earlier report, else its size estimate)."""
    from sglfix.execution.planner import Plan
    from sglfix.execution.shards import deal, scenario_loads

    if shard is None or shard.count == 1:
        return list(chosen)
    load: dict[str, float] = {}
    for name, cost in scenario_loads(Plan(scenarios=list(chosen), sets=[()]), timings=timings).items():
        load[group_of(name)] = load.get(group_of(name), 0.0) + cost
    mine = deal(load, shard)
    return [s for s in chosen if group_of(s.name) in mine]


@dataclass
class Found:
    """What the search found, and what the report counts."""

    groups: list[Group] = field(default_factory=list)
    masking: list[Masking] = field(default_factory=list)
    masking_sets: set = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    known_base: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    replacements: list[str] = field(default_factory=list)
    cells: CellCache | None = None
    record: tuple[str, ...] | None = None
    # The result store, if the search read it: its folder, cells served from it, cells run.
    store: dict | None = None


class Search:
    """One bisect over ``chosen`` for ``candidates`` on ``runner``'s workers."""

    def __init__(
        self, runner: Any, *, candidates: list[str], rules: Any, reachability: bool, base: Sequence[str] | None = None
    ) -> None:
        from sglfix.execution.reach import targets_of
        from sglfix.toggling.ids import ToggleId

        self.runner, self.candidates, self.rules = runner, candidates, rules
        # What every set holds: the environment's reverts, after the candidate fixes (--apply).
        self.base = tuple(runner.env if base is None else base)
        registry = runner.target.registry
        self._toggle = lambda rid: registry.toggles[ToggleId.parse(rid).pr]
        self.targets = {c: targets_of([c], registry=registry) for c in candidates}
        self.record = tuple(sorted(set().union(*self.targets.values()))) if reachability else None

    def parts_of(self, rid: str) -> list[str]:
        toggle = self._toggle(rid)
        return toggle.ids[1:] if ":" not in rid and len(toggle.parts) > 1 else []

    def siblings(self, rid: str) -> list[str]:
        return [i for i in self._toggle(rid).ids[1:] if i != rid] if ":" in rid else []

    def run(self, chosen: Sequence[Any], *, say: Callable[[str], None], every_set: bool = False) -> Found:
        """The search; ``FailingBaseline`` when the baseline fails a scenario (judged as
        everywhere: a known divergence or a SKIP is left out, not a failure)."""
        from sglfix.report.outcome import Meaning

        found = Found(record=self.record)
        with self.runner.pool() as pool:
            found.info = dict(pool.info)  # the workers' handshake before any progress line
            cells = CellCache(pool, chosen, self.base, say=say, every_set=every_set)
            cells.rank = {c: i for i, c in enumerate(self.candidates)}
            found.cells = cells
            names = [s.name for s in chosen]
            self.baseline = cells.run((), names, record=self.record)
            self.base_json = {n: r.to_json() for n, r in self.baseline.items()}
            judged = {n: self.rules.meaning(self.base_json[n], None) for n in names}
            found.skipped = [n for n in names if judged[n][0] is Meaning.SKIPPED]
            found.known_base = [n for n in names if judged[n][0] is Meaning.KNOWN]
            bad = {n: self.baseline[n] for n in names if judged[n][0].fails}
            if bad:
                raise FailingBaseline(self._failing_baseline(bad))
            names = [n for n in names if n not in found.skipped]
            groups: dict[str, list[str]] = {}
            for n in names:
                groups.setdefault(group_of(n), []).append(n)
            for number, (group, members) in enumerate(groups.items(), 1):
                cells.context = f"group {number}/{len(groups)} {group}"
                found.groups.append(self._group(cells, group, members, found, label=cells.context))
            found.replacements = list(getattr(pool, "replacements", []))
            found.info = dict(pool.info)  # through the store: the workers', if any started
        found.store = _store_use(pool, cells=len(cells.results))  # its writes done
        found.groups = [g for g in found.groups if g.culprits or g.unreachable]
        return found

    def _failing_baseline(self, bad: dict) -> str:
        from sglfix.report.outcome import ENV_VAR

        first = next(iter(bad.values()))
        from sglfix.toggling.candidate import split_ids

        fixes, env = split_ids(self.base)
        what = f"{ENV_VAR}={','.join(env)}" if env else "nothing reverted"
        if fixes:
            what += f", {','.join(fixes)} applied"
        return (
            f"the baseline ({what}) fails {len(bad)} scenario(s), e.g. "
            f"{first.scenario}: {first.verdict} {first.key_figure}; bisect needs a passing baseline"
        )

    def failing(self, results: dict) -> list[str]:
        """The scenarios whose cell fails, as the judgement means it (never a known divergence,
        never the baseline's own verdict)."""
        return sorted(n for n, r in results.items() if self.rules.meaning(r.to_json(), self.base_json.get(n))[0].fails)

    def _group(self, cells: CellCache, group: str, members: list[str], found: Found, *, label: str) -> Group:
        from sglfix.execution.bisect import Oracle, find_culprits

        asked: set[frozenset] = set()  # the distinct sets this group's search asks about

        def fails(ids) -> bool:
            asked.add(frozenset(ids))
            return bool(self.failing(cells.run(tuple(ids), members)))

        # Candidates none of whose functions the group's baselines enter cannot change its cells
        # alone; they are left out of the search unless only they explain the failure.
        reached = [self.baseline[n].reached for n in members]
        searched, unreachable = list(self.candidates), []
        if self.record is not None and all(r is not None for r in reached):
            entered = set().union(*map(set, reached))
            searched = [c for c in self.candidates if self.targets[c] & entered]
            unreachable = [c for c in self.candidates if c not in searched]
        oracle = Oracle(fails, order=self.candidates)
        culprits = find_culprits(searched, oracle)
        if not culprits and unreachable and fails(self.candidates):
            # Only a combination with the unreached candidates explains it: search them all.
            searched, unreachable = list(self.candidates), []
            culprits = find_culprits(searched, oracle)
        narrowed = []
        for culprit in culprits:
            if len(culprit) == 1 and self.parts_of(culprit[0]):
                narrowed += find_culprits(self.parts_of(culprit[0]), oracle) or [culprit]
            else:
                narrowed.append(culprit)
        search_runs, search_sets = len(asked), set(cells.sets)
        swept = self._sweep(cells, searched, narrowed, asked, fails, label=label)
        found_here = self._confirm(cells, members, narrowed, swept)
        self._masking(cells, group, found_here, narrowed, searched, found)
        found.masking_sets.update(cells.sets - search_sets)
        return Group(
            group=group,
            scenarios=len(members),
            culprits=found_here,
            unreachable=unreachable,
            searched=len(searched),
            runs=search_runs,
            swept=len(swept[1]),
        )

    def _sweep(self, cells, searched, narrowed, asked, fails, *, label: str) -> tuple[list[str], list[str]]:
        """Masking breaks the premise of every group question (a passing set is clean): sweep,
        alone, the candidates a search can have missed. With no culprit found, every searched
        candidate; otherwise the parts of a toggle with another part among the candidates (parts
        of one fix are where masking lives: 26651's fixture and Triton). Returns (found by the
        sweep, swept); what it finds is added to ``narrowed``."""
        alone_asked = {next(iter(k)) for k in asked if len(k) == 1}
        found_ids = {c for culprit in narrowed for c in culprit}
        pool = (
            searched
            if not narrowed
            else [c for c in searched if any(sib in self.candidates for sib in self.siblings(c))]
        )
        sweep = [c for c in pool if c not in alone_asked and c not in found_ids]
        if sweep:
            cells.context = f"{label}: masking sweep"
        hits = []
        for c in sweep:
            if fails([c]):
                narrowed.append([c])
                hits.append(c)
        return hits, sweep

    def _confirm(self, cells, members, narrowed, swept) -> list[Culprit]:
        from sglfix.common.verdicts import worst

        found = []
        for culprit in narrowed:
            results = cells.run(tuple(culprit), members)
            bad_names = self.failing(results)
            if not bad_names:
                continue
            verdict = worst([results[n].verdict for n in bad_names])
            # The figure of a cell that gave the verdict shown, never another scenario's.
            shown = next(n for n in bad_names if results[n].verdict == verdict)
            found.append(
                Culprit(
                    ids=list(culprit),
                    verdict=verdict,
                    scenarios=bad_names,
                    key_figure=results[shown].key_figure,
                    key_scenario=shown,
                    found_by="masking sweep" if culprit[0] in swept[0] else "search",
                )
            )
        return found

    def _masking(self, cells, group, found_here, narrowed, searched, found: Found) -> None:
        others = [c[0] for c in narrowed if len(c) == 1]
        for culprit in found_here:
            if len(culprit.ids) != 1:
                continue
            (c,) = culprit.ids
            partners = self.siblings(c) + [o for o in others if o != c]
            if culprit.found_by == "masking sweep":
                partners += [o for o in searched if o != c]  # something in the search hid it
            for partner in dict.fromkeys(partners):
                # On the scenarios the culprit fails alone: which pass with both reverted?
                both = cells.run((c, partner), culprit.scenarios)
                hidden = sorted(set(both) - set(self.failing(both)))
                if hidden:
                    found.masking.append(
                        Masking(
                            group=group,
                            culprit=c,
                            masked_by=partner,
                            scenarios=hidden,
                            all=len(hidden) == len(culprit.scenarios),
                        )
                    )
                    if culprit.found_by == "masking sweep":
                        break  # named: the search's premise failed here


def report_of(
    found: Found,
    *,
    command: str,
    wall_s: float,
    candidates: int,
    plan: dict,
    shard: str | None = None,
    apply: FixComparison | None = None,
) -> BisectReport:
    """The bisect report of what ``found`` holds: the culprits of every group (with it), the
    masking pairs, the scenarios left out, and what ran (``sglfix.report.bisect``)."""
    cells = found.cells
    assert cells is not None, "a search that ran has its cells"
    given: dict[str, Any] = {"shard": shard} if shard is not None else {}
    if found.store is not None:
        given["store"] = StoreUse.model_validate(found.store)
    if apply is not None:
        given["apply"] = apply
    return BisectReport(
        schema=2,
        tool=TOOL,
        command=command,
        date=now(),
        wall_s=wall_s,
        device=found.info.get("device"),
        device_name=found.info.get("device_name"),
        codebase=found.info.get("codebase"),
        candidates=candidates,
        runs=len(cells.sets - found.masking_sets - {()}),
        masking_runs=len(found.masking_sets - {()}),
        sets_run=len(cells.sets - {()}),
        reachability=found.record is not None,
        cells=len(cells.results),
        culprits=[FlatCulprit(**c.model_dump(), group=g.group) for g in found.groups for c in g.culprits],
        masking=found.masking,
        left_out=LeftOut(skip=found.skipped, known=found.known_base),
        groups=found.groups,
        worker_replacements=found.replacements,
        plan=PlanIdentity.model_validate(plan),
        **given,
    )
