"""Compare two matrix reports cell by cell (e.g. CPU vs GPU) and print where verdicts differ.

Usage: python bench/parity.py A.json B.json [--json OUT]
Exit 0 when every cell present in both has the same verdict, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys


def cells(path: str) -> dict[tuple[str, str], str]:
    data = json.load(open(path, encoding="utf-8"))
    return {(",".join(c["toggles"]), c["scenario"]): c["verdict"] for c in data["cells"]}, data


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json")
    args = ap.parse_args()
    a, da = cells(args.a)
    b, db = cells(args.b)
    common = sorted(set(a) & set(b))
    differ = [{"toggles": t, "scenario": s, args.a: a[(t, s)], args.b: b[(t, s)]} for t, s in common if a[(t, s)] != b[(t, s)]]
    only = sorted(set(a) ^ set(b))
    summary = {
        "a": {"file": args.a, "device": da.get("device"), "device_name": da.get("device_name"), "wall_s": da.get("wall_s"), "cells": len(a)},
        "b": {"file": args.b, "device": db.get("device"), "device_name": db.get("device_name"), "wall_s": db.get("wall_s"), "cells": len(b)},
        "common_cells": len(common), "agree": len(common) - len(differ), "differ": differ,
        "missing_in_one": [list(k) for k in only],
    }
    if args.json:
        json.dump(summary, open(args.json, "w"), indent=1)
    print(f"{len(common)} common cells: {len(common) - len(differ)} agree, {len(differ)} differ; "
          f"{len(only)} in one report only")
    print(f"  {da.get('device')} ({da.get('device_name')}): {len(a)} cells, matrix wall {da.get('wall_s')} s")
    print(f"  {db.get('device')} ({db.get('device_name')}): {len(b)} cells, matrix wall {db.get('wall_s')} s")
    for d in differ[:40]:
        print(f"  DIFFER {d['toggles'] or 'baseline'} {d['scenario']}: {d[args.a]} vs {d[args.b]}")
    return 0 if not differ and not only else 1


if __name__ == "__main__":
    sys.exit(main())
