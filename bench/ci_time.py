"""How long CI takes: `.ci/run` on a fresh clone of a commit, timed end to end, with pytest's
collection time and the costliest test files, written as bench/results/ci-time.json.

    python bench/ci_time.py [--commit REV] [--json OUT] [--target-s 1500] [--keep DIR]

The clone is made from this checkout (only committed work is measured) in a temporary folder, or
in ``--keep DIR`` to look at afterwards. `.ci/run` runs as CI runs it; the only addition is a JUnit
file for pytest through PYTEST_ADDOPTS (the per-file times; the command itself is unchanged), and
an empty sglfix cache folder (SGLFIX_CACHE), so no release, store or parse is served warm from
this machine's earlier runs.
Exit 1 when the run fails or takes longer than the target (CI's 25 minutes by default).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class FileTime(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file: str = Field(description="a test file, from the repository root")
    seconds: float = Field(description="its tests' setup, call and teardown, summed (JUnit)")


class CiTime(BaseModel):
    """bench/results/ci-time.json."""

    model_config = ConfigDict(extra="forbid")
    commit: str
    date: str
    machine: str = Field(description="CPUs, memory and Python of the machine that ran it")
    command: str = Field(description="what was timed")
    ci_wall_s: float = Field(description="`.ci/run` on the fresh clone, start to end")
    target_s: float
    within_target: bool
    exit_code: int
    pytest_s: float | None = Field(description="pytest's own wall time, as its summary line gives it")
    collection_s: float | None = Field(description="`pytest --collect-only -q` in the clone, wall time")
    tests: dict[str, int] = Field(description="outcomes, as pytest's summary line counts them")
    steps_s: dict[str, float] = Field(description="each line of .ci/run, wall time")
    slowest_files: list[FileTime] = Field(description="the ten costliest test files")


def _memory() -> str:
    try:
        with open("/proc/meminfo") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
        return f"{kib / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        return "?"


def _per_file(junit: Path) -> dict[str, float]:
    took: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        # tests.execution.test_x or tests.execution.test_x.TestClass: the module is the last
        # part that is not a class.
        while parts and parts[-1][:1].isupper():
            parts.pop()
        took["/".join(parts) + ".py"] += float(case.get("time") or 0)
    return took


def _summary(log: str) -> tuple[float | None, dict[str, int]]:
    line = next((x for x in reversed(log.splitlines()) if re.search(r"\b(passed|failed)\b.* in [\d.]+s", x)), "")
    took = re.search(r" in ([\d.]+)s", line)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", line)}
    return (float(took[1]) if took else None, counts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "ci-time.json")
    ap.add_argument("--target-s", type=float, default=1500.0)
    ap.add_argument(
        "--keep",
        type=Path,
        help="clone into this folder (kept, with junit.xml and ci-time.log) instead of a temporary one",
    )
    args = ap.parse_args(argv)

    commit = subprocess.run(
        ["git", "rev-parse", args.commit], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="sglfix-ci-time-") as tmp:
        where = args.keep or Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
        subprocess.run(["git", "checkout", "-q", commit], cwd=where, check=True)
        # Kept with --keep: `python tests/budgets.py --junit` makes the budgets from it.
        junit = (args.keep.resolve() / "junit.xml") if args.keep else Path(tmp) / "junit.xml"
        # sglfix's caches (releases fetched, result stores, parsed files) start empty, as on a
        # fresh CI machine, not warm from this machine's earlier runs.
        cache = Path(tmp) / "sglfix-cache"
        env = {**os.environ, "PYTEST_ADDOPTS": f"--junitxml={junit}", "SGLFIX_CACHE": str(cache)}
        env.pop("VIRTUAL_ENV", None)
        steps: dict[str, float] = {}
        lines = [
            x for x in (where / ".ci" / "run").read_text().splitlines() if x and not x.startswith(("#", "set ", "cd "))
        ]
        log_parts = []
        start = time.monotonic()
        code = 0
        # One line at a time, as the script runs them (set -e: the first failure ends it), so that
        # each step's time is known; the whole is the sum plus what bash itself spends.
        for i, line in enumerate(lines, 1):
            t0 = time.monotonic()
            proc = subprocess.run(
                ["bash", "-c", "set -euo pipefail\n" + line], cwd=where, env=env, capture_output=True, text=True
            )
            steps[f"line {i}: {line[:80]}"] = round(time.monotonic() - t0, 1)
            log_parts.append(proc.stdout + proc.stderr)
            print(f"line {i}: {steps[f'line {i}: {line[:80]}']:.0f} s, exit {proc.returncode}", file=sys.stderr)
            if proc.returncode:
                code = proc.returncode
                break
        wall = time.monotonic() - start
        log = "\n".join(log_parts)
        (Path(tmp) / "ci.log").write_text(log)
        if args.keep:
            (args.keep / "ci-time.log").write_text(log)
        pytest_s, counts = _summary(log_parts[0] if log_parts else "")
        collection_s = None
        if code == 0:
            t0 = time.monotonic()
            collected = subprocess.run(
                [str(where / ".venv" / "bin" / "python"), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                cwd=where, capture_output=True, text=True, env={k: v for k, v in env.items() if k != "PYTEST_ADDOPTS"},
            )  # fmt: skip
            collection_s = round(time.monotonic() - t0, 1) if collected.returncode == 0 else None
        files = _per_file(junit) if junit.exists() else {}

    result = CiTime(
        commit=commit,
        date=datetime.now(UTC).strftime("%Y-%m-%d"),
        machine=f"{os.cpu_count()} CPUs, {_memory()}, Python {platform.python_version()}",
        command="bash .ci/run (a fresh clone, a venv made by the script)",
        ci_wall_s=round(wall, 1),
        target_s=args.target_s,
        within_target=code == 0 and wall <= args.target_s,
        exit_code=code,
        pytest_s=pytest_s,
        collection_s=collection_s,
        tests=counts,
        steps_s=steps,
        slowest_files=[
            FileTime(file=name, seconds=round(s, 1)) for name, s in sorted(files.items(), key=lambda kv: -kv[1])[:10]
        ],
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(result.model_dump_json(indent=1) + "\n")
    print(
        f"ci_wall_s={result.ci_wall_s} (target {args.target_s:.0f}) exit={code} pytest_s={pytest_s} "
        f"collection_s={collection_s}; wrote {args.json}"
    )
    return 0 if result.within_target else 1


if __name__ == "__main__":
    sys.exit(main())
