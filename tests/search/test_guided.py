"""A patch's search looks next to where the patch is alive: it starts from its seeds (built-in
scenarios as nodes) and runs the neighbours of every example where the patched cell built other
metadata than its base cell without moving a verdict. The pool here stands in for the workers
only: the search, the judgement, the space, the seeds and the moves are real."""

from __future__ import annotations

import random

from stand_in import Result

from sglfix.codebases import get_codebase
from sglfix.execution.runner import choose_scenarios
from sglfix.execution.search import Budget, Guide, Search, SearchTarget, search_on
from sglfix.report.outcome import Rules
from sglfix.search.near import moves, neighbours, node_of, seeds
from sglfix.search.shrink import node_key
from sglfix.search.space import examples, space_for, to_scenario
from sglfix.toggling.profiles import get_profile

MUTANT = "+m-0000000000"


class _Pool:
    """The patched cell builds other metadata (a field digest moves) wherever the batch's first
    prefix is ``alive_at``; it fails there (DIVERGE) only where the batch holds more than one
    request."""

    def __init__(self, *, alive_at: int) -> None:
        self.alive_at = alive_at
        self.ran: list[str] = []

    def run(self, cells, **_: object) -> list[Result]:
        out = []
        for c in cells:
            s, patched = c.scenario, MUTANT in c.toggles
            self.ran.append(s.name)
            first = s.prefix_lens[0]
            alive = patched and first == self.alive_at
            shows = alive and s.batch_size > 1
            verdict = "DIVERGE" if shows else "PASS"
            findings = [{"verdict": verdict, "message": "diverges at row 1"}] if shows else []
            fp = {"metadata": "moved" if alive else "same", "fields": {"kv_indptr": "moved" if alive else "same"}}
            out.append(
                Result(
                    {
                        "scenario": s.name,
                        "toggles": list(c.toggles),
                        "verdict": verdict,
                        "findings": findings,
                        "fingerprint": fp,
                    }
                )
            )
        return out

    def fresh(self, cells) -> list[Result]:
        return self.run(cells)


def _space():
    return space_for(get_codebase("reproduction"), family="triton", mode="DECODE")


def _search(pool: _Pool, *, count: int, guide: Guide):
    space = _space()
    drawn = examples(space, count=count, seed=5)
    target = SearchTarget(apply=(MUTANT,), kind="mutant")
    search = Search(space, target, Rules(mode="findings"), Budget(count=count, seed=5), guide=guide)
    return search_on(pool, drawn, search, say=lambda _: None)


def _seed(prefix: int):
    """One seed of the space: a single request at ``prefix``, eager."""
    space = _space()
    node = {"backend": "triton", "mode": "DECODE", "page_size": 1, "batch": {"prefix_lens": [prefix]}}
    return space, (node, to_scenario(node, codebase=space.codebase), "written-by-hand")


def test_a_mutant_alive_next_to_a_seed_is_killed_by_its_neighbours_and_not_without_them():
    _, seed = _seed(37)
    # Alive where the first prefix is 37 (the seed's, no edge the space draws near), shown there
    # with a second request: a step away from the seed, which the space's own draws do not hit.
    pool = _Pool(alive_at=37)
    guided = _search(pool, count=60, guide=Guide(seeds=(seed,), near=True))
    assert guided.found is not None, "the neighbours of the seed never reached the failing batch"
    assert guided.seeds == 1 and guided.alive >= 1 and guided.neighbours > 0
    assert guided.origin is not None and "by" in guided.origin  # a neighbour's steps, named
    blind = _search(_Pool(alive_at=37), count=60, guide=Guide())
    assert blind.found is None, "the generic space alone found it: the test no longer needs the neighbours"
    # Seeds without looking near them: the seed itself is alive and shows nothing.
    seeded_only = _search(_Pool(alive_at=37), count=60, guide=Guide(seeds=(seed,)))
    assert seeded_only.found is None and seeded_only.neighbours == 0


def test_where_the_patch_is_never_alive_no_neighbour_is_drawn():
    _, seed = _seed(37)
    outcome = _search(_Pool(alive_at=10_000), count=20, guide=Guide(seeds=(seed,), near=True))
    assert outcome.alive == 0 and outcome.neighbours == 0 and outcome.found is None


def test_the_built_in_scenarios_load_back_from_their_nodes():
    for profile in ("reproduction", "sglang-0.5.23"):
        prof = get_profile(profile)
        scenarios = choose_scenarios(profile=prof, globs=[], files=[], backend=None)
        space = space_for(get_codebase(prof.codebase))
        kept = seeds(scenarios, space=space)
        assert len(kept) >= 0.9 * len(scenarios), f"{profile}: {len(kept)} of {len(scenarios)} seeds"
        by_name = {s.name: s for s in scenarios}
        for node, scenario, name in kept:
            original = by_name[name]
            assert scenario.prefix_lens == original.prefix_lens and scenario.capture_bs == original.capture_bs
            assert node == node_of(original)


def test_neighbours_are_admitted_distinct_and_the_same_for_the_same_random_state():
    space, (node, _, _) = _seed(40)
    node = {**node, "batch": {"prefix_lens": [40, 7]}, "cuda_graph": {"capture_bs": [2, 4]}}
    assert any(what.startswith("request") for what, _ in moves(node))
    assert any(what.startswith("captured size") for what, _ in moves(node))

    def draw(seed: int):
        return neighbours(node, count=12, rng=random.Random(seed), admits=space.admits, known=set(), key=node_key)

    first = draw(1)
    assert first == draw(1) and first != draw(2)
    assert len({node_key(n) for _, n in first}) == len(first) == 12
    assert all(space.admits(n) and 1 <= len(steps) <= 3 for steps, n in first)
    # Single steps come first: the first neighbours are each one move away.
    assert all(len(steps) == 1 for steps, _ in first[:6])


class _Skipping(_Pool):
    def run(self, cells, **kw: object) -> list[Result]:
        out = super().run(cells, **kw)
        for r in out:
            r.cell.update(verdict="SKIP", findings=[{"verdict": "SKIP", "message": "no CUDA device here"}])
        return out


def test_a_search_where_nothing_can_run_says_so_and_not_that_nothing_showed():
    _, seed = _seed(37)
    outcome = _search(_Skipping(alive_at=37), count=10, guide=Guide(seeds=(seed,), near=True))
    assert outcome.found is None and outcome.skipped == outcome.tried == 10
    assert outcome.budget_hit.startswith("no example could run here: all 10 SKIP"), outcome.budget_hit


def test_seeds_are_dealt_by_kind_and_those_of_kinds_entering_the_change_run_first():
    from sglfix.execution.search import _Lines

    space = space_for(get_codebase("reproduction"), family="triton")
    made = []
    for mode in ("DECODE", "EXTEND"):
        for prefix in (20, 21, 22):
            batch = {"prefix_lens": [prefix], **({"extend_lens": [3]} if mode == "EXTEND" else {})}
            node = {"backend": "triton", "mode": mode, "page_size": 1, "batch": batch}
            made.append((node, to_scenario(node, codebase=space.codebase), f"{mode}-{prefix}"))
    lines = _Lines([], space=space, budget=Budget(count=50, seed=0), done=set(), seeds=made)
    first = [s.mode for _, s in lines.take(2)]
    assert sorted(map(str, first)) == ["DECODE", "EXTEND"], "the first batch should hold one seed of each kind"
    # Only EXTEND was seen entering the change: its seeds go before the DECODE ones left.
    assert lines.focus({("triton", "EXTEND")})
    rest = [str(s.mode) for _, s in lines.take(4)]
    assert rest == ["EXTEND", "EXTEND", "DECODE", "DECODE"], rest
