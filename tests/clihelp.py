"""Run the CLI in-process or as a real subprocess, capturing exit code and output; run a Python
probe in a fresh process and read the JSON it prints last.

``run_cli`` runs the real app in this process (``typer.testing.CliRunner``): the same exit code,
stdout and one-line stderr as ``python -m sglfix``, without an interpreter and torch to start for
every call. What the command leaves in the process is undone after it (the environment, the
working directory, ``sys.path``, the code base made active, stand-ins, a release's modules), and
what a fresh process would not remember is forgotten before it (the toggle files and profiles
read, notes said once). ``run_cli(..., subprocess=True)`` starts ``python -m sglfix`` instead: for
a test where the process boundary is the point (cells run, a signal sent, processes counted, the
start-up hook, the entry point itself)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess as _subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


@dataclass
class Result:
    code: int
    out: str
    err: str


def _env(env: dict | None) -> dict[str, str]:
    """The environment a CLI call runs in: this one, COLUMNS=250, ``env``, the fixtures first on
    PYTHONPATH (for the processes it starts)."""
    full_env = dict(os.environ)
    # Assertions read the tables' contents: a COLUMNS inherited from the outer run (pytest-xdist sets
    # 80) must not squeeze them. A test of the layout passes its own.
    full_env["COLUMNS"] = "250"
    full_env.update(env or {})
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (FIXTURES, full_env.get("PYTHONPATH", "")) if p)
    return full_env


def run_cli(
    *args: str, env: dict | None = None, cwd: str | None = None, timeout: float = 120, subprocess: bool = False
) -> Result:
    """``sglfix ARGS``: in this process, or (``subprocess``) as ``python -m sglfix`` with ``timeout``."""
    if subprocess:
        proc = _subprocess.run(
            [sys.executable, "-m", "sglfix", *args],
            capture_output=True,
            text=True,
            env=_env(env),
            cwd=cwd,
            timeout=timeout,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)
    started = sorted(k for k in set(env or {}) & _AT_START if env[k] != os.environ.get(k))
    assert not started, f"{started} act when an interpreter starts: run_cli(..., subprocess=True)"
    return _in_process(list(args), env=_env(env), cwd=cwd)


# Read when an interpreter starts, not by the command: giving one takes a process of its own.
_AT_START = {"PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONSTARTUP"}


def _runner() -> Any:
    from typer._click import formatting
    from typer.testing import CliRunner

    class Runner(CliRunner):
        @contextlib.contextmanager
        def isolation(self, *a: Any, **kw: Any) -> Iterator[Any]:
            with super().isolation(*a, **kw) as streams:
                # Help wraps at the terminal's width (COLUMNS), as in the console script; the
                # runner forces 80.
                formatting.FORCED_WIDTH = None
                yield streams

    return Runner()


def _in_process(args: list[str], *, env: dict[str, str], cwd: str | None) -> Result:
    from sglfix.cli.app import app

    with _fresh_process_state():
        os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        # The app maps every way a command ends to an exit code and one line (SystemExit); an
        # exception escaping it is a failure of the app itself and fails the test.
        result = _runner().invoke(app, args, catch_exceptions=False)
    if result.exit_code == 130 and "sglfix: interrupted" in result.stderr:
        raise KeyboardInterrupt  # Ctrl-C during the call: the test run's to stop, not the command's
    return Result(result.exit_code, result.stdout, result.stderr)


@contextlib.contextmanager
def _fresh_process_state() -> Iterator[None]:
    """Forget before, and undo after, what a command leaves in the process."""
    from sglfix.cli import context
    from sglfix.codebases import records, standins
    from sglfix.common import codebase

    engines = _engines()
    environ = dict(os.environ)
    cwd = os.getcwd()
    path, meta_path = list(sys.path), list(sys.meta_path)
    modules = set(sys.modules)
    active = codebase._ACTIVE
    installed, equivalents = list(standins._INSTALLED), dict(standins._EQUIVALENTS)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    _forget(records, context)
    try:
        yield
    finally:
        engine = sorted(name for name in set(sys.modules) - modules if name in engines)
        added = [p for p in sys.path if p not in path and p]
        os.chdir(cwd)
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
        sys.path[:] = path
        sys.meta_path[:] = meta_path
        for name in set(sys.modules) - modules:
            # The module's own names only: a lazy module's __getattr__ would import more.
            own = getattr(sys.modules.get(name), "__dict__", {})
            where = own.get("__file__") or ""
            if own.get("__sglfix_standin__") or any(where.startswith(p) for p in added):
                del sys.modules[name]
        entered = codebase._ACTIVE if codebase._ACTIVE is not active else None
        codebase._ACTIVE = active
        standins._INSTALLED[:] = installed
        standins._EQUIVALENTS.clear()
        standins._EQUIVALENTS.update(equivalents)
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
        _forget(records, context)
    assert not engine, f"the command imported {engine} into the test process: run_cli(..., subprocess=True)"
    assert entered is None or entered.is_reproduction, (
        f"the command made {entered.name} the test process's code under test: run_cli(..., subprocess=True)"
    )


@functools.cache
def _engines() -> frozenset[str]:
    """The packages of the code bases sglfix replays other than its own (sglang): imported into
    the test process they would be what every later test imports."""
    from sglfix.codebases.records import profiles

    return frozenset(p.package for p in profiles().values() if not p.is_reproduction and p.package)


def _forget(records: Any, context: Any) -> None:
    """What a fresh process has not read yet: toggle files, profiles, where packages are (lru
    caches of sglfix), and the notes it says once."""
    records._FOUND.clear()
    context._NOTED.clear()
    for name, module in list(sys.modules.items()):
        if name == "sglfix" or name.startswith("sglfix."):
            for value in list(vars(module).values()):
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()


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
    proc = _subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(root), **(env or {})},
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
