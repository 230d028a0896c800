"""``sglfix search``'s work: examples drawn from the search space run as cells on the runner's
workers (through the result store when it is on), each judged by the one judgement against the
search's target, and the first that shows it shrunk to the smallest scenario that still does.

Targets (``SearchTarget``): ``baseline`` finds a cell that fails on the code as it is (a live bug;
a profile's known divergence is not one); ``revert`` finds a scenario where reverting the given
toggle ids makes a cell fail that passes without them. A cell is "the same failure" while its
verdict and its check (the key finding's message, numbers left out) stay the same. An ERROR (a
failure of sglfix itself) is never a finding: it is counted and reported as what it is.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.scenario import Scenario
from sglfix.search.shrink import Shrunk, shrink
from sglfix.search.space import Space, examples, to_scenario

__all__ = ["Budget", "Failure", "SearchOutcome", "SearchTarget", "run_search", "signature"]

# Examples asked for at once: enough to keep every worker busy, few enough to stop soon after a find.
BATCH_PER_JOB = 4
MIN_BATCH = 8


@dataclass(frozen=True)
class SearchTarget:
    """What a search looks for: ``base`` is the set every cell runs with (the environment's
    reverts); ``revert`` the toggle ids whose effect it looks for (empty: the baseline itself)."""

    base: tuple[str, ...] = ()
    revert: tuple[str, ...] = ()
    # A baseline search: (candidate fix id, the known divergence it clears) for each fix the
    # profile keeps beside its known divergences; a find one of them clears is that divergence.
    known_fixes: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return "revert" if self.revert else "baseline"

    @property
    def sets(self) -> list[tuple[str, ...]]:
        return [self.base, (*self.base, *self.revert)] if self.revert else [self.base]


def signature(cell: dict) -> tuple[str, str]:
    """The verdict and the check of a failing cell: its key finding's message with every number
    left out (a smaller batch fails the same check at other rows)."""
    from sglfix.report.context import key_figure

    return cell.get("verdict", ""), re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", key_figure(cell))


@dataclass
class Failure:
    """An example that shows the target: its node, its scenario, the failing cell (and the base
    cell it is judged against, for a revert)."""

    node: dict
    scenario: Scenario
    cell: dict
    base_cell: dict | None
    why: str


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
    budget_hit: str | None = None  # why the search stopped without a find (examples or time)
    # The known divergence the smallest find is (its candidate fix makes it pass), if any.
    known: str | None = None
    info: dict = field(default_factory=dict)


class _Judge:
    """Runs examples' cells for the target and says which show it."""

    def __init__(self, pool: Any, *, target: SearchTarget, rules: Any, outcome: SearchOutcome) -> None:
        from sglfix.execution.planner import PlannedCell

        self.pool, self.target, self.rules, self.outcome = pool, target, rules, outcome
        self._cell = PlannedCell

    def run(self, scenarios: Sequence[Scenario]) -> list[tuple[dict, dict | None] | None]:
        """For each scenario, (the target's cell, the base cell) where the target shows, else None."""
        cells = [self._cell(s, t) for t in self.target.sets for s in scenarios]
        results = [r.to_json() for r in self.pool.run(cells)]
        n = len(scenarios)
        out: list[tuple[dict, dict | None] | None] = []
        for i in range(n):
            base = results[i]
            top = results[n + i] if self.target.revert else base
            out.append(self._shows(top, base if self.target.revert else None))
        return out

    def _shows(self, cell: dict, base: dict | None) -> tuple[dict, dict | None] | None:
        from sglfix.report.meaning import Meaning

        for c in (cell, base):
            if c is not None and c.get("verdict") == "ERROR":
                self.outcome.errors.append(c)
                return None
        if cell.get("verdict") == "SKIP":
            self.outcome.skipped += 1
            return None
        if base is not None and self.rules.meaning(base, None)[0] is not Meaning.PASSED:
            return None  # a revert is judged where its baseline passes
        meaning, _ = self.rules.meaning(cell, base)
        return (cell, base) if meaning is Meaning.FAILED else None


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
    clock: Callable[[], float] = time.perf_counter,
) -> SearchOutcome:
    """Draw the budget's examples (deterministic from its seed), run them a batch at a time until
    one shows the target or the budget is spent, then shrink that one."""
    count, seconds, seed = budget.count, budget.seconds, budget.seed
    start = clock()
    outcome = SearchOutcome()
    drawn = examples(space, count=count, seed=seed)
    if not drawn:
        raise ConfigError("the search space holds no scenario the code base runs; widen --family / --mode")
    with runner.pool() as pool:
        outcome.info = dict(getattr(pool, "info", {}) or {})
        judge = _Judge(pool, target=target, rules=rules, outcome=outcome)
        batch = max(MIN_BATCH, BATCH_PER_JOB * int(getattr(runner, "jobs", 1) or 1))
        for at in range(0, len(drawn), batch):
            if seconds is not None and clock() - start >= seconds:
                outcome.budget_hit = f"--time {seconds:g} s spent"
                break
            chunk = drawn[at : at + batch]
            shown = judge.run([s for _, s in chunk])
            outcome.tried += len(chunk)
            say(f"search: {outcome.tried}/{len(drawn)} examples, {clock() - start:.0f} s")
            hit = next(((ex, s) for ex, s in zip(chunk, shown) if s is not None), None)
            if hit is not None:
                (node, scenario), (cell, base) = hit
                outcome.found = Failure(node, scenario, cell, base, why=" ".join(signature(cell)))
                break
        else:
            outcome.budget_hit = f"--examples {count}: none showed the target"
        outcome.search_s = round(clock() - start, 2)
        if outcome.found is not None:
            say(f"search: found {outcome.found.scenario.name}: {signature(outcome.found.cell)[0]}; shrinking")
            outcome.shrunk, outcome.shrunk_failure = _shrink(judge, outcome.found, space=space, say=say)
            outcome.known = _known(pool, outcome.shrunk_failure or outcome.found, target=target)
        outcome.info = dict(getattr(pool, "info", {}) or outcome.info)
    outcome.wall_s = round(clock() - start, 2)
    return outcome


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


def _shrink(judge: _Judge, found: Failure, *, space: Space, say: Callable[[str], None]) -> tuple[Shrunk, Failure]:
    wanted = signature(found.cell)
    last: dict[str, Failure] = {}

    def valid(node: dict) -> bool:
        try:
            to_scenario(node, codebase=space.codebase)
        except ConfigError:
            return False
        return True

    def still_fails(nodes: Sequence[dict]) -> list[bool]:
        scenarios = [to_scenario(n, codebase=space.codebase) for n in nodes]
        out = []
        for node, scenario, shown in zip(nodes, scenarios, judge.run(scenarios)):
            same = shown is not None and signature(shown[0]) == wanted
            if same and shown is not None:
                last[scenario.name] = Failure(node, scenario, shown[0], shown[1], why=" ".join(wanted))
            out.append(same)
        say(f"search: shrinking, {sum(out)} of {len(out)} smaller scenarios still fail")
        return out

    shrunk = shrink(found.node, valid=valid, still_fails=still_fails)
    final = to_scenario(shrunk.node, codebase=space.codebase)
    return shrunk, last.get(final.name, found)
