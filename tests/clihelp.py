"""Run the CLI in-process or as a real subprocess, capturing exit code and output; run a Python
probe in a fresh process and read the JSON it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_cli(*args: str, env: dict | None = None, cwd: str | None = None, timeout: float = 120) -> Result:
    full_env = dict(os.environ)
    # Assertions read the tables' contents: a COLUMNS inherited from the outer run (pytest-xdist sets
    # 80) must not squeeze them. A test of the layout passes its own.
    full_env["COLUMNS"] = "250"
    full_env.update(env or {})
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (fixtures, full_env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "sglfix", *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(result: Result, *needles: str) -> str:
    assert result.code == 2, (result.code, result.out, result.err)
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err and "Traceback" not in result.out
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def run_probe(code: str, *, env: dict | None = None, cwd: str | None = None, timeout: float = 120) -> Any:
    """Run ``code`` in a fresh Python with this checkout on its path (a probe that must not touch
    the test process: a freeze, a collector switched off, module state), require exit 0, and
    return the last line it printed, read as JSON."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(root), **(env or {})},
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
