"""The JSON report of a run: what ran where, every cell with its findings, the summary."""

from __future__ import annotations

import datetime
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from sglfix.common.version import source as sglfix_source

__all__ = ["SCHEMA", "build_report", "package_version", "summarize"]

# The report format's version. A report without the key is schema 1, the format before it (its
# older layout has no cell ids, no not_run, env_revert, flashinfer or sglfix keys);
# sglfix.report.load reads both. Bump it when a key changes meaning or goes away.
SCHEMA = 2


def package_version(name: str) -> str | None:
    # Read from the installed metadata: the parent never imports torch or triton.
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def summarize(results: Sequence[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in results:
        out[r.verdict] = out.get(r.verdict, 0) + 1
    return out


def _memo_summary(info: dict, results: Sequence[Any]) -> dict | None:
    """Interpreted launches and memo hits over the run (None on CUDA, where kernels are compiled)."""
    counted = [r.kernels for r in results if getattr(r, "kernels", None)]
    if not counted:
        return None
    state = info.get("interpreter") or {}
    return {
        "memo": bool(state.get("memo")),
        "launches": sum(k["launches"] for k in counted),
        "hits": sum(k["hits"] for k in counted),
    }


def build_report(
    *,
    command: Sequence[str],
    info: dict,
    results: Sequence[Any],
    cell_ids: Sequence[str],
    wall_s: float,
    env_revert: str | None,
) -> dict:
    """The report's facts; ``sglfix.report.outcome.Judgement.annotate`` adds what they mean
    (each cell's meaning, the expectations checked and not, the known divergences seen)."""
    cells = []
    for cid, r in zip(cell_ids, results):
        cells.append({"id": cid, **r.to_json()})
    return {
        "tool": "sglfix",
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(command),
        "device": info.get("device"),
        "device_name": info.get("device_name"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "torch": info.get("torch") or package_version("torch"),
        "triton": info.get("triton") or package_version("triton"),
        # The FlashInfer backends' GPU kernels (None where it is not installed).
        "flashinfer": package_version("flashinfer-python"),
        "sglfix": package_version("sglfix"),
        # The code that ran, exactly: its version and git commit (sglfix.common.version.source).
        "sglfix_source": sglfix_source(),
        "env_revert": env_revert,
        # What the cells replayed through: name, distribution, version, path, stand-ins used.
        "codebase": info.get("codebase"),
        "wall_s": round(wall_s, 2),
        # Worker processes (or Ray actors) the run started: never more than its cells.
        "workers": info.get("workers"),
        "boot_s": info.get("boot_s"),
        # Where the cells ran: local worker processes or Ray actors (with --ray-keep, how many
        # kept actors the run took warm and how many it started).
        "executor": {
            "name": info.get("executor") or "local",
            **({"kept": info["kept"]} if info.get("kept") else {}),
            # Local workers sharing a GPU through an MPS daemon (sglfix.execution.mps).
            **({"mps": True} if info.get("mps") else {}),
        },
        "kernel_memo": _memo_summary(info, results),
        "cells": cells,
        "summary": summarize(results),
        "expectations": [],
        "stray": [],
        "not_run": [],
        # The profile's known divergences (confirmed upstream bugs) and the baseline cells showing each.
        "known_divergences": [],
    }
