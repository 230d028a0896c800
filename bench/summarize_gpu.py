"""Summarise a gpu_run.sh result directory into bench/results/gpu-matrix-bench.json.

Usage: python bench/summarize_gpu.py RUN_DIR CPU_MATRIX.json OUT.json
RUN_DIR holds matrix-cuda.json, matrix-cuda-reach.json and logs.tgz unpacked (gpu.txt,
jit-state.txt). Records the device, FlashInfer version, JIT-cache state at the start of each
matrix run, wall times, the verdict summary, expectations, and verdict parity with the CPU matrix.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from relpaths import relativize


def _effective(report: dict) -> dict:
    return {
        (",".join(c["toggles"]), c["scenario"]): c["findings"][0]["same_as"]
        if c["verdict"] == "NOT_REACHED"
        else c["verdict"]
        for c in report["cells"]
    }


def main() -> int:
    run, cpu_path, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    cold = json.loads((run / "matrix-cuda.json").read_text())
    warm = json.loads((run / "matrix-cuda-reach.json").read_text())
    cpu = json.loads(Path(cpu_path).read_text())
    gpu = (run / "gpu.txt").read_text().splitlines()
    jit = (run / "jit-state.txt").read_text().split(":")[-1].strip()

    def verdicts(d: dict) -> dict:
        return {(",".join(c["toggles"]), c["scenario"]): c["verdict"] for c in d["cells"]}

    a, b = verdicts(cpu), verdicts(cold)
    common = set(a) & set(b)
    differ = sorted(k for k in common if a[k] != b[k])
    summary = {
        "what": "GPU matrix wall time (every cell, then warm with reachability), and CPU/GPU verdict parity",
        "command": ("JIT=cold bash bench/gpu_run.sh" if jit == "cold" else "bash bench/gpu_run.sh")
        + " (device call carrying .cache)",
        "sglfix_commit": subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip(),
        "date": cold["date"],
        "device": cold["device_name"],
        "gpu": gpu[0],
        "stack": gpu[1],
        "flashinfer": cold.get("flashinfer"),
        "matrix_command": cold["command"],
        "cells": len(cold["cells"]),
        "every_cell": {
            "jit_cache_at_start": "cold (FlashInfer and Triton caches removed)"
            if jit == "cold"
            else "FlashInfer JIT cache carried (warm), Triton cache as carried",
            "wall_s": cold["wall_s"],
            "command": cold["command"],
        },
        "reachability": {
            "jit_cache_at_start": "as the first run left it",
            "wall_s": warm["wall_s"],
            "command": warm["command"],
            "reachability": "--no-reachability" not in warm["command"],
            "not_reached": warm["summary"].get("NOT_REACHED", 0),
        },
        "summary": cold["summary"],
        "expectations_met": sum(c["met"] for c in cold["expectations"]),
        "expectations": len(cold["expectations"]),
        "stray": len(cold["stray"]),
        "parity_with_cpu": {
            "cpu_report": cpu_path,
            "cpu_wall_s": cpu["wall_s"],
            "common": len(common),
            "agree": len(common) - len(differ),
            "differ": [list(k) for k in differ],
            "only_in_one": len(set(a) ^ set(b)),
        },
        # Unreached cells stand for their baseline's verdict (the finding's same_as).
        "reachability_changes_no_verdict": _effective(warm) == b,
    }
    Path(out).write_text(json.dumps(relativize(summary), indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("cells", "every_cell", "reachability", "parity_with_cpu")}, indent=1))
    return 0 if not differ and len(common) == len(a) == len(b) else 1


if __name__ == "__main__":
    sys.exit(main())
