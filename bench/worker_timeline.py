"""How busy a run's workers were, from the lines they wrote under ``SGLFIX_WORKER_TIMELINE=DIR``
(one per request: when it came, when its reply went): each worker's span, busy time and longest
idle gaps, and the run's first and last request.

    SGLFIX_WORKER_TIMELINE=/tmp/tl sglfix matrix ...; python bench/worker_timeline.py /tmp/tl [--json OUT]
"""

from __future__ import annotations

import argparse
import glob
import json
import os

from relpaths import relativize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--json")
    a = ap.parse_args()
    workers = {}
    for path in sorted(glob.glob(os.path.join(a.folder, "worker-*.timeline"))):
        rows = []
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                began, ended, cell = line.split(" ", 2)
                rows.append((float(began), float(ended), cell.strip()))
        if rows:
            workers[os.path.basename(path)] = sorted(rows)
    if not workers:
        raise SystemExit(f"no worker-*.timeline in {a.folder}")
    t0 = min(r[0][0] for r in workers.values())
    t1 = max(r[-1][1] for r in workers.values())
    out = {"span_s": round(t1 - t0, 2), "workers": []}
    for name, rows in workers.items():
        busy = sum(e - b for b, e, _ in rows)
        gaps = sorted(((rows[i + 1][0] - rows[i][1], rows[i + 1][2]) for i in range(len(rows) - 1)), reverse=True)
        w = {
            "worker": name,
            "requests": len(rows),
            "first_s": round(rows[0][0] - t0, 2),
            "last_s": round(rows[-1][1] - t0, 2),
            "busy_s": round(busy, 2),
            "idle_between_s": round(sum(g for g, _ in gaps), 2),
            "longest_idle": [[round(g, 2), cell] for g, cell in gaps[:3]],
            "slowest": [[round(e - b, 2), c] for b, e, c in sorted(rows, key=lambda r: r[0] - r[1])[:3]],
        }
        out["workers"].append(w)
        print(
            f"{name}: {w['requests']} requests from {w['first_s']} s to {w['last_s']} s, busy {w['busy_s']} s, "
            f"idle between {w['idle_between_s']} s; longest idle {w['longest_idle'][:2]}; slowest {w['slowest'][:2]}"
        )
    firsts = sorted(w["first_s"] for w in out["workers"])
    lasts = sorted(w["last_s"] for w in out["workers"])
    busy = sum(w["busy_s"] for w in out["workers"])
    out["overall"] = {
        "workers": len(firsts),
        "first_request_s": [firsts[0], firsts[len(firsts) // 2], firsts[-1]],
        "last_reply_s": [lasts[0], lasts[len(lasts) // 2], lasts[-1]],
        "busy_share": round(busy / (len(firsts) * out["span_s"]), 3) if out["span_s"] else None,
    }
    o = out["overall"]
    print(
        f"{o['workers']} workers: first request at {o['first_request_s']} s (min, median, max), last reply at "
        f"{o['last_reply_s']} s; busy {o['busy_share']} of workers x span"
    )
    print(f"span of all requests: {out['span_s']} s")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(relativize(out), fh, indent=2)


if __name__ == "__main__":
    main()
