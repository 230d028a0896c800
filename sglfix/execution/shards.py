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

Every shard's report carries its plan's identity (``plan_identity``): what chose its cells and
what they mean (the selection, the toggle sets asked for, the code base and the toggle files, the
options that change either, the deal's costs) and a digest of the whole plan's cell ids.
``sglfix report merge`` joins only shards whose identities agree, so that a set of shards is one
plan split, never pieces of several.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.execution.planner import Plan
from sglfix.scenario import Scenario

__all__ = [
    "MAX_SHARDS",
    "Shard",
    "deal",
    "parse_shard",
    "plan_identity",
    "scenario_cost",
    "scenario_loads",
    "shard_plan",
]

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


def plan_identity(
    *,
    command: str,
    options: Mapping[str, Any],
    cells: Iterable[str],
    profile: Any,
    registry_dir: str,
    candidates: Sequence[Any] = (),
    record: Sequence[str] = (),
    timings: Mapping[str, float] | None = None,
) -> dict:
    """What makes a plan this plan, as a report records it (``plan``): ``command`` (run, matrix,
    bisect) and its parsed ``options`` (the ones that choose cells or change what they mean),
    ``cells`` (the ids of the whole plan, before any shard took its part), the ``profile`` (its
    code base), the toggle files at ``registry_dir``, the candidate fixes applied, the functions
    each cell records (--reach-file) and the timings that dealt the shards (--shard-costs). Files
    are named by name and content, never by where they are: the same plan on two machines has
    the same identity."""
    ids = sorted(set(cells))
    listed = "\n".join(ids)
    return {
        "command": command,
        "profile": profile.asked or profile.name,
        "release": _release_of(profile),
        "codebase": _codebase_of(profile),
        "toggles": _files_digest(registry_dir),
        "scenario": sorted(set(options.get("scenario") or ())),
        "scenario_file": [_file_ref(f) for f in options.get("scenario_file") or ()],
        "backend": options.get("backend"),
        "memory_budget": options.get("memory_budget"),
        "parts": bool(options.get("parts")),
        "revert": [str(r) for r in options.get("revert") or options.get("candidates") or ()],
        "no_reachability": bool(options.get("no_reachability")),
        "env_baseline": bool(options.get("env_baseline")),
        "reach_file": list(record),
        "apply": [f"{c.id}@{c.sha256[:12]}" for c in candidates],
        "expect_fixes": list(options.get("expect_fixes") or ()),
        "shard_costs": _digest(json.dumps(sorted(timings.items()))) if timings else None,
        "cells": f"{len(ids)} cells, {_digest(listed)}",
    }


def _digest(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def _file_ref(path: str) -> str:
    """A scenario file as ``name@digest`` (its path differs between machines, its content not)."""
    try:
        return f"{Path(path).name}@{_digest(Path(path).read_bytes())}"
    except OSError:
        return Path(path).name


def _files_digest(directory: str) -> str:
    """The toggle files of ``directory`` (and their variants) by name and content."""
    h = hashlib.sha256()
    root = Path(directory)
    for f in sorted([*root.glob("*.yaml"), *root.glob("variants/*.yaml")]):
        try:
            data = f.read_bytes()
        except OSError:
            continue
        h.update(f"{f.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return "sha256:" + h.hexdigest()[:16]


def _codebase_of(profile: Any) -> str | None:
    """``distribution version`` of the code base the profile replays (None: not importable)."""
    from sglfix.codebases import installed

    found = installed(profile)
    return f"{found.distribution} {found.version}" if found is not None else None


def _release_of(profile: Any) -> str | None:
    """The release (--release) the code base was fetched as, when it is one of sglfix's
    fetched releases (sglfix.codebases.releases); None for the code as installed."""
    if profile.is_reproduction:
        return None
    from sglfix.codebases import installed
    from sglfix.common import cachedir

    found = installed(profile)
    if found is None:
        return None
    releases = os.path.realpath(cachedir.releases())
    return found.version if os.path.realpath(found.path).startswith(releases + os.sep) else None
