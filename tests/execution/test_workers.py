"""Worker processes and the pool, by fault injection: real workers on CPU, toggles in a tmp dir.

Each injected fault is a toggle whose patch does something hostile inside the code under test
(segfault, exit, hang, print forged replies, leave module state behind, start a child that
holds the output pipe). The pool must turn each into the right verdict for the right cell, keep
going with a fresh worker, and leave no process behind. Observed timings are printed (-s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from builders import BENIGN, LEAK_CLASS, SCEN, SCEN2, TARGET, Cell, assert_matched, cell, write_class_leak, write_toggle
from procs import alive, wait_gone

from sglfix.common.errors import ConfigError
from sglfix.execution.pool import WorkerConfig, WorkerPool, WorkerStartError
from sglfix.patching.targets import DEFAULT_ALLOWED_PREFIXES

TIMINGS: dict[str, float] = {}


def note(key: str, seconds: float) -> None:
    TIMINGS[key] = round(seconds, 3)
    print(f"[timing] {key}: {seconds:.3f} s")


@pytest.fixture(scope="module", autouse=True)
def _print_timings():
    yield
    print("\n[timings] " + json.dumps(TIMINGS, indent=1))


# ---------------------------------------------------------------------------------------------
# The hostile toggles
# ---------------------------------------------------------------------------------------------

SEGV, EXIT3, SIGKILL, HANG, CHILD_SEGV, FORGE, LEAK_MODULE, HARNESS, OUTSIDE = (
    90001,
    90002,
    90003,
    90004,
    90005,
    90006,
    90007,
    90010,
    90011,
)
MUTE_HANG, CHILD_LEFT, RAISES_EXIT, RAISES_INTERRUPT, SESSION_LEFT = 90012, 90013, 90014, 90015, 90016
RESULT_STUB = {
    "scenario": "forged",
    "toggles": [],
    "device": "cpu",
    "verdict": "DIVERGE",
    "findings": [],
    "error": None,
    "timings_ms": {},
    "revert_env": None,
}


@pytest.fixture(scope="module")
def marks(tmp_path_factory) -> Path:
    """Where the hostile code leaves what it did (times, pids, fds) for the tests to check."""
    return tmp_path_factory.mktemp("marks")


@pytest.fixture(scope="module")
def tdir(tmp_path_factory, marks) -> Path:
    d = tmp_path_factory.mktemp("fault_toggles")
    stamp = f"open({str(marks / 'fault_at')!r}, 'w').write(repr(__import__('time').time()))"
    write_toggle(d, SEGV, preamble=f"import os, signal\n{stamp}\nos.kill(os.getpid(), signal.SIGSEGV)")
    write_toggle(d, EXIT3, preamble="import os\nos._exit(3)")
    # Raised, not exited: the code under test's exception, like any other.
    write_toggle(d, RAISES_EXIT, preamble="raise SystemExit(3)")
    write_toggle(d, RAISES_INTERRUPT, preamble="raise KeyboardInterrupt")
    write_toggle(d, SIGKILL, preamble="import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    write_toggle(d, HANG, preamble="import time\ntime.sleep(600)")
    # A child that inherits stdout/stderr (and, with close_fds=False, every inheritable fd) and
    # outlives its parent: EOF on the output pipe never comes.
    write_toggle(
        d,
        CHILD_SEGV,
        preamble=f"""
        import os, signal, subprocess, sys
        ch = sys.modules["sglfix.execution.serve"]._CHANNEL
        open({str(marks / "channel_fds")!r}, 'w').write(f"{{ch._in.fileno()}} {{ch._out}}")
        child = subprocess.Popen([sys.executable, "-c",
            "import os, time; open({str(marks / "child_fds")!r}, 'w').write(' '.join(os.listdir('/proc/self/fd'))); time.sleep(120)"],
            close_fds=False)
        open({str(marks / "child_pid")!r}, 'w').write(str(child.pid))
        t0 = __import__('time').monotonic()
        while not os.path.exists({str(marks / "child_fds")!r}) and __import__('time').monotonic() - t0 < 20:
            __import__('time').sleep(0.01)
        {stamp}
        os.kill(os.getpid(), signal.SIGSEGV)
    """,
    )
    forged = json.dumps({"id": 1, "result": RESULT_STUB})
    write_toggle(
        d,
        FORGE,
        preamble=f"""
        import json, sys
        for stream in (sys.stdout, sys.stderr):
            stream.write("@@sglfix-reply " + {forged!r} + "\\n")
            stream.write({forged!r} + "\\n@@sglfix-ready\\n")
            stream.flush()
        channel = getattr(sys.modules["sglfix.execution.serve"], "_CHANNEL", None)
        if channel is not None:  # straight onto the reply pipe, with an id no request has
            channel.send({{"id": -1, "result": json.loads({forged!r})["result"]}})
    """,
    )
    write_toggle(
        d,
        LEAK_MODULE,
        preamble="""
        def _leaked(*args, **kwargs):
            raise RuntimeError("module state leaked from 90007")
        globals()["decode_attention_fwd"] = _leaked
    """,
    )
    write_class_leak(d)
    # Closes its own output and hangs: nothing on any pipe tells the parent, only the deadline.
    write_toggle(d, MUTE_HANG, preamble="import os, time\nos.close(1)\nos.close(2)\ntime.sleep(600)")
    # A cell that finishes normally but leaves a child running.
    write_toggle(
        d,
        CHILD_LEFT,
        preamble=f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(marks / "left_child_pid")!r}, 'w').write(str(child.pid))
    """,
    )
    # Children that leave the worker's process group: one in a session of its own, and a daemon
    # (double fork, its parent gone) whose pid only a file tells.
    write_toggle(
        d,
        SESSION_LEFT,
        preamble=f"""
        import os, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        open({str(marks / "session_child_pid")!r}, 'w').write(str(child.pid))
        daemon = subprocess.Popen([sys.executable, "-c",
            "import os, sys, time\\n"
            "if os.fork():\\n    os._exit(0)\\n"
            "os.setsid()\\n"
            "open(sys.argv[1], 'w').write(str(os.getpid()))\\n"
            "time.sleep(300)", {str(marks / "daemon_pid")!r}])
        daemon.wait()
        t0 = __import__('time').monotonic()
        while not os.path.exists({str(marks / "daemon_pid")!r}) and __import__('time').monotonic() - t0 < 20:
            __import__('time').sleep(0.01)
    """,
    )
    # The guard check (the judge) meets a buffer list it cannot read: sglfix fails, not the code.
    write_toggle(d, HARNESS, preamble="self.static_buffers = [object()]")
    write_toggle(d, OUTSIDE, target="colorsys.rgb_to_yiq", match="y = 0.30*r + 0.59*g + 0.11*b\n")
    # A drifted copy of a built-in toggle: must be the one that runs (and fail to apply).
    (d / "26738.yaml").write_text(
        yaml.safe_dump(
            {
                "pr": 26738,
                "title": "drifted copy",
                "patches": [
                    {
                        "target": TARGET,
                        "edits": [{"match": "this line is not in the source\n", "replacement": "pass\n"}],
                    }
                ],
            }
        )
    )
    return d


@pytest.fixture(scope="module")
def pool(tdir):
    started = time.monotonic()
    p = WorkerPool(WorkerConfig(device="cpu", toggles_dir=str(tdir), timeout=120), jobs=2)
    note("pool construction (non-blocking)", time.monotonic() - started)
    with p:
        info = p.info
        note("first handshake", time.monotonic() - started)
        assert info["device"] == "cpu" and info["device_name"] == "cpu" and info["torch"]
        yield p
    assert wait_gone(p.pids) == [], "workers outlived the pool"


def run_timed(pool: WorkerPool, cells: list[Cell]):
    """Results, wall time, and when (time.time()) each (scenario, toggles) got its result."""
    t0 = time.monotonic()
    seen: dict[tuple, float] = {}
    results = pool.run(cells, on_result=lambda r: seen.setdefault((r.scenario, tuple(r.toggles)), time.time()))
    return results, time.monotonic() - t0, seen


# ---------------------------------------------------------------------------------------------
# Without processes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), -0.0])
def test_timeout_must_be_finite_and_positive(bad):
    with pytest.raises(ConfigError) as exc:
        WorkerConfig(device="cpu", timeout=bad)
    assert "--timeout" in str(exc.value) and "\n" not in str(exc.value)


def test_config_rejects_unknown_device_and_missing_toggles_dir(tmp_path):
    with pytest.raises(ConfigError, match="--device 'gpu'"):
        WorkerConfig(device="gpu")
    with pytest.raises(ConfigError, match="--toggles"):
        WorkerConfig(device="cpu", toggles_dir=str(tmp_path / "nope"))
    cfg = WorkerConfig(device="cpu", toggles_dir=str(tmp_path), allowed_prefixes=["a.b"])
    assert cfg.allowed_prefixes == ("a.b",) and os.path.isabs(cfg.toggles_dir)


def test_state_snapshot_sees_rebinding_but_not_harmless_additions():
    import types

    from sglfix.execution.snapshot import StateSnapshot

    name = "sglfix.backends._state_probe"
    mod = types.ModuleType(name)
    exec(
        "class K:\n    def m(self):\n        return 1\ndef f(x=1):\n    return x\nTABLE = {'a': 1}\nLIMIT = 3\n",
        vars(mod),
    )
    sys.modules[name] = mod
    try:
        snap = StateSnapshot("sglfix.backends")
        assert snap.changes() == []
        mod.helper_added_by_interpreter = object()  # an added name is not a leak...
        assert snap.changes() == []
        mod.helper_added_by_interpreter = object()  # ...but rebinding it afterwards is
        assert snap.changes() == [f"{name}.helper_added_by_interpreter"]
        snap = StateSnapshot("sglfix.backends")
        mod.len = lambda x: 0  # shadows a builtin: old code would read it
        assert snap.changes() == [f"{name}.len"]
        del mod.len
        snap = StateSnapshot("sglfix.backends")
        for change, path in (
            (lambda: setattr(mod, "LIMIT", 4), f"{name}.LIMIT"),
            (lambda: setattr(mod.K, "m", lambda self: 2), f"{name}.K.m"),
            (lambda: setattr(mod.f, "__code__", (lambda x=1: x + 1).__code__), f"{name}.f.__code__"),
            (lambda: setattr(mod.f, "__defaults__", (2,)), f"{name}.f.__defaults__"),
            (lambda: mod.TABLE.update(a=2), f"{name}.TABLE[...]"),
        ):
            snap = StateSnapshot("sglfix.backends")
            change()
            assert path in snap.changes(), path
        # A module cache bound lazily (None in the snapshot) is put back to None, not a leak...
        mod.CACHE = None
        snap = StateSnapshot("sglfix.backends")
        mod.CACHE = object()
        assert snap.reset_lazy() == [f"{name}.CACHE"] and mod.CACHE is None and snap.changes() == []
        mod.LIMIT = 5  # ...while a rebound value still is one
        assert snap.reset_lazy() == [] and snap.changes() == [f"{name}.LIMIT"]
        mod.LIMIT, mod.TABLE = 3, {"a": 1}
        # A module dict that only gained keys is a memo filled by use: the added keys go...
        snap = StateSnapshot("sglfix.backends")
        table = mod.TABLE
        table["filled"] = object()
        assert snap.changes() == [f"{name}.TABLE[...]"]
        assert snap.reset_lazy() == [f"{name}.TABLE[...]"] and mod.TABLE is table and table == {"a": 1}
        assert snap.changes() == []
        # ...a value changed beside an added key is still a change, and nothing is dropped.
        table.update(a=2, filled=1)
        assert snap.reset_lazy() == [] and table == {"a": 2, "filled": 1}
        assert snap.changes() == [f"{name}.TABLE[...]"]
    finally:
        del sys.modules[name]


def _session(monkeypatch, tmp_path):
    from sglfix.execution.session import Session
    from sglfix.toggling.env import ENV_VAR

    monkeypatch.setenv(ENV_VAR, "0")  # the session writes it; monkeypatch puts the old value back
    monkeypatch.setenv("SGLFIX_TOGGLES_DIR", str(tmp_path))
    return Session(device="cpu", allowed_prefixes=None)


def test_an_exception_escaping_run_cell_is_an_error_with_type_message_and_frame(monkeypatch, tmp_path):
    import sglfix.harness.cell as cellmod

    def broken(*args, **kwargs):
        raise KeyError("no such adapter")

    monkeypatch.setattr(cellmod, "run_cell", broken)
    reply = _session(monkeypatch, tmp_path).handle({"id": 7, "toggles": [], "scenario": cell(SCEN).scenario.to_json()})
    assert reply["id"] == 7
    result = reply["result"]
    assert result["verdict"] == "ERROR" and result["scenario"] == SCEN
    finding = result["findings"][0]
    assert finding["type"] == "KeyError" and "no such adapter" in finding["message"]
    assert "test_workers.py" in finding["frame"] and "in broken" in finding["frame"]


def test_a_revert_that_cannot_be_applied_is_an_error_naming_it(monkeypatch, tmp_path):
    from sglfix.toggling.registry import _load

    _load.cache_clear()
    reply = _session(monkeypatch, tmp_path).handle(
        {"id": 8, "toggles": ["99999"], "scenario": cell(SCEN).scenario.to_json()}
    )
    _load.cache_clear()
    result = reply["result"]
    assert result["verdict"] == "ERROR", result
    assert result["findings"][0]["message"].startswith("revert 99999 failed: ")


# ---------------------------------------------------------------------------------------------
# Real workers
# ---------------------------------------------------------------------------------------------


def test_segfault_exit_and_sigkill_are_faults_and_the_next_cells_still_run(pool, marks):
    deaths = sum(w.restarts for w in pool.workers)
    cells = [cell(SCEN, str(SEGV)), cell(SCEN, str(EXIT3)), cell(SCEN, str(SIGKILL)), cell(SCEN), cell(SCEN2)]
    results, wall, seen = run_timed(pool, cells)
    assert_matched(results, cells)
    assert [r.verdict for r in results] == ["FAULT", "FAULT", "FAULT", "PASS", "PASS"], [r.findings for r in results]
    assert "signal SIGSEGV" in results[0].key_figure and "triton_backend.py" in results[0].key_figure
    assert "exit code 3" in results[1].key_figure
    assert "signal SIGKILL" in results[2].key_figure
    assert sum(w.restarts for w in pool.workers) - deaths == 3
    assert all(w.pid is None or alive(w.pid) for w in pool.workers)  # a fresh worker when work is left
    latency = seen[(SCEN, (str(SEGV),))] - float((marks / "fault_at").read_text())
    note("segfault -> FAULT (kill to result)", latency)
    note("3 faults + 2 passes, jobs=2 (incl. 3 restarts)", wall)
    assert latency < 5.0


def test_a_child_holding_the_output_pipe_does_not_turn_a_segfault_into_a_timeout(pool, marks):
    cells = [cell(SCEN, str(CHILD_SEGV)), cell(SCEN)]
    results, _wall, seen = run_timed(pool, cells)
    assert_matched(results, cells)
    assert [r.verdict for r in results] == ["FAULT", "PASS"], [r.findings for r in results]
    latency = seen[(SCEN, (str(CHILD_SEGV),))] - float((marks / "fault_at").read_text())
    note("segfault with a child holding stdout -> FAULT", latency)
    assert latency < 5.0  # not the 120 s timeout
    child = int((marks / "child_pid").read_text())
    # The channel is not inherited, even by a child started with close_fds=False.
    channel = set((marks / "channel_fds").read_text().split())
    inherited = set((marks / "child_fds").read_text().split())
    assert len(channel) == 2 and "1" in inherited and not channel & inherited, (channel, inherited)
    assert wait_gone([child], timeout=5.0) == [], "the child of the code under test outlived its worker"


def test_forged_reply_lines_never_shift_results(pool):
    cells = [cell(SCEN, str(FORGE)), cell(SCEN), cell(SCEN2, str(FORGE)), cell(SCEN2), cell(SCEN, str(FORGE))]
    discarded = sum(w.discarded for w in pool.workers)
    results, wall, _ = run_timed(pool, cells)
    assert_matched(results, cells)
    assert [r.verdict for r in results] == ["PASS"] * 5, [r.findings for r in results]
    assert all(r.scenario != "forged" for r in results)
    assert sum(w.discarded for w in pool.workers) - discarded >= 3  # one per forged cell, on the channel
    note("5 cells with forged replies, jobs=2", wall)


@pytest.fixture(scope="module")
def pool1(tdir):
    """One worker (so that the next set runs where the last one ran), colorsys allowed."""
    config = WorkerConfig(
        device="cpu",
        toggles_dir=str(tdir),
        timeout=HANG_LIMIT,
        allowed_prefixes=DEFAULT_ALLOWED_PREFIXES + ("colorsys",),
    )
    with WorkerPool(config, jobs=1) as p:
        _ = p.info
        yield p
    assert wait_gone(p.pids) == []


HANG_LIMIT = 10


def test_state_left_by_a_revert_does_not_reach_other_toggle_sets(pool1):
    cells = [
        cell(SCEN),
        cell(SCEN, str(LEAK_MODULE)),
        cell(SCEN),
        cell(SCEN, str(LEAK_CLASS)),
        cell(SCEN),
        cell(SCEN, str(BENIGN)),
    ]
    pool = pool1
    fresh = pool.run([cell(SCEN)])[0]
    replaced = len(pool.replacements)
    t0 = time.monotonic()
    results = []
    for c in cells:  # one plan each: the pool would otherwise run the three baselines first
        results += pool.run([c])
    note("6 cells across leaking sets, jobs=1", time.monotonic() - t0)
    assert_matched(results, cells)
    verdicts = [r.verdict for r in results]
    assert verdicts == ["PASS", "CRASH", "PASS", "CRASH", "PASS", "PASS"], [r.findings for r in results]
    assert "leaked from 90007" in results[1].key_figure and "leaked from 90008" in results[3].key_figure
    for r in (results[2], results[4]):
        assert r.error == fresh.error  # same numbers as a baseline in a fresh worker
    new = pool.replacements[replaced:]
    assert any("_fill_kv_indices" in why for why in new), new


def test_the_set_after_a_workers_first_revert_still_runs(tdir):
    """Restoring a set must not take away what the kernels' runtime added meanwhile (the Triton
    interpreter adds its helpers to a kernel's module on the kernel's first run)."""
    with WorkerPool(WorkerConfig(device="cpu", toggles_dir=str(tdir), timeout=120), jobs=1) as p:
        first = p.run([cell(SCEN, str(BENIGN))])  # a fresh worker: no kernel has run yet
        then = p.run([cell(SCEN), cell(SCEN2)])
    assert [r.verdict for r in first + then] == ["PASS"] * 3, [r.findings for r in first + then]


def test_toggles_dir_and_its_copies_reach_the_workers(pool):
    cells = [cell(SCEN, str(BENIGN)), cell(SCEN, "26738"), cell(SCEN, "26738:main")]
    results = pool.run(cells)
    assert_matched(results, cells)
    ok, drifted, part = results
    assert ok.verdict == "PASS" and ok.revert_env == str(BENIGN), ok.findings
    for r, rid in ((drifted, "26738"), (part, "26738:main")):
        assert r.verdict == "ERROR", r.findings  # the built-in 26738 would apply cleanly
        assert r.key_figure.startswith(f"revert {rid} failed: "), r.key_figure
        assert "not registered" not in r.key_figure


def test_systemexit_and_keyboardinterrupt_raised_by_the_code_are_crashes_with_type_and_frame(pool):
    cells = [cell(SCEN, str(RAISES_EXIT)), cell(SCEN, str(RAISES_INTERRUPT)), cell(SCEN)]
    results = pool.run(cells)
    assert_matched(results, cells)
    exits, interrupt, _after = results
    assert [r.verdict for r in results] == ["CRASH", "CRASH", "PASS"], [r.findings for r in results]
    assert exits.key_figure.startswith("SystemExit: 3 [") and ".py:" in exits.key_figure, exits.key_figure
    assert interrupt.key_figure.startswith("KeyboardInterrupt:"), interrupt.key_figure
    assert exits.findings[0]["type"] == "SystemExit" and interrupt.findings[0]["type"] == "KeyboardInterrupt"


def test_harness_failures_and_disallowed_targets_are_errors_not_skips(pool):
    cells = [cell(SCEN, str(HARNESS)), cell(SCEN, str(OUTSIDE))]
    results = pool.run(cells)
    assert_matched(results, cells)
    harness, outside = results
    assert harness.verdict == "ERROR" and "AttributeError" in harness.key_figure, harness.findings
    assert outside.verdict == "ERROR" and outside.key_figure.startswith(f"revert {OUTSIDE} failed: ")
    assert "allowed module prefixes" in outside.key_figure


def test_hang_is_a_timeout_within_the_limit_and_allowed_prefixes_reach_the_worker(pool1):
    # One plan per timed cell: within a plan the pool runs the set its worker holds first, so the
    # order results arrive in is not the order of the cells.
    cells = [cell(SCEN, str(OUTSIDE)), cell(SCEN)]
    results = pool1.run(cells)
    assert_matched(results, cells)
    assert [r.verdict for r in results] == ["PASS", "PASS"], [r.findings for r in results]
    t0 = time.monotonic()
    (hung,) = pool1.run([cell(SCEN, str(HANG))])
    hang_took = time.monotonic() - t0
    (after,) = pool1.run([cell(SCEN)])
    assert (hung.verdict, after.verdict) == ("TIMEOUT", "PASS"), (hung.findings, after.findings)
    note(f"hang -> TIMEOUT (limit {HANG_LIMIT} s)", hang_took)
    note("cell after a timeout (incl. restart)", time.monotonic() - t0 - hang_took)
    assert HANG_LIMIT <= hang_took < HANG_LIMIT + 3


def test_code_that_closes_its_output_and_hangs_is_a_timeout_and_the_cli_never_waits_unbounded(pool1):
    # One plan per cell: in one plan the pool would run the set its worker holds first. The
    # first makes sure a worker is up, so that the clock below counts the hang only.
    assert pool1.run([cell(SCEN)])[0].verdict == "PASS"
    t0 = time.monotonic()
    (hung,) = pool1.run([cell(SCEN, str(MUTE_HANG))])
    took = time.monotonic() - t0
    (after,) = pool1.run([cell(SCEN)])
    assert (hung.verdict, after.verdict) == ("TIMEOUT", "PASS"), (hung.findings, after.findings)
    note(f"closed stdout/stderr + hang -> TIMEOUT (limit {HANG_LIMIT} s)", took)
    assert HANG_LIMIT <= took < HANG_LIMIT + 3


def test_a_child_left_by_a_passing_cell_is_gone_when_the_pool_closes(tdir, marks):
    with WorkerPool(WorkerConfig(device="cpu", toggles_dir=str(tdir), timeout=120), jobs=1) as p:
        cells = [cell(SCEN, str(CHILD_LEFT)), cell(SCEN)]
        results = p.run(cells)
        assert_matched(results, cells)
        assert [r.verdict for r in results] == ["PASS", "PASS"], [r.findings for r in results]
        child = int((marks / "left_child_pid").read_text())
        assert alive(child)  # still running while its worker lives
        t0 = time.monotonic()
    assert wait_gone([child], timeout=5.0) == [], "a child of the code under test outlived the pool"
    note("child left by a passing cell gone after close", time.monotonic() - t0)
    assert wait_gone(p.pids) == []


def test_cuda_without_a_gpu_is_a_config_error(tmp_path):
    with WorkerPool(WorkerConfig(device="cuda"), jobs=1) as p:
        t0 = time.monotonic()
        with pytest.raises(ConfigError) as exc:
            _ = p.info
        note("--device cuda refused", time.monotonic() - t0)
    assert str(exc.value) == "--device cuda: no CUDA device here; use --device cpu"
    assert wait_gone(p.pids) == []


def test_auto_resolves_in_the_worker_and_the_parent_never_imports_torch(tmp_path):
    script = tmp_path / "auto.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys
        from sglfix.execution.pool import WorkerConfig, WorkerPool
        from sglfix.scenario import load_scenarios
        from dataclasses import dataclass
        s = next(s for s in load_scenarios([], builtin=True) if s.name == {SCEN!r})
        @dataclass
        class Cell:
            id: str
            scenario: object
            toggles: tuple
        with WorkerPool(WorkerConfig(device="auto"), jobs=1) as pool:
            info = pool.info
            r = pool.run([Cell("a", s, ())])[0]
        print(json.dumps({{"info": info, "verdict": r.verdict, "device": r.device,
                          "torch": "torch" in sys.modules, "triton": "triton" in sys.modules}}))
    """)
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.splitlines()[-1])
    assert data["info"]["device"] == "cpu" and data["info"]["device_name"] == "cpu"
    assert data["info"]["torch"] and data["info"]["triton"]
    assert data["verdict"] == "PASS" and data["device"] == "cpu"
    assert not data["torch"] and not data["triton"]


def test_a_worker_that_cannot_start_raises_one_line(tmp_path, monkeypatch):
    shadow = tmp_path / "torch"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('torch is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with WorkerPool(WorkerConfig(device="cpu"), jobs=2) as p, pytest.raises(WorkerStartError) as exc:
        p.run([cell(SCEN), cell(SCEN2)])
    message = str(exc.value)
    assert "\n" not in message and "worker failed to start" in message and "torch is broken here" in message
    assert exc.value.exit_code == 2
    assert wait_gone(p.pids) == []


# ---------------------------------------------------------------------------------------------
# The parent killed mid-run
# ---------------------------------------------------------------------------------------------

PARENT = """
import os, signal, sys
from dataclasses import dataclass
from sglfix.execution.pool import Terminated, WorkerConfig, WorkerPool, signals_raise
from sglfix.scenario import load_scenarios

# A job started in the background may begin with SIGINT ignored; a CLI run from a terminal has
# Python's handler, which is what this stands for.
signal.signal(signal.SIGINT, signal.default_int_handler)

@dataclass
class Cell:
    id: str
    scenario: object
    toggles: tuple

s = next(s for s in load_scenarios([], builtin=True) if s.name == sys.argv[2])
cells = [Cell(str(i), s, (sys.argv[3],)) for i in range(2)] + [Cell("b", s, ())]
try:
    with signals_raise(), WorkerPool(WorkerConfig(device="cpu", toggles_dir=sys.argv[1], timeout=300), jobs=2) as pool:
        pool.run(cells)
except KeyboardInterrupt:
    sys.exit(130)
except Terminated as exc:
    sys.exit(exc.exit_code)
"""

MIDRUN = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(os.path.join(MARKS, f"busy-{os.getpid()}"), "w").write(f"{os.getpid()} {child.pid}")
time.sleep(300)
"""


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_a_parent_killed_mid_run_leaves_no_worker(tmp_path, signum, code):
    toggles = tmp_path / "toggles"
    toggles.mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    write_toggle(toggles, 90020, preamble=f"MARKS = {str(marks)!r}\n" + MIDRUN)
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(toggles), SCEN, "90020"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(marks.glob("busy-*"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        busy = [tuple(int(x) for x in f.read_text().split()) for f in marks.glob("busy-*")]
        assert len(busy) == 2, (proc.poll(), proc.stderr.read1().decode() if proc.poll() is not None else "")
        workers = [w for w, _ in busy]
        children = [c for _, c in busy]
        t0 = time.monotonic()
        proc.send_signal(signum)
        rc = proc.wait(timeout=30)
        note(f"{signal.Signals(signum).name} to parent -> exit", time.monotonic() - t0)
        err = proc.stderr.read().decode()
        assert rc == code, err[-2000:]
        assert wait_gone(workers, timeout=10) == [], "a worker outlived its parent"
        note(f"{signal.Signals(signum).name} to parent -> workers gone", time.monotonic() - t0)
        assert wait_gone(children, timeout=10) == [], "a child of the code under test outlived the run"
        note(f"{signal.Signals(signum).name} to parent -> children of the code under test gone", time.monotonic() - t0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for f in marks.glob("busy-*"):
            for pid in f.read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_processes_that_left_the_workers_group_are_gone_when_the_pool_closes(tdir, marks):
    with WorkerPool(WorkerConfig(device="cpu", toggles_dir=str(tdir), timeout=120), jobs=1) as p:
        (result,) = p.run([cell(SCEN, str(SESSION_LEFT))])
        assert result.verdict == "PASS", result.findings
        session_child = int((marks / "session_child_pid").read_text())
        daemon = int((marks / "daemon_pid").read_text())
        assert alive(session_child) and alive(daemon)  # still running while their worker lives
        assert os.getsid(session_child) != os.getsid(p.pids[0]) and os.getsid(daemon) != os.getsid(p.pids[0])
    assert wait_gone([session_child, daemon], timeout=5.0) == [], "a process of the code under test outlived the pool"


def test_a_replaced_worker_is_reported_on_the_console_and_in_the_json(tmp_path):
    """A set that leaves the code's state changed costs a fresh worker; the run says so (which
    set, what changed), never only as extra processes."""
    from clihelp import run_cli

    d = tmp_path / "toggles"
    d.mkdir()
    write_class_leak(d)
    out = tmp_path / "r.json"
    r = run_cli(
        "--toggles",
        str(d),
        "matrix",
        "-s",
        SCEN,
        "--device",
        "cpu",
        "--jobs",
        "1",
        "--no-reachability",
        "--json",
        str(out),
        timeout=600,
        subprocess=True,
    )
    assert r.code in (0, 1), r.err
    lines = [line for line in r.err.splitlines() if "a worker was replaced" in line]
    assert lines and "after 90008" in lines[0] and "_fill_kv_indices" in lines[0], r.err
    report = json.loads(out.read_text())
    assert any("after 90008" in why for why in report["worker_replacements"]), report["worker_replacements"]
    # Every cell still ran on a clean worker.
    assert {c["toggles"][0] if c["toggles"] else "": c["verdict"] for c in report["cells"]}[str(BENIGN)] == "PASS"


def test_a_revert_whose_module_needs_a_package_this_machine_lacks_is_told_apart():
    """Only a missing third-party module makes a revert unavailable here (SKIP, and its targets
    never entered); a missing module of the code base or of sglfix stays a failure (ERROR)."""
    from sglfix.execution.session import _missing_dependency
    from sglfix.patching.targets import TargetError

    def raised(cause: BaseException) -> BaseException:
        try:
            try:
                raise cause
            except BaseException as exc:
                raise TargetError("target 'x.y': importing x failed") from exc
        except TargetError as err:
            return err

    assert _missing_dependency(raised(ModuleNotFoundError("No module named 'cutlass'", name="cutlass"))) == "cutlass"
    assert _missing_dependency(raised(ModuleNotFoundError("no", name="cutlass.cute"))) == "cutlass.cute"
    assert _missing_dependency(raised(ModuleNotFoundError("no", name="sglfix.backends.nowhere"))) is None
    assert _missing_dependency(raised(ImportError("cannot import name 'f'"))) is None
    assert _missing_dependency(raised(ValueError("no match"))) is None


OOM_ONCE, OOM_ALWAYS = 90017, 90018


def _oom_toggles(d: Path, marker: Path) -> None:
    """The code under test runs out of GPU memory: the first time only (what another worker's
    memory does to a cell), and every time (the cell's own need)."""
    raise_oom = "raise __import__('torch').OutOfMemoryError('CUDA out of memory. Tried to allocate 384.00 MiB')"
    write_toggle(
        d,
        OOM_ONCE,
        preamble=f"""
        import os
        if os.path.exists({str(marker)!r}):
            os.remove({str(marker)!r})
            {raise_oom}
    """,
    )
    write_toggle(d, OOM_ALWAYS, preamble=raise_oom)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_cell_out_of_memory_beside_other_workers_runs_again_alone(tmp_path, jobs):
    """Out of GPU memory beside other workers says nothing of the cell: it runs again alone, and
    that result is its own (PASS here, ERROR when it needs the memory itself). A lone worker's
    result stands as it came."""
    d = tmp_path / "toggles"
    d.mkdir()
    marker = tmp_path / "oom-once"
    marker.touch()
    _oom_toggles(d, marker)
    cells = [cell(SCEN, str(OOM_ONCE)), cell(SCEN, str(OOM_ALWAYS)), cell(SCEN), cell(SCEN2)]
    with WorkerPool(WorkerConfig(device="cpu", toggles_dir=str(d), timeout=120), jobs=jobs) as p:
        results = p.run(cells)
        pids = p.pids
    assert_matched(results, cells)
    assert not any(alive(pid) for pid in pids)
    once, always, *rest = results
    assert [r.verdict for r in rest] == ["PASS", "PASS"]
    assert always.verdict == "ERROR" and always.findings[0]["type"] == "OutOfMemoryError", always.findings
    assert not marker.exists()
    # The message says who was not the cause, and never blames --jobs when the cell ran alone.
    own = "the cell needs more than the GPU had free"
    if jobs == 1:
        assert once.verdict == "ERROR" and p.reran_alone == [], p.reran_alone
        for r in (once, always):
            assert "no other worker of this run shared its GPU" in r.findings[0]["message"], r.findings
            assert own in r.findings[0]["message"] and "--jobs" not in r.findings[0]["message"]
        return
    assert once.verdict == "PASS", once.findings
    assert "it ran out again alone, the other workers idle" in always.findings[0]["message"], always.findings
    assert own in always.findings[0]["message"] and "--jobs" not in always.findings[0]["message"]
    assert sorted(p.reran_alone) == [
        f"{OOM_ONCE}::{SCEN}: it ran out of GPU memory beside 1 other worker; alone it gave PASS",
        f"{OOM_ALWAYS}::{SCEN}: it ran out of GPU memory beside 1 other worker; alone it gave ERROR",
    ], p.reran_alone


def test_a_cell_run_again_alone_is_reported_on_the_console_and_in_the_json(tmp_path):
    from clihelp import run_cli

    d = tmp_path / "toggles"
    d.mkdir()
    marker = tmp_path / "oom-once"
    marker.touch()
    _oom_toggles(d, marker)
    (d / f"{OOM_ALWAYS}.yaml").unlink()
    out = tmp_path / "r.json"
    r = run_cli(
        "--toggles", str(d), "matrix", "-s", SCEN, "--device", "cpu", "--jobs", "2", "--no-reachability",
        "--no-cache", "--json", str(out), timeout=600, subprocess=True,
    )  # fmt: skip
    assert r.code == 0, r.err
    assert f"sglfix: ran again alone: {OOM_ONCE}::{SCEN}: it ran out of GPU memory beside 1 other worker" in r.err
    report = json.loads(out.read_text())
    assert [line.split(":")[0] for line in report["reran_alone"]] == [str(OOM_ONCE)], report["reran_alone"]
    assert {tuple(c["toggles"]): c["verdict"] for c in report["cells"]}[(str(OOM_ONCE),)] == "PASS"
    assert not report["executor"].get("mps"), report["executor"]  # no GPU here: no daemon


@pytest.mark.parametrize(
    ("exc", "oom"),
    [
        (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported asynchronously"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (ValueError("shape mismatch"), False),
    ],
)
def test_out_of_gpu_memory_is_told_by_its_text_where_torchs_own_error_does_not_reach_the_cell(exc, oom):
    """Memory gone under a kernel library (cuBLAS's workspace) or a plain CUDA call is the GPU's
    state, never the code under test's crash: an ERROR the pool runs again alone."""
    import torch

    from sglfix.harness.cell import is_out_of_gpu_memory

    assert is_out_of_gpu_memory(exc) is oom
    assert is_out_of_gpu_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
