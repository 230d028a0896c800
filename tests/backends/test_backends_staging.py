"""The kit builders lay a case out on the host and send it to the device without waiting
(``sglfix.backends.test.kits.attention_unittest.staging``): the ground truth they lay out from
their host copies is what the pools and inputs on the device hold, the host mirrors are what
``.cpu()`` gives, and on CUDA no builder waits for the device."""

from __future__ import annotations

import pytest
import torch

from sglfix.backends.test.kits.attention_unittest import staging
from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import (
    build_case,
    default_device,
)
from sglfix.backends.test.kits.attention_unittest.attention_methods.draft_decode import (
    build_decode_case,
    build_draft_decode_case,
)
from sglfix.backends.test.kits.attention_unittest.attention_methods.dsv4_draft import build_dsv4_draft_decode_case
from sglfix.backends.test.kits.attention_unittest.attention_methods.mla_draft_extend import (
    build_mla_draft_extend_case,
)

DEVICE = default_device()
PREFIX = [37, 0, 90, 5]
MLA = dict(num_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16")
GQA = dict(num_heads=4, num_kv_heads=2, head_dim=64, dtype="float16")

# One of each builder and mode; none goes through the spec-v2 glue or the DRAFT_EXTEND_V2 fixture,
# the engine's own code, whose host reads are part of what a scenario runs.
BUILDERS = {
    "extend": lambda: build_case(mode="extend", prefix_lens=PREFIX, extend_lens=[3, 1, 4, 2], seed=1, device=DEVICE),
    "decode": lambda: build_case(mode="decode", prefix_lens=PREFIX, seed=2, page_size=4, device=DEVICE),
    "verify": lambda: build_case(mode="target_verify", prefix_lens=PREFIX, topk=2, num_draft_tokens=5, seed=3,
                                 device=DEVICE),
    "draft_extend": lambda: build_case(mode="draft_extend", prefix_lens=PREFIX, accept_lens=[0, 2, 3, 1], seed=4,
                                       device=DEVICE),
    "draft_extend_v2_gpu_only": lambda: build_case(mode="draft_extend_v2", prefix_lens=PREFIX, gpu_only=True, seed=5,
                                                   device=DEVICE),
    "draft_decode_mla": lambda: build_draft_decode_case(mla=True, prefix_lens=PREFIX, topk=2, num_steps=3, seed=6,
                                                        device=DEVICE, **MLA),
    "draft_decode_gqa": lambda: build_draft_decode_case(mla=False, prefix_lens=PREFIX, topk=4, num_steps=3, seed=7,
                                                        device=DEVICE, **GQA),
    "decode_gqa": lambda: build_decode_case(mla=False, prefix_lens=PREFIX, seed=8, device=DEVICE, **GQA),
    "mla_draft_extend": lambda: build_mla_draft_extend_case(mode="draft_extend", prefix_lens=PREFIX,
                                                            accept_lens=[0, 1, 2, 3], num_draft_tokens=4,
                                                            page_size=64, seed=9, device=DEVICE),
    "dsv4_draft": lambda: build_dsv4_draft_decode_case(prefix_lens=PREFIX, num_steps=3, num_heads=16,
                                                       dtype="bfloat16", seed=10, device=DEVICE),
}


def _pool_rows(case) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool's K and V buffers as the device holds them, read back."""
    pool = case.forward_batch.token_to_kv_pool
    if hasattr(pool, "kv_buffer"):
        latent = pool.kv_buffer[0].cpu()
        return latent, latent[..., : case.v_pad.shape[-1]]
    return pool.k_buffer[0].cpu(), pool.v_buffer[0].cpu()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_ground_truth_laid_out_on_the_host_is_what_the_device_holds(name):
    case = BUILDERS[name]()
    fb = case.forward_batch
    k_cache, v_cache = _pool_rows(case)
    table = fb.req_to_token_pool.req_to_token.cpu()
    rows = fb.req_pool_indices.cpu().tolist()
    k_pad, v_pad = case.k_pad.cpu(), case.v_pad.cpu()
    assert k_pad.device.type == "cpu" and case.k_pad.device.type == DEVICE.type
    for b, (row, p) in enumerate(zip(rows, case.prefix_lens)):
        slots = table[row, :p].long()
        # Each request's cached prefix in the ground truth is the pool's contents at its slots.
        assert torch.equal(k_pad[b, :p], k_cache[slots]), (name, b)
        assert torch.equal(v_pad[b, :p], v_cache[slots]), (name, b)
    assert _same_rows(case)


def _same_rows(case) -> bool:
    """The new tokens' ground truth holds the rows of the q handed to the forward (the two orders
    differ: by request in one, by step or token in the other)."""
    q_pad, q = case.q_pad.cpu(), case.q.cpu().reshape(-1, *case.q_pad.shape[2:])
    return torch.equal(torch.sort(q_pad[case.q_valid.cpu()].flatten(1), dim=0)[0], torch.sort(q.flatten(1), dim=0)[0])


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_host_mirrors_are_what_cpu_gives(name):
    fb = BUILDERS[name]().forward_batch
    if fb.seq_lens_cpu is None:
        return
    assert torch.equal(fb.seq_lens_cpu, fb.seq_lens.cpu())
    assert fb.seq_lens_cpu.dtype == fb.seq_lens.dtype
    assert fb.seq_lens_sum == int(fb.seq_lens.sum())
    if DEVICE.type == "cpu":
        # .cpu() of a CPU tensor is the tensor itself: the CPU run keeps that aliasing.
        assert fb.seq_lens_cpu is fb.seq_lens


def test_staging_on_the_cpu_is_the_plain_call():
    t = torch.arange(6, dtype=torch.int32)
    assert staging.to_device(t, torch.device("cpu")) is t
    assert staging.mirror(t, torch.zeros(6, dtype=torch.int32)) is t
    dst = torch.zeros(6, dtype=torch.int32)
    staging.fill_(dst, t)
    assert torch.equal(dst, t)
    assert torch.equal(staging.tensor([1, 2], dtype=torch.int64, device=torch.device("cpu")), torch.tensor([1, 2]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_no_builder_waits_for_the_device(name):
    BUILDERS[name]()  # first loads (allocator, pinned pool) outside the check
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        case = BUILDERS[name]()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    # ... and what it sent arrived: the copies were queued, not lost.
    assert _same_rows(case)
