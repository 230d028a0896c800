"""Workers sharing a GPU through one CUDA MPS daemon of the run's own.

Without MPS, the processes sharing a GPU take turns on it: the device runs one context at a time,
so every read a worker waits on also waits for the other workers' slices (a read after a kernel
is 21x slower by four processes than by one: bench/results/contention-h100.json). A cell is a few
small kernels and many such reads, so the workers spend their time waiting for each other. Under
MPS their kernels share one context on the device and run side by side.

The price is fault isolation: a fatal fault in one client (an illegal address, a device-side
assert) is delivered to every client on that GPU, each with the same error, without saying whose
it was (bench/results/mps-h100.json). So a run under MPS never takes a lost context at its word:
the pool runs every cell that lost its context again alone, outside MPS, where a fault can only
be the cell's own (``sglfix.execution.pool``), and the GPU leaves MPS for the rest of the run.

The daemon runs in the foreground as a child of this process, in a private pipe folder that only
this run's workers are pointed at; it is told to quit when the pool closes, killed if it does
not, and dies with this process otherwise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time

from sglfix.common.errors import ConfigError
from sglfix.execution.devices import uses_cuda

__all__ = ["CONTROL", "LOG_ENV", "PIPE_ENV", "Daemon", "check_mps", "users_daemon"]

CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
_DEFAULT_PIPE = "/tmp/nvidia-mps"  # where a client looks when PIPE_ENV is unset
_READY_S = 10.0
_QUIT_S = 10.0


def users_daemon() -> str | None:
    """The pipe folder of an MPS daemon the workers would join anyway (the user's own, or the
    machine's at the default place), or None."""
    given = os.environ.get(PIPE_ENV)
    if given:
        return given
    return _DEFAULT_PIPE if os.path.exists(os.path.join(_DEFAULT_PIPE, "control")) else None


def check_mps(choice: str, *, device: str, executor: str) -> bool:
    """Whether this run's workers share their GPUs through MPS (``--mps auto|on|off``): by default
    wherever the local workers run on CUDA and the control program is installed. ``on`` where it
    cannot be is one line, exit 2, before any worker starts."""
    if choice not in ("auto", "on", "off"):
        raise ConfigError(f"--mps {choice!r}: use auto, on or off")
    if choice == "off":
        return False
    why = None
    if executor != "local":
        why = "Ray places its actors itself; MPS is for the local workers"
    elif not uses_cuda(device):
        why = "the cells run on the CPU"
    elif users_daemon() is None and shutil.which(CONTROL) is None:
        why = f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)"
    if why is None:
        return True
    if choice == "on":
        raise ConfigError(f"--mps on: {why}; drop --mps on, or give --mps off")
    return False


def _die_with_parent() -> None:  # in the child, before exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Daemon:
    """One MPS control daemon for this run's workers; ``env`` points a worker at it."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="sglfix-mps-")
        self.pipe = os.path.join(self.folder, "pipe")
        self.log = os.path.join(self.folder, "log")
        self.empty = os.path.join(self.folder, "none")  # the pipe folder of no daemon
        for d in (self.pipe, self.log, self.empty):
            os.mkdir(d)
        self.env = {PIPE_ENV: self.pipe, LOG_ENV: self.log}
        self.proc: subprocess.Popen | None = None

    def start(self) -> Daemon:
        """Start it and wait until it answers; raises ConfigError (and leaves nothing) if not."""
        env = {**os.environ, **self.env}
        try:
            self.proc = subprocess.Popen(
                [CONTROL, "-f"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C at the terminal is the pool's to handle
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            self.stop()
            raise ConfigError(f"--mps: {CONTROL} did not start ({exc}); give --mps off") from exc
        until = time.monotonic() + _READY_S
        while not os.path.exists(os.path.join(self.pipe, "control")):
            if self.proc.poll() is not None or time.monotonic() > until:
                code = self.proc.poll()
                self.stop()
                raise ConfigError(
                    f"--mps: the MPS daemon did not come up ({'exit ' + str(code) if code is not None else 'no answer'}); "
                    "give --mps off"
                )
            time.sleep(0.01)
        self._start_server()
        return self

    def _start_server(self) -> None:
        """Ask the daemon for this user's server now (it answers at once and starts the server in
        the background), so that the server sets up its GPUs while the workers import torch; left
        to itself the daemon starts it only when the first worker connects, which then waits for
        it (0.39 s against 0.13 s on one H100: bench/results/first-use-h100.json). Best effort:
        a daemon that refuses still starts the server for the first worker."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [CONTROL],
                input=f"start_server -uid {os.getuid()}\n",
                text=True,
                env={**os.environ, **self.env},
                capture_output=True,
                timeout=_QUIT_S,
            )

    def stop(self) -> None:
        """Tell it to quit (its server goes with it), kill what is left after a bound, remove
        its folder. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [CONTROL],
                    input="quit\n",
                    text=True,
                    env={**os.environ, **self.env},
                    capture_output=True,
                    timeout=_QUIT_S,
                )
            try:
                proc.wait(timeout=_QUIT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.SubprocessError):
                    proc.wait(timeout=_QUIT_S)
        shutil.rmtree(self.folder, ignore_errors=True)
