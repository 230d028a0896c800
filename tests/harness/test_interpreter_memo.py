"""The interpreter speed-ups change no result: a repeated launch is answered only when every byte
it loads is the same, a nested @jit call sees the same language, and a matrix slice gives the same
cells (verdicts, findings, error sizes) with the memo on and off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from clihelp import run_cli

SCRIPT = textwrap.dedent("""
    import json, os
    import torch, triton
    import triton.language as tl
    from sglfix.harness import interpreter as it

    assert it.install(), "interpreter hooks not installed"
    SCALE = tl.constexpr(2.0)

    @triton.jit
    def _twice(x):
        return x * SCALE

    @triton.jit
    def gather(src, idx, out, n: tl.constexpr):
        i = tl.arange(0, n)
        j = tl.load(idx + i)
        tl.store(out + i, _twice(tl.load(src + j)))

    @triton.jit
    def bump(ctr):
        tl.atomic_add(ctr, 1)

    checks = {}
    def launch(src, idx, fill):
        out = torch.full((4,), fill)          # what the output held before must not matter
        before = dict(it.stats())
        gather[(1,)](src, idx, out, n=4)
        after = it.stats()
        want = src.untyped_storage()
        flat = torch.empty(0, dtype=src.dtype).set_(want)
        expect = flat[src.storage_offset() + idx.long()] * float(SCALE.value)
        assert torch.equal(out, expect), (out, expect)
        return after["hits"] - before["hits"]

    big = torch.arange(32, dtype=torch.float32)
    src = big[:8]                             # the kernel may read past the view: idx 10 below
    idx = torch.tensor([3, 1, 10, 1], dtype=torch.int32)
    builtins_before = tl.core.load
    checks["first"] = launch(src, idx, float("nan"))
    checks["repeat_other_garbage"] = launch(src, idx, 7.0)
    big[20] = 99.0                            # a byte the kernel never loads
    checks["unread_changed"] = launch(src, idx, 0.0)
    big[10] = -5.0                            # past the view, inside the storage, loaded
    checks["read_changed"] = launch(src, idx, 0.0)
    checks["index_changed"] = launch(src, torch.tensor([0, 0, 2, 5], dtype=torch.int32), 0.0)
    SCALE = tl.constexpr(3.0)                 # a global the kernel's helper reads
    checks["global_changed"] = launch(src, idx, 0.0)
    checks["language_restored"] = tl.core.load is builtins_before

    ctr = torch.zeros(1, dtype=torch.int32)
    before = dict(it.stats())
    for _ in range(3):
        bump[(4,)](ctr)
    checks["atomic_count"] = int(ctr.item())
    checks["atomic_uncacheable"] = it.stats()["uncacheable"] - before["uncacheable"]
    checks["stats"] = it.stats()
    print(json.dumps(checks))
""")


def _run(tmp_path, **env):
    script = tmp_path / "memo_probe.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1", **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_launch_is_answered_only_when_every_loaded_byte_is_the_same(tmp_path):
    c = _run(tmp_path)
    assert c["first"] == 0
    assert c["repeat_other_garbage"] == 1  # bytes it only stores may differ
    assert c["unread_changed"] == 1  # bytes it never loads may differ
    assert c["read_changed"] == 0  # a loaded byte past the view changed: run again
    assert c["index_changed"] == 0
    assert c["global_changed"] == 0  # the helper's global is part of the key
    assert c["language_restored"] is True
    assert c["atomic_count"] == 12 and c["atomic_uncacheable"] == 3  # atomics always run
    assert c["stats"]["memo"] is True


def test_memo_off_runs_every_launch(tmp_path):
    c = _run(tmp_path, SGLFIX_KERNEL_MEMO="0")
    assert c["stats"]["memo"] is False and c["stats"]["hits"] == 0 and c["stats"]["launches"] == 0
    assert c["atomic_count"] == 12 and c["language_restored"] is True


def _cells(path):
    data = json.loads(path.read_text())
    out = {}
    for c in data["cells"]:
        out[c["id"]] = {k: c[k] for k in ("verdict", "findings", "error", "revert_env")}
    return data, out


def test_a_matrix_slice_is_the_same_with_the_memo_on_and_off(tmp_path, monkeypatch):
    on, off = tmp_path / "on.json", tmp_path / "off.json"
    args = ("matrix", "--parts", "--device", "cpu", "-s", "triton-target-verify@*", "-s", "fi-draft-topk8@*")
    r_on = run_cli(*args, "--json", str(on), timeout=1200, subprocess=True)
    monkeypatch.setenv("SGLFIX_KERNEL_MEMO", "0")
    r_off = run_cli(*args, "--json", str(off), timeout=1200, subprocess=True)
    assert r_on.code == r_off.code == 0, r_on.err[-2000:] + r_off.err[-2000:]
    data_on, cells_on = _cells(on)
    data_off, cells_off = _cells(off)
    assert cells_on == cells_off
    assert {c["verdict"] for c in cells_on.values()} > {"PASS"}  # the slice holds failing cells too
    assert data_off["kernel_memo"]["memo"] is False and data_off["kernel_memo"]["hits"] == 0
    memo = data_on["kernel_memo"]
    assert memo["memo"] is True and memo["hits"] > memo["launches"] // 2, memo


# What both bfloat16 tests run first: the hooks installed or not (argv[1]: "hooks" or "plain").
_BF16_HEADER = textwrap.dedent("""
    import sys, torch, triton, triton.language as tl
    from sglfix.harness import interpreter as it
    if sys.argv[1] == "hooks":
        assert it.install()
""")


def _error_printed(code: str, mode: str) -> float:
    """The last number ``code`` prints, run under the interpreter after ``_BF16_HEADER``."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run(
        [sys.executable, "-c", _BF16_HEADER + code, mode], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return float(r.stdout.split()[-1])


def test_a_bfloat16_dot_means_on_cpu_what_it_means_on_the_gpu():
    """The interpreter multiplies bfloat16 dot operands as raw bits (sglang's attention kernels
    dot bfloat16 directly); with the hooks installed the product is the float32 one."""
    code = textwrap.dedent("""
        @triton.jit
        def mm(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
            r = tl.arange(0, N)
            a = tl.load(a_ptr + r[:, None] * N + r[None, :])
            b = tl.load(b_ptr + r[:, None] * N + r[None, :])
            tl.store(c_ptr + r[:, None] * N + r[None, :], tl.dot(a, b))

        g = torch.Generator().manual_seed(0)
        a = torch.randn(16, 16, generator=g).to(torch.bfloat16)
        b = torch.randn(16, 16, generator=g).to(torch.bfloat16)
        c = torch.empty(16, 16)
        mm[(1,)](a, b, c, N=16)
        print((c - a.float() @ b.float()).abs().max().item())
    """)
    errors = {mode: _error_printed(code, mode) for mode in ("plain", "hooks")}
    # Triton 3.9's own interpreter gives errors of ~1e10 here ("plain"); the hooks must not.
    assert errors["hooks"] < 1e-4, errors


def test_bfloat16_arithmetic_means_on_cpu_what_it_means_on_the_gpu():
    """The interpreter computes elementwise bfloat16 ops, comparisons, sums, maxima and scans on
    bfloat16's uint16 storage as integers (sglang's MHA decode kernel multiplies bfloat16
    q and k tiles and read NaN on CPU); with the hooks installed each is the float one, rounded
    to bfloat16 as the GPU rounds."""
    code = textwrap.dedent("""
        @triton.jit
        def ops(a_ptr, b_ptr, o_ptr, N: tl.constexpr):
            r = tl.arange(0, N)
            a = tl.load(a_ptr + r)
            b = tl.load(b_ptr + r)
            tl.store(o_ptr + r, (a * b).to(tl.float32))
            tl.store(o_ptr + N + r, (a - b * a).to(tl.float32))
            tl.store(o_ptr + 2 * N + r, tl.where(a < b, 1.0, 0.0))
            tl.store(o_ptr + 3 * N + r, tl.cumsum(a, 0).to(tl.float32))
            tl.store(o_ptr + 4 * N, tl.sum(a * b, 0).to(tl.float32))
            tl.store(o_ptr + 4 * N + 1, tl.max(a, 0).to(tl.float32))
            tl.store(o_ptr + 4 * N + 2, tl.min(-a, 0).to(tl.float32))

        N = 16
        g = torch.Generator().manual_seed(0)
        a = torch.randn(N, generator=g).to(torch.bfloat16)
        b = torch.randn(N, generator=g).to(torch.bfloat16)
        out = torch.zeros(5 * N)
        ops[(1,)](a, b, out, N=N)
        ref = torch.zeros(5 * N)
        ref[:N] = (a * b).float()
        ref[N : 2 * N] = (a - b * a).float()
        ref[2 * N : 3 * N] = (a < b).float()
        ref[3 * N : 4 * N] = a.float().cumsum(0)
        ref[4 * N] = (a * b).float().sum()
        ref[4 * N + 1] = a.float().max()
        ref[4 * N + 2] = (-a).float().min()
        err = ((out - ref).abs() / (1 + ref.abs())).nan_to_num(nan=float("inf"))
        print(err.max().item())
    """)
    # The elementwise results are exact; sums and scans are rounded once to bfloat16 (~2**-8).
    assert _error_printed(code, "hooks") < 1e-2
