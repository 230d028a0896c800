"""Fault probe: a toggle whose reverted code segfaults, a hang, and a plain cell, on one device.

Runs through the same worker pool as ``sglfix run``. Expected: FAULT, TIMEOUT, PASS, in that order;
no worker process left after the pool closes. Prints a short table; ``--json`` writes the figures.

Usage: python bench/fault_probe.py [--device cpu|cuda] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from relpaths import relativize

TARGET = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata"
ANCHOR = "bs = forward_batch.batch_size\n"
SCENARIO = "triton-decode@cg=eager,gpu_only=off"


@dataclass(frozen=True)
class Cell:
    id: str
    scenario: object
    toggles: tuple


def _toggle(directory: Path, pr: int, preamble: str) -> None:
    patch = {
        "target": TARGET,
        "preamble": textwrap.dedent(preamble).strip() + "\n",
        "edits": [{"match": ANCHOR, "append": "pass\n"}],
    }
    (directory / f"{pr}.yaml").write_text(yaml.safe_dump({"pr": pr, "title": f"probe {pr}", "patches": [patch]}))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    args = ap.parse_args()
    from sglfix.execution.pool import WorkerConfig, WorkerPool
    from sglfix.scenario import load_scenarios

    scenario = {s.name: s for s in load_scenarios()}[SCENARIO]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _toggle(d, 91001, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
        _toggle(d, 91002, "import time\ntime.sleep(600)")
        cells = [Cell("segv", scenario, ("91001",)), Cell("hang", scenario, ("91002",)), Cell("plain", scenario, ())]
        timeout = 20.0
        config = WorkerConfig(device=args.device, toggles_dir=str(d), timeout=timeout)
        rows = []
        t0 = time.monotonic()
        with WorkerPool(config, jobs=1) as pool:
            info = pool.info
            for c in cells:
                t = time.monotonic()
                (r,) = pool.run([c])
                rows.append(
                    {
                        "cell": c.id,
                        "verdict": r.verdict,
                        "seconds": round(time.monotonic() - t, 2),
                        "message": r.key_figure,
                    }
                )
            pids = list(pool.pids)
        time.sleep(0.5)
        left = [p for p in pids if _alive(p)]
    ok = [r["verdict"] for r in rows] == ["FAULT", "TIMEOUT", "PASS"] and not left
    data = {
        "device": info.get("device"),
        "device_name": info.get("device_name"),
        "timeout_s": timeout,
        "cells": rows,
        "workers_started": len(pids),
        "workers_left": left,
        "ok": ok,
        "wall_s": round(time.monotonic() - t0, 2),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(relativize(data), indent=1) + "\n")
    print(f"{'cell':>6} {'verdict':>8} {'s':>6}  message")
    for r in rows:
        print(f"{r['cell']:>6} {r['verdict']:>8} {r['seconds']:>6}  {r['message'][:80]}")
    print(f"workers started {len(pids)}, left {len(left)}; ok={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
