"""Shards: ``--shard i/N`` splits a plan by whole scenarios, balanced by cost; the shards' reports
merge into the unsharded report, cell by cell."""

from __future__ import annotations

import json
import random

import pytest
from clihelp import assert_one_line_error, run_cli

from sglfix.common.errors import ConfigError
from sglfix.execution.planner import plan_matrix
from sglfix.execution.shards import Shard, parse_shard, scenario_cost, shard_plan
from sglfix.report.load import cell_costs
from sglfix.scenario import load_scenarios
from sglfix.toggling.registry import load_registry

SUBSET = ["-s", "triton-draft-extend-v2*", "-s", "triton-decode*", "-s", "flashinfer-mla-draft*"]


@pytest.fixture(scope="module")
def plan():
    return plan_matrix(load_scenarios(), registry=load_registry(), parts=True)


def _loads(plan, shards, timings=None):
    per_unit = 1.0
    out = []
    for sub in shards:
        out.append(
            sum(
                timings.get(c.id, scenario_cost(c.scenario) * per_unit) if timings else scenario_cost(c.scenario)
                for c in sub.cells
            )
        )
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 7, 50, 400])
def test_every_cell_is_in_exactly_one_shard_and_whole_scenarios_stay_together(plan, n):
    shards = [shard_plan(plan, Shard(i, n)) for i in range(1, n + 1)]
    ids = [c.id for s in shards for c in s.cells]
    assert sorted(ids) == sorted(c.id for c in plan.cells) and len(set(ids)) == len(ids)
    for s in shards:
        assert s.sets == plan.sets  # every toggle set, the baseline first: reachability works in a shard
        assert len(s.cells) == len(s.scenarios) * len(plan.sets)
    if n > len(plan.scenarios):
        assert sum(1 for s in shards if not s.cells) == n - len(plan.scenarios)


def test_the_deal_is_deterministic_and_balanced(plan):
    n = 7
    first = [[s.name for s in shard_plan(plan, Shard(i, n)).scenarios] for i in range(1, n + 1)]
    shuffled = list(plan.scenarios)
    random.Random(5).shuffle(shuffled)
    other = type(plan)(scenarios=shuffled, sets=plan.sets, env_ids=plan.env_ids)
    again = [sorted(s.name for s in shard_plan(other, Shard(i, n)).scenarios) for i in range(1, n + 1)]
    assert [sorted(x) for x in first] == again  # the order the scenarios came in does not matter
    loads = _loads(plan, [shard_plan(plan, Shard(i, n)) for i in range(1, n + 1)])
    biggest = max(scenario_cost(s) for s in plan.scenarios) * len(plan.sets)
    assert max(loads) <= sum(loads) / n + biggest  # the largest-first greedy bound


def test_timings_from_an_earlier_report_steer_the_deal(plan):
    names = [s.name for s in plan.scenarios]
    heavy = names[0]
    timings = {c.id: (1e6 if c.scenario.name == heavy else 1.0) for c in plan.cells}
    shards = [shard_plan(plan, Shard(i, 3), timings=timings) for i in (1, 2, 3)]
    alone = [s for s in shards if heavy in {x.name for x in s.scenarios}]
    assert len(alone) == 1 and [x.name for x in alone[0].scenarios] == [heavy]
    report = {
        "cells": [
            {"toggles": list(c.toggles), "scenario": c.scenario.name, "timings_ms": {"run": 2.0, "check": 1.5}}
            for c in plan.cells[:5]
        ]
    }
    assert cell_costs(report) == {c.id: 3.5 for c in plan.cells[:5]}
    report["cells"][0]["timings_ms"]["total"] = 4.0  # a total, when there, is the cell's time
    assert cell_costs(report)[plan.cells[0].id] == 4.0


@pytest.mark.parametrize("text", ["", "1", "0/3", "4/3", "1/0", "a/b", "1/2/3", "-1/3", "1/100000"])
def test_bad_shard_values_are_one_line_errors(text):
    with pytest.raises(ConfigError):
        parse_shard(text)
    r = run_cli("matrix", "--shard", text, "-s", "triton-decode*", "--device", "cpu")
    assert_one_line_error(r, "--shard")
    assert parse_shard(" 2 / 7 ") == Shard(2, 7)


def test_shard_costs_needs_a_shard_and_a_readable_report(tmp_path):
    r = run_cli("run", "-s", "triton-decode*", "--device", "cpu", "--shard-costs", str(tmp_path / "x.json"))
    assert_one_line_error(r, "--shard-costs", "--shard")
    r = run_cli(
        "run", "-s", "triton-decode*", "--device", "cpu", "--shard", "1/2", "--shard-costs", str(tmp_path / "x.json")
    )
    assert_one_line_error(r, "x.json")


def _strip(cell: dict) -> dict:
    # Timings and the kernel memo's counts depend on what a worker ran before; the rest may not.
    return {k: v for k, v in cell.items() if k not in ("timings_ms", "kernels")}


def _key(item) -> str:
    return json.dumps(item, sort_keys=True)


def test_merged_shards_equal_the_unsharded_matrix_cell_by_cell(tmp_path):
    whole = tmp_path / "whole.json"
    r = run_cli("matrix", "--parts", *SUBSET, "--device", "cpu", "--json", str(whole), timeout=900)
    assert r.code == 0, r.out[-2000:] + r.err[-2000:]
    expected = json.loads(whole.read_text())
    cells = {(",".join(c["toggles"]), c["scenario"]): _strip(c) for c in expected["cells"]}
    assert any(c["verdict"] == "NOT_REACHED" for c in expected["cells"]) and expected["expectations"]
    for n in (2, 3, 7):
        paths = []
        for i in range(1, n + 1):
            path = tmp_path / f"shard-{n}-{i}.json"
            r = run_cli(
                "matrix",
                "--parts",
                *SUBSET,
                "--device",
                "cpu",
                "--shard",
                f"{i}/{n}",
                "--json",
                str(path),
                "--jobs",
                "1",
                timeout=900,
            )
            assert r.code == 0, (n, i, r.out[-2000:], r.err[-2000:])
            assert json.loads(path.read_text())["shard"] == f"{i}/{n}"
            paths.append(str(path))
        merged_path = tmp_path / f"merged-{n}.json"
        r = run_cli("report", "merge", *paths, "-o", str(merged_path), "--gate")
        assert r.code == 0, r.out + r.err
        merged = json.loads(merged_path.read_text())
        got = {(",".join(c["toggles"]), c["scenario"]): _strip(c) for c in merged["cells"]}
        assert got == cells, n
        assert sorted(map(_key, merged["expectations"])) == sorted(map(_key, expected["expectations"])), n
        assert merged["summary"] == expected["summary"]
        assert sorted(map(_key, merged["stray"])) == sorted(map(_key, expected["stray"]))
        assert sorted(merged["not_run"]) == sorted(expected["not_run"])
