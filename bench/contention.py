"""What slows workers down when several share one host and one GPU: the same small loads run by
1 process and by N at once, each timed in its own process.

    python3 bench/contention.py --procs 1 4 --json OUT.json

Loads: ``python`` (a pure-Python loop: the host's cores), ``launch`` (tiny CUDA kernels, a sync
every 8: launch latency and GPU time-slicing between processes), ``sync`` (a device-to-host read
after every kernel), ``malloc`` (allocations after an emptied cache: cudaMalloc and cudaFree),
``pinned`` (pinned host buffers after an emptied host cache: cudaHostAlloc).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

from relpaths import relativize

LOADS = ("python", "launch", "sync", "malloc", "pinned")


def _load(name: str) -> float:
    if name == "python":
        t = time.perf_counter()
        sum(i * i for i in range(6_000_000))
        return time.perf_counter() - t
    import torch

    x = torch.ones(256, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    if name == "launch":
        for i in range(4000):
            x.add_(1.0)
            if i % 8 == 7:
                torch.cuda.synchronize()
    elif name == "sync":
        for _ in range(2000):
            x.add_(1.0)
            x[0].item()
    elif name == "malloc":
        for _ in range(300):
            ys = [torch.empty(1 << 20, device="cuda") for _ in range(4)]
            del ys
            torch.cuda.empty_cache()
    elif name == "pinned":
        for _ in range(100):
            y = torch.empty(1 << 20, pin_memory=True)
            del y
            torch._C._host_emptyCache()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def _child(load: str, start_at: float) -> None:
    import torch

    if load != "python":
        torch.empty(1, device="cuda")
        _load(load)  # once untimed: first-use costs out of the figure
    while time.time() < start_at:  # every process starts its timed load together
        time.sleep(0.001)
    print(json.dumps({"s": _load(load)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--loads", nargs="*", default=list(LOADS))
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], float(args.child[1]))
        return
    rows = []
    for load in args.loads:
        row = {"load": load}
        for n in args.procs:
            start_at = time.time() + 8.0  # after every child imported torch and made its context
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--child", load, str(start_at)],
                    stdout=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                )
                for _ in range(n)
            ]
            times = [json.loads(p.communicate()[0].strip().splitlines()[-1])["s"] for p in procs]
            row[f"x{n}_s"] = round(sum(times) / len(times), 4)
        base = row.get(f"x{args.procs[0]}_s")
        for n in args.procs[1:]:
            row[f"x{n}_slowdown"] = round(row[f"x{n}_s"] / base, 2) if base else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        report = {
            "bench": "contention",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(relativize(report), f, indent=1)


if __name__ == "__main__":
    main()
