"""A candidate fix checked the way a reviewer reads it: ``sglfix matrix --apply FIX --expect-fixes
GLOB`` (every set with and without the fix), then a summary of what the fix changed, cell by cell.

    python bench/fix_check.py --profile sglang-0.5.23 --fix profiles/sglang-0.5.23/fixes/X.patch \\
        --expect probe-req-to-token-tree-ps1 [--parts] [-s GLOB ...] [--device cpu|cuda] --json OUT.json

The summary holds the device, the date, the command, the matrix's outcome, every cell's verdict and
meaning, and the cells whose verdict the fix changes (before and after). Exit 1 when the gate fails
(the fix breaks a cell, or does not clear what --expect names).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter

from relpaths import relativize


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--fix", required=True)
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("-s", "--scenario", action="append", default=[])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--parts", action="store_true")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fix-check-") as tmp:
        report_path = os.path.join(tmp, "matrix.json")
        cmd = ["sglfix", "matrix", "--profile", args.profile, "--device", args.device, "--apply", args.fix]
        cmd += ["--parts"] if args.parts else []
        for g in args.expect:
            cmd += ["--expect-fixes", g]
        for g in args.scenario:
            cmd += ["-s", g]
        started = time.perf_counter()
        proc = subprocess.run([*cmd, "--json", report_path], capture_output=True, text=True)
        wall = time.perf_counter() - started
        if not os.path.exists(report_path):
            sys.stderr.write(proc.stderr[-4000:])
            return 2
        with open(report_path) as fh:
            report = json.load(fh)
    cells = report["cells"]
    by = {c["id"]: c for c in cells}
    changed = []
    for c in cells:
        fixes = [t for t in c["toggles"] if t.startswith("+")]
        if not fixes or c.get("meaning") not in ("fixed", "broken"):
            continue
        unpatched_id = ",".join(t for t in c["toggles"] if not t.startswith("+")) or "baseline"
        twin = by.get(f"{unpatched_id}::{c['scenario']}")
        changed.append(
            {
                "cell": c["id"],
                "without_fix": twin["verdict"] if twin else None,
                "with_fix": c["verdict"],
                "meaning": c["meaning"],
                "why": c.get("why"),
            }
        )
    judged = report["judged"]
    summary = {
        "bench": "fix_check",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(cmd),
        "device": report.get("device"),
        "device_name": report.get("device_name"),
        "codebase": report.get("codebase"),
        "torch": report.get("torch"),
        "triton": report.get("triton"),
        "flashinfer": report.get("flashinfer"),
        "wall_s": round(wall, 1),
        "cells": len(cells),
        "exit_code": proc.returncode,
        "passed": judged["passed"],
        "outcome": judged["outcome"],
        "fix_summary": judged.get("fix_summary"),
        "fix_checks": judged.get("fix_checks"),
        "candidate": report.get("apply", {}).get("candidates"),
        "meanings_of_patched_cells": dict(
            sorted(Counter(c.get("meaning") for c in cells if any(t.startswith("+") for t in c["toggles"])).items())
        ),
        "changed_by_fix": changed,
        # Every cell that ran (a NOT_REACHED cell stands for its baseline's verdict: counted only).
        "not_reached": sum(c["verdict"] == "NOT_REACHED" for c in cells),
        "verdicts": {c["id"]: [c["verdict"], c.get("meaning")] for c in cells if c["verdict"] != "NOT_REACHED"},
    }
    with open(args.json, "w") as fh:
        json.dump(relativize(summary), fh, indent=1)
        fh.write("\n")
    print(judged["outcome"])
    print(f"{len(changed)} cell(s) changed by the fix; summary: {args.json}")
    return 0 if judged["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
