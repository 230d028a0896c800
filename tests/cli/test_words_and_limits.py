"""Output that names the right thing, and the limits bad input meets before any worker starts
(issue 34: the Markdown title, the code base named, --jobs, --shard-costs and the words of a few
refusals)."""

from __future__ import annotations

import json
import os

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli

DECODE = "triton-decode@cg=eager,gpu_only=off"


def test_the_markdown_title_names_the_command_past_sglfixs_own_options():
    from sglfix.report.markdown import render_markdown

    base = {"cells": [], "device": "cpu"}
    for command, title in (
        ("sglfix --profile sglang-0.5.23 matrix --parts", "### sglfix matrix"),
        ("sglfix --debug --toggles d run -r 1", "### sglfix run"),
        ("sglfix report merge a.json -o b.json --gate", "### sglfix report merge"),
    ):
        assert render_markdown({**base, "command": command}).splitlines()[0] == title, command


def test_the_code_base_is_named_in_the_header_markdown_and_junit(tmp_path):
    md, xml = tmp_path / "r.md", tmp_path / "r.xml"
    r = run_cli("run", "-s", DECODE, "--device", "cpu", "--markdown", str(md), "--junit", str(xml), subprocess=True)
    assert r.code == 0, r.err
    assert "code base: built-in reproduction" in r.out.splitlines()[0], r.out
    assert "of built-in reproduction on cpu" in md.read_text()
    assert 'name="codebase" value="built-in reproduction"' in xml.read_text()


def test_jobs_has_a_ceiling_and_never_more_workers_than_cells(tmp_path):
    line = assert_one_line_error(run_cli("run", "-j", "100000", "-s", DECODE, "--device", "cpu"), "--jobs 100000")
    assert "at most" in line
    # One cell with -j 4 starts one worker: the report's run is the same, only one process.
    out = tmp_path / "r.json"
    r = run_cli("run", "-j", "4", "-s", DECODE, "--device", "cpu", "--json", str(out), subprocess=True)
    assert r.code == 0, r.err
    data = json.loads(out.read_text())
    assert [c["verdict"] for c in data["cells"]] == ["PASS"] and data["workers"] == 1


@pytest.mark.parametrize("value", ["x", "0", "-2"])
def test_a_bad_jobs_variable_is_one_line_naming_it_before_any_cell(value):
    line = assert_one_line_error(run_cli("run", "-s", DECODE, "--device", "cpu", env={"SGLFIX_JOBS": value}))
    assert "SGLFIX_JOBS" in line and value in line, line


def test_the_jobs_variable_is_the_default_and_the_option_wins(tmp_path, monkeypatch):
    # Two cells: by default (2 on CPU) two workers; the variable says one; --jobs says two again.
    monkeypatch.delenv("SGLFIX_JOBS", raising=False)  # the suite's own (tests/conftest.py)
    two = ("-s", DECODE, "-s", "triton-decode@cg=graph,gpu_only=off")
    for env, more, workers in (({}, (), 2), ({"SGLFIX_JOBS": "1"}, (), 1), ({"SGLFIX_JOBS": "1"}, ("-j", "2"), 2)):
        out = tmp_path / "r.json"
        r = run_cli("run", *two, "--device", "cpu", *more, "--json", str(out), env=env)
        assert r.code == 0, r.err
        data = json.loads(out.read_text())
        assert len(data["cells"]) == 2 and data["workers"] == workers, (env, more, data["workers"])


def test_shard_costs_refuse_timings_that_are_not_durations(tmp_path):
    report = json.loads((ROOT / "bench/results/matrix-cpu.json").read_text())
    for bad in ("NaN", "Infinity", "-5"):
        data = dict(report, cells=[dict(c) for c in report["cells"][:4]])
        data["cells"][1]["timings_ms"] = {"total": "@"}
        path = tmp_path / "costs.json"
        path.write_text(json.dumps(data).replace('"@"', bad))
        r = run_cli("matrix", "--shard", "1/2", "--shard-costs", str(path), "-s", DECODE, "--device", "cpu")
        assert_one_line_error(r, "timings_ms", "not durations")


def test_refusals_name_the_right_thing():
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_DEBUG_REVERT_PR"}
    line = assert_one_line_error(run_cli("run", "-r", "27640", "--device", "cpu", env=env), "27640")
    assert "SGLANG_DEBUG_REVERT_PR" not in line and "did you mean '27460'" in line
    assert_one_line_error(run_cli("run", "-s", "", "--device", "cpu"), "empty scenario glob")
    line = assert_one_line_error(run_cli("run", "--timeout", "1e400", "-s", DECODE, "--device", "cpu"), "--timeout")
    assert "inf" not in line.split(":")[1]
    assert_one_line_error(run_cli("run", "--backend", "tritn", "--device", "cpu"), "did you mean 'triton'")


def test_the_memory_budget_names_a_scenario_that_was_selected():
    line = assert_one_line_error(run_cli("run", "--memory-budget", "1K", "-s", DECODE, "--device", "cpu"), DECODE)
    assert "over the memory budget of 1.0 KiB" in line


def test_a_missing_choice_and_a_non_ascii_device_are_one_line_naming_the_input():
    assert_one_line_error(run_cli("schema"), "Missing argument", "toggle", "scenario")
    for value in ("²", "cuda:²"):
        line = assert_one_line_error(run_cli("run", "--devices", value, "-s", DECODE), "is not a CUDA device")
        assert "internal error" not in line


def test_a_signal_while_a_report_is_written_leaves_no_temporary_file(tmp_path):
    """SIGTERM just after the path probe's or the report's temporary file is created (before the
    code could arm its clean-up): exit 143, neither the report nor any temporary file left. In a
    process of its own: a signal handler runs in the main thread, which an xdist worker's test may
    not be."""
    import subprocess
    import sys

    report = ROOT / "bench" / "results" / "matrix-cpu-reach.json"
    for suffix in (".check", ".tmp"):
        where = tmp_path / suffix.strip(".")
        where.mkdir()
        out = where / "merged.json"
        code = (
            "import os, signal, tempfile\n"
            "real = tempfile.mkstemp\n"
            "def mkstemp(*a, **k):\n"
            "    made = real(*a, **k)\n"
            f"    if k.get('suffix') == {suffix!r}:\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return made\n"
            "tempfile.mkstemp = mkstemp\n"
            "from sglfix.cli import main\n"
            f"main(['report', 'merge', {str(report)!r}, '-o', {str(out)!r}])\n"
        )
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=where)
        assert r.returncode == 143, (suffix, r.returncode, r.stderr[-2000:])
        assert not list(where.iterdir()), (suffix, list(where.iterdir()))


def _sigterm_scripts() -> dict[str, str]:
    """The ways SIGTERM can come while a report is written, as bench/refusals.py sends them."""
    import sys

    bench = str(ROOT / "bench")
    sys.path.insert(0, bench)
    try:
        from refusals import SIGTERM_SCRIPTS
    finally:
        sys.path.remove(bench)
    return SIGTERM_SCRIPTS


_SIGTERM_WHEN = _sigterm_scripts()


@pytest.mark.parametrize("when", list(_SIGTERM_WHEN))
def test_sigterm_delivered_to_another_thread_or_twice_leaves_no_temporary_file(tmp_path, when):
    """However the SIGTERMs come while a report is written (to a thread other than the one
    writing, or again while the temporary file is removed): exit 143, nothing left."""
    import subprocess
    import sys

    report = ROOT / "bench" / "results" / "matrix-cpu-reach.json"
    out = tmp_path / "merged.json"
    code = (
        _SIGTERM_WHEN[when]
        + f"from sglfix.cli import main\nmain(['report', 'merge', {str(report)!r}, '-o', {str(out)!r}])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 143, (r.returncode, r.stderr[-2000:])
    assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())


def test_repeated_sigterm_to_a_process_writing_reports_leaves_no_temporary_file(tmp_path):
    """A process that writes a report again and again (a second thread alive, as a run's pool
    has) gets SIGTERM after SIGTERM at random moments; each ends one write. No temporary file is
    ever left, whether the write is then abandoned or the report is whole."""
    import random
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from sglfix.common.signals import Terminated, signals_raise\n"
        "from sglfix.report.output import write_atomic\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "text = ('x' * 99 + '\\n') * 2000\n"
        "stop = Path('stop')\n"
        "with signals_raise():\n"
        "    print('ready', flush=True)\n"
        "    while True:\n"
        "        try:\n"
        "            if stop.exists():\n"
        "                break\n"
        "            write_atomic('r.json', text)\n"
        "        except Terminated:\n"
        "            pass\n"
    )
    rng = random.Random(54)
    sent = 0
    while sent < 300:  # a SIGTERM between two writes ends the process: the next one starts
        proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        try:
            assert proc.stdout.readline().strip() == "ready"
            while sent < 300 and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                sent += 1
                time.sleep(rng.uniform(0, 0.003))
            (tmp_path / "stop").touch()
            proc.wait(timeout=60)
            (tmp_path / "stop").unlink()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("r.json", "stop"))
    assert not left, left


def test_a_new_toggle_beside_the_command_is_never_ignored_silently(tmp_path):
    root = ROOT
    (tmp_path / "toggles").mkdir()
    text = (root / "toggles" / "27460.yaml").read_text().replace("27460", "27545")
    (tmp_path / "toggles" / "27545.yaml").write_text(text)
    r = run_cli("list", cwd=str(tmp_path))
    assert r.code == 0 and "27545.yaml new" in r.err and "--toggles toggles" in r.err, r.err
    r = run_cli("--toggles", "toggles", "list", "--json", cwd=str(tmp_path))
    assert r.code == 0 and "note" not in r.err and [t["id"] for t in json.loads(r.out)["toggles"]] == ["27545"]


def test_a_report_with_a_damaged_judgement_field_is_refused_and_nothing_is_written(tmp_path):
    root = ROOT
    good = json.loads((root / "bench/results/matrix-sglang-cpu.json").read_text())
    known = good["known_divergences"][0]
    bad_cases = {
        "string verdict": {"known_divergences": [{**known, "verdict": "INVARIANT"}]},
        "gpu device": {"known_divergences": [{**known, "device": "gpu"}]},
        "shard 0/2": {"shard": "0/2"},
        "bad expect row": {"expect": [{"revert": "26738", "scenario": "x", "wanted": ["CRASH"]}]},
        "NaN wall": {"wall_s": float("nan")},
    }
    for name, change in bad_cases.items():
        path = tmp_path / f"{name.replace(' ', '-').replace('/', '-')}.json"
        path.write_text(json.dumps({**good, **change}))
        out = tmp_path / "merged.json"
        r = run_cli("report", "merge", str(path), "-o", str(out), "--gate")
        assert_one_line_error(r, str(path))
        assert not out.exists(), name
