"""Reachability planning without workers: what runs, what is marked, and in which order results
come back; the worker side (a real baseline records the targets it enters) on one real cell."""

from __future__ import annotations

from dataclasses import dataclass

from sglfix.execution.reach import RecordingCell, UnreachedCell, run_reaching, targets_of
from sglfix.harness.cell import not_reached_result
from sglfix.harness.result import CellResult
from sglfix.toggling.registry import load_registry


@dataclass(frozen=True)
class Scen:
    name: str


@dataclass(frozen=True)
class Cell:
    scenario: Scen
    toggles: tuple[str, ...]


class FakePool:
    """Answers like the worker would: baselines report ``entered``; unreached cells are marked.
    Cells run in the order they are queued, and ``feed`` adds to the queue, as in the real pool."""

    def __init__(self, entered: dict[str, list[str] | None]):
        self.entered = entered
        self.sent: list = []  # every cell given to a worker, in the order run

    def answer(self, c):
        r = CellResult(scenario=c.scenario.name, toggles=list(c.toggles), device="cpu")
        if isinstance(c, RecordingCell):
            r.reached = self.entered[c.scenario.name]
        elif isinstance(c, UnreachedCell):
            r.add("NOT_REACHED", "not reached", same_as=c.same_as, targets=list(c.targets))
        return r.finish()

    def run(self, cells, on_result=None, feed=None):
        queue, out = list(cells), []
        while queue:
            c = queue.pop(0)
            if getattr(c, "answer", None) is not None:  # known without a worker: settled, never sent
                out.append(c.answer)
            else:
                self.sent.append(c)
                out.append(self.answer(c))
            if on_result:
                on_result(out[-1])
            if feed:
                queue += feed(c, out[-1])
        return out


def test_cells_whose_targets_the_baseline_never_enters_are_marked_not_run():
    registry = load_registry()
    kv = sorted(targets_of(["26651:triton-kv-lens"], registry=registry))
    fixture = targets_of(["26651:fixture"], registry=registry)
    assert kv and fixture and not set(kv) & fixture
    a, b = Scen("a"), Scen("b")
    sets = [(), ("26651:triton-kv-lens",), ("26651:fixture",), ("26651:fixture", "26651:triton-kv-lens")]
    cells = [Cell(s, t) for t in sets for s in (a, b)]
    pool = FakePool({"a": kv[:1], "b": None})  # b's baseline could not record: all of b runs
    seen = []
    results = run_reaching(pool, cells, base=(), registry=registry, on_result=lambda r: seen.append(r))
    assert [(r.scenario, tuple(r.toggles)) for r in results] == [(c.scenario.name, c.toggles) for c in cells]
    verdicts = {(r.scenario, tuple(r.toggles)): r.verdict for r in results}
    assert verdicts[("a", ("26651:triton-kv-lens",))] == "PASS"  # its function was entered: it ran
    assert verdicts[("a", ("26651:fixture",))] == "NOT_REACHED"
    assert verdicts[("a", ("26651:fixture", "26651:triton-kv-lens"))] == "PASS"  # one of them entered
    assert all(v != "NOT_REACHED" for (s, _), v in verdicts.items() if s == "b")
    recorded = [c for c in pool.sent if isinstance(c, RecordingCell)]
    assert [c.scenario.name for c in recorded] == ["a", "b"] and all(c.toggles == () for c in recorded)
    assert pool.sent[:2] == recorded  # the baselines are first in line
    assert set(recorded[0].record) == set(kv) | fixture
    unreached = [c for c in pool.sent if isinstance(c, UnreachedCell)]
    assert [(c.scenario.name, c.toggles) for c in unreached] == [("a", ("26651:fixture",))]
    assert unreached[0].same_as == "PASS" and set(unreached[0].targets) == fixture
    assert unreached[0].extra == {"not_reached": {"same_as": "PASS", "targets": sorted(fixture)}}
    assert len(seen) == len(cells)


def test_a_real_baseline_records_the_targets_it_enters_and_an_unreached_set_still_applies(tmp_path):
    from sglfix.execution.pool import WorkerConfig, WorkerPool
    from sglfix.scenario import load_scenarios

    registry = load_registry()
    scen = next(s for s in load_scenarios([], builtin=True) if s.name == "triton-decode@cg=eager,gpu_only=off")
    record = tuple(sorted(targets_of(["26651", "26738", "27460"], registry=registry)))
    with WorkerPool(WorkerConfig(device="cpu", timeout=120), jobs=1) as pool:
        (base,) = pool.run([RecordingCell(scen, (), record)])
        assert base.verdict == "PASS", base.findings
        # Eager decode builds its metadata in init_forward_metadata (26738's target) and never
        # touches CUDA-graph metadata (26651) or the FlashInfer MLA draft (27460).
        assert base.reached == [
            "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata"
        ]
        cells = [Cell(scen, ("27460",)), Cell(scen, ("26651:clamp",)), Cell(scen, ("26738",))]
        results = run_reaching(pool, [Cell(scen, ())] + cells, base=(), registry=registry)
    verdicts = [r.verdict for r in results]
    assert verdicts == ["PASS", "NOT_REACHED", "NOT_REACHED", "PASS"], [r.findings for r in results]
    assert results[1].revert_env == "27460"  # the worker applied the set before answering
    assert results[1].findings[0]["same_as"] == "PASS"


class ApplyingPool(FakePool):
    """Like a worker: an unreached cell's answer carries the revert it applied; ``broken`` sets
    fail to apply (ERROR)."""

    def __init__(self, entered, broken=()):
        super().__init__(entered)
        self.broken = set(broken)

    def answer(self, c):
        if isinstance(c, UnreachedCell) and c.toggles in self.broken:
            r = CellResult(scenario=c.scenario.name, toggles=list(c.toggles), device="cpu")
            r.add("ERROR", f"revert {','.join(c.toggles)} failed: no such code")
            r.finish()
        elif isinstance(c, UnreachedCell):  # what the worker's session answers
            r = not_reached_result(
                c.scenario.name, list(c.toggles), device="cpu", same_as=c.same_as, targets=list(c.targets)
            )
            r.kernels = {"launches": 0, "hits": 0}
        else:
            r = super().answer(c)
        r.revert_env = ",".join(c.toggles) or "0"
        return r


def test_a_sets_unreached_cells_take_one_round_trip_and_its_answer():
    registry = load_registry()
    kv = sorted(targets_of(["26651:triton-kv-lens"], registry=registry))
    scens = [Scen(f"s{i}") for i in range(5)]
    sets = [(), ("26651:fixture",), ("26738:glue-constant",)]
    cells = [Cell(s, t) for t in sets for s in scens]
    pool = ApplyingPool({s.name: kv[:1] for s in scens})
    seen = []
    results = run_reaching(pool, cells, base=(), registry=registry, on_result=seen.append)
    sent = [c for c in pool.sent if isinstance(c, UnreachedCell)]
    assert sorted(c.toggles for c in sent) == [("26651:fixture",), ("26738:glue-constant",)]  # one per set
    # Every unreached cell reads as a worker's own answer would: its scenario, its set's revert.
    direct = ApplyingPool({})
    for c, r in zip(cells, results):
        if not c.toggles:
            continue
        (want,) = direct.run(
            [UnreachedCell(c.scenario, c.toggles, "PASS", tuple(sorted(targets_of(c.toggles, registry=registry))))]
        )
        assert r.to_json() == want.to_json()
    assert len(seen) == len(cells)


def test_a_set_that_fails_to_apply_sends_each_of_its_cells_to_a_worker():
    registry = load_registry()
    kv = sorted(targets_of(["26651:triton-kv-lens"], registry=registry))
    scens = [Scen(f"s{i}") for i in range(4)]
    cells = [Cell(s, t) for t in [(), ("26651:fixture",)] for s in scens]
    pool = ApplyingPool({s.name: kv[:1] for s in scens}, broken={("26651:fixture",)})
    results = run_reaching(pool, cells, base=(), registry=registry)
    assert [r.verdict for r in results[4:]] == ["ERROR"] * 4
    assert len([c for c in pool.sent if isinstance(c, UnreachedCell)]) == 4  # the probe, then each one


def test_the_pool_runs_cells_a_result_feeds_it():
    from sglfix.execution.pool import WorkerConfig, WorkerPool
    from sglfix.scenario import load_scenarios

    scens = [s for s in load_scenarios([], builtin=True) if s.name.startswith("triton-decode@cg=eager")][:2]
    first, then = Cell(scens[0], ()), Cell(scens[1], ("26738",))
    fed = []

    def feed(cell, result):
        fed.append((cell.scenario.name, result.verdict))
        return [then] if cell is first else []

    with WorkerPool(WorkerConfig(device="cpu", timeout=120), jobs=1) as pool:
        results = pool.run([first], feed=feed)
    assert [(r.scenario, tuple(r.toggles)) for r in results] == [(scens[0].name, ()), (scens[1].name, ("26738",))]
    assert fed == [(scens[0].name, "PASS"), (scens[1].name, results[1].verdict)]
