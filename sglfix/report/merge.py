"""One report from shards: the union of the cells, the summary recounted, the rest combined.

- The same cell (toggle set, scenario) in two inputs: kept once (the first input's copy) when the
  verdicts agree; a one-line error naming the cell and both files when they do not.
- ``expectations``: the inputs' checks, duplicates removed; the same expectation checked in
  several shards becomes one check over all the scenarios the shards ran (``got`` joined, ``met``
  recomputed as ``check_expectations`` does: the wanted verdict on at least one of them, a
  NOT_REACHED cell counting as its baseline's verdict, a cell showing one of the reports' known
  divergences meeting a wanted PASS).
- ``stray``: concatenated, duplicates removed. ``not_run``: likewise, less the expectations some
  shard did check.
- ``wall_s``: the largest (shards run side by side). Device and environment fields (device,
  device_name, host, python, torch, ...): the common value, or ``"mixed"`` when the inputs differ;
  ``merged_from`` records each input's own.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
from collections.abc import Sequence
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.common.verdicts import stands_for
from sglfix.report.jsonreport import SCHEMA
from sglfix.report.load import cell_id, cell_key, count_verdicts, describe

__all__ = ["ENV_FIELDS", "MIXED", "merge_reports"]

ENV_FIELDS = (
    "device",
    "device_name",
    "host",
    "python",
    "torch",
    "triton",
    "flashinfer",
    "sglfix",
    "env_revert",
    "codebase",
)
MIXED = "mixed"


def merge_reports(inputs: Sequence[tuple[str, dict]], *, command: Sequence[str]) -> dict:
    """``inputs``: (path, report as ``load_report`` returns it), in order; ``command``: argv."""
    if not inputs:
        raise ConfigError("report merge needs at least one report")
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
    merged_cells = list(cells.values())
    reports = [r for _, r in inputs]
    verdicts = {key: stands_for(c.get("verdict"), c.get("findings")) for key, c in cells.items()}
    devices = {key: c.get("device") for key, c in cells.items()}
    known = _merge_known([k for r in reports for k in r.get("known_divergences", [])])
    expectations = _merge_expectations(
        [e for r in reports for e in r.get("expectations", [])], verdicts, devices=devices, known=known
    )
    checked = {f"revert {','.join(e['revert'])} on {e['scenario']}" for e in expectations if _is_check(e)}
    walls = [r["wall_s"] for r in reports if isinstance(r.get("wall_s"), (int, float))]
    out: dict[str, Any] = {
        "tool": "sglfix",
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(command),
    }
    for key in ENV_FIELDS:
        values = {_hashable(r.get(key)) for r in reports}
        out[key] = reports[0].get(key) if len(values) == 1 else MIXED
    out.update(
        {
            "wall_s": max(walls) if walls else None,
            "cells": merged_cells,
            "summary": count_verdicts(merged_cells),
            "expectations": expectations,
            "stray": _unique([s for r in reports for s in r.get("stray", [])]),
            "not_run": [n for n in _unique([n for r in reports for n in r.get("not_run", [])]) if n not in checked],
            "known_divergences": known,
            "shards": _shard_set(inputs),
            "merged_from": [{**describe(path, r), "host": r.get("host")} for path, r in inputs],
        }
    )
    return out


def _merge_known(entries: Sequence[dict]) -> list[dict]:
    """One entry per known divergence, seen on the union of the shards' cells."""
    merged: dict[str, dict] = {}
    for k in entries:
        into = merged.setdefault(k["scenario"], {**k, "seen_on": []})
        into["seen_on"] = sorted(set(into["seen_on"]) | set(k.get("seen_on", [])))
    return list(merged.values())


def _hashable(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _unique(items: Sequence[Any]) -> list:
    seen: set[str] = set()
    out = []
    for item in items:
        key = _hashable(item)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _is_check(e: Any) -> bool:
    return (
        isinstance(e, dict)
        and isinstance(e.get("revert"), list)
        and isinstance(e.get("scenario"), str)
        and isinstance(e.get("wanted"), list)
        and isinstance(e.get("got"), dict)
    )


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
    }


def _is_known(known: Sequence[dict], *, scenario: str, verdict: str, device: Any) -> bool:
    return any(
        verdict in k.get("verdict", [])
        and k.get("device", "any") in ("any", device)
        and fnmatch.fnmatchcase(scenario, k.get("scenario", ""))
        for k in known
    )


def _meets(
    wanted: Sequence[str], revert: str, name: str, verdict: str, *, verdicts: dict, devices: dict, known: Sequence[dict]
) -> bool:
    """Whether one scenario's verdict meets an expectation: a NOT_REACHED cell counts as its
    baseline's verdict, and a known divergence meets an expectation of PASS."""
    eff = verdicts.get((revert, name), verdict) if verdict == "NOT_REACHED" else verdict
    return eff in wanted or (
        "PASS" in wanted and _is_known(known, scenario=name, verdict=eff, device=devices.get((revert, name)))
    )


def _merge_expectations(items: Sequence[Any], verdicts: dict, *, devices: dict, known: Sequence[dict]) -> list:
    by_key: dict[str, dict] = {}
    out: list = []
    for e in _unique(items):
        if not _is_check(e):
            out.append(e)
            continue
        key = _hashable([e.get("toggle"), e["revert"], e["scenario"], e["wanted"], e.get("device")])
        if key not in by_key:
            by_key[key] = dict(e)
            out.append(by_key[key])
            continue
        m = by_key[key]
        m["got"] = {**m["got"], **e["got"]}
        revert = ",".join(m["revert"])
        m["met"] = any(
            _meets(m["wanted"], revert, name, v, verdicts=verdicts, devices=devices, known=known)
            for name, v in m["got"].items()
        )
    return out
