"""Shards: one plan split across CI jobs or machines, ``--shard i/N``, whose reports merge
(``sglfix report merge``) into the report of the unsharded run.

A shard takes whole scenarios: every cell of a scenario (its baseline and each toggle set) lands
in the same shard, so reachability (a cell judged against its scenario's baseline) and the
expectation checks per scenario work inside a shard exactly as in the whole run, and every cell
is in exactly one shard. Scenarios are dealt by cost, largest first, each to the shard with the
least cost so far (ties: the lower shard number, then the scenario name): deterministic on any
machine, for the same plan and costs. The cost of a cell is its timing in an earlier report
(``--shard-costs REPORT.json``, read by ``sglfix.report.load.cell_costs``) when that report has the cell, else an estimate from the
scenario's size: requests x tokens x steps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sglfix.common.errors import ConfigError
from sglfix.execution.planner import Plan
from sglfix.scenario import Scenario

__all__ = ["MAX_SHARDS", "Shard", "deal", "parse_shard", "scenario_cost", "scenario_loads", "shard_plan"]

MAX_SHARDS = 1024
_SHARD_RE = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str, *, what: str = "--shard") -> Shard:
    m = _SHARD_RE.fullmatch(text or "")
    if not m:
        raise ConfigError(f"{what} {text!r}: give i/N, the i-th of N shards (e.g. 2/7)")
    index, count = int(m.group(1)), int(m.group(2))
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigError(f"{what} {text}: N must be 1 .. {MAX_SHARDS}")
    if not 1 <= index <= count:
        raise ConfigError(f"{what} {text}: i must be 1 .. {count} (shards are numbered from 1)")
    return Shard(index, count)


def scenario_cost(scenario: Scenario) -> float:
    """A size estimate of one cell of ``scenario``: requests x tokens x steps."""
    bs = scenario.batch_size
    tokens = sum(scenario.prefix_lens) + sum(scenario.extend_lens)
    steps = max(1, scenario.spec.num_steps * scenario.spec.topk if "draft" in str(scenario.mode).lower() else 1)
    graphs = 1 + (len(scenario.capture_bs) if scenario.capture_bs else 0)  # eager run + each capture
    return float(bs * max(tokens, 1) * steps * graphs)


def shard_plan(plan: Plan, shard: Shard, *, timings: Mapping[str, float] | None = None) -> Plan:
    """The part of ``plan`` shard ``shard`` runs: its scenarios with every toggle set, set-major."""
    if shard.count == 1:
        return plan
    mine = deal(scenario_loads(plan, timings=timings), shard)
    return Plan(scenarios=[s for s in plan.scenarios if s.name in mine], sets=list(plan.sets), env_ids=plan.env_ids)


def scenario_loads(plan: Plan, *, timings: Mapping[str, float] | None = None) -> dict[str, float]:
    """Each scenario's cost in ``plan``: its cells' timings in an earlier report where it has
    them, else their size estimates."""
    timings = timings or {}
    # Earlier timings are in ms and estimates in abstract units: scale the estimates by the median
    # ms per unit of the cells that have both, so the two can be added.
    per_unit = _ms_per_unit(plan, timings)
    load: dict[str, float] = {}
    for cell in plan.cells:
        cost = timings.get(cell.id)
        if cost is None:
            cost = scenario_cost(cell.scenario) * per_unit
        load[cell.scenario.name] = load.get(cell.scenario.name, 0.0) + cost
    return load


def deal(load: Mapping[str, float], shard: Shard) -> set[str]:
    """The names ``shard`` takes of ``load`` (name -> cost): largest first, each to the shard with
    the least cost so far (ties: the lower shard number; equal costs in name order)."""
    totals = [0.0] * shard.count
    mine: set[str] = set()
    for name in sorted(load, key=lambda n: (-load[n], n)):
        target = min(range(shard.count), key=lambda k: (totals[k], k))
        totals[target] += load[name]
        if target == shard.index - 1:
            mine.add(name)
    return mine


def _ms_per_unit(plan: Plan, timings: Mapping[str, float]) -> float:
    ratios = sorted(timings[c.id] / scenario_cost(c.scenario) for c in plan.cells if c.id in timings)
    return ratios[len(ratios) // 2] if ratios else 1.0
