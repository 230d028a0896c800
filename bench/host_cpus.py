"""How many CPUs this machine really gives a run: what the OS reports (cores, affinity), the
cgroup's CPU quota, and a measured answer: N processes each spinning the same pure-Python loop
side by side, for N up to twice the reported cores; where the wall time starts to grow with N, the
processes no longer each have a core.

    python bench/host_cpus.py [--json F] [--work 0.4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time

from relpaths import relativize


def _spin(n: int) -> float:
    began = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i
    return time.perf_counter() - began


def _quota() -> str | None:
    for path in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        try:
            with open(path) as f:
                return f"{path}: {f.read().strip()}"
        except OSError:
            continue
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--work", type=float, default=0.4, help="seconds of work each process does alone")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    n = 200_000
    while _spin(n) < a.work:  # the loop length that takes --work seconds alone
        n *= 2
    ctx = mp.get_context("fork")
    rows = []
    for procs in sorted({1, 2, 4, 8, 12, 16, 24, 32, 48, cores, 2 * cores} - {0}):
        if procs > 2 * cores:
            continue
        with ctx.Pool(procs) as pool:
            began = time.perf_counter()
            each = pool.map(_spin, [n] * procs, chunksize=1)
            wall = time.perf_counter() - began
        rows.append({"procs": procs, "wall_s": round(wall, 3), "slowest_s": round(max(each), 3)})
        print(f"{procs:>4} processes: wall {wall:.2f} s, slowest {max(each):.2f} s", flush=True)
    alone = rows[0]["slowest_s"]
    # Throughput (loops a second, all processes together): it grows with N while each process
    # has a core of its own; one process alone runs faster than any of many (turbo), so the
    # plateau, not the time alone, says how many cores there are.
    for r in rows:
        r["throughput"] = round(r["procs"] / r["slowest_s"], 2)
    top = max(r["throughput"] for r in rows)
    cores_worth = min(r["procs"] for r in rows if r["throughput"] >= 0.9 * top)
    out = {
        "cpu_count": cores,
        "affinity": affinity,
        "cgroup_quota": _quota(),
        "alone_s": alone,
        "rows": rows,
        "cores_worth": cores_worth,
        "note": "cores_worth: the fewest processes side by side whose throughput is within 10 % of the most measured",
    }
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(relativize(out), f, indent=1)


if __name__ == "__main__":
    main()
