"""The full matrix on one GPU, on every GPU (one worker each), and through Ray: wall times,
speed-up and whether the verdicts are identical cell by cell.

Run on a GPU machine after sglfix (and FlashInfer, and Ray for the Ray run) are installed;
``bench/gpu_run.sh`` with ``ONLY=scale`` does that and calls this. Each run is a separate
``sglfix matrix --parts --no-reachability`` process (every cell runs, so the figure is the
matrix's work, not reachability's shortcut), timed from process start to exit, so worker boot,
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
import subprocess
import sys
import tempfile
import time


def _gpu_count() -> int:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def _matrix(args: list[str], json_path: str, log_path: str, *, every_cell: bool = True) -> dict:
    reach = ["--no-reachability"] if every_cell else []
    cmd = [sys.executable, "-m", "sglfix", "matrix", "--parts", *reach, *args, "--json", json_path]
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "250"})
    wall = time.perf_counter() - start
    report = json.load(open(json_path)) if os.path.exists(json_path) else None
    return {"command": " ".join(["sglfix", *cmd[3:]]), "rc": proc.returncode, "process_wall_s": round(wall, 2),
            "report": report, "log": log_path}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--skip-ray", action="store_true", help="no Ray run (Ray not installed)")
    ap.add_argument("-s", "--scenario", action="append", default=[], help="scenario globs (default: every one)")
    ap.add_argument("--logs", default=None, help="folder for the runs' output (default: next to --json)")
    ns = ap.parse_args()
    logs = ns.logs or os.path.dirname(os.path.abspath(ns.json))
    os.makedirs(logs, exist_ok=True)
    sel = [a for g in ns.scenario for a in ("-s", g)]
    gpus = _gpu_count()
    if gpus < 1:
        print("no CUDA device here", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="sglfix-scale-")

    # The kernel caches come carried (gpu_run.sh); a reachability run loads them and compiles
    # whatever is missing, so no timed run pays for compiling.
    print("== warm-up (not timed)", flush=True)
    warm = _matrix(["--devices", "0", *sel], f"{tmp}/warm.json", f"{logs}/scale-warm.txt", every_cell=False)

    plan: list[tuple[str, list[str]]] = [("local, 1 GPU", ["--devices", "0"])]
    missing: list[str] = []
    if gpus >= 2:
        plan.append((f"local, {gpus} GPUs", ["--devices", "all"]))
    else:
        missing.append(f"local on 2+ GPUs (this machine has {gpus})")
    # Two workers sharing one GPU: not the 2-GPU figure, but it shows how far the matrix is bound
    # by the host side (Python, launches) that a second worker, on any GPU, takes in parallel.
    plan.append(("local, 2 workers on 1 GPU", ["--device", "cuda", "--jobs", "2"]))
    if not ns.skip_ray:
        plan.append((f"ray, {gpus} GPU{'s' if gpus > 1 else ''}", ["--executor", "ray", "--devices", "all"]))
        if gpus < 2:
            missing.append(f"ray on 2+ GPUs (this machine has {gpus}; the Ray run used {gpus})")
    else:
        missing.append("ray (not installed on this machine)")

    runs = []
    for i, (label, args) in enumerate(plan):
        print(f"== {label}", flush=True)
        r = _matrix([*args, *sel], f"{tmp}/run{i}.json", f"{logs}/scale-run{i}.txt")
        r["label"] = label
        runs.append(r)

    base = runs[0]["report"]
    base_verdicts = {c["id"]: c["verdict"] for c in base["cells"]} if base else {}
    rows = []
    for r in runs:
        rep = r.pop("report")
        row = {k: v for k, v in r.items() if k != "log"}
        if rep is None:
            row.update(cells=0, identical=False, error="no report written")
            rows.append(row)
            continue
        verdicts = {c["id"]: c["verdict"] for c in rep["cells"]}
        differ = sorted(k for k in set(verdicts) | set(base_verdicts) if verdicts.get(k) != base_verdicts.get(k))
        row.update(cells=len(verdicts), cells_wall_s=rep.get("wall_s"), summary=rep.get("summary"),
                   identical_to_1gpu=not differ, differ=differ[:20],
                   speedup_vs_1gpu=round(runs[0]["process_wall_s"] / r["process_wall_s"], 3),
                   cells_speedup_vs_1gpu=round(base["wall_s"] / rep["wall_s"], 3) if rep.get("wall_s") else None)
        rows.append(row)

    dev = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                         capture_output=True, text=True).stdout.strip()
    result = {
        "bench": "scale-out",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device_name": dev, "gpus": gpus, "cpu_count": os.cpu_count(),
        "command": "ONLY=scale bash bench/gpu_run.sh  (python3 bench/scale_out.py --json ...)",
        "scenarios": ns.scenario or ["*"],
        "warm_up": {"rc": warm["rc"], "process_wall_s": warm["process_wall_s"]},
        "runs": rows,
        "missing": missing,
    }
    with open(ns.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'run':<26} {'rc':>3} {'cells':>6} {'wall_s':>8} {'cells_s':>8} {'speedup':>8} identical")
    for row in rows:
        print(f"{row['label']:<26} {row['rc']:>3} {row['cells']:>6} {row['process_wall_s']:>8} "
              f"{row.get('cells_wall_s', '-')!s:>8} {row.get('speedup_vs_1gpu', '-')!s:>8} {row.get('identical_to_1gpu')}")
    for m in missing:
        print("missing:", m)
    return 0 if all(r.get("identical_to_1gpu") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
