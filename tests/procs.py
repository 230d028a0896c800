"""Process checks the fault and signal tests share: is a pid still a live process?"""

from __future__ import annotations

import time


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
