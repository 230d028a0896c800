"""A find is confirmed before it is reported: its example runs once more through no store, and an
example whose cells differ run to run (a verdict resting on memory nothing wrote) is never a find.
The pool here stands in for the workers only: the search, the judgement and the space are real."""

from __future__ import annotations

from stand_in import Result

from sglfix.codebases import get_codebase
from sglfix.execution.search import Budget, Search, SearchTarget, search_on
from sglfix.report.outcome import Rules
from sglfix.search.space import examples, space_for


class _Pool:
    """Answers each cell by ``verdict_of(scenario name, how many times that cell ran)``."""

    def __init__(self, verdict_of) -> None:
        self.verdict_of, self.runs, self.fresh_runs = verdict_of, {}, 0

    def run(self, cells, **_: object) -> list[Result]:
        out = []
        for c in cells:
            name = c.scenario.name
            n = self.runs[name] = self.runs.get(name, 0) + 1
            verdict = self.verdict_of(name, n)
            findings = [] if verdict == "PASS" else [{"verdict": verdict, "message": f"{verdict.lower()} at row 3"}]
            out.append(Result({"scenario": name, "toggles": [], "verdict": verdict, "findings": findings}))
        return out

    def fresh(self, cells) -> list[Result]:
        self.fresh_runs += 1
        return self.run(cells)


def _search(pool: _Pool, count: int = 12):
    space = space_for(get_codebase("reproduction"), family="triton", mode="DECODE")
    drawn = examples(space, count=count, seed=3)
    search = Search(space, SearchTarget(), Rules(mode="findings"), Budget(count=count, seed=3))
    return drawn, search_on(pool, drawn, search, say=lambda _: None)


def _order() -> list[str]:
    drawn, _ = _search(_Pool(lambda *_: "PASS"))
    return [s.name for _, s in drawn]


def test_a_find_that_does_not_fail_again_is_flaky_and_the_search_looks_on():
    order = _order()

    def verdict_of(name: str, n: int) -> str:
        # The first example fails its first run only (NAN from memory nothing wrote); the fifth always.
        if name == order[0]:
            return "NAN" if n == 1 else "PASS"
        return "DIVERGE" if name == order[4] else "PASS"

    pool = _Pool(verdict_of)
    _, outcome = _search(pool)
    assert outcome.flaky == [order[0]]
    assert outcome.found is not None and outcome.found.scenario.name == order[4]
    assert pool.fresh_runs >= 2  # the flaky one and the find, each run again through no store


def test_a_find_that_fails_the_same_way_again_is_reported_at_once():
    order = _order()
    _, outcome = _search(_Pool(lambda name, n: "INVARIANT" if name == order[1] else "PASS"))
    assert outcome.flaky == []
    assert outcome.found.scenario.name == order[1]
