"""Process checks the fault and signal tests share: is a pid still a live process? And a private
Ray head for the tests that join one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

# A private test head; the token file of another cluster is not ours.
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}


def alive(pid: int) -> bool:
    """A zombie or a dead pid is gone; /proc is the truth (no signal sent, no reaping)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def tagged(tag: str) -> list[int]:
    """Live processes whose environment carries ``SGLFIX_TEST_TAG=tag``: everything a command
    started (workers, Ray's daemons and actors, their children) inherits it."""
    import os

    needle = f"SGLFIX_TEST_TAG={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0") and alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


def wait_untagged(tag: str, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not tagged(tag):
            return []
        time.sleep(0.2)
    return tagged(tag)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def ray_head(*, num_cpus: int) -> Iterator[int]:
    """A Ray head of its own (``ray start --head --block``) on a free port, yielded once it
    accepts connections, torn down with its process group (its daemons, and the actors' workers
    under its raylet)."""
    import pytest

    port = free_port()
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}"]
    cmd += [f"--num-cpus={num_cpus}", "--include-dashboard=false", "--disable-usage-stats"]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **RAY_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the Ray head did not start (exit {proc.poll()})")
                time.sleep(0.5)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def workers_of(parent: int) -> list[int]:
    """The sglfix workers (``sglfix.execution.serve``) ``parent`` started, by pid."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == parent and b"sglfix.execution.serve" in cmd:
            found.append(int(entry))
    return found
