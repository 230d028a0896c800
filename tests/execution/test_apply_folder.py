"""A worker's candidate-fix folder (``sglfix-apply-*``): a worker ends by SIGKILL to its group,
which runs no exit handler, so the folder outlives it; the next worker to make one removes every
folder whose holder is gone, and never one whose holder lives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

MAKE = textwrap.dedent("""
    import sys, time
    from sglfix.execution.session import _Fixes
    fixes = _Fixes([("+a", "--- a\\n", "sha")])
    print(fixes.files["+a"], flush=True)
    if sys.argv[1] == "hold":
        time.sleep(600)
""")


def _make(tmp_path, mode: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", MAKE, mode], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    path = proc.stdout.readline().strip()
    assert path.startswith(str(tmp_path)), path
    if mode == "hold":
        assert os.path.isfile(path), path
    else:
        proc.wait(timeout=60)  # an exiting worker: its folder goes with it
    return proc, os.path.dirname(path)


def test_a_killed_workers_folder_is_removed_by_the_next_and_a_live_ones_kept(tmp_path):
    dead, dead_dir = _make(tmp_path, "hold")
    os.killpg(dead.pid, signal.SIGKILL)
    dead.wait(timeout=30)
    assert os.path.isdir(dead_dir), "SIGKILL runs no exit handler: the folder is still there"
    live, live_dir = _make(tmp_path, "hold")
    try:
        _, done_dir = _make(tmp_path, "exit")
        time.sleep(0.2)
        assert not os.path.exists(dead_dir), "the folder of a killed worker outlived the next worker's start"
        assert os.path.isdir(live_dir), "a live worker's folder was removed under it"
        assert not os.path.exists(done_dir), "a worker that exited left its folder"
    finally:
        os.killpg(live.pid, signal.SIGKILL)
        live.wait(timeout=30)
