"""The full CPU matrix, this checkout against another (e.g. the commit before a speed change).

Runs ``python -m sglfix matrix --parts --device cpu --no-reachability`` in each checkout in turn
(A B A B ...: pairing keeps the ratio honest while the machine's speed drifts), times each whole
process (wall, and the CPU time of the process and its workers), and checks that both give the
same cells: verdict, findings and error figures, cell by cell.

    python bench/cpu_speed.py --before /path/to/old/checkout [--runs 2] [--json OUT.json]

The old checkout must be importable as ``sglfix`` from its root (a source checkout is).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relpaths import relativize

HERE = Path(__file__).resolve().parent.parent
MATRIX = ["-m", "sglfix", "matrix", "--parts", "--device", "cpu"]


def _has_reachability(checkout: Path) -> bool:
    """Whether that checkout's matrix marks unreached cells (then --no-reachability runs every
    cell there too, so both sides do the same work)."""
    return any("--no-reachability" in p.read_text() for p in (checkout / "sglfix" / "cli").glob("*.py"))


def timed(checkout: Path, out: Path, *, new: bool) -> dict:
    args = [sys.executable, *MATRIX, *(["--no-reachability"] if new else []), "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=checkout, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: matrix exited {proc.returncode}: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def cells(path: Path) -> dict:
    return {c["id"]: (c["verdict"], c["findings"], c["error"]) for c in json.loads(path.read_text())["cells"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, type=Path, help="the other checkout (B)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            a, b = Path(tmp) / f"a{i}.json", Path(tmp) / f"b{i}.json"
            runs["A"].append(timed(HERE, a, new=True))
            runs["B"].append(timed(args.before.resolve(), b, new=_has_reachability(args.before.resolve())))
            same = same and cells(a) == cells(b)
            print(f"pair {i + 1}: A {runs['A'][-1]}  B {runs['B'][-1]}  same cells: {same}", flush=True)
    ratio = [x["wall_s"] / y["wall_s"] for x, y in zip(runs["A"], runs["B"])]
    summary = {
        "A_wall_median_s": statistics.median(r["wall_s"] for r in runs["A"]),
        "B_wall_median_s": statistics.median(r["wall_s"] for r in runs["B"]),
        "A_over_B_wall_median": round(statistics.median(ratio), 4),
        "same_cells": same,
    }
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                relativize(
                    {
                        "tool": "sglfix bench/cpu_speed.py",
                        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                        "host": platform.node(),
                        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                        "runs": runs,
                        **summary,
                    }
                ),
                indent=1,
            )
            + "\n"
        )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
