"""The full matrix on one GPU, on every GPU, and through Ray, each with the default workers per
GPU: wall times, speed-up and whether the verdicts are identical cell by cell.

Run on a GPU machine after sglfix (and FlashInfer, and Ray for the Ray run) are installed;
``bench/gpu_run.sh`` with ``ONLY=scale`` does that and calls this. Each run is a separate
``sglfix matrix --parts --no-reachability --no-cache`` process (every cell runs, so the figure is
the matrix's work, not reachability's shortcut or the result store's), timed from process start to exit, so worker boot,
Ray's start and its shutdown are all counted. A warm-up run (with reachability) first loads the kernel caches.

On a machine with one GPU the multi-GPU runs cannot happen: the report says which are missing,
and the Ray run still goes on one GPU (actors with ``num_gpus=1``).

    python3 bench/scale_out.py --json OUT.json [--skip-ray] [-s GLOB ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from relpaths import relativize

from sglfix.common.verdicts import stands_for

KEPT_FIRST = "ray, joined, --ray-keep: first run"
KEPT_NEXT = "ray, joined, --ray-keep: next run"
KEPT_OTHER = f"{KEPT_NEXT} with other options"  # another identity: it must evict the kept actors


def _python_int(code: str) -> int:
    """What ``python -c code`` prints last, as an int (a fresh process: CUDA stays out of this one)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def _matrix(
    args: list[str],
    json_path: str,
    log_path: str,
    *,
    every_cell: bool = True,
    timeout: float | None = None,
    env: dict | None = None,
    campaign: list[str] | None = None,
) -> dict:
    reach = ["--no-reachability"] if every_cell else []
    cmd = [sys.executable, "-m", "sglfix", "matrix", "--parts", *reach, "--no-cache", *args, "--json", json_path]
    if campaign is not None:  # sglfix [globals] mutate ... with the run's own options after it
        cmd = [sys.executable, "-m", "sglfix", *campaign, "--device", "cuda", "--no-cache", *args, "--json", json_path]
    # GPU memory in use, sampled while the run lasts: its peak says how close the workers came
    # to filling the GPU.
    sampler = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits", "-lms", "250"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    start = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "COLUMNS": "250", **(env or {})},
                timeout=timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.perf_counter() - start
    sampler.terminate()
    samples = [line.split(",") for line in sampler.communicate()[0].splitlines() if "," in line]
    used = [int(a) for a, _ in samples if a.strip().isdigit()]
    total = next((int(b) for _, b in samples if b.strip().isdigit()), None)
    report = None
    if rc != 124 and os.path.exists(json_path):
        with open(json_path) as f:
            report = json.load(f)
    return {
        "command": " ".join(["sglfix", *cmd[3:]]),
        "rc": rc,
        "process_wall_s": round(wall, 2),
        "gpu_memory_peak_mib": max(used) if used else None,
        "gpu_memory_total_mib": total,
        "report": report,
        "log": log_path,
    }


def _outcomes(rep: dict) -> dict[str, str]:
    """What a run decided, one entry per cell (a matrix) or per mutant (a campaign: its status and
    the cells that showed it), compared run against run."""
    if "mutants" in rep:
        return {
            m["id"]: f"{m['status']} over {m['cells']} cell(s)"
            + "".join(sorted(f" {k['cell']}={k['verdict']}" for k in m["killed_by"]))
            for m in rep["mutants"]
        }
    # A NOT_REACHED cell stands for its baseline's verdict: reachability must change none.
    return {c["id"]: stands_for(c["verdict"], c.get("findings")) for c in rep["cells"]}


def _ray_head(*, start: bool, cpus: int = 2) -> float:
    """``ray start --head`` (or ``ray stop``) on this machine; the seconds it took."""
    cmd = [sys.executable, "-m", "ray.scripts.scripts"]
    if start:
        cmd += ["start", "--head", f"--num-cpus={cpus}", "--include-dashboard=false", "--disable-usage-stats"]
    else:
        cmd += ["stop"]
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return round(time.perf_counter() - t, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--skip-ray", action="store_true", help="no Ray run (Ray not installed)")
    ap.add_argument("-s", "--scenario", action="append", default=[], help="scenario globs (default: every one)")
    ap.add_argument("--logs", default=None, help="folder for the runs' output (default: next to --json)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting runs once this many seconds have passed (a device call has a hard limit); "
        "a run cut by it is recorded as missing, and the JSON is rewritten after every run",
    )
    ap.add_argument(
        "--plan",
        choices=("scale", "workers"),
        default="scale",
        help="scale: 1 GPU, every GPU, Ray on every GPU; workers: 1 worker against the default "
        "number of workers per GPU (every cell, and with reachability) and 2 and 4 workers",
    )
    ap.add_argument("--workers", type=int, nargs="*", default=[4, 6, 8], help="workers plan: other worker counts")
    ap.add_argument(
        "--campaign",
        default=None,
        help="scale plan: each run is this sglfix command, a mutation campaign (one string: "
        "'--profile sglang-0.5.23 mutate --function GLOB'), not the matrix; runs compare mutant by mutant",
    )
    ap.add_argument(
        "--warm-shards",
        type=int,
        default=40,
        help="with --campaign: the warm-up runs every baseline and one of this many shares of the mutants",
    )
    ap.add_argument(
        "--skip-single",
        action="store_true",
        help="no one-worker run: the first run of the plan is the baseline the others are compared with",
    )
    ap.add_argument(
        "--reference",
        default=None,
        help="a committed every-cell matrix report (e.g. bench/results/matrix-cpu.json): each run's "
        "verdicts are compared with it cell by cell too",
    )
    ap.add_argument("--kept-next", type=int, default=1, help="workers plan: warm runs after the first --ray-keep run")
    ap.add_argument(
        "--kept-other",
        action="store_true",
        help="workers plan: then one kept run with other options, which stops the idle kept actors to make room",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="scale plan: run the local runs (1 GPU, every GPU) this many times, each round compared with "
        "its own 1-GPU run (host variance shows)",
    )
    ap.add_argument(
        "--timelines",
        default=None,
        help="folder: each run's workers write their request timelines under it (SGLFIX_WORKER_TIMELINE), "
        "summarised per run by bench/worker_timeline.py",
    )
    ap.add_argument(
        "--sweep",
        type=int,
        nargs="*",
        default=[],
        help="scale plan: also --devices all with --jobs N for each N (workers dealt over the GPUs), "
        "to find how many a machine of several GPUs runs best",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="scale plan: also --devices all with these options (one string, e.g. '--mps off'), to compare "
        "a setting on several GPUs with the default",
    )
    ap.add_argument(
        "--profiles",
        default=None,
        help="folder: each run's workers run under cProfile (SGLFIX_WORKER_PROFILE), their stats under it "
        "per run (bench/worker_profile.py merges them); a diagnosis: the timings are not comparable then",
    )
    ns = ap.parse_args()
    campaign = shlex.split(ns.campaign) if ns.campaign else None
    if campaign is not None and ns.plan != "scale":
        print("--campaign runs with --plan scale only", file=sys.stderr)
        return 2
    logs = ns.logs or os.path.dirname(os.path.abspath(ns.json))
    os.makedirs(logs, exist_ok=True)
    sel = [a for g in ns.scenario for a in ("-s", g)]
    gpus = _python_int("import torch; print(torch.cuda.device_count())")
    if gpus < 1:
        print("no CUDA device here", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="sglfix-scale-")
    began = time.perf_counter()

    # The kernel caches come carried (gpu_run.sh); a reachability run loads them and compiles
    # whatever is missing, so no timed run pays for compiling.
    print("== warm-up (not timed)", flush=True)
    if campaign is None:
        warm = _matrix(["--devices", "0", *sel], f"{tmp}/warm.json", f"{logs}/scale-warm.txt", every_cell=False)
    else:  # every baseline and a few mutants: the campaign's kernels, each compiled once
        warm = _matrix(
            ["--devices", "0", "--shard", f"1/{ns.warm_shards}"],
            f"{tmp}/warm.json",
            f"{logs}/scale-warm.txt",
            campaign=campaign,
        )

    plan: list[tuple[str, list[str]]] = [] if ns.skip_single else [("local, 1 GPU", ["--devices", "0"])]
    missing: list[str] = []
    reach_labels: set[str] = set()
    if ns.plan == "workers":
        default = _python_int("from sglfix.execution.devices import default_gpu_workers as d; print(d())")
        plan += [
            (f"local, default options ({default} workers on 1 GPU)", ["--device", "cuda"]),
            (f"local, default options ({default} workers), with reachability", ["--device", "cuda"]),
        ]
        reach_labels.add(plan[-1][0])
        plan += [
            (f"local, {n} workers on 1 GPU", ["--device", "cuda", "--jobs", str(n)]) for n in ns.workers if n != default
        ]
    elif gpus >= 2:
        plan.append((f"local, {gpus} GPUs", ["--devices", "all"]))
    else:
        missing.append(f"local on 2+ GPUs (this machine has {gpus})")
    kept_args = ["--executor", "ray", "--ray-address", "auto", "--ray-keep", "600", "--device", "cuda"]
    if ns.plan == "workers":
        if ns.skip_ray:
            missing.append("ray (--skip-ray: not installed, or not asked for)")
        else:  # the same workers as Ray actors sharing the GPU, against the local default
            after = next(n for n, (label, _) in enumerate(plan) if label in reach_labels) + 1
            plan[after:after] = [
                (f"ray, default options ({default} actors on 1 GPU)", ["--executor", "ray", "--device", "cuda"]),
                # A Ray head already running on the host (ray start --head), as a Ray user keeps
                # one: the run joins it and leaves it up, so it pays no cluster start or stop.
                (
                    f"ray, joined to a running head ({default} actors on 1 GPU)",
                    ["--executor", "ray", "--ray-address", "auto", "--device", "cuda"],
                ),
                # --ray-keep: the first run leaves its actors in the cluster, the next one takes
                # them warm (the head stays up between the two).
                (f"{KEPT_FIRST} ({default} actors on 1 GPU)", kept_args),
                *[
                    (f"{KEPT_NEXT} ({default} actors on 1 GPU){'' if n == 0 else f', again ({n + 1})'}", kept_args)
                    for n in range(ns.kept_next)
                ],
                *(
                    [(f"{KEPT_OTHER} (--timeout 301, {default} actors)", [*kept_args, "--timeout", "301"])]
                    if ns.kept_other
                    else []
                ),
            ]
    elif not ns.skip_ray:
        plan.append((f"ray, {gpus} GPU{'s' if gpus > 1 else ''}", ["--executor", "ray", "--devices", "all"]))
    if ns.plan == "scale" and gpus >= 2:
        plan += [(f"local, {gpus} GPUs, {n} workers", ["--devices", "all", "--jobs", str(n)]) for n in ns.sweep]
        plan += [(f"local, {gpus} GPUs, {v}", ["--devices", "all", *v.split()]) for v in ns.variant]
        for n in range(2, ns.repeat + 1):  # again, the 1-GPU run first: each round's own baseline
            plan += [(f"{label} (round {n})", args) for label, args in plan[:2] if label.startswith("local")]
        if gpus < 2:
            missing.append(f"ray on 2+ GPUs (this machine has {gpus}; the Ray run used {gpus})")
    else:
        missing.append("ray (--skip-ray: not installed, or not asked for)")

    dev = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "bench": "scale-out",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device_name": dev,
        "gpus": gpus,
        "cpu_count": os.cpu_count(),
        "command": "ONLY=scale bash bench/gpu_run.sh  (python3 bench/scale_out.py --json ...)",
        "workload": "matrix" if campaign is None else "sglfix " + " ".join(campaign),
        "scenarios": ns.scenario or ["*"],
        "warm_up": {"rc": warm["rc"], "process_wall_s": warm["process_wall_s"]},
        "runs": [],
        "missing": missing,
    }
    reference = None
    if ns.reference:
        with open(ns.reference) as f:
            ref_report = json.load(f)
        reference = {c["id"]: stands_for(c["verdict"], c.get("findings")) for c in ref_report["cells"]}
        result["reference"] = ns.reference
    result["baseline"] = plan[0][0] if plan else None
    base_verdicts: dict[str, str] | None = None
    base_wall: tuple[float, float] | None = None
    head_start = None
    for i, (label, args) in enumerate(plan):
        left = None if ns.budget_s is None else ns.budget_s - (time.perf_counter() - began)
        if left is not None and left < 20:
            missing.append(f"{label}: not started, the time budget ({ns.budget_s:.0f} s) was spent")
            continue
        print(f"== {label}", flush=True)
        head = None
        if "--ray-address" in args and not label.startswith(KEPT_NEXT):
            head = _ray_head(start=True, cpus=os.cpu_count() or 2)
            head_start = head
        diagnose = {}
        if ns.timelines:
            diagnose["SGLFIX_WORKER_TIMELINE"] = os.path.join(os.path.abspath(ns.timelines), f"run{i}")
        if ns.profiles:
            diagnose["SGLFIX_WORKER_PROFILE"] = os.path.join(os.path.abspath(ns.profiles), f"run{i}")
        r = _matrix(
            [*args, *sel] if campaign is None else args,
            f"{tmp}/run{i}.json",
            f"{logs}/scale-run{i}.txt",
            timeout=left,
            every_cell=label not in reach_labels,
            env=diagnose,
            campaign=campaign,
        )
        following = plan[i + 1][0] if i + 1 < len(plan) else ""
        if "--ray-address" in args and not following.startswith(KEPT_NEXT):
            r["ray_head"] = {"start_s": head_start, "stop_s": _ray_head(start=False)}
        elif head is not None:
            r["ray_head"] = {"start_s": head, "left_up_for_the_next_run": True}
        rep = r.pop("report")
        if os.path.exists(f"{tmp}/run{i}.json"):  # every cell's verdict and timings, with the logs
            shutil.copy(f"{tmp}/run{i}.json", f"{logs}/scale-run{i}.json")
        row = {k: v for k, v in r.items() if k != "log"}
        row["label"] = label
        if rep is None:
            row.update(
                cells=0,
                identical_to_1gpu=False,
                error="cut by the time budget" if r["rc"] == 124 else "no report written",
            )
        else:
            verdicts = _outcomes(rep)
            if i == 0:
                base_verdicts = verdicts
            if i == 0 or label.startswith(f"{plan[0][0]} (round "):
                base_wall = (r["process_wall_s"], rep["wall_s"])  # this round's 1-GPU run
            row.update(
                cells=len(verdicts) if campaign is None else sum(m["cells"] for m in rep["mutants"]),
                mutants=None if campaign is None else len(verdicts),
                scores=rep.get("scores") if campaign is not None else None,
                cells_wall_s=rep.get("wall_s"),
                workers=rep.get("workers"),
                boot_s=rep.get("boot_s"),
                summary=rep.get("summary"),
                executor=rep.get("executor"),
            )
            if reference is not None:
                off = sorted(k for k in set(verdicts) | set(reference) if verdicts.get(k) != reference.get(k))
                row.update(identical_to_reference=not off, differ_from_reference=off[:20])
            if base_verdicts is None:  # the 1-GPU run left no report: nothing to compare with
                row.update(identical_to_1gpu=None, speedup_vs_1gpu=None, cells_speedup_vs_1gpu=None)
            else:
                differ = sorted(
                    k for k in set(verdicts) | set(base_verdicts) if verdicts.get(k) != base_verdicts.get(k)
                )
                row.update(
                    identical_to_1gpu=not differ,
                    differ=differ[:20],
                    speedup_vs_1gpu=round(base_wall[0] / r["process_wall_s"], 3),
                    cells_speedup_vs_1gpu=round(base_wall[1] / rep["wall_s"], 3) if rep.get("wall_s") else None,
                )
        result["runs"].append(row)
        # Rewritten after every run: a device call cut short still returns what it measured.
        with open(ns.json, "w") as f:
            json.dump(relativize(result), f, indent=1)
    if any("--ray-address" in args for _, args in plan):
        _ray_head(start=False)  # a head left up for a kept run that the budget cut
    rows = result["runs"]
    local_row = next(
        (r for r in rows if r["label"].startswith("local, default options") and "reach" not in r["label"]), None
    )
    for key, prefix in (
        ("ray_vs_local", "ray, default"),
        ("ray_joined_vs_local", "ray, joined to"),
        ("ray_kept_first_vs_local", KEPT_FIRST),
        ("ray_kept_next_vs_local", KEPT_NEXT),
        ("ray_kept_other_vs_local", KEPT_OTHER),
    ):
        ray_row = next((r for r in rows if r["label"].startswith(prefix)), None)
        if ray_row and local_row and ray_row.get("cells_wall_s") and local_row.get("cells_wall_s"):
            result[key] = {
                "process": round(local_row["process_wall_s"] / ray_row["process_wall_s"], 3),
                "cells": round(local_row["cells_wall_s"] / ray_row["cells_wall_s"], 3),
                "note": "local wall / Ray wall for the same cells and worker count: >= 1 means Ray is as fast",
            }
    with open(ns.json, "w") as f:
        json.dump(relativize(result), f, indent=1)
    print(
        f"{'run':<26} {'rc':>3} {'cells':>6} {'workers':>7} {'wall_s':>8} {'cells_s':>8} {'speedup':>8} {'cells_x':>8} identical"
    )
    for row in rows:
        print(
            f"{row['label']:<26} {row['rc']:>3} {row['cells']:>6} {row.get('workers', '-')!s:>7} "
            f"{row['process_wall_s']:>8} {row.get('cells_wall_s', '-')!s:>8} {row.get('speedup_vs_1gpu', '-')!s:>8} "
            f"{row.get('cells_speedup_vs_1gpu', '-')!s:>8} {row.get('identical_to_1gpu')}"
        )
    for m in missing:
        print("missing:", m)
    return 0 if all(r.get("identical_to_1gpu") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
