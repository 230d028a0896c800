"""Compare two matrix reports cell by cell (e.g. CPU vs GPU) and print where verdicts differ.

Usage: python bench/parity.py A.json B.json [--json OUT]
Exit 0 when every cell is in both reports with the same verdict, 1 otherwise, 2 on bad input.

A thin wrapper over ``sglfix report compare A B --strict`` (sglfix.report.load / .compare: both
report schemas, cells matched by toggle set and scenario) that keeps this script's JSON layout,
which bench/summarize_gpu.py and the committed bench/results/parity-*.json use.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from relpaths import relativize

from sglfix.common.errors import SglfixError
from sglfix.report.compare import compare_reports
from sglfix.report.load import load_report
from sglfix.report.output import check_output_path, write_json


def _side(path: str, report: dict) -> dict:
    return {
        "file": path,
        "device": report.get("device"),
        "device_name": report.get("device_name"),
        "wall_s": report.get("wall_s"),
        "cells": len(report["cells"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        check_output_path(args.json, option="--json")
        da, db = load_report(args.a), load_report(args.b)
    except SglfixError as exc:
        print(f"parity: error: {exc}", file=sys.stderr)
        return 2
    result = compare_reports(da, db)
    differ = [
        {"toggles": ",".join(c.toggles), "scenario": c.scenario, args.a: c.old, args.b: c.new}
        for c in sorted(result.changed, key=lambda c: (",".join(c.toggles), c.scenario))
    ]
    by_id = {c["id"]: c for c in (*da["cells"], *db["cells"])}
    only = sorted([",".join(by_id[i]["toggles"]), by_id[i]["scenario"]] for i in result.only_old + result.only_new)
    summary = {
        "a": _side(args.a, da),
        "b": _side(args.b, db),
        "common_cells": result.common,
        "agree": result.same,
        "differ": differ,
        "missing_in_one": only,
    }
    if args.json:
        write_json(args.json, relativize(summary))
    print(f"{result.common} common cells: {result.same} agree, {len(differ)} differ; {len(only)} in one report only")
    print(f"  {da.get('device')} ({da.get('device_name')}): {len(da['cells'])} cells, matrix wall {da.get('wall_s')} s")
    print(f"  {db.get('device')} ({db.get('device_name')}): {len(db['cells'])} cells, matrix wall {db.get('wall_s')} s")
    for d in differ[:40]:
        print(f"  DIFFER {d['toggles'] or 'baseline'} {d['scenario']}: {d[args.a]} vs {d[args.b]}")
    return 1 if result.failed(strict=True) else 0


if __name__ == "__main__":
    sys.exit(main())
