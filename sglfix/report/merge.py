"""One report from shards: the union of the cells, the summary recounted, the rest combined.

- The same cell (toggle set, scenario) in two inputs: kept once (the first input's copy) when the
  verdicts agree; a one-line error naming the cell and both files when they do not.
- What the cells mean is judged again over the merged cells (``sglfix.report.outcome.judge``),
  from the inputs' expectation rows and known divergences joined: an expectation checked in
  several shards becomes one check over every scenario the shards ran, and the merged report's
  ``expectations``, ``stray``, ``not_run``/``not_checked``, ``known_divergences`` and each cell's
  meaning are exactly what the unsharded run's would be. Inputs judged against different
  baselines (``REVERT_PR``) or of different code bases are refused.
- Shards (inputs with a ``shard``) of different plans are refused, in one line naming the first
  option that differs and its two values (``plan``, ``sglfix.execution.shards.plan_identity``):
  only shards of one command line make the whole run. A shard that records no plan (written
  before reports did) cannot be checked: ``--gate`` refuses it unless asked (``unchecked_plans``),
  a plain merge takes it, and the merged report lists it (``shards.no_plan``). The merged report's
  ``plan`` is the inputs' common plan without the shards' deal (``shard_costs``), as the unsharded
  run's; none when they do not share one.
- ``wall_s``: the largest (shards run side by side). Device and environment fields (device,
  device_name, host, python, torch, ...): the common value, or ``"mixed"`` when the inputs differ;
  ``merged_from`` records each input's own.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.report.jsonreport import SCHEMA
from sglfix.report.load import cell_id, cell_key, count_verdicts, describe
from sglfix.report.outcome import Judgement, Known, base_of, codebase_identity, expects_of, judge, mode_of

__all__ = ["ENV_FIELDS", "MIXED", "PLAN_OPTIONS", "merge_judged", "merge_reports", "no_plan", "one_plan"]

ENV_FIELDS = (
    "device",
    "device_name",
    "host",
    "python",
    "torch",
    "triton",
    "flashinfer",
    "sglfix",
    "sglfix_source",
    "env_revert",
    "codebase",
)
MIXED = "mixed"

# A plan identity's fields (``sglfix.report.schema.PlanIdentity``, made by
# ``sglfix.execution.shards.plan_identity``), in the order a difference is named, each with the
# option (or the thing) a user recognises it by.
PLAN_OPTIONS = {
    "command": "the command",
    "profile": "--profile",
    "release": "--release",
    "codebase": "the code base",
    "toggles": "the toggle files",
    "scenario": "-s",
    "scenario_file": "--scenario-file",
    "backend": "--backend",
    "memory_budget": "--memory-budget",
    "parts": "--parts",
    "revert": "-r",
    "no_reachability": "--no-reachability",
    "env_baseline": "--env-baseline",
    "reach_file": "--reach-file",
    "apply": "--apply",
    "expect_fixes": "--expect-fixes",
    "shard_costs": "--shard-costs",
    "cells": "the plan's cells",
}


def merge_reports(inputs: Sequence[tuple[str, dict]], *, command: Sequence[str]) -> dict:
    """``inputs``: (path, report as ``load_report`` returns it), in order; ``command``: argv."""
    return merge_judged(inputs, command=command)[0]


def merge_judged(
    inputs: Sequence[tuple[str, dict]],
    *,
    command: Sequence[str],
    gate: bool = False,
    unchecked_plans: bool = False,
) -> tuple[dict, Judgement]:
    """The merged report and its one judgement, which its cells carry and every output and the
    gate read: in gate mode when ``gate`` or any input ran as a gate. Shards of different plans
    are refused; with ``gate``, so is a shard that records no plan unless ``unchecked_plans``."""
    if not inputs:
        raise ConfigError("report merge needs at least one report")
    plan = one_plan(inputs, gate=gate, unchecked_plans=unchecked_plans)
    cells: dict[tuple[str, str], dict] = {}
    origin: dict[tuple[str, str], str] = {}
    for path, report in inputs:
        for c in report["cells"]:
            key = cell_key(c)
            if key not in cells:
                cells[key], origin[key] = c, path
            elif cells[key]["verdict"] != c["verdict"]:
                raise ConfigError(
                    f"cell {cell_id(c)} is {cells[key]['verdict']} in {origin[key]} but {c['verdict']} "
                    f"in {path}; shards of one report must agree: rerun that cell, or leave one "
                    f"of the files out"
                )
    merged_cells = [dict(c) for c in cells.values()]
    reports = [r for _, r in inputs]
    _same(inputs, "baseline", base_of, fix=f"merge reports run with the same {envs.REVERT_PR.name}")
    _same(inputs, "code base", codebase_identity, fix="merge reports of one code base and version")
    _same(inputs, "candidate fixes", _fixes_of, fix="merge reports run with the same --apply files")
    expects = list(dict.fromkeys(e for r in reports for e in expects_of(r)))
    known = list(dict.fromkeys(Known.from_json(k) for r in reports for k in r.get("known_divergences", [])))
    mode = "gate" if gate or any(mode_of(r) == "gate" for r in reports) else "findings"
    walls = [r["wall_s"] for r in reports if isinstance(r.get("wall_s"), (int, float))]
    out: dict[str, Any] = {
        "tool": "sglfix",
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(command),
    }
    for name in ENV_FIELDS:
        values = {_hashable(r.get(name)) for r in reports}
        out[name] = reports[0].get(name) if len(values) == 1 else MIXED
    if plan is not None:
        out["plan"] = plan
    out.update(
        {
            "wall_s": max(walls) if walls else None,
            "cells": merged_cells,
            "summary": count_verdicts(merged_cells),
            "shards": _shard_set(inputs),
            # Every input's worker replacements (a set that left state behind), with their reasons.
            "worker_replacements": [w for r in reports for w in r.get("worker_replacements") or []],
            "reran_alone": [w for r in reports for w in r.get("reran_alone") or []],
            "drifted": list({d["id"]: d for r in reports for d in r.get("drifted") or []}.values()),
            "not_applicable": list({d["id"]: d for r in reports for d in r.get("not_applicable") or []}.values()),
            "merged_from": [{**describe(path, r), "host": r.get("host")} for path, r in inputs],
        }
    )
    applied = [r["apply"] for r in reports if isinstance(r.get("apply"), dict)]
    if applied:
        # Every shard applied the same fixes (checked above); their conflicts together.
        conflicts = {d["set"]: d for a in applied for d in a.get("conflicts") or []}
        out["apply"] = {**applied[0], "conflicts": list(conflicts.values())}
    judgement = judge(out, mode=mode, expects=expects, known=known, base=base_of(reports[0]))
    judgement.annotate(out)
    return out, judgement


def no_plan(inputs: Sequence[tuple[str, dict]]) -> list[str]:
    """The inputs that are shards and record no plan (written before reports recorded one)."""
    return [path for path, r in inputs if r.get("shard") is not None and not isinstance(r.get("plan"), dict)]


def one_plan(inputs: Sequence[tuple[str, dict]], *, gate: bool, unchecked_plans: bool = False) -> dict | None:
    """The plan the inputs share (without the shards' deal, as the unsharded run records it;
    None when they do not all record one, or record different ones). Shards of different plans
    are refused in one line naming the first option that differs; with ``gate``, a shard that
    records no plan is refused unless ``unchecked_plans``."""
    unknown = no_plan(inputs)
    if unknown and gate and not unchecked_plans:
        raise ConfigError(
            f"{unknown[0]} is a shard that records no plan (written before reports recorded one): whether the "
            "shards are of one plan cannot be checked; run the shards again, or give --unchecked-plans to gate "
            "on them anyway"
        )
    plans = [_plan_of(r) for _, r in inputs]
    shards = [(path, p) for (path, r), p in zip(inputs, plans) if r.get("shard") is not None and p is not None]
    for path, plan in shards[1:]:
        first, seen = shards[0]
        for key in [*PLAN_OPTIONS, *sorted(set(seen) | set(plan))]:
            if seen.get(key) != plan.get(key):
                label = PLAN_OPTIONS.get(key, key)
                raise ConfigError(
                    f"shards {first} and {path} are of different plans: {label} is {_plan_value(seen.get(key))} "
                    f"in {first} but {_plan_value(plan.get(key))} in {path}; merge the shards of one command line "
                    "(only --shard I/N differs), or run the odd one again"
                )
    given = [p for p in plans if p is not None]
    if len(given) < len(plans):
        return None
    common = [{**p, "shard_costs": None} for p in given]
    return common[0] if all(p == common[0] for p in common) else None


def _plan_of(report: dict) -> dict | None:
    """A report's plan with every field (a field left out has the schema's default)."""
    import copy

    from sglfix.report.schema import PlanIdentity

    plan = report.get("plan")
    if not isinstance(plan, dict):
        return None
    fields = PlanIdentity.model_fields
    return {**{k: copy.deepcopy(f.default) for k, f in fields.items() if not f.is_required()}, **plan}


def _plan_value(value: Any) -> str:
    """A plan field's value as the refusal shows it."""
    if isinstance(value, bool):
        return "given" if value else "not given"
    if value is None or value == []:
        return "none"
    if isinstance(value, list):
        return " ".join(repr(v) if " " in str(v) or not v else str(v) for v in value)
    return str(value)


def _fixes_of(report: dict) -> str | None:
    """The candidate fixes a report applied (--apply), by id and content; None without."""
    applied = report.get("apply")
    if not isinstance(applied, dict):
        return None
    return ",".join(
        f"{c.get('id')}@{str(c.get('sha256'))[:12]}" for c in applied.get("candidates") or () if isinstance(c, dict)
    )


def _same(inputs: Sequence[tuple[str, dict]], what: str, of: Any, *, fix: str) -> None:
    """The inputs agree on ``of(report)`` (a report that does not record it agrees with any)."""
    seen: dict[Any, str] = {}
    for path, report in inputs:
        value = of(report)
        if value is None:
            continue
        seen.setdefault(value, path)
    if len(seen) > 1:
        (a, pa), (b, pb) = list(seen.items())[:2]
        raise ConfigError(f"{pa} and {pb} differ in {what} ({_show(a)} vs {_show(b)}); {fix}")


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(value) or "the code as installed"
    return str(value)


def _hashable(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _shard_set(inputs: Sequence[tuple[str, dict]]) -> dict | None:
    """Which shards of how many the inputs are (None when none is a shard): ``missing`` and
    ``repeated`` shard numbers, and ``problems``, the lines that fail a gate."""
    given = [(path, r.get("shard")) for path, r in inputs]
    if all(sh is None for _, sh in given):
        return None
    problems: list[str] = []
    unsharded = [path for path, sh in given if sh is None]
    if unsharded:
        problems.append(
            f"{', '.join(unsharded)} {'is' if len(unsharded) == 1 else 'are'} not a shard, merged with shards"
        )
    parsed: list[tuple[int, int]] = []
    for path, sh in given:
        if sh is None:
            continue
        try:
            index, count = (int(x) for x in str(sh).split("/"))
        except ValueError:
            problems.append(f"{path}: shard {sh!r} is not i/N")
            continue
        parsed.append((index, count))
    counts = sorted({c for _, c in parsed})
    if len(counts) > 1:
        problems.append(f"shards of different splits: {', '.join(f'of {c}' for c in counts)}")
    count = counts[0] if counts else 0
    seen = [i for i, _ in parsed]
    repeated = sorted({i for i in seen if seen.count(i) > 1})
    missing = [i for i in range(1, count + 1) if i not in seen]
    if repeated:
        problems.append(f"shard {', '.join(f'{i}/{count}' for i in repeated)} given more than once")
    if missing:
        problems.append(
            f"shard {', '.join(f'{i}/{count}' for i in missing)} missing: the merged report is not the whole run"
        )
    return {
        "count": count,
        "given": sorted(seen),
        "missing": missing,
        "repeated": repeated,
        "problems": problems,
        "partial_allowed": False,
        "no_plan": no_plan(inputs),
    }
