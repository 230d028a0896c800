"""Shards: ``--shard i/N`` splits a plan by whole scenarios, balanced by cost; the shards' reports
merge into the unsharded report, cell by cell."""

from __future__ import annotations

import json
import random
from pathlib import Path

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
    # Timings and the kernel memo's counts depend on what a worker ran before, and when a served
    # result was stored on the run that stored it; the rest may not.
    return {k: v for k, v in cell.items() if k not in ("timings_ms", "kernels", "stored")}


def _key(item) -> str:
    return json.dumps(item, sort_keys=True)


def test_merged_shards_equal_the_unsharded_matrix_cell_by_cell(tmp_path):
    # The two shards run their cells; the three and the seven are served them from the store the
    # unsharded run filled (a served cell is a fresh run's: tests/test_store.py), so each cell runs
    # twice here, not four times, and every way of dealing the plan is still merged and compared.
    store = ("--cache", str(tmp_path / "store"))
    whole = tmp_path / "whole.json"
    r = run_cli(
        "matrix", "--parts", *SUBSET, "--device", "cpu", "--json", str(whole), *store, timeout=900, subprocess=True
    )
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
                *(store if n > 2 else ()),
                timeout=900,
                subprocess=True,
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
        assert merged["plan"] == expected["plan"]  # the shards' plan is the unsharded run's


# --- the plan a shard is of ------------------------------------------------------------------------

ONE = "triton-extend-ps16-bf16"  # one scenario: shard 1/3 runs it, 2/3 and 3/3 run nothing


def _shard(tmp_path, name: str, *args: str) -> str:
    path = tmp_path / f"{name}.json"
    r = run_cli(
        "matrix", "-s", ONE, "--device", "cpu", "--no-cache", "-j", "1", *args, "--json", str(path), subprocess=True
    )
    assert r.code == 0, r.out[-2000:] + r.err[-2000:]
    return str(path)


def test_shards_of_different_plans_are_refused_and_of_one_plan_merge_into_the_whole(tmp_path):
    whole = json.loads(Path(_shard(tmp_path, "whole")).read_text())
    one, two, three = (_shard(tmp_path, f"s{i}", "--shard", f"{i}/3") for i in (1, 2, 3))
    plans = [json.loads(Path(p).read_text())["plan"] for p in (one, two, three)]
    assert plans[0] == plans[1] == plans[2] == whole["plan"]
    assert whole["plan"]["scenario"] == [ONE] and whole["plan"]["parts"] is False
    # A shard of the same selection but with --parts: the set is complete (1/3, 2/3, 3/3), and
    # the gate would pass on it; it is another plan, and the merge says which option differs.
    parts = _shard(tmp_path, "p2", "--parts", "--shard", "2/3")
    out = str(tmp_path / "m.json")
    line = assert_one_line_error(run_cli("report", "merge", one, parts, three, "-o", out, "--gate"), "--parts")
    assert "different plans" in line and "not given in " + one in line and "given in " + parts in line, line
    assert not Path(out).exists()  # nothing half-written
    r = run_cli("report", "merge", one, two, three, "-o", out, "--gate")
    assert r.code == 0, r.out + r.err
    merged = json.loads(Path(out).read_text())
    assert merged["plan"] == whole["plan"]
    assert {c["id"]: c["verdict"] for c in merged["cells"]} == {c["id"]: c["verdict"] for c in whole["cells"]}


def _report(shard: str | None, **plan) -> dict:
    base = {
        "command": "matrix",
        "profile": "reproduction",
        "codebase": "sglfix (reproduction) 0.1.0",
        "toggles": "sha256:0000000000000000",
        "scenario": ["a*"],
        "cells": "2 cells, sha256:1111111111111111",
    }
    report = {
        "tool": "sglfix",
        "schema": 2,
        "cells": [{"toggles": [], "scenario": f"a{shard or ''}", "verdict": "PASS"}],
        "shard": shard,
        "plan": {**base, **plan},
    }
    if shard is None:
        del report["shard"]
    return report


def test_merge_names_the_first_option_that_differs_between_shards():
    from sglfix.report.merge import merge_judged
    from sglfix.report.schema import PlanIdentity

    def merge(*reports):
        return merge_judged([(f"s{i}.json", r) for i, r in enumerate(reports, 1)], command=["sglfix"], gate=True)

    with pytest.raises(ConfigError, match=r"-s is a\* in s1.json but b\* in s2.json"):
        merge(_report("1/2"), _report("2/2", scenario=["b*"]))
    with pytest.raises(ConfigError, match=r"--no-reachability is not given in s1.json but given in s2.json"):
        merge(_report("1/2"), _report("2/2", no_reachability=True))
    with pytest.raises(ConfigError, match=r"--shard-costs is none in s1.json but sha256:2 in s2.json"):
        merge(_report("1/2"), _report("2/2", shard_costs="sha256:2"))
    with pytest.raises(ConfigError, match=r"the plan's cells is 2 cells, sha256:1+ in s1.json but 3 cells"):
        merge(_report("1/2"), _report("2/2", cells="3 cells, sha256:2222222222222222"))
    merged, _ = merge(_report("1/2", shard_costs="sha256:2"), _report("2/2", shard_costs="sha256:2"))
    # The merged report's plan is the unsharded run's: the shards' deal is not part of it.
    assert merged["plan"] == PlanIdentity.model_validate(_report(None)["plan"]).model_dump()
    # Reports that are not shards (one selection here, another there) still merge: no plan then.
    merged, _ = merge(_report(None), _report(None, scenario=["b*"]))
    assert "plan" not in merged


def test_a_shard_that_records_no_plan_is_gated_on_only_when_asked(tmp_path):
    from sglfix.report.merge import merge_judged

    old = [_report("1/2"), _report("2/2")]
    for r in old:
        del r["plan"]  # written before reports recorded their plan: it still loads
    inputs = [("s1.json", old[0]), ("s2.json", old[1])]
    with pytest.raises(ConfigError, match=r"s1.json is a shard that records no plan.*--unchecked-plans"):
        merge_judged(inputs, command=["sglfix"], gate=True)
    merged, _ = merge_judged(inputs, command=["sglfix"], gate=True, unchecked_plans=True)
    assert merged["shards"]["no_plan"] == ["s1.json", "s2.json"] and "plan" not in merged
    assert merge_judged(inputs, command=["sglfix"])[0]["shards"]["no_plan"] == ["s1.json", "s2.json"]
    paths = []
    for i, r in enumerate(old, 1):
        paths.append(str(tmp_path / f"s{i}.json"))
        Path(paths[-1]).write_text(json.dumps(r))
    out = str(tmp_path / "m.json")
    assert_one_line_error(
        run_cli("report", "merge", *paths, "-o", out, "--gate"), "records no plan", "--unchecked-plans"
    )
    r = run_cli("report", "merge", *paths, "-o", out, "--gate", "--unchecked-plans")
    assert r.code == 0 and "record no plan: not checked" in r.err, r.out + r.err
    assert json.loads(Path(out).read_text())["shards"]["no_plan"] == paths
    assert_one_line_error(run_cli("report", "merge", *paths, "-o", out, "--unchecked-plans"), "--gate")
