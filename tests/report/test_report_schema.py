"""Every field of a saved report is checked by type before a merge, a comparison or ``--shard-costs``
reads it: a damaged value is one line naming the file and the field, exit 2, and nothing is
written; every report in bench/results and every report the code writes today still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli

RESULTS = ROOT / "bench" / "results"
FAST = "triton-decode@cg=eager,gpu_only=off"
# What sglfix.execution.ray_keep.Keeper.info records of a run's kept Ray actors.
KEPT = {"keep_s": 600.0, "identity": "0123456789abcdef0123", "reused": 1, "started": 1, "declined": {}, "evicted": 0}


# What sglfix.execution.shards.plan_identity records of a matrix's plan.
PLAN = {
    "command": "matrix",
    "profile": "sglang-0.5.23",
    "release": None,
    "codebase": "sglang 0.5.23",
    "toggles": "sha256:0123456789abcdef",
    "scenario": ["sglang-triton-*"],
    "scenario_file": ["mine.yaml@sha256:fedcba9876543210"],
    "backend": None,
    "memory_budget": None,
    "parts": True,
    "revert": [],
    "no_reachability": False,
    "env_baseline": False,
    "reach_file": [],
    "apply": [],
    "expect_fixes": [],
    "shard_costs": None,
    "cells": "2 cells, sha256:0011223344556677",
}


def _cell(scenario: str, toggles: list[str], verdict: str = "PASS") -> dict:
    label = ",".join(toggles) or "baseline"
    return {
        "id": f"{label}::{scenario}",
        "scenario": scenario,
        "toggles": toggles,
        "device": "cpu",
        "verdict": verdict,
        "findings": [] if verdict == "PASS" else [{"verdict": verdict, "message": "max abs err 4", "rows": 3}],
        "error": {
            "max_abs_err": 4.0,
            "max_rel_err": float("inf"),
            "bad_rows": 1,
            "rows": 3,
            "bad_fraction": 0.3333,
            "first_bad_request": 0,
            "first_bad_row": 2,
            "nonfinite": 0,
        },
        "timings_ms": {"build": 1.0, "run": 2.0, "reference": 0.5, "total": 3.5},
        "revert_env": "0",
        "kernels": {"launches": 4, "hits": 2},
        "reached": None,
        "meaning": "passed" if verdict == "PASS" else "expected",
        "why": "passed",
    }


def _good() -> dict:
    """A schema-2 report with every top-level field a run, a Ray run with kept actors and a
    merge of shards write (built here: the damage below is all that is wrong with it)."""
    check = {"toggle": "26651", "revert": ["26651"], "scenario": "s*", "wanted": ["DIVERGE"], "device": "any"}
    return {
        "tool": "sglfix",
        "schema": 2,
        "date": "2026-11-26T17:44:42+00:00",
        "command": "sglfix matrix --device cpu --executor ray --ray-keep 600",
        "device": "cpu",
        "device_name": "cpu",
        "host": "vm",
        "python": "3.11.7",
        "torch": "2.13.0+cpu",
        "triton": "3.9.0",
        "flashinfer": None,
        "sglfix": "0.1.0",
        "env_revert": None,
        "codebase": {
            "name": "sglang-0.5.23",
            "distribution": "sglang",
            "version": "0.5.23",
            "path": "/x/sglang",
            "standins": ["sgl_kernel"],
            "modules_loaded": 1288,
            "reproduction_modules_loaded": 0,
        },
        "wall_s": 2.5,
        "workers": 2,
        "executor": {"name": "ray", "kept": dict(KEPT)},
        "kernel_memo": {"memo": True, "launches": 8, "hits": 4},
        "cells": [_cell("s1", []), _cell("s1", ["26651"], "DIVERGE")],
        "summary": {"PASS": 1, "DIVERGE": 1},
        "shard": "1/2",
        "plan": dict(PLAN),
        "worker_replacements": ["a set left sglang.srt changed"],
        "shards": {
            "count": 2,
            "given": [1, 2],
            "missing": [],
            "repeated": [],
            "problems": [],
            "partial_allowed": False,
            "no_plan": [],
        },
        "merged_from": [
            {
                "file": "s1.json",
                "schema": 2,
                "date": "2026-11-26T17:40:00+00:00",
                "command": "sglfix matrix --shard 1/2",
                "device": "cpu",
                "device_name": "cpu",
                "wall_s": 2.5,
                "cells": 2,
                "summary": {"PASS": 1, "DIVERGE": 1},
                "host": "vm",
            }
        ],
        "judged": {
            "mode": "gate",
            "baseline": [],
            "passed": True,
            "exit_code": 0,
            "outcome": "gate passed (1 of 1 expectations met)",
            "counts": {"passed": 1, "expected": 1},
        },
        "expect": [check],
        "expectations": [{**check, "met": True, "got": {"s1": "DIVERGE"}}],
        "stray": [],
        "not_run": [],
        "not_checked": [],
        "known_divergences": [
            {
                "scenario": "s*",
                "verdict": ["NAN"],
                "reason": "upstream",
                "reproduce": "sglfix run -s s1",
                "device": "cpu",
                "seen_on": [],
                "status": "not seen (fixed?)",
            }
        ],
    }


def _cell0(**change):
    def damage(data: dict) -> None:
        data["cells"][0] = {**data["cells"][0], **change}

    return damage


def _top(**change):
    return lambda data: data.update(change)


def _within(key: str, **change):
    return lambda data: data.update({key: {**data[key], **change}})


# (what, damage, the field the one line names)
DAMAGED = [
    ("executor: text", _top(executor="ray"), '"executor"'),
    ("executor: unknown name", _within("executor", name="slurm"), "executor.name"),
    ("executor: kept count", _within("executor", kept={**KEPT, "started": -1}), "executor.kept.started"),
    ("executor: misspelt key", _top(executor={"nme": "local"}), "'nme'"),
    ("codebase: number", _top(codebase=5), '"codebase"'),
    ("codebase: stand-ins text", _within("codebase", standins="sgl_kernel"), "codebase.standins"),
    ("codebase: version number", _within("codebase", version=0.5), "codebase.version"),
    ("codebase: no name", _top(codebase={"version": "0.5.23"}), "codebase.name"),
    ("kernel_memo: memo text", _within("kernel_memo", memo="yes"), "kernel_memo.memo"),
    ("kernel_memo: list", _top(kernel_memo=[1]), '"kernel_memo"'),
    ("kernel_memo: negative", _within("kernel_memo", hits=-1), "kernel_memo.hits"),
    ("worker_replacements: text", _top(worker_replacements="worker died"), '"worker_replacements"'),
    ("worker_replacements: item", _top(worker_replacements=[3]), "worker_replacements[0]"),
    ("workers: text", _top(workers="4"), '"workers"'),
    ("workers: true", _top(workers=True), '"workers"'),
    ("host: number", _top(host=7), '"host"'),
    ("torch: list", _top(torch=["2.11"]), '"torch"'),
    ("env_revert: number", _top(env_revert=26738), '"env_revert"'),
    ("summary: verdict", _top(summary={"GREEN": 1}), '"summary"'),
    ("judged: passed text", _within("judged", passed="yes"), "judged.passed"),
    ("shards: incomplete", _top(shards={"count": 2}), "shards.given"),
    ("merged_from: cells text", _top(merged_from=[{"file": "a.json", "cells": "3"}]), "merged_from[0].cells"),
    (
        "not_checked: no reason",
        _top(not_checked=[{"revert": ["1"], "scenario": "x", "wanted": ["PASS"]}]),
        "not_checked[0].reason",
    ),
    ("plan: parts text", _within("plan", parts="yes"), "plan.parts"),
    ("plan: misspelt key", _within("plan", prts=True), "'prts'"),
    ("plan: no cells", _top(plan={k: v for k, v in PLAN.items() if k != "cells"}), "plan.cells"),
    ("unknown top-level key", _top(exeutor={"name": "local"}), "'exeutor'"),
    ("cell kernels", _cell0(kernels={"launches": "3", "hits": 0}), "kernels.launches"),
    ("cell reached", _cell0(reached="all"), "reached"),
    ("cell revert_env", _cell0(revert_env=0), "revert_env"),
    ("cell meaning", _cell0(meaning="fine"), "meaning"),
    ("cell error", _cell0(error={"max_abs_err": "big"}), "error.max_abs_err"),
    ("cell unknown key", _cell0(verdikt="PASS"), "'verdikt'"),
]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("good") / "good.json"
    path.write_text(json.dumps(_good()))
    return path


def test_the_undamaged_report_merges(good, tmp_path):
    out = tmp_path / "m.json"
    r = run_cli("report", "merge", str(good), "-o", str(out), "--gate")
    assert r.code in (0, 1) and out.exists(), r.err


@pytest.mark.parametrize("what,damage,field", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_a_damaged_field_is_one_line_naming_it_and_merge_writes_nothing(tmp_path, what, damage, field):
    data = _good()
    damage(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    out = tmp_path / "merged.json"
    line = assert_one_line_error(run_cli("report", "merge", str(bad), "-o", str(out), "--gate"), str(bad), field)
    assert "damaged" in line, line
    assert not out.exists(), what


SOME = [d for d in DAMAGED if d[0] in ("executor: text", "codebase: number", "kernel_memo: list", "cell kernels")]


@pytest.mark.parametrize("what,damage,field", SOME, ids=[d[0] for d in SOME])
def test_compare_and_shard_costs_refuse_the_same_damage(good, tmp_path, what, damage, field):
    data = _good()
    damage(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    out = tmp_path / "cmp.json"
    r = run_cli("report", "compare", str(good), str(bad), "--json", str(out))
    assert_one_line_error(r, str(bad), field)
    assert not out.exists()
    r = run_cli("matrix", "--shard", "1/2", "--shard-costs", str(bad), "-s", FAST, "--device", "cpu")
    assert_one_line_error(r, str(bad), field)


def _reports() -> list[Path]:
    out = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("tool") == "sglfix" and isinstance(data.get("cells"), list):
            out.append(path)
    return out


def test_every_report_in_bench_results_loads():
    from sglfix.report.load import load_report

    paths = _reports()
    # Schema 1 and 2, CPU and CUDA, sharded and merged, the reproduction and real sglang.
    assert {"matrix-cpu-3a461bc.json", "matrix-sglang-cpu.json", "matrix-sglang-cuda.json"} <= {p.name for p in paths}
    for path in paths:
        report = load_report(str(path))
        assert report["cells"] and all(c["id"] for c in report["cells"]), path


def test_what_the_code_writes_loads(tmp_path):
    """A Ray run with kept actors, a shard with a worker replaced, and their merge across two
    installs of one code base (its ``codebase`` then ``mixed``)."""
    from sglfix.harness.result import CellResult
    from sglfix.report.jsonreport import build_report
    from sglfix.report.load import load_report
    from sglfix.report.merge import merge_reports
    from sglfix.report.outcome import judge

    def written(name: str, path: str, **info) -> tuple[str, dict]:
        results = [
            CellResult(scenario="s1", toggles=[], device="cpu", kernels={"launches": 3, "hits": 1}),
            CellResult(scenario="s1", toggles=["26651"], device="cpu", verdict="NOT_REACHED", reached=[]),
        ]
        codebase = {"name": "sglang-0.5.23", "distribution": "sglang", "version": "0.5.23", "path": path}
        info = {"device": "cpu", "device_name": "cpu", "workers": 2, "codebase": codebase, **info}
        report = build_report(
            command=["sglfix", "matrix"],
            info=info,
            results=results,
            cell_ids=["baseline::s1", "26651::s1"],
            wall_s=1.5,
            env_revert=None,
        )
        report["shard"] = "1/1"
        report["worker_replacements"] = ["a set left sglang.srt changed"]
        judge(report, mode="gate").annotate(report)
        file = tmp_path / name
        file.write_text(json.dumps(report))
        return str(file), load_report(str(file))

    ray = written("ray.json", "/a/sglang", executor="ray", kept=dict(KEPT), interpreter={"memo": True})
    local = written("local.json", "/b/sglang")
    assert ray[1]["executor"] == {"name": "ray", "kept": KEPT} and ray[1]["kernel_memo"]["memo"] is True
    merged = merge_reports([ray, local], command=["sglfix", "report", "merge"])
    assert merged["codebase"] == "mixed"
    (tmp_path / "m.json").write_text(json.dumps(merged))
    assert load_report(str(tmp_path / "m.json"))["shards"]["count"] == 1
