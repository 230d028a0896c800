"""``sglfix search``'s work: examples drawn from the search space run as cells on the runner's
workers (through the result store when it is on), each judged by the one judgement against the
search's target, and the first that shows it shrunk to the smallest scenario that still does.

Targets (``SearchTarget``): ``baseline`` finds a cell that fails on the code as it is (a live bug;
a profile's known divergence is not one); ``revert`` finds a scenario where reverting the given
toggle ids makes a cell fail that passes without them; ``apply`` (a candidate fix, or a mutant of
``sglfix mutate`` loaded as one) finds a scenario where the change moves a verdict against the same
cell without it, as ``mutate`` kills a mutant (``Rules.fix_meaning``: BROKEN, CHANGED or FIXED). A
cell is "the same failure" while its verdict and its check (the key finding's message, numbers left
out) stay the same, and for ``apply`` its meaning too. An ERROR (a failure of sglfix itself) is
never a finding: it is counted and reported as what it is; a TIMEOUT says nothing either way.

With a change (a revert or a patch), each example's base cell runs first and records which of the
change's functions it enters; the changed cell runs only where it did (``run_reaching``): a change
whose code an example never runs cannot show there.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.scenario import Scenario
from sglfix.search.shrink import Shrunk, node_key, shrink
from sglfix.search.space import Space, examples, kind_of, to_scenario

__all__ = [
    "Budget",
    "Failure",
    "Guide",
    "Search",
    "SearchOutcome",
    "SearchTarget",
    "Shown",
    "run_search",
    "search_on",
    "signature",
]

# Examples asked for at once: enough to keep every worker busy, few enough to stop soon after a find.
BATCH_PER_JOB = 4
MIN_BATCH = 8


@dataclass(frozen=True)
class SearchTarget:
    """What a search looks for: ``base`` is the set every cell runs with (the environment's
    reverts); ``revert`` the toggle ids whose effect it looks for, or ``apply`` the candidate
    fix ids (a patch, a mutant) whose effect it looks for (neither: the baseline itself)."""

    base: tuple[str, ...] = ()
    revert: tuple[str, ...] = ()
    apply: tuple[str, ...] = ()
    # A baseline search: (candidate fix id, the known divergence it clears) for each fix the
    # profile keeps beside its known divergences; a find one of them clears is that divergence.
    known_fixes: tuple[tuple[str, str], ...] = ()
    # What the report calls an apply target: "mutant" (killing one) or "apply" (a patch).
    kind: str = "apply"

    def __post_init__(self) -> None:
        if self.revert and self.apply:
            raise ConfigError("search for one change at a time: --revert, or a patch (--apply / --mutant)")

    @property
    def change(self) -> tuple[str, ...]:
        return self.revert or self.apply

    @property
    def name(self) -> str:
        return "revert" if self.revert else self.kind if self.apply else "baseline"

    @property
    def sets(self) -> list[tuple[str, ...]]:
        return [self.base, (*self.base, *self.change)] if self.change else [self.base]


def signature(cell: dict) -> tuple[str, str]:
    """The verdict and the check of a failing cell: its key finding's message with every number
    left out (a smaller batch fails the same check at other rows)."""
    from sglfix.report.context import key_figure
    from sglfix.report.outcome import check_of

    return cell.get("verdict", ""), check_of(key_figure(cell))


@dataclass
class Failure:
    """An example that shows the target: its node, its scenario, the failing cell (and the base
    cell it is judged against, for a change), and for a patch what the change did there
    (``meaning``: BROKEN, CHANGED or FIXED, and the judgement's sentence)."""

    node: dict
    scenario: Scenario
    cell: dict
    base_cell: dict | None
    why: str
    meaning: str | None = None
    said: str | None = None

    @property
    def same(self) -> tuple[str, ...]:
        """What a smaller scenario must show to fail the same way."""
        shown = self.cell if self.meaning != "FIXED" else (self.base_cell or self.cell)
        return (*signature(shown), self.meaning or "")


@dataclass
class SearchOutcome:
    tried: int = 0
    wall_s: float = 0.0
    search_s: float = 0.0
    found: Failure | None = None
    shrunk: Shrunk | None = None
    shrunk_failure: Failure | None = None
    errors: list[dict] = field(default_factory=list)  # cells sglfix itself failed on
    skipped: int = 0  # examples no cell could run here (SKIP)
    skip_why: str | None = None  # the first SKIP's reason
    timeouts: int = 0  # examples whose cell ran out of time (says nothing of the target)
    budget_hit: str | None = None  # why the search stopped without a find (examples or time)
    # The known divergence the smallest find is (its candidate fix makes it pass), if any.
    known: str | None = None
    info: dict = field(default_factory=dict)
    # The examples run, in order, up to the find: what a resumed search skips.
    record: list[str] = field(default_factory=list)
    # The kinds a change's search narrowed to (those whose examples entered its functions).
    focus: list[str] = field(default_factory=list)
    # Examples that showed the target once and not when run again (their cells differ run to run).
    flaky: list[str] = field(default_factory=list)
    # A patch's guided search: the seeds it started from, the neighbours it queued, the examples
    # where the patch was alive, and where the find came from (None: drawn from the space).
    seeds: int = 0
    neighbours: int = 0
    alive: int = 0
    origin: str | None = None


@dataclass(frozen=True)
class Shown:
    """An example's cells that show the target: the cell, its base cell (with a change), and for a
    patch the judgement's meaning and sentence."""

    cell: dict
    base: dict | None
    meaning: str | None = None
    said: str | None = None

    def failure(self, node: dict, scenario: Scenario) -> Failure:
        f = Failure(node, scenario, self.cell, self.base, why="", meaning=self.meaning, said=self.said)
        f.why = " ".join(x for x in f.same if x)
        return f


def alive(changed: dict, base: dict) -> int:
    """How much a change built differently in a cell that ran it (0: nothing, or nothing to compare):
    each metadata field whose digest moved counts one, an output that moved counts four (the
    effect reached the kernel's answer, only not past the tolerance)."""
    from sglfix.report.mutation import NO_DIGEST, OUTPUT, built_differently

    if changed.get("verdict") in ("NOT_REACHED", "ERROR", "SKIP", "TIMEOUT"):
        return 0
    moved = built_differently(changed, base)
    if NO_DIGEST in moved:
        return 0
    return sum(4 if m == OUTPUT else 1 for m in moved)


# What a patch must do to a cell to show: mutate's kill (``sglfix.report.mutation``).
_MOVED = ("BROKEN", "CHANGED", "FIXED")


class _Judge:
    """Runs examples' cells for the target and says which show it."""

    def __init__(
        self, pool: Any, *, target: SearchTarget, rules: Any, outcome: SearchOutcome, registry: Any = None
    ) -> None:
        from sglfix.execution.planner import PlannedCell

        self.pool, self.target, self.rules, self.outcome = pool, target, rules, outcome
        self.registry = registry
        self._cell = PlannedCell
        # The change's functions, and the kinds of the examples whose base cell entered one.
        self.targets: frozenset[str] = frozenset()
        if target.change and registry is not None:
            from sglfix.execution.reach import targets_of

            self.targets = targets_of(target.change, registry=registry)
        self.reaching: set[tuple[str, str]] = set()
        # Examples (by scenario name) where the change ran and built something else than the base
        # cell did without moving a verdict: how much it changed there (``alive``).
        self.alive: dict[str, int] = {}

    def run(self, scenarios: Sequence[Scenario]) -> list[Shown | None]:
        """For each scenario, its cells where they show the target, else None."""
        cells = [self._cell(s, t) for t in self.target.sets for s in scenarios]
        if self.target.change and self.registry is not None:
            from sglfix.execution.reach import run_reaching
            from sglfix.execution.settings import EVERY_FUNCTION

            # Base cells record every function they enter: the result store then serves them to
            # the next search of the same space whatever change it looks for (a campaign of
            # mutants, one search each, runs each example's base cell once).
            ran = run_reaching(
                self.pool, cells, base=self.target.base, registry=self.registry, record=(EVERY_FUNCTION,)
            )
        else:
            ran = self.pool.run(cells)
        results = [r.to_json() for r in ran]
        n = len(scenarios)
        for scenario, base in zip(scenarios, results[:n]):
            if self.targets & set(base.get("reached") or ()):
                self.reaching.add(kind_of(scenario))
        if self.target.change:
            for scenario, base, changed in zip(scenarios, results[:n], results[n:]):
                score = alive(changed, base)
                if score:
                    self.alive[scenario.name] = score
        return [self._shown(results[i], results[n + i] if self.target.change else None) for i in range(n)]

    def again(self, scenario: Scenario) -> Shown | None:
        """The example's cells run once more on the workers, through no store: whether it shows
        the target again. A verdict resting on memory nothing wrote (NAN one run, DIVERGE the next)
        is no find: the change did not move it."""
        cells = [self._cell(scenario, t) for t in self.target.sets]
        fresh = getattr(self.pool, "fresh", None)
        ran = [r.to_json() for r in (fresh(cells) if fresh is not None else self.pool.run(cells))]
        return self._shown(ran[0], ran[1] if self.target.change else None)

    def _shown(self, base: dict, changed: dict | None) -> Shown | None:
        if not self.target.change:
            return self._fails(base)
        assert changed is not None
        if self.target.apply:
            return self._moves(changed, base)
        return self._reverted(changed, base)

    def _unusable(self, *cells: dict) -> bool:
        """A cell that says nothing of the target: ERROR (counted: sglfix failed), TIMEOUT, or SKIP."""
        for c in cells:
            if c.get("verdict") == "ERROR":
                self.outcome.errors.append(c)
                return True
        if any(c.get("verdict") == "TIMEOUT" for c in cells):
            self.outcome.timeouts += 1
            return True
        skips = [c for c in cells if c.get("verdict") == "SKIP"]
        if skips:
            self.outcome.skipped += 1
            if self.outcome.skip_why is None:
                from sglfix.report.context import key_figure

                self.outcome.skip_why = key_figure(skips[0]) or str(skips[0].get("error") or "")
            return True
        return False

    def _fails(self, cell: dict) -> Shown | None:
        from sglfix.report.meaning import Meaning

        if self._unusable(cell):
            return None
        return Shown(cell, None) if self.rules.meaning(cell, None)[0] is Meaning.FAILED else None

    def _reverted(self, cell: dict, base: dict) -> Shown | None:
        from sglfix.report.meaning import Meaning

        if self._unusable(cell, base):
            return None
        if self.rules.meaning(base, None)[0] is not Meaning.PASSED:
            return None  # a revert is judged where its baseline passes
        return Shown(cell, base) if self.rules.meaning(cell, base)[0] is Meaning.FAILED else None

    def _moves(self, cell: dict, base: dict) -> Shown | None:
        if self._unusable(cell, base):
            return None
        meaning, said = self.rules.fix_meaning(cell, base)
        name = getattr(meaning, "name", str(meaning))
        return Shown(cell, base, name, said) if name in _MOVED else None


@dataclass(frozen=True)
class Guide:
    """Where a patch's search looks besides the space: ``seeds`` (node, scenario, the built-in
    scenario's name; ``sglfix.search.near.seeds``) run first, and with ``near`` the neighbours of
    every example where the patch is alive (its cells digest what they built) come before the
    space's other examples."""

    seeds: tuple[tuple[dict, Scenario, str], ...] = ()
    near: bool = False


@dataclass(frozen=True)
class Budget:
    """How much a search may try: ``count`` examples drawn from ``seed``, no new batch after
    ``seconds`` (None: no time limit)."""

    count: int
    seed: int = 0
    seconds: float | None = None


def run_search(
    runner: Any,
    *,
    space: Space,
    target: SearchTarget,
    rules: Any,
    budget: Budget,
    say: Callable[[str], None],
    resume: Sequence[str] = (),
    guide: Guide | None = None,
) -> SearchOutcome:
    """Draw the budget's examples (deterministic from its seed), run them a batch at a time on
    ``runner``'s pool until one shows the target or the budget is spent, then shrink that one.
    ``resume``: the names of the examples an earlier search of the same space and seed tried
    (its report's record); they are not run again. ``guide``: seeds to run first, and whether the
    neighbours of the examples where a patch is alive run before the space's others (``_Lines``)."""
    clock = time.perf_counter
    start = clock()
    drawn = _drawn(space, budget=budget, resume=resume)
    with runner.pool() as pool:
        search = Search(
            space,
            target,
            rules,
            budget,
            registry=runner.target.registry,
            jobs=int(getattr(runner, "jobs", 1) or 1),
            guide=guide or Guide(),
        )
        outcome = search_on(pool, drawn, search, say=say, clock=clock, start=start, resumed=resume)
    outcome.record[:0] = list(resume)
    return outcome


def _drawn(space: Space, *, budget: Budget, resume: Sequence[str]) -> list[tuple[dict, Scenario]]:
    """The budget's examples less those an earlier search tried (``resume``: its record)."""
    drawn = examples(space, count=budget.count, seed=budget.seed)
    if not drawn:
        raise ConfigError("the search space holds no scenario the code base runs; widen --family / --mode")
    done = set(resume)
    return [ex for ex in drawn if ex[1].name not in done]


class _Lines:
    """What a search runs next: the examples of every kind in turn and, from the first batch in
    which a change's search sees kinds enter its functions, those kinds' examples (the set grows
    as more kinds are seen: a space of forty kinds is not waited round). Focused, every other example
    comes from those kinds and the rest from every kind still: entering a change's code is not
    showing it (a revert of a capture path that every graph mode enters shows in one of them), and
    a kind whose first examples did not enter it (no graph drawn, no window) can still join them.

    A patch's search (a mutant, a fix) also starts from its seeds (the built-in scenarios, where
    asked) and looks near every example where the patch is alive (``_Judge.alive``): neighbours of
    the liveliest first, every other example while there are any (the space's own draws go on
    beside them: a find at an edge the space draws near is no neighbour of a seed)."""

    EVERY = 2  # one example in this many from every kind, once focused
    NEAR = 2  # of this many examples, all but one from the neighbours while there are any
    PER_PARENT = 6  # neighbours drawn around each example where the change is alive

    def __init__(
        self,
        drawn: Sequence[tuple[dict, Scenario]],
        *,
        space: Space,
        budget: Budget,
        done: set,
        seeds: Sequence[tuple[dict, Scenario, str]] = (),
    ) -> None:
        self.every: list[tuple[dict, Scenario]] = list(drawn)
        self.focused: list[tuple[dict, Scenario]] = []
        # One seed of each kind in turn: the first batch shows which kinds enter the change.
        self.seeds: list[tuple[dict, Scenario]] = _by_kind_in_turn([(node, s) for node, s, _ in seeds])
        # (minus how alive the parent was, order drawn, node, scenario): the liveliest parent's first.
        self.near: list[tuple[int, int, dict, Scenario]] = []
        self.space, self.budget, self.done = space, budget, done
        self.kinds: tuple[tuple[str, str], ...] = ()
        self.taken = 0
        # Where each example that did not come from the generic space came from.
        self.origin: dict[str, str] = {s.name: f"the built-in scenario {name}" for _, s, name in seeds}
        self.nodes: dict[str, dict] = {}
        self.known: set[str] = set()
        self.grown = 0  # neighbours queued
        self._rng = random.Random(budget.seed)

    def __bool__(self) -> bool:
        return bool(self.every or self.focused or self.seeds or self.near)

    def focus(self, reaching: set[tuple[str, str]]) -> bool:
        """Narrow to ``reaching`` (the kinds seen entering the change); whether it changed."""
        now = tuple(sorted(reaching))
        if now == self.kinds:
            return False
        self.kinds = now
        self.focused = examples(replace(self.space, only=now), count=self.budget.count, seed=self.budget.seed)
        # Seeds of kinds that enter the change first: a seed whose kind never enters it runs code
        # the change is not in (the examples a survivor's search would spend there show nothing).
        entering = set(now)
        self.seeds.sort(key=lambda ex: kind_of(ex[1]) not in entering)
        return True

    def grow(self, alive: dict[str, int]) -> int:
        """Queue the neighbours of the examples newly seen alive (each example once); how many."""
        from sglfix.search.near import neighbours

        added = 0
        for name, score in sorted(alive.items(), key=lambda kv: -kv[1]):
            node = self.nodes.pop(name, None)
            if node is None:
                continue
            for steps, near in neighbours(
                node, count=self.PER_PARENT, rng=self._rng, admits=self.space.admits, known=self.known, key=node_key
            ):
                scenario = to_scenario(near, codebase=self.space.codebase)
                if scenario.name in self.done:
                    continue
                seed = self.origin.get(name, "")
                parent = f"{name} ({seed})" if seed.startswith("the built-in") else name
                self.origin.setdefault(scenario.name, f"{parent} by {', '.join(steps)}")
                heapq.heappush(self.near, (-score, self.grown, near, scenario))
                self.grown += 1
                added += 1
        return added

    def take(self, n: int) -> list[tuple[dict, Scenario]]:
        out: list[tuple[dict, Scenario]] = []
        while len(out) < n and self:
            if self.seeds:
                example = self.seeds.pop(0)
            elif self.near and (self.taken % self.NEAR != self.NEAR - 1 or not (self.every or self.focused)):
                _, _, node, scenario = heapq.heappop(self.near)
                example = (node, scenario)
            else:
                from_every = not self.focused or (self.every and self.taken % self.EVERY == self.EVERY - 1)
                line = self.every if from_every else self.focused
                example = line.pop(0)
            if example[1].name in self.done:
                continue
            self.taken += 1
            self.done.add(example[1].name)
            self.known.add(node_key(example[0]))
            self.nodes[example[1].name] = example[0]
            out.append(example)
        return out


def _by_kind_in_turn(examples_: Sequence[tuple[dict, Scenario]]) -> list[tuple[dict, Scenario]]:
    """``examples_`` dealt one of each kind in turn (each kind's own order kept)."""
    lines: dict[tuple[str, str], list[tuple[dict, Scenario]]] = {}
    for ex in examples_:
        lines.setdefault(kind_of(ex[1]), []).append(ex)
    out: list[tuple[dict, Scenario]] = []
    queues = [list(reversed(line)) for line in lines.values()]
    while queues:
        out.extend(q.pop() for q in queues)
        queues = [q for q in queues if q]
    return out


@dataclass(frozen=True)
class Search:
    """One search: where it draws, what it looks for, how cells are judged, its budget; the
    registry the change's ids name (reachability reads their functions) and the workers' count
    (a batch keeps each busy)."""

    space: Space
    target: SearchTarget
    rules: Any
    budget: Budget
    registry: Any = None
    jobs: int = 1
    guide: Guide = field(default_factory=lambda: Guide())


def search_on(
    pool: Any,
    drawn: Sequence[tuple[dict, Scenario]],
    search: Search,
    *,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.perf_counter,
    start: float | None = None,
    resumed: Sequence[str] = (),
) -> SearchOutcome:
    """``run_search`` on an open pool (a campaign of searches shares one: its workers, its store).
    ``resumed``: the examples an earlier search tried (counted as tried, never run again)."""
    space, target, rules, budget = search.space, search.target, search.rules, search.budget
    registry, jobs = search.registry, search.jobs
    start = clock() if start is None else start
    outcome = SearchOutcome(tried=len(resumed))
    outcome.info = dict(getattr(pool, "info", {}) or {})
    judge = _Judge(pool, target=target, rules=rules, outcome=outcome, registry=registry)
    batch = max(MIN_BATCH, BATCH_PER_JOB * max(1, jobs))
    lines = _Lines(drawn, space=space, budget=budget, done=set(resumed), seeds=search.guide.seeds)
    left = budget.count - len(resumed)
    while lines and left > 0:
        if budget.seconds is not None and clock() - start >= budget.seconds:
            outcome.budget_hit = f"--time {budget.seconds:g} s spent"
            break
        chunk = lines.take(min(batch, left))
        shown = judge.run([s for _, s in chunk])
        for (node, scenario), cells in zip(chunk, shown):
            outcome.record.append(scenario.name)
            if cells is None:
                continue
            found = cells.failure(node, scenario)
            if _again(judge, found):
                outcome.found = found
                break  # the examples after a find were run, but are tried again by a resumed search
            outcome.flaky.append(scenario.name)
            say(f"search: {scenario.name} showed it once, not when run again (its cells differ run to run)")
        outcome.tried = len(resumed) + len(outcome.record)
        left = budget.count - outcome.tried
        say(f"search: {outcome.tried}/{budget.count} examples, {clock() - start:.0f} s")
        if outcome.found is not None:
            break
        if search.guide.near and judge.alive:
            grown = lines.grow(judge.alive)
            if grown:
                say(f"search: {len(judge.alive)} example(s) where the change is alive; {grown} neighbour(s) queued")
        if judge.targets and judge.reaching and lines.focus(judge.reaching):
            outcome.focus = sorted(f"{w}/{m}" for w, m in judge.reaching)
            say(f"search: {len(judge.reaching)} kind(s) enter the change's functions; every other example on them")
    else:
        outcome.budget_hit = (
            f"--examples {budget.count}: none showed the target"
            if left <= 0
            else f"the space's {outcome.tried} example(s) tried: none showed the target"
        )
    ran = outcome.tried - len(resumed)
    if outcome.found is None and ran and outcome.skipped == ran:
        # Nothing ran: "none showed the target" would claim a search that never happened.
        outcome.budget_hit = f"no example could run here: all {ran} SKIP ({outcome.skip_why or 'no reason given'})"
    outcome.search_s = round(clock() - start, 2)
    outcome.seeds, outcome.neighbours, outcome.alive = len(search.guide.seeds), lines.grown, len(judge.alive)
    if outcome.found is not None:
        outcome.origin = lines.origin.get(outcome.found.scenario.name)
        say(f"search: found {outcome.found.scenario.name}: {outcome.found.why}; shrinking")
        outcome.shrunk, outcome.shrunk_failure = _shrink(judge, outcome.found, space=space, say=say, jobs=jobs)
        if outcome.shrunk_failure is not outcome.found and not _again(judge, outcome.shrunk_failure):
            # The smallest did not fail the same way again: the find as found is the answer.
            say(f"search: {outcome.shrunk_failure.scenario.name} did not fail the same way again; keeping the find")
            outcome.flaky.append(outcome.shrunk_failure.scenario.name)
            outcome.shrunk, outcome.shrunk_failure = None, None
        outcome.known = _known(pool, outcome.shrunk_failure or outcome.found, target=target)
    outcome.info = dict(getattr(pool, "info", {}) or outcome.info)
    outcome.wall_s = round(clock() - start, 2)
    return outcome


def _again(judge: _Judge, failure: Failure) -> bool:
    """Whether ``failure``'s example, run once more through no store, fails the same way."""
    again = judge.again(failure.scenario)
    return again is not None and again.failure(failure.node, failure.scenario).same == failure.same


def _known(pool: Any, failure: Failure, *, target: SearchTarget) -> str | None:
    """The known divergence whose candidate fix makes ``failure``'s scenario pass, if any: the find
    is then that bug (under a scenario no one wrote), not a new one."""
    from sglfix.execution.planner import PlannedCell

    if not target.known_fixes:
        return None
    cells = [PlannedCell(failure.scenario, (*target.base, fix)) for fix, _ in target.known_fixes]
    for (_, what), result in zip(target.known_fixes, pool.run(cells)):
        if result.verdict == "PASS":
            return what
    return None


def _shrink(
    judge: _Judge, found: Failure, *, space: Space, say: Callable[[str], None], jobs: int
) -> tuple[Shrunk, Failure]:
    wanted = found.same
    last: dict[str, Failure] = {}
    told = [0, 0]  # smaller scenarios run and still failing since the last line said

    def still_fails(nodes: Sequence[dict]) -> list[bool]:
        scenarios = [to_scenario(n, codebase=space.codebase) for n in nodes]
        out = []
        for node, scenario, shown in zip(nodes, scenarios, judge.run(scenarios)):
            failure = shown.failure(node, scenario) if shown is not None else None
            same = failure is not None and failure.same == wanted
            if failure is not None and same:
                last[scenario.name] = failure
            out.append(same)
        told[0], told[1] = told[0] + len(out), told[1] + sum(out)
        return out

    def round_over(shrunk: Shrunk) -> None:
        say(f"search: shrinking, round {shrunk.rounds}: {told[1]} of {told[0]} smaller scenarios still fail")
        told[0] = told[1] = 0

    # As many smaller scenarios at once as the workers run together (two at the least, for the
    # pool's turnaround): the first that still fails is taken without running the rest.
    shrunk = shrink(found.node, valid=space.admits, still_fails=still_fails, chunk=max(2, jobs), on_round=round_over)
    final = to_scenario(shrunk.node, codebase=space.codebase)
    return shrunk, last.get(final.name, found)
