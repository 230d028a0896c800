"""Where a worker's time goes, cell by cell: the matrix's cells run in this process the way a
worker runs them (``serve._boot`` then ``Session.handle`` per request, no pipes), timed by phase,
by one process alone and by several at once on the same device, plus one run under cProfile.

Comparing the phase sums of one process with those of N concurrent ones shows which phase
grows when workers share a GPU (the device, the host) and which is fixed per cell (the
harness: parsing, switching sets, building, serialising the result).

    python3 bench/cell_profile.py --device cuda --procs 1 4 --sets 8 --json OUT.json

One process of ``--procs N`` takes every N-th toggle set of the plan, all scenarios each, in
plan order: what the pool's grouping by set gives a worker.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import io
import json
import os
import pstats
import subprocess
import sys
import time

from relpaths import relativize


def _plan(sets_wanted: int | None, globs: list[str]):
    from sglfix.execution.planner import plan_matrix
    from sglfix.scenario.loader import load_scenarios, select_scenarios
    from sglfix.toggling.registry import load_registry

    registry = load_registry()
    scenarios = load_scenarios()
    if globs:
        scenarios = select_scenarios(scenarios, globs=globs)
    plan = plan_matrix(scenarios, registry=registry, parts=True)
    sets = plan.sets[:sets_wanted] if sets_wanted else plan.sets
    return [c for c in plan.cells if c.toggles in sets], sets


def _child(args: argparse.Namespace) -> None:
    """One emulated worker: boot, then its share of the cells; a JSON line on stdout."""
    t0 = time.perf_counter()
    import torch

    t_torch = time.perf_counter()
    if args.device == "cuda":
        torch.empty(1, device="cuda")  # CUDA initialised: what the boot pays for the context
    t_cuda = time.perf_counter()
    from sglfix.execution.serve import _boot
    from sglfix.execution.session import Session

    info = _boot(args.device)
    boot_s = time.perf_counter() - t0
    if args.keep_cache:
        # Experiment: torch.cuda.graph empties the caching allocators (device and pinned host)
        # before every capture; keep them, so the next cell's allocations are cache hits.
        torch.cuda.empty_cache = lambda: None
        torch._C._host_emptyCache = lambda: None
    cells, sets = _plan(args.sets, args.scenario)
    mine = set(sets[args.index :: args.of])
    cells = [c for c in cells if c.toggles in mine]
    session = Session(device=info["device"], allowed_prefixes=None)
    profiler = cProfile.Profile() if args.cprofile else None
    syncs: dict[str, int] = {}
    if args.count_syncs:
        _count_syncs(syncs)
    rows = []
    start = time.perf_counter()
    for i, c in enumerate(cells):
        request = {"id": i, "toggles": list(c.toggles), "scenario": c.scenario.to_json()}
        switching = list(c.toggles) != session.current
        t = time.perf_counter()
        if args.memory:
            torch.cuda.reset_peak_memory_stats()
        profiling = profiler is not None and sets.index(c.toggles) >= args.profile_skip
        if profiling:
            profiler.enable()
        reply = session.handle(request)
        line = json.dumps(reply)  # what the worker sends
        if profiling:
            profiler.disable()
        took = time.perf_counter() - t
        result = reply.get("result") or {}
        rows.append(
            {
                "scenario": c.scenario.name,
                "set": ",".join(c.toggles) or "baseline",
                "switch": switching,
                "handle_ms": round(took * 1e3, 3),
                "reply_bytes": len(line),
                "verdict": result.get("verdict"),
                "timings_ms": result.get("timings_ms") or {},
            }
        )
        if args.memory:
            # The device memory the process holds after the cell (the allocator's cache
            # included) and the most it held during it.
            rows[-1]["reserved_mib"] = torch.cuda.memory_reserved() >> 20
            rows[-1]["peak_mib"] = torch.cuda.max_memory_reserved() >> 20
            free, total = torch.cuda.mem_get_info()
            rows[-1]["device_used_mib"] = (total - free) >> 20  # what the driver says is in use: torch's and not
            if args.memory_gc:
                # What of it only the cyclic collector frees (a graph and its memory pool kept by a
                # reference cycle), and what that collection costs.
                import gc

                graphs, storages = 0, {}
                for o in gc.get_objects():  # before the collection: what the cell left alive
                    if isinstance(o, torch.cuda.CUDAGraph):
                        graphs += 1
                    elif isinstance(o, torch.Tensor) and o.is_cuda:
                        st = o.untyped_storage()
                        storages[st.data_ptr()] = st.nbytes()
                rows[-1]["graphs_alive"] = graphs
                rows[-1]["cuda_tensor_mib"] = sum(storages.values()) >> 20
                t_gc = time.perf_counter()
                found = gc.collect()
                torch.cuda.empty_cache()
                rows[-1]["gc_ms"] = round((time.perf_counter() - t_gc) * 1e3, 2)
                rows[-1]["gc_found"] = found
                rows[-1]["reserved_after_gc_mib"] = torch.cuda.memory_reserved() >> 20
    out = {"index": args.index, "of": args.of, "boot_s": round(boot_s, 3), "wall_s": time.perf_counter() - start}
    out["boot_parts_s"] = {
        "import_torch": round(t_torch - t0, 3),
        "cuda_init": round(t_cuda - t_torch, 3),
        "boot_rest": round(boot_s - (t_cuda - t0), 3),
    }
    firsts: dict[str, list] = {}
    for r in rows:  # each backend family's first cell in this process against its later ones
        fam = r["scenario"].split("@")[0]
        firsts.setdefault(fam, []).append(r["handle_ms"])
    out["first_use_ms"] = round(sum(v[0] - min(v) for v in firsts.values() if len(v) > 1), 1)
    out["rows"] = rows
    if args.count_syncs:
        out["syncs"] = syncs
    by_set: dict[str, float] = {}
    for r in rows:  # the first set a process runs pays every first use (imports, kernel loads)
        by_set[r["set"]] = by_set.get(r["set"], 0.0) + r["handle_ms"] / 1e3
    out["set_s"] = [round(v, 2) for v in by_set.values()]
    if profiler is not None:
        if args.prof_out:
            profiler.dump_stats(args.prof_out)
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(profiler, stream=buf).sort_stats(key).print_stats(args.top)
            out[f"profile_{key}"] = buf.getvalue()
    print("RESULT " + json.dumps(out))


def _count_syncs(counts: dict[str, int]) -> None:
    """Every synchronising CUDA call from now on, counted by its Python caller (file:line):
    torch's sync debug mode warns on each, forced on for the whole cell (the harness's own
    pauses and its sync-free watch are switched off, so nothing is hidden from the count),
    plus every ``torch.cuda.synchronize()``."""
    import sys
    import warnings

    import torch

    torch.cuda.set_sync_debug_mode("warn")
    torch.cuda.set_sync_debug_mode = lambda _mode: None
    torch.cuda.get_sync_debug_mode = lambda: 0

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" in str(message):
            key = f"{filename}:{lineno}"
            counts[key] = counts.get(key, 0) + 1

    warnings.showwarning = show
    warnings.simplefilter("always")
    synchronize = torch.cuda.synchronize

    def counted(*a, **k):
        f = sys._getframe(1)
        key = f"synchronize() {f.f_code.co_filename}:{f.f_lineno}"
        counts[key] = counts.get(key, 0) + 1
        return synchronize(*a, **k)

    torch.cuda.synchronize = counted
    stream_sync = torch.cuda.Stream.synchronize

    def stream_counted(self):  # a stream's wait (the judge's batched reads) is not in the debug mode's view
        f = sys._getframe(1)
        key = f"Stream.synchronize() {f.f_code.co_filename}:{f.f_lineno}"
        counts[key] = counts.get(key, 0) + 1
        return stream_sync(self)

    torch.cuda.Stream.synchronize = stream_counted
    import sglfix.harness.syncwatch as sw

    sw.watch_syncs = lambda device, *, enabled=True: contextlib.nullcontext([])


def _spawn(n: int, args: argparse.Namespace, *, cprofile: bool = False) -> dict:
    base = [sys.executable, __file__, "--child", "--device", args.device, "--top", str(args.top)]
    if args.sets:
        base += ["--sets", str(args.sets)]
    for g in args.scenario:
        base += ["-s", g]
    if args.keep_cache:
        base.append("--keep-cache")
    if cprofile and args.profile_skip:
        base += ["--profile-skip", str(args.profile_skip)]
    if args.count_syncs:
        base.append("--count-syncs")
    if args.memory:
        base.append("--memory")
    if args.memory_gc:
        base.append("--memory-gc")
    if cprofile:
        base.append("--cprofile")
        if args.prof_out:
            base += ["--prof-out", args.prof_out]
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*base, "--index", str(i), "--of", str(n)],
            stdout=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "OMP_NUM_THREADS": "1",  # as the pool's workers run
                **({"CUDA_VISIBLE_DEVICES": str(i % args.spread)} if args.spread else {}),
            },
        )
        for i in range(n)
    ]
    children = []
    for p in procs:
        stdout, _ = p.communicate()
        line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode or line is None:
            raise SystemExit(f"cell_profile child failed (rc {p.returncode})")
        children.append(json.loads(line[len("RESULT ") :]))
    wall = time.perf_counter() - start
    return {"procs": n, "cprofile": cprofile, "wall_s": round(wall, 2), "children": children}


def _summary(run: dict) -> dict:
    """Per-phase sums over every child's cells (seconds) and the harness's own share."""
    sums: dict[str, float] = {}
    handle = outside = 0.0
    cells = switches = 0
    for child in run["children"]:
        for r in child["rows"]:
            cells += 1
            switches += r["switch"]
            handle += r["handle_ms"]
            tm = r["timings_ms"]
            for k, v in tm.items():
                sums[k] = sums.get(k, 0.0) + v
            outside += r["handle_ms"] - tm.get("total", 0.0)
    return {
        "procs": run["procs"],
        "cprofile": run["cprofile"],
        "cells": cells,
        "set_switches": switches,
        "wall_s": run["wall_s"],
        "boot_s": [c["boot_s"] for c in run["children"]],
        "cells_wall_s": [round(c["wall_s"], 2) for c in run["children"]],
        "first_sets_s": [c["set_s"][:2] for c in run["children"]],
        "boot_parts_s": [c["boot_parts_s"] for c in run["children"]],
        "first_use_s": [round(c["first_use_ms"] / 1e3, 2) for c in run["children"]],
        "handle_s": round(handle / 1e3, 2),
        "phases_s": {k: round(v / 1e3, 2) for k, v in sorted(sums.items())},
        "outside_cell_s": round(outside / 1e3, 2),
        "per_cell_ms": round(handle / max(1, cells), 2),
    }


def _by_scenario(run: dict, top: int = 15) -> list:
    acc: dict[str, float] = {}
    for child in run["children"]:
        for r in child["rows"]:
            family = r["scenario"].split("@")[0]
            acc[family] = acc.get(family, 0.0) + r["handle_ms"]
    return [[k, round(v / 1e3, 2)] for k, v in sorted(acc.items(), key=lambda kv: -kv[1])[:top]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--procs", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--sets", type=int, default=None, help="only the plan's first N toggle sets")
    ap.add_argument("-s", "--scenario", action="append", default=[])
    ap.add_argument("--profile-sets", type=int, default=3, help="toggle sets of the cProfile run (0: none)")
    ap.add_argument(
        "--profile-skip",
        type=int,
        default=0,
        help="the cProfile run profiles only after its first N toggle sets (the steady state, not first uses)",
    )
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--json", required=False)
    ap.add_argument("--prof-out", help="where the cProfile run's stats go (pstats file)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cprofile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count-syncs", action="store_true", help="count synchronising calls by caller")
    ap.add_argument("--memory", action="store_true", help="record each cell's device memory (reserved after, peak)")
    ap.add_argument(
        "--memory-gc",
        action="store_true",
        help="with --memory: after each cell also a full collection and an emptied cache (what cycles held)",
    )
    ap.add_argument("--keep-cache", action="store_true", help="no allocator emptying before captures (experiment)")
    ap.add_argument(
        "--spread",
        type=int,
        default=0,
        help="deal the processes over this many GPUs (CUDA_VISIBLE_DEVICES = i mod N), as --devices deals workers",
    )
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--of", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    report = {
        "bench": "cell_profile",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python3", "bench/cell_profile.py", *sys.argv[1:]]),
        "cpu_count": os.cpu_count(),
        "runs": [],
    }
    last = None
    for n in args.procs:
        run = last = _spawn(n, args)
        summary = _summary(run)
        summary["by_scenario_s"] = _by_scenario(run)
        report["runs"].append(summary)
        print(json.dumps({k: v for k, v in summary.items() if k != "by_scenario_s"}), flush=True)
    if args.memory and last:
        rows = [r for child in last["children"] for r in child["rows"]]
        report["memory"] = [
            [r["set"], r["scenario"], r["reserved_mib"], r["peak_mib"], r["device_used_mib"]]
            + (
                [r["reserved_after_gc_mib"], r["gc_ms"], r["gc_found"], r["graphs_alive"], r["cuda_tensor_mib"]]
                if args.memory_gc
                else []
            )
            for r in rows
        ]
        print(
            f"device memory: most reserved after a cell {max(r['reserved_mib'] for r in rows)} MiB, "
            f"highest peak {max(r['peak_mib'] for r in rows)} MiB"
        )
    if args.count_syncs:
        counts: dict[str, int] = {}
        cells = 0
        for child in last["children"] if last else []:
            cells += len(child["rows"])
            for k, v in child.get("syncs", {}).items():
                counts[k] = counts.get(k, 0) + v
        top = sorted(counts.items(), key=lambda kv: -kv[1])
        report["syncs_per_cell"] = {k: round(v / max(1, cells), 2) for k, v in top}
        print(f"synchronising calls per cell: {sum(counts.values()) / max(1, cells):.1f}")
        for k, v in top[:40]:
            print(f"{v / max(1, cells):8.2f}  {k}")
    if args.profile_sets:
        sets, args.sets = args.sets, args.profile_sets
        run = _spawn(1, args, cprofile=True)
        args.sets = sets
        summary = _summary(run)
        child = run["children"][0]
        summary["profile_tottime"] = child.get("profile_tottime")
        summary["profile_cumulative"] = child.get("profile_cumulative")
        report["profile"] = summary
        print(summary["profile_tottime"][:6000])
        print(summary["profile_cumulative"][:9000])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(relativize(report), f, indent=1)


if __name__ == "__main__":
    main()
