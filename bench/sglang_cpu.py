"""Real sglang on a CPU machine: how long the README's set-up takes, and the real-sglang matrix.

1. The install, timed step by step in a fresh virtualenv (no system site packages), exactly as the
   README's sglang command does it: ``pip install torch==2.13.0``, ``pip install --no-deps
   sglang==0.5.23``, ``pip install ".[sglang]"`` (a regular install of this checkout).
2. In that venv, ``sglfix matrix --profile sglang-0.5.23 --parts --device cpu --json`` (the README command): the whole process
   timed, the cells counted by verdict, the gate's exit code, and the code base the report names.

    python bench/sglang_cpu.py [--venv DIR] [--reuse] [--json bench/results/sglang-cpu.json]

``--reuse`` skips the install when ``--venv`` already holds one (the matrix figure alone).
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

from relpaths import relativize, rewrite_json_text

ROOT = Path(__file__).resolve().parent.parent
VERSION = "0.5.23"


def _timed(
    cmd: list[str], *, env: dict | None = None, cwd: Path | None = None
) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    return time.perf_counter() - t0, r


def _check(step: str, r: subprocess.CompletedProcess) -> None:
    if r.returncode != 0:
        sys.exit(f"{step} failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")


def install(venv: Path) -> dict:
    steps = {}
    t, r = _timed([sys.executable, "-m", "venv", str(venv)])
    _check("venv", r)
    steps["venv"] = round(t, 1)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    for name, args in (
        ("torch", ["torch==2.13.0"]),
        ("sglang --no-deps", ["--no-deps", f"sglang=={VERSION}"]),
        ("sglfix[sglang]", [f"{ROOT}[sglang]"]),
    ):
        t, r = _timed(pip + args)
        _check(name, r)
        steps[name] = round(t, 1)
    return {
        "steps_s": steps,
        "total_s": round(sum(steps.values()), 1),
        "venv_mb": round(sum(f.stat().st_size for f in venv.rglob("*") if f.is_file()) / 2**20),
    }


def matrix(venv: Path, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLFIX_", "SGLANG_DEBUG"))}
    env["COLUMNS"] = "200"
    t, r = _timed(
        [
            str(venv / "bin" / "sglfix"),
            "matrix",
            "--profile",
            f"sglang-{VERSION}",
            "--parts",
            "--device",
            "cpu",
            "--json",
            str(out),
        ],
        env=env,
        cwd=Path(tempfile.gettempdir()),
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    return {
        "exit_code": r.returncode,
        "process_wall_s": round(t, 1),
        "cells_wall_s": report.get("wall_s"),
        "cells": len(report.get("cells", [])),
        "summary": report.get("summary"),
        "codebase": report.get("codebase"),
        "expectations": {
            "met": sum(1 for e in report.get("expectations", []) if e.get("met")),
            "total": len(report.get("expectations", [])),
        },
        "stray": len(report.get("stray", [])),
        "tail": (r.stdout + r.stderr)[-1500:],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=None)
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="sglfix-sglang-"))
    venv = args.venv or scratch / "venv"
    try:
        result = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "command": " ".join(["python", "bench/sglang_cpu.py", *sys.argv[1:]]),
        }
        if not (args.reuse and (venv / "bin" / "sglfix").exists()):
            result["install"] = install(venv)
        result["matrix"] = matrix(venv, scratch / "matrix.json")
        if args.json:
            report = scratch / "matrix.json"
            if report.exists():
                # sglfix's own report, its paths of this machine (the scratch venv) rewritten.
                args.json.with_name(args.json.stem + "-matrix.json").write_text(rewrite_json_text(report.read_text()))
            args.json.write_text(json.dumps(relativize(result), indent=2) + "\n")
        print(
            json.dumps(
                {k: v for k, v in result.items() if k != "matrix"}
                | {"matrix": {k: v for k, v in result["matrix"].items() if k != "tail"}},
                indent=2,
            )
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
