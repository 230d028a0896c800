"""Triton's key from sglfix's memo (sglfix.harness.tritonkey): the value Triton computes, served
to the next process, hashed again when the install changes, Triton untouched when unsure."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from clihelp import run_probe

from sglfix.harness import tritonkey

# Triton is imported by the probes only: imported in this process before sglfix.backends, it
# would make the backends refuse to load in the tests that follow (no CUDA, no TRITON_INTERPRET).
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton's own key")

_PROBE = r"""
import json
import triton.runtime.cache as cache
import triton.runtime.autotuner as autotuner
real = cache.triton_key
from sglfix.harness.tritonkey import remember_triton_key
how = remember_triton_key()
print(json.dumps({
    "how": how,
    "key": cache.triton_key(),
    "truth": real.__wrapped__(),  # hashed afresh, past any cache
    "autotuner_same": autotuner.triton_key is cache.triton_key,
    "again": remember_triton_key(),
}))
"""


def _probe(cache_dir) -> dict:
    return run_probe(_PROBE, env={"SGLFIX_CACHE": str(cache_dir)}, timeout=300)


@needs_triton
def test_the_memo_gives_what_triton_computes_and_serves_the_next_process(tmp_path):
    first = _probe(tmp_path)
    assert first["how"] == "computed"
    assert first["key"] == first["truth"]
    assert first["autotuner_same"]  # a module that imported the function by name gets the memo too
    assert first["again"] is None  # installed once
    second = _probe(tmp_path)
    assert second["how"] == "memo"
    assert second["key"] == second["truth"] == first["key"]
    [entry] = list((tmp_path / "triton-key").iterdir())
    assert json.loads(entry.read_text())["key"] == first["key"]


@needs_triton
def test_a_memo_of_another_install_state_is_hashed_again(tmp_path):
    first = _probe(tmp_path)
    [entry] = list((tmp_path / "triton-key").iterdir())
    entry.write_text(json.dumps({"fingerprint": "of a triton since rebuilt", "key": "stale"}))
    again = _probe(tmp_path)
    assert again["how"] == "computed" and again["key"] == first["key"] != "stale"
    entry.write_text("{not json")
    assert _probe(tmp_path)["how"] == "computed"


@needs_triton
def test_an_unwritable_cache_leaves_the_key_right(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = _probe(blocker)  # the cache folder is a file: nothing can be stored there
    assert out["how"] == "computed" and out["key"] == out["truth"]


def test_the_fingerprint_follows_every_file_triton_hashes(tmp_path):
    root = tmp_path / "triton"
    for rel in ("compiler/compiler.py", "backends/nvidia/driver.py", "language/core.py", "_C/libtriton.so"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    (root / "runtime").mkdir()
    (root / "runtime" / "cache.py").write_bytes(b"def triton_key(): ...")
    (root / "tools").mkdir()
    (root / "tools" / "unrelated.py").write_bytes(b"")
    base = tritonkey.fingerprint(str(root), "3.7.0")
    assert base == tritonkey.fingerprint(str(root), "3.7.0")
    assert base != tritonkey.fingerprint(str(root), "3.8.0")
    (root / "tools" / "unrelated.py").write_bytes(b"edited")  # not hashed by Triton either
    assert tritonkey.fingerprint(str(root), "3.7.0") == base
    for rel in ("_C/libtriton.so", "backends/nvidia/driver.py", "runtime/cache.py"):
        path = root / rel
        st = path.stat()
        path.write_bytes(b"y")  # same size: the modification time tells
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        changed = tritonkey.fingerprint(str(root), "3.7.0")
        assert changed != base
        base = changed
    (root / "language" / "extra.py").write_bytes(b"")  # a file added
    assert tritonkey.fingerprint(str(root), "3.7.0") != base


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU worker's boot")
def test_a_gpu_worker_boots_with_the_memo(tmp_path, monkeypatch):
    from sglfix.execution.worker import Worker

    monkeypatch.setenv("SGLFIX_CACHE", str(tmp_path))
    infos = []
    for _ in range(2):
        w = Worker(device="cuda")
        try:
            w.start()
            w.wait_ready()
            infos.append(w.info)
        finally:
            w.kill()
    assert [i["triton_key"] for i in infos] == ["computed", "memo"]
