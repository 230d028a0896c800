"""Long-lived worker processes that run cells, and the parent-side handle to them.

A fresh process that imports torch and initialises CUDA costs seconds, so a worker runs many
cells and is restarted only after a fault or a timeout. Each request names the toggle set; the
worker applies it the way production does, by setting ``SGLANG_DEBUG_REVERT_PR`` in its own
environment and calling ``maybe_revert_pr_fix()``, restoring the previous set first.

Protocol: one JSON object per line on stdin (request) and on stdout (reply). Everything else
the cell prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from sglfix.harness.cell import CellResult
from sglfix.common.errors import SglfixError

__all__ = ["Worker", "WorkerStartError", "serve"]


class WorkerStartError(SglfixError):
    """A worker process could not even start (import error, broken install)."""

_REPLY = "@@sglfix-reply "
_READY = "@@sglfix-ready"
STARTUP_TIMEOUT = 300.0  # importing torch, initialising CUDA, loading the backends


def _scenario_from_json(data: dict):
    from sglfix.scenario import ModelShape, Scenario, SpecShape

    data = dict(data)
    data["model"] = ModelShape(**data["model"])
    data["spec"] = SpecShape(**data["spec"])
    for key in ("prefix_lens", "extend_lens", "accept_lens", "capture_bs"):
        if data.get(key) is not None:
            data[key] = tuple(data[key])
    return Scenario(**data)


def serve() -> None:
    """The worker's loop (``python -m sglfix.execution.worker``)."""
    out = sys.stdout
    sys.stdout = sys.stderr  # kernels and backends may print; keep the reply channel clean
    from sglfix.toggling.env import ENV_VAR, maybe_revert_pr_fix

    import torch  # noqa: F401 - paid once, before the first cell's clock starts

    import sglfix.backends.srt.model_executor.cuda_graph_runner  # noqa: F401
    import sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention  # noqa: F401

    out.write(_READY + "\n")
    out.flush()
    held = None
    current: list[str] | None = None  # nothing decided yet: the first request sets the variable
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        toggles = request["toggles"]
        scenario = _scenario_from_json(request["scenario"])
        reply: dict[str, Any]
        try:
            if toggles != current:
                if held is not None:
                    held.restore()
                    held = None
                os.environ[ENV_VAR] = ",".join(toggles) if toggles else "0"
                current = None
                held = maybe_revert_pr_fix()
                current = list(toggles)
            from sglfix.harness.cell import run_cell

            cell = run_cell(scenario, device=request["device"], toggles=toggles)
            cell.revert_env = os.environ.get(ENV_VAR)
            reply = cell.to_json()
        except Exception as exc:  # a revert that does not apply: the cell cannot be run
            result = CellResult(scenario=scenario.name, toggles=toggles, device=request["device"])
            result.add("SKIP", f"revert {','.join(toggles)} failed: {str(exc).splitlines()[0]}")
            reply = result.finish().to_json()
        out.write(_REPLY + json.dumps(reply) + "\n")
        out.flush()


class Worker:
    """Parent-side handle: sends a cell, waits with a timeout, restarts after a death."""

    def __init__(self, *, device: str, extra_env: dict[str, str] | None = None) -> None:
        self.device = device
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._buffer = b""

    def _start(self) -> None:
        env = dict(os.environ)
        env.pop("SGLANG_DEBUG_REVERT_PR", None)
        env.update(self.extra_env)
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
            env.setdefault("CUDA_VISIBLE_DEVICES", "")
        env.setdefault("OMP_NUM_THREADS", "1")
        # The worker must run the very sglfix this process runs, whatever the current directory
        # holds: no implicit cwd on sys.path (-P), this package's parent first.
        import sglfix

        home = os.path.dirname(os.path.dirname(os.path.abspath(sglfix.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (home, env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "sglfix.execution.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, start_new_session=True,
        )
        self._buffer = b""
        self._stderr_tail = b""

    def _signal_kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _kill(self) -> None:
        if self.proc is None:
            return
        self._signal_kill()
        self.proc.wait()
        self.proc = None

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                self._kill()
            self.proc = None

    def _drain_stderr(self) -> None:
        assert self.proc is not None
        fd = self.proc.stderr.fileno()
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self._stderr_tail = (self._stderr_tail + chunk)[-4000:]

    def run(self, *, scenario_json: dict, scenario_name: str, toggles: list[str], timeout: float) -> CellResult:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
            if self._wait_for(_READY.encode(), STARTUP_TIMEOUT) in (None, False):
                # No cell has run yet, so this is the environment, not the code under test:
                # stop the whole run rather than fault every cell.
                failed = self._fault(scenario_name, toggles, starting=True)
                raise WorkerStartError(failed.findings[0]["message"] + "; check the install with: python -m sglfix.execution.worker </dev/null")
        assert self.proc is not None
        request = json.dumps({"toggles": toggles, "scenario": scenario_json, "device": self.device}) + "\n"
        try:
            self.proc.stdin.write(request.encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._fault(scenario_name, toggles)
        got = self._wait_for(_REPLY.encode(), timeout)
        if got is None:
            self._kill()
            self.restarts += 1
            result = CellResult(scenario=scenario_name, toggles=toggles, device=self.device)
            result.add("TIMEOUT", f"no result within {timeout:g} s; worker restarted")
            return result.finish()
        if got is False:
            return self._fault(scenario_name, toggles)
        return CellResult.from_json(json.loads(got))

    def _wait_for(self, marker: bytes, timeout: float):
        """The rest of the line after ``marker``; None on timeout; False when the worker died."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        out_fd, err_fd = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        while True:
            if marker in self._buffer and b"\n" in self._buffer.split(marker, 1)[1]:
                line, self._buffer = self._buffer.split(marker, 1)[1].split(b"\n", 1)
                return line.strip() or True
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready = select.select([out_fd, err_fd], [], [], min(left, 1.0))[0]
            if err_fd in ready:
                chunk = os.read(err_fd, 65536)
                self._stderr_tail = (self._stderr_tail + chunk)[-4000:]
            if out_fd in ready:
                chunk = os.read(out_fd, 65536)
                if not chunk:
                    return False
                self._buffer += chunk

    def _fault(self, scenario_name: str, toggles: list[str], *, starting: bool = False) -> CellResult:
        assert self.proc is not None
        try:
            self._drain_stderr()
        except Exception:
            pass
        if starting and self.proc.poll() is None:
            self._signal_kill()
        code = self.proc.wait()
        tail = self._stderr_tail.decode(errors="replace").strip().splitlines()[-3:]
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        self.proc = None
        self.restarts += 1
        result = CellResult(scenario=scenario_name, toggles=toggles, device=self.device)
        what = "worker failed to start" if starting else "worker died"
        result.add("FAULT", f"{what} ({how}): {' | '.join(tail) or 'no output'}", returncode=code)
        return result.finish()


if __name__ == "__main__":
    serve()
