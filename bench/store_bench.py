"""The result store on the CPU box: what a second identical matrix, an edited toggle and an edited
sglang file cost, and whether every answer equals a run without the store.

    python bench/store_bench.py --json bench/results/store-cpu.json [--skip-sglang]

1. The reproduction, ``sglfix matrix --parts --device cpu`` over a copy of its toggles folder with
   a fresh store: the first run, the same run again, the run after one toggle file is edited
   (a part's summary: what the part is changes), and the same with ``--no-cache``.
2. Real sglang 0.5.23 (installed; a tree of links to it first on PYTHONPATH, as a checkout is):
   ``matrix --profile sglang-0.5.23 --parts``, again, after a comment is added inside the Triton
   backend's decode (a file only the Triton cells run), and with ``--no-cache``.

Each run is a whole process, timed from outside. Exit 1 when a check fails: a second run that runs
any cell or takes more than 5 % of the first, an edit that re-runs a cell that does not depend on
what was edited (or serves one that does), a verdict that differs from the run without the store.
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

ROOT = Path(__file__).resolve().parent.parent
TOGGLE = "21987.yaml"
TOGGLE_OLD, TOGGLE_NEW = "summary: replay writes cu_seqlens_q", "summary: the replay writes cu_seqlens_q"
TRITON = Path("srt") / "layers" / "attention" / "triton_backend.py"
IN_A_CALL = "            layer.scaling,\n"


def run(args: list[str], *, out: Path, env: dict, cwd: str) -> dict:
    start = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "sglfix", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=3600,
    )
    wall = time.perf_counter() - start
    if r.returncode not in (0, 1) or not out.exists():
        raise SystemExit(f"sglfix {' '.join(args)} exited {r.returncode}: {r.stderr[-1500:]}")
    report = json.loads(out.read_text())
    cells = {c["id"]: c for c in report["cells"]}
    return {
        "command": "sglfix " + " ".join(args),
        "process_s": round(wall, 2),
        "cells_s": report.get("wall_s"),
        "exit": r.returncode,
        "cells": len(cells),
        "served": sum(1 for c in cells.values() if c.get("stored")),
        "ran": sum(1 for c in cells.values() if not c.get("stored")),
        "workers": report.get("workers"),
        "outcome": (report.get("judged") or {}).get("outcome"),
        "_cells": cells,
    }


def verdicts(step: dict) -> dict[str, str]:
    return {k: c["verdict"] for k, c in step["_cells"].items()}


def diff(a: dict[str, str], b: dict[str, str]) -> dict[str, list]:
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def series(name: str, *, args: list[str], env: dict, cwd: str, edit, depends, work: Path) -> dict:
    """First, second, after ``edit()``, and the same without the store; the checks."""
    store = work / f"store-{name}"
    with_store = [*args, "--cache", str(store)]
    first = run(with_store, out=work / f"{name}-1.json", env=env, cwd=cwd)
    second = run(with_store, out=work / f"{name}-2.json", env=env, cwd=cwd)
    what = edit()
    third = run(with_store, out=work / f"{name}-3.json", env=env, cwd=cwd)
    fresh = run([*args, "--no-cache"], out=work / f"{name}-fresh.json", env=env, cwd=cwd)
    ran = {k for k, c in third["_cells"].items() if not c.get("stored")}
    should = {k for k in third["_cells"] if depends(k)}
    # A cell whose verdict differs between two runs that both ran every cell (the first and the
    # one without the store) is the code under test's own run-to-run variation (a kernel reading
    # memory it never wrote): named, and not charged to the store.
    differ = diff(verdicts(third), verdicts(fresh))
    varies = diff(verdicts(first), verdicts(fresh))
    served = {k for k, c in third["_cells"].items() if c.get("stored")}
    # A verdict that differs where both runs ran the cell is the code's own variation; it must
    # still mean the same (an expectation that takes either verdict): the answer people act on.
    meant = {k: c.get("meaning") for k, c in third["_cells"].items()}
    meant_fresh = {k: c.get("meaning") for k, c in fresh["_cells"].items()}
    checks = {
        "second run ran no cell": second["ran"] == 0,
        "second run at most 5 % of the first (process wall)": second["process_s"] <= 0.05 * first["process_s"],
        "after the edit, exactly the cells that depend on it ran": ran == should,
        "after the edit, every served cell has the verdict of the run without the store": not served & set(differ),
        "after the edit, every cell means what it means without the store": meant == meant_fresh,
        "the gate's outcome equals the run without the store's": third["outcome"] == fresh["outcome"],
        "second run's verdicts equal the first's": verdicts(second) == verdicts(first),
    }
    return {
        "edit": what,
        "first": {k: v for k, v in first.items() if k != "_cells"},
        "second": {k: v for k, v in second.items() if k != "_cells"},
        "after_edit": {k: v for k, v in third.items() if k != "_cells"},
        "without_store": {k: v for k, v in fresh.items() if k != "_cells"},
        "second_over_first": round(second["process_s"] / first["process_s"], 4),
        "after_edit_over_first": round(third["process_s"] / first["process_s"], 4),
        "after_edit_vs_without_store (cells that ran in both)": differ,
        "first_vs_without_store (run-to-run variation)": varies,
        "ran_after_edit_not_expected": sorted(ran - should)[:20],
        "served_after_edit_but_depends": sorted(should - ran)[:20],
        "checks": checks,
    }


def reproduction(work: Path, env: dict) -> dict:
    toggles = work / "toggles"
    shutil.copytree(ROOT / "toggles", toggles, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))

    def edit() -> str:
        path = toggles / TOGGLE
        text = path.read_text()
        assert text.count(TOGGLE_OLD) == 1, f"{TOGGLE} no longer holds {TOGGLE_OLD!r}"
        path.write_text(text.replace(TOGGLE_OLD, TOGGLE_NEW))
        return f"toggles/{TOGGLE}: one part's summary ({TOGGLE_OLD!r} -> {TOGGLE_NEW!r})"

    return series(
        "reproduction",
        args=["--toggles", str(toggles), "matrix", "--parts", "--device", "cpu"],
        env=env,
        cwd=str(work),
        edit=edit,
        # The sets that revert the edited part: 21987 whole, the part alone, any set naming either.
        depends=lambda cell_id: bool({"21987", "21987:uniform-stride"} & set(cell_id.split("::")[0].split(","))),
        work=work,
    )


def real_sglang(work: Path, env: dict) -> dict:
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed: pip install --no-deps sglang==0.5.23 (README)")
    installed = Path(next(iter(spec.submodule_search_locations)))
    tree = work / "tree"
    shutil.copytree(installed, tree / "sglang", copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))

    def edit() -> str:
        path = tree / "sglang" / TRITON
        text = path.read_text()
        assert IN_A_CALL in text, f"{TRITON} no longer holds {IN_A_CALL!r}"
        path.unlink()
        path.write_text(text.replace(IN_A_CALL, "            # edited\n" + IN_A_CALL, 1))
        return f"sglang/{TRITON}: a comment inside TritonAttnBackend's decode call"

    first_cells: dict = {}

    def depends(cell_id: str) -> bool:
        # The cells of the scenarios whose baseline ran the Triton backend's file.
        return cell_id.split("::", 1)[1] in first_cells

    out = series(
        "sglang",
        args=["--profile", "sglang-0.5.23", "matrix", "--parts", "--device", "cpu"],
        env={**env, "PYTHONPATH": str(tree)},
        cwd=str(work),
        edit=lambda: (first_cells.update(triton_scenarios(work / "store-sglang")), edit())[1],
        depends=depends,
        work=work,
    )
    out["scenarios_that_ran_the_file"] = len(first_cells)
    return out


def triton_scenarios(store: Path) -> dict:
    """The scenarios whose baseline entry lists the Triton backend's file among those it ran (read
    from the store before the edit: what the edit should re-run, as the first run recorded it)."""
    import sqlite3

    found = {}
    conn = sqlite3.connect(str(store / "results.sqlite"))
    for ran, result in conn.execute("SELECT ran, result FROM entries"):
        r = json.loads(result)
        if not r["toggles"] and f"sglang/{TRITON}" in json.loads(ran):
            found[r["scenario"]] = True
    conn.close()
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--skip-sglang", action="store_true")
    ap.add_argument("--skip-reproduction", action="store_true")
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLFIX_", "SGLANG_DEBUG"))}
    result: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "command": "python bench/store_bench.py " + " ".join(sys.argv[1:]),
    }
    with tempfile.TemporaryDirectory(prefix="sglfix-store-bench-") as tmp:
        work = Path(tmp)
        if not a.skip_reproduction:
            result["reproduction"] = reproduction(work, env)
        if not a.skip_sglang:
            result["sglang"] = real_sglang(work, env)
    failed = [
        f"{name}: {check}"
        for name in ("reproduction", "sglang")
        if name in result
        for check, ok in result[name]["checks"].items()
        if not ok
    ]
    result["failed"] = failed
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    for name in ("reproduction", "sglang"):
        if name in result:
            r = result[name]
            print(
                f"{name}: first {r['first']['process_s']} s ({r['first']['cells']} cells), second "
                f"{r['second']['process_s']} s ({r['second']['ran']} ran, {r['second_over_first']:.1%} of the first), "
                f"after the edit {r['after_edit']['process_s']} s ({r['after_edit']['ran']} ran)"
            )
    if failed:
        print("FAILED: " + "; ".join(failed))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
