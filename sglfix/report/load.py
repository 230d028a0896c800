"""Read a JSON report back: schema 1 (no ``schema`` key: the format before it, with or without
cell ids) and schema 2 (``build_report`` today), every field checked by type against the report's
schema (``sglfix.report.schema``) and refused in one line naming the file and the field otherwise.

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
from sglfix.report.jsonreport import SCHEMA
from sglfix.report.schema import cell_label, check_report

__all__ = [
    "SCHEMA",
    "cell_costs",
    "cell_id",
    "cell_key",
    "count_verdicts",
    "describe",
    "load_report",
    "read_json_report",
]

_FIX = "give a report written by sglfix matrix/run --json"


def cell_key(cell: dict) -> tuple[str, str]:
    """(toggle set, scenario): the same cell in any report, whatever ran it."""
    return ",".join(cell["toggles"]), cell["scenario"]


def cell_id(cell: dict) -> str:
    return cell_label(cell["toggles"], cell["scenario"])


def _other_kind(data: object) -> str | None:
    """What another sglfix JSON file is, for the error that refuses it where a report is wanted."""
    if not isinstance(data, dict):
        return None
    if data.get("tool") == "sglfix bisect":
        return "a bisect report (sglfix bisect --json)"
    if data.get("tool") == "sglfix bisect --releases":
        return "a release bisect report (sglfix bisect --releases --json)"
    if data.get("tool") == "sglfix mutate":
        return "a mutation report (sglfix mutate --json)"
    if data.get("tool") == "sglfix" and data.get("kind") == "compare":
        return "a comparison (sglfix report compare --json)"
    return None


def load_report(path: str) -> dict:
    """The report in ``path`` with ``schema`` set (1 when the file has none) and every cell
    carrying its ``id``; ConfigError (exit 2, one line naming the file) for anything else."""
    data = read_json_report(path)
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
    # Checked whole before anything reads it: a damaged report is refused here, not merged or
    # compared into a wrong answer. The dict is kept as read: the file's own values go on.
    check_report(data, where=path, fix=_FIX)
    return {
        **data,
        "schema": schema,
        "cells": [{"id": cell_id(c), **{k: v for k, v in c.items() if k != "id"}} for c in cells],
    }


MAX_REPORT_BYTES = 1 << 30  # a report of every cell of the largest matrices is tens of MB


def read_json_report(path: str, *, kind: str = "sglfix report", fix: str = _FIX) -> Any:
    """The JSON value in the report file ``path``; a one-line ConfigError naming the file, what it
    is not (``kind``) and ``fix`` else."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{path} is a directory; {fix}")
    from sglfix.common.yamlio import read_regular_bytes

    try:
        raw = read_regular_bytes(p, what=path, max_bytes=MAX_REPORT_BYTES, fix=fix)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file; {fix}") from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc}); check its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a {kind}: not UTF-8 text; {fix}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not a {kind}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {fix}"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path} is not a {kind}: JSON nested too deeply; {fix}") from None


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
