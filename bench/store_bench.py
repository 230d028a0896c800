"""The result store on the CPU box: what a second identical matrix and a one-function edit cost,
how many cells that edit re-runs out of how many, and whether every answer equals a run without
the store.

    python bench/store_bench.py --json bench/results/store-cpu.json [--skip-sglang] [--skip-reproduction]

For each code base, with a fresh store folder: the matrix, the same matrix again, the matrix
after a statement is put into one function (``TritonAttnBackend.forward_decode``), the same with
``--verify-store N`` (N served cells run again fresh), and the matrix with ``--no-cache``.

Both run a copy of sglfix taken at the start (``snapshot``: edits to the checkout while the bench
runs change nothing of it), first on PYTHONPATH.

1. The reproduction, ``sglfix matrix --parts --device cpu`` (every scenario), laid out as a wheel
   lays it out (``sglfix/backends``, every file a link to this checkout's), so that the edit is an
   edit of the code under test and not of sglfix.
2. Real sglang 0.5.23 (installed; a tree of links to it first on PYTHONPATH, as a checkout is):
   ``sglfix --profile sglang-0.5.23 matrix --device cpu`` (every scenario, without ``--parts``
   by default: the bench stays affordable on 2 shared cores; ``--sglang-parts`` for all of it).

Each run is a whole process, timed from outside. The cells the edit should re-run are read from
the store before the edit: those whose record names the function. Exit 1 when a check fails: a
second run that runs any cell or takes more than 5 % of the first, an edit that re-runs other
cells than those, a served verdict that differs from the run without the store, a failed
``--verify-store``.
"""

from __future__ import annotations

import argparse
import ast
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

ROOT = Path(__file__).resolve().parent.parent
FUNCTION = "TritonAttnBackend.forward_decode"
STATEMENT = "_edited = 0"
VERIFY = 40


def run(args: list[str], *, out: Path, env: dict, cwd: str, work: Path) -> dict:
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
    if r.returncode == 1 and not out.exists() and "--verify-store" in args:
        # A served cell differed from its fresh run: the run says which, and writes no report.
        said = [line for line in r.stderr.splitlines() if line.startswith("sglfix: error:")]
        return {"command": "sglfix " + " ".join(args).replace(str(work), "<tmp>"), "exit": 1, "error": said[-1:],
                "verified": None, "served": None, "_cells": {}}  # fmt: skip
    if r.returncode not in (0, 1) or not out.exists():
        raise SystemExit(f"sglfix {' '.join(args)} exited {r.returncode}: {r.stderr[-1500:]}")
    report = json.loads(out.read_text())
    cells = {c["id"]: c for c in report["cells"]}
    return {
        "command": "sglfix " + " ".join(args).replace(str(work), "<tmp>"),
        "process_s": round(wall, 2),
        "cells_s": report.get("wall_s"),
        "exit": r.returncode,
        "cells": len(cells),
        "served": sum(1 for c in cells.values() if c.get("stored")),
        "ran": sum(1 for c in cells.values() if not c.get("stored")),
        "workers": report.get("workers"),
        "verified": (report.get("store") or {}).get("verified"),
        "outcome": (report.get("judged") or {}).get("outcome"),
        "_cells": cells,
    }


def verdicts(step: dict) -> dict[str, str]:
    return {k: c["verdict"] for k, c in step["_cells"].items()}


def diff(a: dict[str, str], b: dict[str, str]) -> dict[str, list]:
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def insert_statement(path: Path, qualname: str, statement: str) -> list[str]:
    """``statement`` first in the body of ``qualname`` in ``path`` (a link is replaced by a
    file); the qualified names of the file's functions whose lines it moved."""
    text = path.read_text()
    tree = ast.parse(text)
    scope, node = tree.body, None
    for name in qualname.split("."):
        node = next(n for n in scope if getattr(n, "name", None) == name)
        scope = node.body
    first = node.body[0]
    lines = text.splitlines(keepends=True)
    lines.insert(first.lineno - 1, " " * first.col_offset + statement + "\n")
    path.unlink()
    path.write_text("".join(lines))
    moved = []

    def walk(body: list, prefix: str) -> None:
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno >= first.lineno:
                moved.append(prefix + n.name)
            elif isinstance(n, ast.ClassDef):
                walk(n.body, f"{prefix}{n.name}.")

    walk(tree.body, "")
    return moved


def series(name: str, *, args: list[str], env: dict, cwd: str, edited: Path, function: str, work: Path) -> dict:
    """First, second, after the edit, with --verify-store, and without the store; the checks."""
    from sglfix.execution.store import stored_cells_naming

    store = work / f"store-{name}"
    with_store = [*args, "--cache", str(store)]
    first = run(with_store, out=work / f"{name}-1.json", env=env, cwd=cwd, work=work)
    second = run(with_store, out=work / f"{name}-2.json", env=env, cwd=cwd, work=work)

    def ids(cells: set) -> set[str]:
        return {f"{','.join(t) or 'baseline'}::{s}" for s, t in cells}

    direct = ids(stored_cells_naming(str(store), [function]))
    moved = insert_statement(edited, FUNCTION, STATEMENT)
    # A result that cites a line (a crash's frame) is keyed on lines: the functions below the
    # edit moved, and the cells whose such result names one of them run again too.
    prefix = function.partition("::")[0]
    cites = ids(stored_cells_naming(str(store), [f"{prefix}::{q}" for q in moved], placed_only=True))
    named = direct | cites
    third = run(with_store, out=work / f"{name}-3.json", env=env, cwd=cwd, work=work)
    verify = run(
        [*with_store, "--verify-store", str(VERIFY)], out=work / f"{name}-verify.json", env=env, cwd=cwd, work=work
    )
    fresh = run([*args, "--no-cache"], out=work / f"{name}-fresh.json", env=env, cwd=cwd, work=work)
    ran = {k for k, c in third["_cells"].items() if not c.get("stored")}
    served = {k for k, c in third["_cells"].items() if c.get("stored")}
    differ = diff(verdicts(third), verdicts(fresh))
    # A cell whose verdict differs between two runs that both ran every cell (the first and the
    # one without the store) is the code under test's own run-to-run variation: named.
    varies = diff(verdicts(first), verdicts(fresh))
    meant = {k: c.get("meaning") for k, c in third["_cells"].items()}
    meant_fresh = {k: c.get("meaning") for k, c in fresh["_cells"].items()}
    checks = {
        "second run ran no cell": second["ran"] == 0,
        "second run at most 5 % of the first (process wall)": second["process_s"] <= 0.05 * first["process_s"],
        "after the edit, exactly the cells whose record names the function ran": ran == named,
        "after the edit, every served cell has the verdict of the run without the store": not served & set(differ),
        "after the edit, every cell means what it means without the store": meant == meant_fresh,
        "the gate's outcome equals the run without the store's": third["outcome"] == fresh["outcome"],
        "second run's verdicts equal the first's": verdicts(second) == verdicts(first),
        f"--verify-store {VERIFY} found every served cell it re-ran the same": "error" not in verify
        and verify["verified"] == min(VERIFY, verify["served"]),
    }
    return {
        "one_function_edit": {
            "function": function,
            "edit": f"{STATEMENT!r} put first in its body",
            "cells": third["cells"],
            "ran": third["ran"],
            "served": third["served"],
            "expected_to_run": len(named),
            "of_which_only_cite_a_line_the_edit_moved": len(cites - direct),
        },
        "first": {k: v for k, v in first.items() if k != "_cells"},
        "second": {k: v for k, v in second.items() if k != "_cells"},
        "after_edit": {k: v for k, v in third.items() if k != "_cells"},
        "verify_store": {k: v for k, v in verify.items() if k != "_cells"},
        "without_store": {k: v for k, v in fresh.items() if k != "_cells"},
        "second_over_first": round(second["process_s"] / first["process_s"], 4),
        "after_edit_over_first": round(third["process_s"] / first["process_s"], 4),
        "after_edit_vs_without_store": differ,
        "first_vs_without_store (run-to-run variation)": varies,
        "ran_after_edit_not_expected": sorted(ran - named)[:20],
        "served_after_edit_but_named": sorted(named - ran)[:20],
        "checks": checks,
    }


def snapshot(work: Path) -> Path:
    """``work/site``: sglfix as it is now, copied (edits to the checkout while the bench runs
    change nothing of it), with the reproduction's files linked below ``sglfix/backends``, as a
    wheel lays it out: a file replaced there is an edit of the code under test, not of sglfix."""
    import sglfix
    from sglfix.common.codebase import package_dir

    site = work / "site"
    pkg = site / "sglfix"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(sglfix.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__", "backends"))
    for name in ("profiles", "scenarios", "toggles"):
        shutil.rmtree(pkg / name, ignore_errors=True)
        shutil.copytree(package_dir(f"sglfix.{name}"), pkg / name, ignore=skip)
    shutil.copytree(package_dir("sglfix.backends"), pkg / "backends", copy_function=os.symlink, ignore=skip)
    return site


def reproduction(work: Path, env: dict, site: Path) -> dict:
    rel = Path("backends") / "srt" / "layers" / "attention" / "triton_backend.py"
    return series(
        "reproduction",
        args=["matrix", "--parts", "--device", "cpu"],
        env={**env, "PYTHONPATH": str(site)},
        cwd=str(work),
        edited=site / "sglfix" / rel,
        function=f"{rel.as_posix()}::{FUNCTION}",
        work=work,
    )


def real_sglang(work: Path, env: dict, site: Path, *, parts: bool) -> dict:
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed: pip install --no-deps sglang==0.5.23 (README)")
    installed = Path(next(iter(spec.submodule_search_locations)))
    tree = work / "tree"
    shutil.copytree(installed, tree / "sglang", copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))
    rel = Path("srt") / "layers" / "attention" / "triton_backend.py"
    return series(
        "sglang",
        args=["--profile", "sglang-0.5.23", "matrix", *(["--parts"] if parts else []), "--device", "cpu"],
        env={**env, "PYTHONPATH": os.pathsep.join((str(tree), str(site)))},
        cwd=str(work),
        edited=tree / "sglang" / rel,
        function=f"sglang/{rel.as_posix()}::{FUNCTION}",
        work=work,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--skip-sglang", action="store_true")
    ap.add_argument("--skip-reproduction", action="store_true")
    ap.add_argument("--sglang-parts", action="store_true", help="real sglang's matrix with --parts (3060 cells)")
    a = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLFIX_", "SGLANG_DEBUG"))}
    result: dict = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "command": "python bench/store_bench.py " + " ".join(sys.argv[1:]),
        "selection": {
            "reproduction": "matrix --parts: every scenario, every set",
            "sglang": "matrix --parts: every scenario, every set"
            if a.sglang_parts
            else "matrix without --parts: every scenario, each toggle whole (the --parts matrix is 3060 cells; "
            "left out to keep the bench affordable on 2 shared cores)",
        },
    }
    with tempfile.TemporaryDirectory(prefix="sglfix-store-bench-") as tmp:
        work = Path(tmp)
        site = snapshot(work)
        if not a.skip_reproduction:
            result["reproduction"] = reproduction(work, env, site)
        if not a.skip_sglang:
            result["sglang"] = real_sglang(work, env, site, parts=a.sglang_parts)
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
            edit = r["one_function_edit"]
            print(
                f"{name}: first {r['first']['process_s']} s ({r['first']['cells']} cells), second "
                f"{r['second']['process_s']} s ({r['second']['ran']} ran, {r['second_over_first']:.1%} of the first), "
                f"after a one-function edit {r['after_edit']['process_s']} s ({edit['ran']} of {edit['cells']} ran)"
            )
    if failed:
        print("FAILED: " + "; ".join(failed))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
