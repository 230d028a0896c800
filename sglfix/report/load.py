"""Read a JSON report back: schema 1 (no ``schema`` key: the format before it, with or without
cell ids) and schema 2 (``build_report`` today), checked for the shape ``compare`` and ``merge``
rely on, and refused in one line otherwise.

A cell's identity across reports is its toggle set and its scenario: ``cell_key`` (the toggles
joined with ","), shown as the cell id ``<toggle set>::<scenario>`` (``baseline`` for no toggle),
the id the planner gives it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.common.verdicts import MARKS
from sglfix.report.jsonreport import SCHEMA

__all__ = ["SCHEMA", "cell_costs", "cell_id", "cell_key", "count_verdicts", "describe", "key_figure", "load_report"]

# sglfix.execution.planner.BASELINE: the label of the empty toggle set (report imports only common).
BASELINE = "baseline"
_FIX = "give a report written by sglfix matrix/run --json"


def cell_key(cell: dict) -> tuple[str, str]:
    """(toggle set, scenario): the same cell in any report, whatever ran it."""
    return ",".join(cell["toggles"]), cell["scenario"]


def cell_id(cell: dict) -> str:
    toggles, scenario = cell_key(cell)
    return f"{toggles or BASELINE}::{scenario}"


def key_figure(cell: dict) -> str:
    """The message of the first finding with the cell's verdict ('' for PASS), as the tables show it."""
    for f in cell.get("findings") or ():
        if isinstance(f, dict) and f.get("verdict") == cell["verdict"]:
            return str(f.get("message", ""))
    return ""


def _other_kind(data: object) -> str | None:
    """What another sglfix JSON file is, for the error that refuses it where a report is wanted."""
    if not isinstance(data, dict):
        return None
    if data.get("tool") == "sglfix bisect":
        return "a bisect report (sglfix bisect --json)"
    if data.get("tool") == "sglfix" and data.get("kind") == "compare":
        return "a comparison (sglfix report compare --json)"
    return None


def load_report(path: str) -> dict:
    """The report in ``path`` with ``schema`` set (1 when the file has none) and every cell
    carrying its ``id``; ConfigError (exit 2, one line naming the file) for anything else."""
    data = _read_json(path)
    kind = _other_kind(data)
    if kind:
        raise ConfigError(f"{path} is {kind}, not a run or matrix report; give the JSON of sglfix run or matrix --json")
    if not isinstance(data, dict) or data.get("tool") != "sglfix":
        raise ConfigError(f'{path} is not a sglfix report (no "tool": "sglfix" at the top); {_FIX}')
    schema = data.get("schema", 1)
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise ConfigError(f'{path}: "schema" is {schema!r}, not a report schema number; {_FIX}')
    if schema > SCHEMA:
        raise ConfigError(
            f"{path} is report schema {schema}, newer than this sglfix reads (1 to {SCHEMA}); upgrade sglfix"
        )
    cells = data.get("cells")
    if not isinstance(cells, list):
        raise ConfigError(f'{path} is not a sglfix report (no "cells" list); {_FIX}')
    for key in ("expectations", "stray", "not_run", "known_divergences"):
        if not isinstance(data.get(key, []), list):
            raise ConfigError(f'{path}: "{key}" is not a list; the file is damaged: {_FIX}')
    _check_top(path, data)
    seen: dict[tuple[str, str], int] = {}
    checked = []
    for i, cell in enumerate(cells):
        checked.append(_check_cell(path, i, cell))
        key = cell_key(cell)
        if key in seen:
            raise ConfigError(
                f"{path}: cell {cell_id(cell)} appears twice (cells {seen[key]} and {i}); "
                f"a report holds each cell once: {_FIX}"
            )
        seen[key] = i
    return {**data, "schema": schema, "cells": checked}


MAX_REPORT_BYTES = 1 << 30  # a report of every cell of the largest matrices is tens of MB


def _read_json(path: str) -> Any:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{path} is a directory; {_FIX}")
    from sglfix.common.yamlio import read_regular_bytes

    try:
        raw = read_regular_bytes(p, what=path, max_bytes=MAX_REPORT_BYTES, fix=_FIX)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; {_FIX}") from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc}); check its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a sglfix report: not UTF-8 text; {_FIX}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not a sglfix report: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {_FIX}"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path} is not a sglfix report: JSON nested too deeply; {_FIX}") from None


def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _verdict_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(v in MARKS for v in value)


def _time_or_none(value: Any) -> bool:
    """A duration: a finite number of at least 0 (JSON from Python may hold NaN or Infinity)."""
    import math

    return value is None or (_number_or_none(value) and math.isfinite(value) and value >= 0)


def _check_top(path: str, data: dict) -> None:
    """The fields ``compare``, ``merge`` and the gate read besides the cells, by type: a damaged
    report is refused here, not merged or compared into a wrong answer."""
    damaged = f"the file is damaged: {_FIX}"
    if not _time_or_none(data.get("wall_s")):
        raise ConfigError(f'{path}: "wall_s" is {data.get("wall_s")!r}, not a duration in seconds; {damaged}')
    for key in ("device", "device_name", "date", "command", "shard"):
        if not (data.get(key) is None or isinstance(data.get(key), str)):
            raise ConfigError(f'{path}: "{key}" is {data.get(key)!r}, not text; {damaged}')
    for i, e in enumerate(data.get("expectations", [])):
        if isinstance(e, dict) and "revert" in e:  # a check (the other items are notes)
            ok = (
                isinstance(e.get("revert"), list)
                and all(isinstance(r, str) for r in e["revert"])
                and isinstance(e.get("scenario"), str)
                and isinstance(e.get("wanted"), list)
                and isinstance(e.get("got"), dict)
                and isinstance(e.get("met", True), bool)
            )
            if not ok:
                raise ConfigError(
                    f"{path}: expectations[{i}] is not a check (revert list, scenario, wanted list, "
                    f"got object, met true/false); {damaged}"
                )
        elif not isinstance(e, (dict, str)):
            raise ConfigError(f"{path}: expectations[{i}] is {e!r}; {damaged}")
    for key in ("stray", "known_divergences"):
        for i, item in enumerate(data.get(key, [])):
            if not isinstance(item, dict) or not isinstance(item.get("scenario"), str):
                raise ConfigError(f"{path}: {key}[{i}] is not an object naming a scenario; {damaged}")
    # What the judgement reads again from a saved report (sglfix.report.outcome): known divergences
    # and expectation rows, each field by type; a verdict is a list of verdict names, never a string
    # (matched by substring), and a device is any, cpu or cuda.
    for i, item in enumerate(data.get("known_divergences", [])):
        if not (_verdict_list(item.get("verdict")) and item.get("device", "any") in ("any", "cpu", "cuda")):
            raise ConfigError(
                f"{path}: known_divergences[{i}] needs a list of verdicts and a device of any, cpu or cuda; {damaged}"
            )
    rows = data.get("expect", [])
    if not isinstance(rows, list):
        raise ConfigError(f'{path}: "expect" is not a list; {damaged}')
    for i, row in enumerate(rows):
        ok = (
            isinstance(row, dict)
            and isinstance(row.get("revert"), list)
            and row["revert"]
            and all(isinstance(r, str) and r for r in row["revert"])
            and isinstance(row.get("scenario"), str)
            and _verdict_list(row.get("wanted"))
            and row.get("device", "any") in ("any", "cpu", "cuda")
        )
        if not ok:
            raise ConfigError(
                f"{path}: expect[{i}] is not an expectation (revert ids, scenario, wanted verdicts, device); {damaged}"
            )
    shard = data.get("shard")
    if shard is not None:
        i, sep, n = str(shard).partition("/")
        if not (sep and i.isascii() and i.isdigit() and n.isascii() and n.isdigit() and 1 <= int(i) <= int(n)):
            raise ConfigError(f'{path}: "shard" is {shard!r}, not I/N with 1 <= I <= N; {damaged}')
    for i, item in enumerate(data.get("not_run", [])):
        if not isinstance(item, str):
            raise ConfigError(f"{path}: not_run[{i}] is {item!r}, not text; {damaged}")


def _check_cell(path: str, i: int, cell: Any) -> dict:
    where = f"{path}: cell {i}"
    if not isinstance(cell, dict):
        raise ConfigError(f"{where} is not an object; {_FIX}")
    scenario, toggles, verdict = cell.get("scenario"), cell.get("toggles"), cell.get("verdict")
    if not isinstance(scenario, str) or not scenario:
        raise ConfigError(f'{where} has no "scenario" name; {_FIX}')
    if not isinstance(toggles, list) or not all(isinstance(t, str) and t for t in toggles):
        raise ConfigError(f'{where} ({scenario}) has no "toggles" list of toggle ids; {_FIX}')
    if verdict not in MARKS:
        raise ConfigError(f"{where} ({scenario}) has verdict {verdict!r}, not one of {', '.join(MARKS)}; {_FIX}")
    findings = cell.get("findings", [])
    if not isinstance(findings, list) or not all(
        isinstance(f, dict) and f.get("verdict") in MARKS and isinstance(f.get("message", ""), str) for f in findings
    ):
        raise ConfigError(
            f'{where} ({scenario}) has "findings" that are not a list of {{verdict, message}} objects; {_FIX}'
        )
    if not (cell.get("device") is None or isinstance(cell.get("device"), str)):
        raise ConfigError(f"{where} ({scenario}) has device {cell.get('device')!r}, not text; {_FIX}")
    timings = cell.get("timings_ms", {})
    if not (timings is None or (isinstance(timings, dict) and all(_time_or_none(v) for v in timings.values()))):
        bad = (
            next((v for v in (timings or {}).values() if not _time_or_none(v)), timings)
            if isinstance(timings, dict)
            else timings
        )
        raise ConfigError(
            f'{where} ({scenario}) has "timings_ms" that are not durations (finite, at least 0): {bad!r}; {_FIX}'
        )
    if not (cell.get("error") is None or isinstance(cell.get("error"), dict)):
        raise ConfigError(f'{where} ({scenario}) has "error" {cell.get("error")!r}, not an object; {_FIX}')
    cid = cell_id(cell)
    if "id" in cell and cell["id"] != cid:
        raise ConfigError(f"{where} has id {cell['id']!r} but its toggles and scenario make {cid!r}; {_FIX}")
    return {"id": cid, **{k: v for k, v in cell.items() if k != "id"}}


def describe(path: str, report: dict) -> dict:
    """What a comparison or a merge records about one input report."""
    return {
        "file": path,
        "schema": report["schema"],
        "date": report.get("date"),
        "command": report.get("command"),
        "device": report.get("device"),
        "device_name": report.get("device_name"),
        "wall_s": report.get("wall_s"),
        "cells": len(report["cells"]),
        "summary": count_verdicts(report["cells"]),
    }


def count_verdicts(cells: Sequence[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in cells:
        out[c["verdict"]] = out.get(c["verdict"], 0) + 1
    return out


def cell_costs(report: dict) -> dict[str, float]:
    """Cell id -> the milliseconds it took (its ``total`` timing, else the sum of its phases): what
    ``--shard-costs`` balances shards by."""
    out: dict[str, float] = {}
    for c in report.get("cells", []):
        timings = c.get("timings_ms") or {}
        total = timings.get("total")
        if not isinstance(total, (int, float)):
            total = sum(v for v in timings.values() if isinstance(v, (int, float)))
        if total > 0:
            out[cell_id(c)] = float(total)
    return out
