"""Where a matrix run's seconds went, from its report: the cells' wall, the process's (given),
time summed by phase over every cell (a set switch counted once, on the cell after it), the
slowest cells, and what the workers said of their boot.

    python bench/speed_summary.py REPORT.json [--process-s S] [--label NAME] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from relpaths import relativize


def summary(path: str, *, process_s: float | None, label: str | None) -> dict:
    r = json.loads(Path(path).read_text())
    cells = r["cells"]
    ran = [c for c in cells if c["verdict"] != "NOT_REACHED"]
    phases: Counter = Counter()
    for c in cells:
        for k, v in (c.get("timings_ms") or {}).items():
            if v:
                phases[k] += v
    slow = sorted(ran, key=lambda c: -((c.get("timings_ms") or {}).get("total") or 0))[:12]
    return {
        "label": label or Path(path).stem,
        "device": r.get("device_name") or r.get("device"),
        "command": r.get("command"),
        "cells": len(cells),
        "ran": len(ran),
        "workers": r.get("workers"),
        "cells_s": r.get("wall_s"),
        "process_s": process_s,
        "summary": r.get("summary"),
        "outcome": (r.get("judged") or {}).get("outcome"),
        "phases_s": {k: round(v / 1000, 2) for k, v in phases.most_common()},
        "slowest": [
            {
                "cell": c["id"],
                "verdict": c["verdict"],
                "ms": {k: round(v) for k, v in (c.get("timings_ms") or {}).items() if v},
            }
            for c in slow
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--process-s", type=float)
    ap.add_argument("--label")
    ap.add_argument("--json")
    a = ap.parse_args()
    s = summary(a.report, process_s=a.process_s, label=a.label)
    print(
        f"{s['label']}: {s['cells']} cells ({s['ran']} run) on {s['workers']} workers: {s['cells_s']} s of cells, "
        f"{s['process_s']} s process; {s['outcome']}; phases {s['phases_s']}"
    )
    for c in s["slowest"][:6]:
        print(f"  {c['cell']} {c['verdict']} {c['ms']}")
    if a.json:
        Path(a.json).write_text(json.dumps(relativize(s), indent=2) + "\n")


if __name__ == "__main__":
    main()
