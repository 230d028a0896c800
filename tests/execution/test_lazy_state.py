"""Lazily initialised module state is no leftover, and a replaced worker's cell still runs.

The state check between toggle sets (``sglfix.execution.snapshot``) must tell a module global
the code under test sets up on first use (sglang 0.5.23: ``_allowed_media_domains`` and
``_media_url_max_file_size_bytes`` re-set by ``configure_media_url_security``,
``global_diff_realtime_monotonic`` re-set by ``calibrate_time_diff``, ``fused_op._forced_backend``
resolved from its ``_UNRESOLVED`` sentinel) from a change a revert left behind. And a worker
replaced between sets must not cost the cell that waits for it its run (``sglfix.execution.pool``).
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
import types
from typing import ClassVar

import pytest

from sglfix.execution.snapshot import StateSnapshot

PREFIX = "_sglfix_lazy_probe"

# The shapes sglang's module state takes, in a module of its own.
SOURCE = textwrap.dedent(
    """
    import functools
    import time

    _DEFAULT_MB = 64
    _allowed_domains = frozenset()
    _max_bytes = _DEFAULT_MB * 1024 * 1024


    def configure(domains=(), mb=_DEFAULT_MB):
        global _allowed_domains, _max_bytes
        _allowed_domains = frozenset(sorted(domains))
        _max_bytes = mb * 1024 * 1024


    diff = time.time() - time.perf_counter()


    def calibrate():
        global diff
        diff = time.time() - time.perf_counter()


    _UNRESOLVED = object()
    _backend = _UNRESOLVED


    def backend():
        global _backend
        if _backend is _UNRESOLVED:
            _backend = None  # read from the environment on first use: unset
        return _backend


    _workspace = None


    def workspace():
        global _workspace
        if _workspace is None:
            _workspace = [0] * 4
        return _workspace


    _groups = []


    class Registry:
        @classmethod
        def reset(cls, *names):
            global _groups
            _groups = list(names)


    _calls = 0


    @functools.lru_cache(maxsize=None)
    def counted(x):
        global _calls
        _calls += 1
        return x


    LIMIT = 3
    BIG = 10**12
    SCALE = 0.5
    TABLE = {"a": 1}


    def f(x=1):
        return x


    class K:
        def m(self):
            return 1
    """
)


@pytest.fixture
def mod():
    """A fresh module under ``PREFIX`` (in sys.modules only for the test)."""
    module = types.ModuleType(PREFIX)
    exec(compile(SOURCE, f"<{PREFIX}>", "exec"), vars(module))
    sys.modules[PREFIX] = module
    try:
        yield module
    finally:
        del sys.modules[PREFIX]


def check(snap: StateSnapshot) -> list[str]:
    """What a worker does between two toggle sets: reset the lazy caches, then look."""
    snap.reset_lazy()
    return snap.changes()


# ---------------------------------------------------------------------------------------------
# (a) The snapshot, on a synthetic module
# ---------------------------------------------------------------------------------------------


def test_a_setter_recomputing_equal_defaults_is_not_a_change(mod):
    snap = StateSnapshot(PREFIX)
    old_domains, old_bytes = mod._allowed_domains, mod._max_bytes
    mod.configure()  # as sglang's ServerArgs does at every backend build
    assert mod._allowed_domains is not old_domains and mod._max_bytes is not old_bytes  # new objects...
    assert check(snap) == []  # ...of equal values
    # A constant no function of its module rebinds, rebound to an equal value: no change either.
    mod.BIG = int(str(10**12))
    assert mod.BIG is not snap.entries[f"{PREFIX}.BIG"] and check(snap) == []


def test_state_the_module_rebinds_itself_is_accepted_and_taken_into_the_snapshot(mod):
    snap = StateSnapshot(PREFIX)
    before = mod.diff
    mod.calibrate()
    while mod.diff == before:  # a calibration moves by the clocks' drift
        mod.calibrate()
    assert check(snap) == []
    assert snap.entries[f"{PREFIX}.diff"] is mod.diff and mod.diff != before  # kept, not reset
    mod.calibrate()
    assert check(snap) == []  # and again at every use
    mod.configure(["example.com"], 1)  # a setter's real configuration
    assert check(snap) == [] and mod._allowed_domains == frozenset({"example.com"})
    # Owned through a classmethod and through an lru_cache wrapper too.
    mod.Registry.reset("tp", "pp")
    mod.counted(1)
    assert check(snap) == [] and mod._calls == 1
    # What an accepted container holds is the snapshot's now: changing it in place is seen.
    mod._groups.append("dp")
    assert check(snap) == [f"{PREFIX}._groups[...]"]


def test_lazy_initialisation_from_none_or_a_sentinel_is_reset_to_unset(mod):
    snap = StateSnapshot(PREFIX)
    sentinel = mod._UNRESOLVED
    assert mod.backend() is None and mod._backend is not sentinel  # resolved on first use
    mod.workspace()
    reset = snap.reset_lazy()
    assert sorted(reset) == [f"{PREFIX}._backend", f"{PREFIX}._workspace"]
    assert mod._backend is sentinel and mod._workspace is None  # the next set resolves afresh
    assert snap.changes() == []
    assert mod.backend() is None and check(snap) == []  # as often as it happens


def test_leftovers_are_still_changes(mod):
    name = PREFIX
    for change, path in (
        (lambda: setattr(mod, "LIMIT", 4), f"{name}.LIMIT"),  # a constant rebound to another value
        (lambda: setattr(mod, "SCALE", 0.25), f"{name}.SCALE"),
        (lambda: setattr(mod, "SCALE", 0.5000001), f"{name}.SCALE"),
        (lambda: setattr(mod, "_UNRESOLVED", object()), f"{name}._UNRESOLVED"),  # a marker swapped
        (lambda: setattr(mod.K, "m", lambda self: 2), f"{name}.K.m"),
        (lambda: setattr(mod.f, "__code__", (lambda x=1: x + 1).__code__), f"{name}.f.__code__"),
        (lambda: setattr(mod.f, "__defaults__", (2,)), f"{name}.f.__defaults__"),
        (lambda: mod.TABLE.update(a=2), f"{name}.TABLE[...]"),
        (lambda: mod.TABLE.pop("a"), f"{name}.TABLE[...]"),
    ):
        snap = StateSnapshot(PREFIX)
        saved = dict(vars(mod)), dict(mod.TABLE), mod.f.__code__, mod.f.__defaults__, mod.K.m
        change()
        assert path in check(snap), path
        vars(mod).update(saved[0])
        mod.TABLE.clear()
        mod.TABLE.update(saved[1])
        mod.f.__code__, mod.f.__defaults__, mod.K.m = saved[2], saved[3], saved[4]
    # A rebinding by code a revert added to the module is no rebinding by the module's own code.
    snap = StateSnapshot(PREFIX)
    exec("def _reverted_helper():\n    global LIMIT\n    LIMIT = 7\n", vars(mod))
    mod._reverted_helper()
    assert check(snap) == [f"{name}.LIMIT"]
    # A float's sign is part of its value.
    mod.LIMIT, mod.SCALE = 3, 0.0
    snap = StateSnapshot(PREFIX)
    mod.SCALE = -0.0
    assert check(snap) == [f"{name}.SCALE"] and math.copysign(1.0, mod.SCALE) < 0


def test_an_accepted_value_is_the_reference_from_then_on(mod):
    """The module's own state is accepted whenever its code rebinds it; a constant rebound after
    it is still seen, and so is a cache bound after the reset."""
    snap = StateSnapshot(PREFIX)
    mod.calibrate()
    mod.workspace()
    assert check(snap) == [] and mod._workspace is None
    mod.LIMIT = 9
    assert check(snap) == [f"{PREFIX}.LIMIT"]


# ---------------------------------------------------------------------------------------------
# (b) The real case: real sglang 0.5.23 on CPU, a baseline before toggle sets on one worker
# ---------------------------------------------------------------------------------------------


def test_real_sglang_baseline_then_toggle_sets_on_one_worker_replaces_no_worker(tmp_path):
    """dsv4-draft@steps=2's baseline builds ServerArgs (configure_media_url_security re-sets the
    media URL policy); probe-eagle-prefill-tail's builds a ReqTimeStats (calibrate_time_diff).
    Then every toggle's set switches in on the same worker."""
    from clihelp import run_cli
    from real_sglang import require_sglang

    require_sglang()
    out = tmp_path / "out.json"
    r = run_cli(
        "--profile",
        "sglang-0.5.23",
        "matrix",
        "--device",
        "cpu",
        "--jobs",
        "1",
        "-s",
        "dsv4-draft@steps=2",
        "-s",
        "probe-eagle-prefill-tail",
        "--json",
        str(out),
        timeout=600,
        subprocess=True,
    )
    assert out.exists(), (r.code, r.err[-3000:])
    report = json.loads(out.read_text())
    assert report["worker_replacements"] == [], report["worker_replacements"]
    assert "a worker was replaced" not in r.err, r.err[-3000:]
    cells = report["cells"]
    assert {c["scenario"] for c in cells} == {"dsv4-draft@steps=2", "probe-eagle-prefill-tail"}
    assert any(not c["toggles"] for c in cells) and any(c["toggles"] for c in cells)
    errors = [(c["scenario"], c["toggles"], c["findings"]) for c in cells if c["verdict"] == "ERROR"]
    assert errors == []


# ---------------------------------------------------------------------------------------------
# (c) The pool: a cell waiting behind replacements runs on the fresh worker
# ---------------------------------------------------------------------------------------------


class _FakeWorker:
    """A worker handle without a process, behaving as a real session does: a baseline cell leaves
    state behind (as sglang's lazy globals did), so the next switch to another set asks for a
    replacement; a fresh process never does, its snapshot being the state it is in. The n-th
    handle answers a cell after 2n+1 polls and boots in ``BOOT`` polls, so that busy workers
    finish one after another while a replaced one boots (as 8 workers on a GPU do)."""

    BOOT = 12
    made = 0
    started = 0
    ran: ClassVar[list[tuple[str, tuple[str, ...]]]] = []

    def __init__(self, config=None, *, extra_env=None):
        self.config = config
        self.proc = None
        self.state = "down"
        self.toggles = None
        self.pids: list[int] = []
        self.restarts = 0
        self.info = None
        self.delay = 1 + 2 * type(self).made
        type(self).made += 1
        self._events: list = []  # [polls left, event]
        self._dirty = False
        self._held: tuple[str, ...] | None = None

    @property
    def pid(self):
        return id(self.proc) if self.proc is not None else None

    @property
    def deadline(self) -> float:
        return -math.inf  # the pool's poll never waits on a fake

    def fds(self) -> list[int]:
        return []

    def start(self) -> None:
        from sglfix.execution.worker import Event

        if self.proc is not None:
            return
        type(self).started += 1
        self.proc = object()
        self.pids.append(id(self.proc))
        self.state, self.toggles, self._dirty, self._held = "starting", None, False, None
        self._events = [[self.BOOT, Event("ready", {"device": "cpu"})]]

    def service(self, *, now=None):
        if not self._events:
            return None
        head = self._events[0]
        head[0] -= 1
        if head[0] > 0:
            return None
        event = self._events.pop(0)[1]
        self.state = "idle"
        return event

    def send(self, *, scenario_json, toggles, timeout=None, extra=None):
        from sglfix.execution.worker import Event
        from sglfix.harness.result import CellResult

        self.state, self.toggles = "busy", tuple(toggles)
        name = scenario_json["name"]
        if self._held is not None and self.toggles != self._held and self._dirty:
            why = f"after {','.join(self._held) or 'baseline'}, state of the code under test differs"
            self._events.append([1, Event("restart", why)])
            return 0
        self._held = self.toggles
        self._dirty = self._dirty or not self.toggles
        type(self).ran.append((name, self.toggles))
        reply = CellResult(scenario=name, toggles=list(toggles), device="cpu").finish().to_json()
        self._events.append([self.delay, Event("reply", reply)])
        return 0

    def result_for(self, event, *, scenario, toggles):
        from sglfix.harness.result import CellResult

        return CellResult.from_json(event.data)

    def signal_kill(self) -> None:
        pass

    def kill(self, *, wait=None) -> None:
        self.proc, self.state, self.toggles, self._events = None, "down", None, []

    def retire(self) -> None:
        self.kill()
        self.restarts += 1


def _fake_pool(monkeypatch, worker_cls, jobs):
    from sglfix.execution import pool as poolmod
    from sglfix.execution.worker import WorkerConfig

    monkeypatch.setattr(poolmod, "Worker", worker_cls)
    for key, value in (("ran", []), ("started", 0), ("made", 0)):
        monkeypatch.setattr(_FakeWorker, key, value)
    return poolmod.WorkerPool(WorkerConfig(device="cpu"), jobs=jobs)


def test_a_cell_waiting_behind_replacements_runs_on_the_fresh_worker(monkeypatch):
    """As a matrix does: baselines first, each result bringing its scenario's toggle cells. Busy
    workers that held the baseline finish one after another and each takes the first toggle
    cell waiting: each must be replaced (the baseline left state), and the cell must then run
    on the fresh worker, not wait for the next busy one and end as ERROR after three."""
    from sglfix.scenario import load_scenarios

    scenarios = load_scenarios([], builtin=True)[:3]

    class Cell:
        def __init__(self, scenario, toggles=()):
            self.scenario, self.toggles = scenario, tuple(toggles)

    def feed(cell, result):  # each baseline result brings its scenario's toggle cell
        return [Cell(cell.scenario, ("90001",))] if not cell.toggles else []

    with _fake_pool(monkeypatch, _FakeWorker, jobs=3) as pool:
        results = pool.run([Cell(s) for s in scenarios], feed=feed)
    assert len(results) == 2 * len(scenarios)
    assert [r.verdict for r in results if r.verdict == "ERROR"] == [], [r.findings for r in results]
    ran = _FakeWorker.ran
    assert sorted(ran) == sorted((s.name, t) for s in scenarios for t in ((), ("90001",)))  # each once
    # Each replacement is on record with its reason, and each fresh worker ran its cell.
    assert len(pool.replacements) == 3 and all("after baseline" in why for why in pool.replacements)
    assert _FakeWorker.started == 3 + len(pool.replacements)


def test_a_cell_no_fresh_worker_can_take_is_an_error_not_a_loop(monkeypatch):
    """A worker that asks to be replaced even on its first cell (it cannot start clean) ends the
    cell as ERROR after MAX_REPLACEMENTS fresh starts, naming why."""
    from sglfix.execution import pool as poolmod
    from sglfix.execution.worker import Event
    from sglfix.scenario import load_scenarios

    class Broken(_FakeWorker):
        def send(self, *, scenario_json, toggles, timeout=None, extra=None):
            self.state, self.toggles = "busy", tuple(toggles)
            self._events.append([1, Event("restart", "state differs from the worker's start: x.y")])
            return 0

    scenario = load_scenarios([], builtin=True)[0]
    cell = types.SimpleNamespace(scenario=scenario, toggles=("90001",))
    with _fake_pool(monkeypatch, Broken, jobs=1) as pool:
        (result,) = pool.run([cell])
    assert result.verdict == "ERROR" and "x.y" in result.key_figure
    assert len(pool.replacements) == poolmod.MAX_REPLACEMENTS + 1


def test_the_real_pool_runs_the_waiting_cell_first_on_the_fresh_worker(tmp_path):
    """Real workers: a set that leaves class state behind costs a replacement, and the fresh
    worker's first cell is the one that waited for it, though a baseline cell is queued too (a
    fresh worker otherwise takes the baseline first)."""
    from builders import BENIGN, LEAK_CLASS, SCEN, SCEN2, cell, write_class_leak

    from sglfix.execution.pool import WorkerConfig, WorkerPool

    d = tmp_path / "toggles"
    d.mkdir()
    write_class_leak(d)
    leak, benign = cell(SCEN, str(LEAK_CLASS)), cell(SCEN, str(BENIGN))
    order: list[tuple[str, tuple[str, ...]]] = []

    def feed(c, result):  # the leaking set's result brings another set's cell, then a baseline
        return [benign, cell(SCEN2)] if c is leak else []

    with WorkerPool(WorkerConfig(device="cpu", toggles_dir=str(d), timeout=120), jobs=1) as pool:
        results = pool.run([leak], feed=feed, on_result=lambda r: order.append((r.scenario, tuple(r.toggles))))
    assert [r.verdict for r in results] == ["CRASH", "PASS", "PASS"], [r.findings for r in results]
    assert len(pool.replacements) == 1 and "after 90008" in pool.replacements[0], pool.replacements
    assert order == [(SCEN, (str(LEAK_CLASS),)), (SCEN, (str(BENIGN),)), (SCEN2, ())], order


# ---------------------------------------------------------------------------------------------
# (c) The check walks only the modules whose identity print changed, and stays exact
# ---------------------------------------------------------------------------------------------


def test_a_change_after_an_accepted_one_is_still_seen_and_an_added_name_is_watched(mod):
    snap = StateSnapshot(PREFIX)
    mod.configure(domains=("x",))  # the module's own state, accepted: the snapshot takes it
    assert check(snap) == []
    assert check(snap) == [], "a clean module after an accepted change reads clean"
    mod.added_later = object()  # a new name: joins the snapshot
    assert check(snap) == []
    mod.added_later = object()  # rebound: a change
    assert check(snap) == [f"{PREFIX}.added_later"]


def test_a_change_in_one_module_of_many_is_found(mod):
    other = types.ModuleType(PREFIX + ".other")
    exec(compile("X = [1]\ndef g():\n    return 2\n", "<other>", "exec"), vars(other))
    sys.modules[other.__name__] = other
    try:
        snap = StateSnapshot(PREFIX)
        assert check(snap) == []
        other.g.__code__ = (lambda: 3).__code__
        other.X.append(2)
        assert check(snap) == [f"{PREFIX}.other.X[...]", f"{PREFIX}.other.g.__code__"]
    finally:
        del sys.modules[other.__name__]


def test_a_dict_subclass_is_read_as_stored_never_through_its_own_methods(mod):
    """transformers' lazy config mapping imports every model's module when listed."""

    class Lazy(dict):
        listed = 0

        def items(self):
            Lazy.listed += 1
            raise AssertionError("listed through items()")

        keys = values = __iter__ = items

    mod.MAPPING = Lazy(a=1)
    snap = StateSnapshot(PREFIX)
    mod.MAPPING["b"] = 2  # a value added: a memo, dropped by reset_lazy
    assert check(snap) == [] and dict(dict.items(mod.MAPPING)) == {"a": 1}
    dict.__setitem__(mod.MAPPING, "a", 3)  # a value changed: a change
    assert check(snap) == [f"{PREFIX}.MAPPING[...]"]
    assert Lazy.listed == 0


def test_a_package_whose_attribute_names_its_submodule_is_not_a_change_when_it_alone_changes(mod):
    """A package binds a name its submodule also has (``sglang.kernels.registry``): a walk of the
    package alone must read that path as the whole walk does (the module), or a set that only
    touched the package would replace its worker for nothing."""
    child = types.ModuleType(PREFIX + ".registry")
    sys.modules[child.__name__] = child
    mod.registry = lambda: None  # the package's own attribute of the same name
    try:
        snap = StateSnapshot(PREFIX)
        mod._groups.append("x")  # only the package changes (a list that gained an item)
        assert check(snap) == [f"{PREFIX}._groups[...]"]
        mod._groups.pop()
        assert check(snap) == []
    finally:
        del sys.modules[child.__name__]


def _make(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), vars(module))
    return module


@pytest.mark.parametrize(
    "change",
    [
        "f = lambda: 2",  # a name rebound
        "f.__code__ = g.__code__",  # a function's code (what a revert swaps)
        "f.__defaults__ = (2,)",
        "f.__kwdefaults__ = {'k': 3}",
        "K.m.__code__ = g.__code__",  # a method's code
        "vars(K)['s'].__func__.__code__ = g.__code__",  # a static method's function's code
        "K.attr = 2",  # a class attribute
        "TABLE['a'] = 2",  # one level into a dict
        "ITEMS[0] = 9",  # and a list
        "TABLE['b'] = 1",  # a key added to a dict: its size
        "SEEN.add(4)",  # a set grown
        "h = 1",  # a name added
        "del g",  # and removed
    ],
)
def test_the_identity_print_differs_for_every_change_the_snapshot_records(change):
    """Only a module whose print differs is walked: a change the print misses is a leftover the
    state check never sees."""
    from sglfix.execution.snapshot import _print

    source = """
        TABLE = {"a": 1}
        ITEMS = [1, 2]
        SEEN = {1, 2}
        def f(x=1, *, k=2):
            return x
        def g(x=1, *, k=2):
            return -x
        class K:
            attr = 1
            def m(self):
                return 1
            @staticmethod
            def s():
                return 1
        """
    module = _make("_sglfix_print_probe", source)
    module.K.__module__ = module.__name__
    before = _print(module)
    assert _print(module) == before  # nothing changed: the same print
    exec(change, vars(module))
    assert _print(module) != before, change
