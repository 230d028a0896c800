"""``sglfix report compare`` and ``merge`` on reports already written: the committed bench reports
(both schema-1 layouts) and small hand-built ones. No cell runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli

from sglfix.common.errors import ConfigError
from sglfix.report.compare import compare_reports
from sglfix.report.jsonreport import SCHEMA, build_report
from sglfix.report.load import load_report
from sglfix.report.merge import merge_reports

RESULTS = ROOT / "bench" / "results"
CPU = RESULTS / "matrix-cpu.json"
CUDA = RESULTS / "matrix-cuda.json"
OLD_LAYOUT = RESULTS / "matrix-cpu-3a461bc.json"
COMMITTED_REPORTS = sorted(RESULTS.glob("matrix-*.json"))


def _cell(scenario: str, toggles=(), verdict: str = "PASS", figure: str = "") -> dict:
    findings = [{"verdict": verdict, "message": figure}] if verdict != "PASS" else []
    label = ",".join(toggles) or "baseline"
    return {
        "id": f"{label}::{scenario}",
        "scenario": scenario,
        "toggles": list(toggles),
        "device": "cpu",
        "verdict": verdict,
        "findings": findings,
        "error": None,
        "timings_ms": {},
        "revert_env": None,
    }


def _report(*cells: dict, **meta) -> dict:
    data = {
        "tool": "sglfix",
        "schema": SCHEMA,
        "date": "2026-01-01T00:00:00+00:00",
        "command": "sglfix matrix",
        "device": "cpu",
        "device_name": "cpu",
        "host": "h",
        "python": "3.11",
        "torch": "2",
        "triton": "3",
        "flashinfer": None,
        "sglfix": "0.1.0",
        "env_revert": None,
        "wall_s": 1.0,
        "cells": list(cells),
        "summary": {},
        "expectations": [],
        "stray": [],
        "not_run": [],
    }
    data.update(meta)
    return data


def _write(path: Path, data) -> str:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


# --- loading -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", COMMITTED_REPORTS, ids=lambda p: p.name)
def test_committed_reports_of_every_schema_load(path):
    report = load_report(str(path))
    raw = json.loads(path.read_text())
    assert report["schema"] == raw.get("schema", 1) in (1, 2)
    assert len(report["cells"]) == len(raw["cells"]) > 0
    for cell, before in zip(report["cells"], raw["cells"]):
        label = ",".join(cell["toggles"]) or "baseline"
        assert cell["id"] == before.get("id", cell["id"]) == f"{label}::{cell['scenario']}"


def test_the_older_layout_has_no_cell_ids_and_still_compares():
    raw = json.loads(OLD_LAYOUT.read_text())
    assert "id" not in raw["cells"][0] and "not_run" not in raw  # really the older layout
    result = compare_reports(load_report(str(OLD_LAYOUT)), load_report(str(CPU)))
    assert result.common == 620 and not result.changed and not result.only_old
    assert len(result.only_new) == 3875 - 620


def test_build_report_writes_schema_2_and_it_loads_back(tmp_path):
    from sglfix.harness.result import CellResult

    results = [
        CellResult(scenario="s1", toggles=[], device="cpu"),
        CellResult(
            scenario="s1",
            toggles=["26651"],
            device="cpu",
            verdict="DIVERGE",
            findings=[{"verdict": "DIVERGE", "message": "max abs err 1"}],
        ),
    ]
    data = build_report(
        command=["sglfix", "matrix"],
        info={"device": "cpu"},
        results=results,
        cell_ids=["baseline::s1", "26651::s1"],
        wall_s=1.0,
        env_revert=None,
    )
    assert data["schema"] == SCHEMA == 2
    report = load_report(_write(tmp_path / "r.json", data))
    assert report["schema"] == 2 and [c["id"] for c in report["cells"]] == ["baseline::s1", "26651::s1"]


@pytest.mark.parametrize(
    "content,needle",
    [
        ({"tool": "sglfix", "schema": 3, "cells": []}, "newer than this sglfix reads"),
        ({"tool": "sglfix", "schema": "2", "cells": []}, "not a report schema number"),
        ({"tool": "sglfix"}, 'no "cells" list'),
        ({"tool": "sglfix", "cells": [{"scenario": "s", "toggles": []}]}, "verdict None"),
        ({"tool": "sglfix", "cells": [{"scenario": "s", "toggles": [], "verdict": "GREEN"}]}, "verdict 'GREEN'"),
        ({"tool": "sglfix", "cells": [{"scenario": "s", "toggles": "26651", "verdict": "PASS"}]}, '"toggles" list'),
        ({"tool": "sglfix", "cells": [{"toggles": [], "verdict": "PASS"}]}, '"scenario"'),
        ({"tool": "sglfix", "cells": [_cell("s"), _cell("s")]}, "appears twice"),
        ({"tool": "sglfix", "cells": [{**_cell("s"), "id": "baseline::t"}]}, "make 'baseline::s'"),
        ([1, 2], "not a sglfix report"),
    ],
)
def test_malformed_reports_are_refused_in_one_line(tmp_path, content, needle):
    path = _write(tmp_path / "bad.json", content)
    with pytest.raises(ConfigError) as info:
        load_report(path)
    message = str(info.value)
    assert "\n" not in message and path in message and needle in message, message


# --- compare -------------------------------------------------------------------------------------


def test_compare_identical_reports_exits_0():
    r = run_cli("report", "compare", str(CPU), str(CPU))
    assert r.code == 0, r.err
    assert "3875 common cells: 3875 same verdict, 0 changed" in r.out
    r = run_cli("report", "compare", str(CPU), str(CUDA), "--strict")  # CPU and GPU agree on every cell
    assert r.code == 0, r.err


def test_compare_changed_verdict_exits_1_and_names_the_cell(tmp_path):
    old = _report(
        _cell("triton-decode@cg=eager"),
        _cell("triton-decode@cg=eager", ["26651:clamp"]),
        _cell("fi-draft-topk8@cg=graph", ["27460"], "DIVERGE", "max abs err 4.39"),
    )
    new = _report(
        _cell("triton-decode@cg=eager"),
        _cell("triton-decode@cg=eager", ["26651:clamp"], "INVARIANT", "indptr not monotone at 3"),
        _cell("fi-draft-topk8@cg=graph", ["27460"]),
    )
    out_json = tmp_path / "cmp.json"
    r = run_cli(
        "report",
        "compare",
        _write(tmp_path / "old.json", old),
        _write(tmp_path / "new.json", new),
        "--json",
        str(out_json),
    )
    assert r.code == 1, (r.out, r.err)
    assert "26651:clamp" in r.out and "triton-decode@cg=eager" in r.out and "INVARIANT" in r.out
    assert "indptr not monotone at 3" in r.out  # the new key figure
    assert "was: max abs err 4.39" in r.out  # a cell that now passes shows what it was
    assert "3 common cells: 1 same verdict, 2 changed" in r.out
    data = json.loads(out_json.read_text())
    assert [(c["id"], c["old"], c["new"]) for c in data["changed"]] == [
        ("26651:clamp::triton-decode@cg=eager", "PASS", "INVARIANT"),
        ("27460::fi-draft-topk8@cg=graph", "DIVERGE", "PASS"),
    ]
    assert data["old"]["cells"] == data["new"]["cells"] == 3


def test_cells_in_one_report_only_are_listed_and_fail_only_with_strict(tmp_path):
    old = _write(tmp_path / "old.json", _report(_cell("a"), _cell("gone", ["1"])))
    new = _write(tmp_path / "new.json", _report(_cell("a"), _cell("added", ["2"])))
    r = run_cli("report", "compare", old, new)
    assert r.code == 0, r.err
    assert "1 only in " + old in r.out and "1::gone" in r.out and "2::added" in r.out
    assert run_cli("report", "compare", old, new, "--strict").code == 1


def test_compare_json_to_stdout_is_json_only(tmp_path):
    r = run_cli("report", "compare", str(OLD_LAYOUT), str(CPU), "--json", "-")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["old"]["schema"] == 1 and data["common_cells"] == 620 and len(data["only_new"]) == 3255


# --- merge ---------------------------------------------------------------------------------------


def _halves(tmp_path: Path) -> tuple[str, str]:
    whole = json.loads(CPU.read_text())
    cells = whole["cells"]
    # Interleaved, so every toggle set and scenario family is split between the shards.
    a = {**whole, "cells": cells[0::2], "wall_s": 250.0}
    b = {**whole, "cells": cells[1::2], "wall_s": 260.0}
    return _write(tmp_path / "a.json", a), _write(tmp_path / "b.json", b)


def test_merge_of_two_halves_compares_equal_to_the_whole(tmp_path):
    a, b = _halves(tmp_path)
    merged_path = tmp_path / "merged.json"
    r = run_cli("report", "merge", a, b, "-o", str(merged_path))
    assert r.code == 0, r.err
    assert "3875 cells" in r.out
    merged, whole = load_report(str(merged_path)), load_report(str(CPU))
    assert merged["schema"] == SCHEMA
    result = compare_reports(whole, merged)
    assert result.common == 3875 and not result.changed and not result.only_old and not result.only_new
    assert merged["summary"] == whole["summary"]
    assert merged["expectations"] == whole["expectations"] and merged["stray"] == whole["stray"]
    assert merged["wall_s"] == 260.0 and merged["device"] == "cpu"
    assert [m["file"] for m in merged["merged_from"]] == [a, b]
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temp file left behind
    r = run_cli("report", "compare", str(CPU), str(merged_path), "--strict")
    assert r.code == 0, r.out


def test_the_gate_refuses_a_set_of_shards_that_lacks_or_repeats_one(tmp_path):
    a, b = _halves(tmp_path)
    for path, shard in ((a, "1/2"), (b, "2/2")):
        data = json.loads(Path(path).read_text())
        data["shard"] = shard
        # Shards of one plan (sglfix.execution.shards.plan_identity): the same on each.
        data["plan"] = {"command": "matrix", "profile": "reproduction", "toggles": "sha256:0", "cells": "3875 cells"}
        Path(path).write_text(json.dumps(data))
    out = str(tmp_path / "m.json")
    whole = run_cli("report", "merge", a, b, "-o", out, "--gate")
    assert whole.code == 0, whole.out + whole.err
    assert load_report(out)["shards"]["missing"] == []
    one = run_cli("report", "merge", a, "-o", out, "--gate")
    assert one.code == 1 and "SHARDS shard 2/2 missing" in one.out, one.out
    twice = run_cli("report", "merge", a, a, "-o", out, "--gate")
    assert twice.code == 1 and "SHARDS shard 1/2 given more than once" in twice.out, twice.out
    partial = run_cli("report", "merge", a, "-o", out, "--gate", "--partial")
    assert partial.code == 0, partial.out
    shards = load_report(out)["shards"]
    assert shards["partial_allowed"] is True and shards["missing"] == [2]  # the report says it is partial
    assert run_cli("report", "merge", a, a, "-o", out, "--gate", "--partial").code == 1  # a repeat never passes
    unsharded = run_cli("report", "merge", a, str(CPU), "-o", out, "--gate")
    assert unsharded.code == 1 and "not a shard, merged with shards" in unsharded.out
    assert_one_line_error(run_cli("report", "merge", str(CPU), "-o", out, "--partial"), "--partial")


def test_merge_keeps_identical_duplicates_once_and_marks_mixed_devices():
    a = _report(_cell("s1"), _cell("s2", ["1"], "DIVERGE", "x"), wall_s=5.0)
    b = _report(_cell("s2", ["1"], "DIVERGE", "y"), _cell("s3"), device="cuda", device_name="H100", wall_s=9.0)
    merged = merge_reports([("a.json", a), ("b.json", b)], command=["sglfix", "report", "merge"])
    assert [c["id"] for c in merged["cells"]] == ["baseline::s1", "1::s2", "baseline::s3"]
    assert merged["summary"] == {"PASS": 2, "DIVERGE": 1}
    assert merged["device"] == merged["device_name"] == "mixed" and merged["host"] == "h"
    assert merged["wall_s"] == 9.0 and merged["command"] == "sglfix report merge"


def test_merge_joins_an_expectation_checked_in_two_shards():
    check = {"toggle": "1", "revert": ["1"], "scenario": "s*", "wanted": ["DIVERGE"], "device": "any"}
    other = {"toggle": "3", "revert": ["3"], "scenario": "t*", "wanted": ["DIVERGE"], "device": "any"}
    a = _report(
        _cell("s1", ["1"]),
        _cell("s9", ["2"], "CRASH"),
        expect=[check, other],
        expectations=[{**check, "met": False, "got": {"s1": "PASS"}}],
    )
    b = _report(
        _cell("s2", ["1"], "DIVERGE"),
        _cell("s9", ["2"], "CRASH"),
        expect=[check, other],
        expectations=[{**check, "met": True, "got": {"s2": "DIVERGE"}}],
    )
    merged = merge_reports([("a", a), ("b", b)], command=["sglfix"])
    # Judged again over the merged cells: met on s2, the stray cell once, the unrun set with its reason.
    assert merged["expectations"] == [{**check, "met": True, "got": {"s1": "PASS", "s2": "DIVERGE"}}]
    assert [(s["toggles"], s["scenario"], s["verdict"]) for s in merged["stray"]] == [(["2"], "s9", "CRASH")]
    assert merged["not_run"] == ["revert 3 on t* (its toggle set did not run)"]


def test_merge_counts_a_known_divergence_of_the_cells_device_as_meeting_a_wanted_pass():
    check = {"toggle": "1", "revert": ["1"], "scenario": "m*", "wanted": ["PASS"], "device": "any"}
    known = {
        "scenario": "m*",
        "verdict": ["DIVERGE"],
        "reason": "upstream",
        "reproduce": "sglfix run",
        "device": "cuda",
        "seen_on": ["m1"],
    }

    def shard(name: str, device: str, with_known: bool) -> dict:
        cell = {**_cell(name, ["1"], "DIVERGE"), "device": device}
        return _report(
            cell,
            expectations=[{**check, "met": with_known, "got": {name: "DIVERGE"}}],
            known_divergences=[known] if with_known else [],
        )

    merged = merge_reports([("a", shard("m1", "cuda", True)), ("b", shard("m2", "cuda", True))], command=["sglfix"])
    assert merged["expectations"][0]["met"] is True
    assert (
        merge_reports([("a", shard("m1", "cuda", False)), ("b", shard("m2", "cuda", False))], command=["sglfix"])[
            "expectations"
        ][0]["met"]
        is False
    )
    # The entry is for CUDA: the same divergence on the CPU stays unmet.
    assert (
        merge_reports([("a", shard("m1", "cpu", True)), ("b", shard("m2", "cpu", True))], command=["sglfix"])[
            "expectations"
        ][0]["met"]
        is False
    )


def test_conflicting_shards_are_a_one_line_error_and_write_nothing(tmp_path):
    a = _write(tmp_path / "a.json", _report(_cell("s1"), _cell("s2", ["27460"], "DIVERGE", "x")))
    b = _write(tmp_path / "b.json", _report(_cell("s2", ["27460"], "CRASH", "y")))
    target = tmp_path / "out.json"
    target.write_text("previous")
    line = assert_one_line_error(run_cli("report", "merge", a, b, "-o", str(target)), "27460::s2", a, b)
    assert "DIVERGE" in line and "CRASH" in line
    assert target.read_text() == "previous"
    loud = run_cli("report", "merge", a, b, "-o", str(target), "--debug")
    assert loud.code == 2 and "Traceback" in loud.err


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda d: str(d / "missing.json"), "no such file"),
        (lambda d: _write(d / "x.json", {"cells": []}), "not a sglfix report"),
        (lambda d: _write(d / "x.json", "not json {"), "not JSON"),
        (lambda d: str(RESULTS / "fault-cuda.json"), "not a sglfix report"),  # has "cells", is no report
        (lambda d: str(d), "is a directory"),
    ],
)
@pytest.mark.parametrize("command", ["compare", "merge"])
def test_bad_input_files_are_one_line_errors(tmp_path, make, needle, command):
    bad = make(tmp_path)
    args = (
        ["compare", bad, str(CPU)] if command == "compare" else ["merge", str(CPU), bad, "-o", str(tmp_path / "m.json")]
    )
    assert_one_line_error(run_cli("report", *args), bad, needle)
    assert not (tmp_path / "m.json").exists()


def test_unwritable_outputs_are_one_line_errors(tmp_path):
    missing = str(tmp_path / "no" / "dir" / "m.json")
    assert_one_line_error(run_cli("report", "merge", str(CPU), "-o", missing), "--output", "does not exist")
    assert_one_line_error(run_cli("report", "merge", str(CPU), "-o", str(tmp_path)), "--output", "is a directory")
    assert_one_line_error(
        run_cli("report", "compare", str(CPU), str(CPU), "--json", missing), "--json", "does not exist"
    )
    assert_one_line_error(run_cli("report", "merge", str(CPU)), "--output")


def test_bare_report_prints_its_help():
    r = run_cli("report")
    assert r.code == 0 and "compare" in r.out and "merge" in r.out, r.err


def test_bench_parity_wraps_report_compare(tmp_path):
    out = tmp_path / "parity.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "parity.py"), str(CPU), str(CUDA), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    committed = json.loads((RESULTS / "parity-cpu-cuda.json").read_text())
    data = json.loads(out.read_text())
    assert {k: data[k] for k in ("common_cells", "agree", "differ", "missing_in_one")} == {
        k: committed[k] for k in ("common_cells", "agree", "differ", "missing_in_one")
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "parity.py"), str(OLD_LAYOUT), str(CPU)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "3255 in one report only" in proc.stdout  # exit 1: cells in one only


def test_sigterm_while_a_report_is_written_leaves_no_temp_file_and_exits_143(tmp_path):
    """SIGTERM at the worst moment (the report's temp file written, not yet renamed): one line,
    exit 143, neither the report nor its temp file left."""
    import subprocess
    import sys

    out = tmp_path / "merged.json"
    code = (
        "import os, signal, time\n"
        "real_fsync = os.fsync\n"
        "def fsync(fd):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(10)\n"
        "    real_fsync(fd)\n"
        "os.fsync = fsync\n"
        "from sglfix.cli import main\n"
        f"main(['report', 'merge', {str(CPU)!r}, '-o', {str(out)!r}])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 143, (r.returncode, r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "terminated" in lines[0], r.stderr
    assert not out.exists() and not list(tmp_path.glob(".*.tmp")), list(tmp_path.iterdir())


def test_merge_gate_writes_the_one_judgement_its_gate_reads(tmp_path):
    # Shards of a run (findings mode) merged with --gate: the merged JSON's cell meanings, the
    # JUnit and the gate's exit all come from one judgement, in gate mode.
    check = {"toggle": "1", "revert": ["1"], "scenario": "s*", "wanted": ["DIVERGE"], "device": "any"}
    a = _report(_cell("s1"), _cell("s1", ["1"]), command="sglfix run", expect=[check])
    b = _report(_cell("s2"), _cell("s2", ["1"]), command="sglfix run", expect=[check])
    out, junit = tmp_path / "m.json", tmp_path / "m.xml"
    r = run_cli(
        "report", "merge", _write(tmp_path / "a.json", a), _write(tmp_path / "b.json", b),
        "-o", str(out), "--junit", str(junit), "--gate",
    )  # fmt: skip
    assert r.code == 1 and "UNMET expect" in r.out, r.out
    merged = json.loads(out.read_text())
    meanings = {c["id"]: c["meaning"] for c in merged["cells"]}
    assert merged["judged"]["mode"] == "gate"
    assert meanings["1::s1"] == meanings["1::s2"] == "unmet", meanings
    from junitparser import JUnitXml

    failed = {(suite.name, case.name) for suite in JUnitXml.fromfile(str(junit)) for case in suite if case.result}
    assert {name for _, name in failed} == {"s1", "s2"} and len(failed) == 2, failed
