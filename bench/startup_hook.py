"""What the start-up hook costs every Python process: unset (the common case) and set.

Builds sglfix's wheel, installs it (not editable: the way production installs it) into a fresh
virtualenv whose other packages come from this environment, and measures there:
- ``python -X importtime -c pass``: the modules imported at start-up (none of sglfix, yaml,
  torch, rich, typer when unset);
- the wall time of ``python -c pass`` with and without ``zz-sglfix-startup.pth``, interleaved in
  rounds (medians), unset;
- the cost of executing the hook's line itself (unset), timed in-process;
- set: ``SGLANG_DEBUG_REVERT_PR=26738:overlap-guard python -c pass`` (validation, registry load,
  the import finder; nothing is imported from the code under test by ``pass``).

    python bench/startup_hook.py [--rounds 7] [--runs 30] [--json bench/results/startup-hook.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import timeit
from pathlib import Path

from relpaths import relativize

ROOT = Path(__file__).resolve().parent.parent
PTH = "zz-sglfix-startup.pth"
HEAVY = ("yaml", "torch", "rich", "typer", "pydantic")


def _median_ms(cmd: list[str], env: dict, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(tmp / "wheel"),
                str(ROOT),
            ],
            check=True,
        )
        shutil.rmtree(ROOT / "build", ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
        py = str(tmp / "venv" / "bin" / "python")
        site = Path(
            subprocess.run(
                [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        ours = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
        (site / "test-env-packages.pth").write_text("\n".join(ours) + "\n")
        (wheel,) = (tmp / "wheel").glob("sglfix-*.whl")
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
        env = {
            k: v for k, v in os.environ.items() if k not in ("SGLANG_DEBUG_REVERT_PR", "PYTHONPATH", "SGLFIX_PROFILE")
        }
        timing = subprocess.run(
            [py, "-X", "importtime", "-c", "pass"], env=env, capture_output=True, text=True, check=True, cwd=tmp
        ).stderr
        names = [line.rsplit("|", 1)[-1].strip() for line in timing.splitlines() if "|" in line]
        flagged = [n for n in names if "sglfix" in n or n.split(".")[0] in HEAVY]
        pth = site / PTH
        with_hook, without = [], []
        for _ in range(args.rounds):
            with_hook.append(_median_ms([py, "-c", "pass"], env, args.runs))
            pth.rename(pth.with_suffix(".off"))
            without.append(_median_ms([py, "-c", "pass"], env, args.runs))
            pth.with_suffix(".off").rename(pth)
        line = pth.read_text()
        code = compile(line, PTH, "exec")  # site compiles it once per start
        saved = os.environ.pop("SGLANG_DEBUG_REVERT_PR", None)
        n = 20000
        line_us = timeit.timeit(lambda: exec(code, {}), number=n) / n * 1e6
        compile_us = timeit.timeit(lambda: compile(line, PTH, "exec"), number=2000) / 2000 * 1e6
        if saved is not None:
            os.environ["SGLANG_DEBUG_REVERT_PR"] = saved
        # Set, side by side with unset in the same rounds: with the content-keyed cache warm (every
        # process after the first), and cold (an empty cache folder for every process).
        set_env = {**env, "SGLANG_DEBUG_REVERT_PR": "26738:overlap-guard", "SGLFIX_CACHE_DIR": str(tmp / "cache")}
        subprocess.run([py, "-c", "pass"], env=set_env, check=True)  # fills the cache
        set_warm, set_cold, unset = [], [], []
        cold_runs = max(3, args.runs // 3)
        for r in range(args.rounds):
            set_warm.append(_median_ms([py, "-c", "pass"], set_env, args.runs))
            unset.append(_median_ms([py, "-c", "pass"], env, args.runs))
            cold = []
            for i in range(cold_runs):
                cold_env = {**set_env, "SGLFIX_CACHE_DIR": str(tmp / f"cold-{r}-{i}")}
                cold.append(_median_ms([py, "-c", "pass"], cold_env, 1))
            set_cold.append(statistics.median(cold))
        report = {
            "tool": "sglfix bench/startup_hook.py",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "command": "python bench/startup_hook.py" + (f" --json {args.json}" if args.json else ""),
            "install": "pip install --no-deps <sglfix wheel> into a fresh venv (not editable)",
            "unset": {
                "importtime_modules_flagged": flagged,
                "importtime_modules_total": len(names),
                "hook_line_exec_us": round(line_us, 2),
                "hook_line_compile_us": round(compile_us, 2),
                "python_c_pass_ms_with_hook": [round(x, 2) for x in with_hook],
                "python_c_pass_ms_without_hook": [round(x, 2) for x in without],
                "median_with_ms": round(statistics.median(with_hook), 2),
                "median_without_ms": round(statistics.median(without), 2),
            },
            "set": {
                "value": "26738:overlap-guard",
                "python_c_pass_ms_cache_warm": [round(x, 2) for x in set_warm],
                "python_c_pass_ms_cache_cold": [round(x, 2) for x in set_cold],
                "python_c_pass_ms_unset_same_rounds": [round(x, 2) for x in unset],
                "median_warm_ms": round(statistics.median(set_warm), 2),
                "median_cold_ms": round(statistics.median(set_cold), 2),
                "median_unset_ms": round(statistics.median(unset), 2),
                "added_ms_warm": round(statistics.median(w - u for w, u in zip(set_warm, unset)), 2),
                "added_ms_cold": round(statistics.median(c - u for c, u in zip(set_cold, unset)), 2),
            },
        }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(relativize(report), indent=2) + "\n")


if __name__ == "__main__":
    main()
