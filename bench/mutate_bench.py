"""Mutation campaigns on the CPU box: the figures of a campaign (score per backend family,
survivors, not reached, equivalents) and what the result store saves: the same campaign again,
and the campaign after one statement is put into one mutated function.

    python bench/mutate_bench.py --json bench/results/mutate-cpu.json [--skip-sglang] [--skip-reproduction]
        [--repro-select GLOB ...] [--sglang-select GLOB ...] [--repro-edit FILE QUALNAME] [--sglang-edit FILE QUALNAME]
    python bench/mutate_bench.py --json OUT --summarize NAME=REPORT.json ...   # figures of campaigns run apart

For each code base, with a fresh store folder: ``sglfix mutate`` (first), the same again
(second: served, checked to take at most 10 % of the first's wall), and after an edit of one
function the campaign mutates (third: checked to re-run that function's mutants and no mutant of
a function whose cells never run it). The runs use a copy of sglfix taken at the start, laid out
as a wheel (``store_bench.snapshot``), so that the edit is an edit of the code under test.
Each run is a whole process, timed from outside. Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relpaths import relativize
from store_bench import insert_statement, snapshot

STATEMENT = "_edited = 0"
REPRO_SELECT = ["triton-*", "fi-*", "fimla-*", "trtllm-*"]
SGLANG_SELECT = ["sglang-*", "fi-*", "fimla-*", "trtllm-*"]
REPRO_EDIT = ("srt/layers/attention/triton_backend.py", "TritonAttnBackend.init_forward_metadata")
SGLANG_EDIT = ("srt/layers/attention/triton_backend.py", "TritonAttnBackend.init_forward_metadata")


def run(args: list[str], *, out: Path, env: dict, cwd: str) -> dict:
    start = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "sglfix", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=5400,
    )
    wall = round(time.perf_counter() - start, 2)
    if not out.exists():
        raise SystemExit(f"sglfix {' '.join(args)} wrote no report (exit {r.returncode}): {r.stderr[-2000:]}")
    report = json.loads(out.read_text())
    phases = report.get("phases") or {}
    return {
        "exit": r.returncode,
        "process_s": wall,
        "phases": phases,
        "ran": phases.get("ran", 0),  # mutant cells run (the baselines' are in baseline_s)
        "served": phases.get("served", 0),
        "_report": report,
    }


def figures(report: dict) -> dict:
    """What a campaign found, as the note quotes it."""
    mutants = report["mutants"]
    by_status: dict[str, int] = {}
    for m in mutants:
        by_status[m["status"]] = by_status.get(m["status"], 0) + 1
    return {
        "mutants": len(mutants),
        "by_status": by_status,
        "scores": report.get("scores"),
        "survivors": [
            f"{m['path']}:{m['line']} {m['operator']}: {m['description']}" for m in mutants if m["status"] == "survived"
        ],
        "not_reached_functions": sorted({m["function"] for m in mutants if m["status"] == "not-reached"}),
        "unreached_surface": report.get("unreached_functions", []),
        # The first 30 (the report holds every one, with its evidence).
        "equivalents_first_30": [
            f"{m['path']}:{m['line']} {m['operator']}: {m['description']}"
            for m in mutants
            if m["status"] == "equivalent"
        ][:30],
        "errors": [f"{m['id']}: {m.get('hint', '')}" for m in mutants if m["status"] in ("error", "timeout")],
    }


def series(name: str, *, args: list[str], env: dict, cwd: str, edited: Path, qualname: str, work: Path) -> dict:
    store = work / f"store-{name}"
    with_store = [*args, "--cache", str(store)]
    first = run(with_store, out=work / f"{name}-1.json", env=env, cwd=cwd)
    second = run(with_store, out=work / f"{name}-2.json", env=env, cwd=cwd)
    insert_statement(edited, qualname, STATEMENT)
    third = run(with_store, out=work / f"{name}-3.json", env=env, cwd=cwd)
    ids = {m["id"]: m["status"] for m in first["_report"]["mutants"]}
    ids3 = {m["id"]: m["status"] for m in third["_report"]["mutants"]}
    edited_fn = [m for m in third["_report"]["mutants"] if m["function"].endswith("." + qualname)]
    # The cells the edit may re-run: every mutant cell of a scenario that ran the edited function
    # (its mutants' scenarios), whichever function the mutant changes: such a cell ran the edited
    # code too, and its result may differ now.
    touched = {
        s for m in first["_report"]["mutants"] if m["function"].endswith("." + qualname) for s in m["reached_by"]
    }
    may_rerun = sum(len(set(m["reached_by"]) & touched) for m in first["_report"]["mutants"])
    checks = {
        "second run ran no cell": second["ran"] == 0,
        "second run at most 10 % of the first (process wall)": second["process_s"] <= 0.10 * first["process_s"],
        "second run's statuses equal the first's": {m["id"]: m["status"] for m in second["_report"]["mutants"]} == ids,
        "after the edit, the edited function still has mutants": bool(edited_fn),
        "after the edit, the other mutants keep their ids": set(ids) - set(ids3)
        <= {m["id"] for m in first["_report"]["mutants"] if m["function"].endswith("." + qualname)},
        "after the edit, only cells of scenarios that run the edited function ran": third["ran"]
        <= may_rerun + sum(m["cells"] for m in edited_fn),
    }
    return {
        "command": "sglfix " + " ".join(args),
        "figures": figures(first["_report"]),
        "first": {k: v for k, v in first.items() if k != "_report"},
        "second": {k: v for k, v in second.items() if k != "_report"},
        "after_edit": {
            **{k: v for k, v in third.items() if k != "_report"},
            "edited": f"{qualname}: {STATEMENT!r} put first in its body",
            "scenarios_running_it": len(touched),
            "cells_it_may_rerun": may_rerun,
            "mutants_of_it": len(edited_fn),
        },
        "second_over_first": round(second["process_s"] / first["process_s"], 4),
        "after_edit_over_first": round(third["process_s"] / first["process_s"], 4),
        "checks": checks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--skip-sglang", action="store_true")
    ap.add_argument("--skip-reproduction", action="store_true")
    ap.add_argument("--repro-select", nargs="*", default=REPRO_SELECT)
    ap.add_argument("--sglang-select", nargs="*", default=SGLANG_SELECT)
    ap.add_argument("--repro-edit", nargs=2, default=REPRO_EDIT, metavar=("FILE", "QUALNAME"))
    ap.add_argument("--sglang-edit", nargs=2, default=SGLANG_EDIT, metavar=("FILE", "QUALNAME"))
    ap.add_argument("--mutate-args", default="", help="more options of every sglfix mutate run (one string)")
    ap.add_argument("--summarize", nargs="*", metavar="NAME=REPORT", help="write the figures of these reports and stop")
    a = ap.parse_args()
    if a.summarize:
        out = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count()}
        for item in a.summarize:
            name, _, path = item.partition("=")
            report = json.loads(Path(path).read_text())
            out[name] = {
                "command": report.get("command"),
                "sglfix_source": report.get("sglfix_source"),
                "device": report.get("device"),
                "device_name": report.get("device_name"),
                "date": report.get("date"),
                "merged_from": report.get("merged_from"),
                "wall_s": report.get("wall_s"),
                "phases": report.get("phases"),
                "figures": figures(report),
                "catalogue": report.get("catalogue"),
                "notes": report.get("notes"),
            }
        Path(a.json).write_text(json.dumps(relativize(out), indent=2) + "\n")
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLFIX_", "SGLANG_DEBUG"))}
    result: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "command": "python bench/mutate_bench.py " + " ".join(sys.argv[1:]),
    }
    with tempfile.TemporaryDirectory(prefix="sglfix-mutate-bench-") as tmp:
        work = Path(tmp)
        site = snapshot(work)
        if not a.skip_reproduction:
            sel = [x for g in a.repro_select for x in ("-s", g)]
            rel, qual = a.repro_edit
            result["reproduction"] = series(
                "reproduction",
                args=["mutate", "--device", "cpu", *sel, *a.mutate_args.split()],
                env={**env, "PYTHONPATH": str(site)},
                cwd=str(work),
                edited=site / "sglfix" / "backends" / rel,
                qualname=qual,
                work=work,
            )
        if not a.skip_sglang:
            import importlib.util

            spec = importlib.util.find_spec("sglang")
            if spec is None or not spec.submodule_search_locations:
                raise SystemExit("sglang is not installed: pip install --no-deps sglang==0.5.23 (README)")
            installed = Path(next(iter(spec.submodule_search_locations)))
            tree = work / "tree"
            shutil.copytree(
                installed, tree / "sglang", copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__")
            )
            sel = [x for g in a.sglang_select for x in ("-s", g)]
            rel, qual = a.sglang_edit
            result["sglang"] = series(
                "sglang",
                args=["--profile", "sglang-0.5.23", "mutate", "--device", "cpu", *sel, *a.mutate_args.split()],
                env={**env, "PYTHONPATH": os.pathsep.join((str(tree), str(site)))},
                cwd=str(work),
                edited=tree / "sglang" / rel,
                qualname=qual,
                work=work,
            )
    failed = [
        f"{name}: {check}"
        for name in ("reproduction", "sglang")
        if name in result
        for check, ok in result[name]["checks"].items()
        if not ok
    ]
    result["failed"] = failed
    Path(a.json).write_text(json.dumps(relativize(result), indent=2) + "\n")
    for name in ("reproduction", "sglang"):
        if name in result:
            r = result[name]
            f = r["figures"]
            print(
                f"{name}: {f['mutants']} mutants {f['by_status']}; first {r['first']['process_s']} s, second "
                f"{r['second']['process_s']} s ({r['second_over_first']:.1%}), after an edit "
                f"{r['after_edit']['process_s']} s ({r['after_edit']['ran']} cells ran)"
            )
    if failed:
        print("FAILED: " + "; ".join(failed))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
