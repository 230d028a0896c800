"""What one CUDA graph capture costs a worker, step by step, in a fresh process on the GPU:
``torch.cuda.graph``'s enter (synchronize, cache emptying) and exit (end of capture,
instantiation), a replay, and the graph's release, for a graph of a few small kernels; then the
same with the caching allocator's memory kept (no emptying) and with one memory pool shared by
every capture, and after FlashInfer is imported (the modules a worker has loaded).

    python3 bench/capture_probe.py --json OUT.json [--captures 60]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import time


def _median_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 3)


def _captures(n: int, *, keep_cache: bool, shared_pool: bool, nodes: int) -> dict:
    import torch

    saved = torch.cuda.empty_cache
    if keep_cache:
        torch.cuda.empty_cache = lambda: None
    pool = torch.cuda.graph_pool_handle() if shared_pool else None
    x = torch.zeros(4096, device="cuda")
    steps: dict[str, list[float]] = {"enter": [], "body": [], "exit": [], "replay": [], "release": []}
    try:
        for _ in range(n):
            g = torch.cuda.CUDAGraph()
            ctx = torch.cuda.graph(g, pool=pool)
            t0 = time.perf_counter()
            ctx.__enter__()
            t1 = time.perf_counter()
            y = x
            for _k in range(nodes):
                y = y * 1.0001 + 1.0
            t2 = time.perf_counter()
            ctx.__exit__(None, None, None)
            t3 = time.perf_counter()
            g.replay()
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            del g, ctx, y
            t5 = time.perf_counter()
            for k, took in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                steps[k].append(took)
    finally:
        torch.cuda.empty_cache = saved
    return {k: _median_ms(v[5:]) for k, v in steps.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--captures", type=int, default=60)
    ap.add_argument("--nodes", type=int, default=12, help="kernels per graph")
    ns = ap.parse_args()
    import torch

    torch.empty(1, device="cuda")
    out: dict = {
        "bench": "capture_probe",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python3", "bench/capture_probe.py", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "nodes": ns.nodes,
        "rows": [],
    }
    big = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")  # a worker's cache holds a few GiB
    del big
    for label, kw in (
        ("torch default (caches emptied)", {"keep_cache": False, "shared_pool": False}),
        ("caches kept", {"keep_cache": True, "shared_pool": False}),
        ("caches kept, one shared pool", {"keep_cache": True, "shared_pool": True}),
    ):
        row = {"label": label, **_captures(ns.captures, nodes=ns.nodes, **kw)}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    with contextlib.suppress(ImportError):
        import flashinfer  # noqa: F401

        row = {
            "label": "caches kept, after import flashinfer",
            **_captures(ns.captures, nodes=ns.nodes, keep_cache=True, shared_pool=False),
        }
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    with open(ns.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
