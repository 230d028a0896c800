"""CUDA-graph runner: capture/replay with padding matches eager and the truth,
the metadata hook sees every init, and guard zones catch overflowing writes."""

import dataclasses

import pytest
import torch

from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import alloc_static
from sglfix.harness.guards import check_guards, describe_guards
from sglfix.backends.srt.model_executor.cuda_graph_runner import make_runner_for_case, run_eager
from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import build_case, default_device
from sglfix.backends.kernels.ops.attention import create_flashinfer_kv_indices_triton

PREFIX = [5, 40, 17]

GRAPH_MODES = {
    "decode": dict(mode="decode"),
    "verify-tree": dict(mode="target_verify", topk=2, num_steps=3, num_draft_tokens=6),
    "draft-extend-v1": dict(mode="draft_extend", accept_lens=[0, 3, 1]),
    "draft-extend-v2-kit": dict(mode="draft_extend_v2", page_size=16),
    "draft-extend-v2-glue": dict(mode="draft_extend_v2", builder="glue", gpu_only=True),
}


@pytest.mark.parametrize("name", list(GRAPH_MODES))
def test_padded_replay_matches_eager_and_truth(name, check):
    kwargs = dict(prefix_lens=PREFIX, seed=11)
    kwargs.update(GRAPH_MODES[name])
    case = build_case(**kwargs)
    eager = run_eager(
        backend=case.make_backend(), forward_batch=case.forward_batch,
        q=case.q, k=case.k, v=case.v, layer=case.layer,
    )
    case = build_case(**kwargs)  # fresh pools: eager wrote the new K/V already
    backend = case.make_backend()
    phases = []
    runner = make_runner_for_case(
        case, backend=backend, capture_bs=[1, 2, 4],
        on_metadata=lambda be, fb, phase: phases.append((phase, fb.batch_size)),
    )
    out = runner.replay(case.forward_batch, q=case.q, k=case.k, v=case.v)
    assert phases == [("capture", 4), ("capture", 2), ("capture", 1), ("replay", 4)]
    assert out.shape == case.q.shape
    assert check.max_error(case, out) < check.tolerance(case.dtype)
    assert (out.float() - eager.float()).abs().max().item() < check.tolerance(case.dtype)
    assert check_guards(backend.static_buffers) == []


@pytest.mark.fixed_by("26651:clamp")
def test_replay_metadata_is_well_formed_in_padded_rows():
    case = build_case(mode="draft_extend_v2", prefix_lens=PREFIX, seed=5)
    seen = {}

    def hook(backend, fb, phase):
        md = backend.forward_metadata
        seen[phase] = (md.kv_indptr.clone(), md.qo_indptr.clone(), fb.tags)

    runner = make_runner_for_case(case, backend=case.make_backend(), capture_bs=[4], on_metadata=hook)
    runner.replay(case.forward_batch, q=case.q, k=case.k, v=case.v)
    kv_indptr, qo_indptr, tags = seen["replay"]
    assert tags["raw_bs"] == 3 and tags["graph_bs"] == 4
    assert kv_indptr.tolist() == [0, 5, 45, 62, 62]  # prefix only; padded row empty
    assert qo_indptr.tolist() == [0, 4, 8, 12, 16]


def test_one_runner_replays_several_batch_sizes(check):
    """Stale static-buffer contents from a bigger replay must not leak into a smaller one."""
    case = build_case(mode="target_verify", prefix_lens=PREFIX, seed=1)
    runner = make_runner_for_case(case, backend=case.make_backend(), capture_bs=[1, 4])
    out = runner.replay(case.forward_batch, q=case.q, k=case.k, v=case.v)
    assert check.max_error(case, out) < 1e-2

    # The first request alone (bs 1, no padding), on the same pools and runner.
    fb = case.forward_batch
    n = case.num_draft_tokens
    p0 = case.prefix_lens[0]
    first = dataclasses.replace(
        fb,
        batch_size=1,
        req_pool_indices=fb.req_pool_indices[:1],
        seq_lens=fb.seq_lens[:1],
        out_cache_loc=fb.out_cache_loc[:n],
        positions=fb.positions[:n],
        seq_lens_sum=None,
        seq_lens_cpu=None,
        spec_info=dataclasses.replace(fb.spec_info, custom_mask=fb.spec_info.custom_mask[: n * (p0 + n)]),
    )
    out1 = runner.replay(first, q=case.q[:n], k=case.k[:n], v=case.v[:n])
    assert (out1.float() - out[:n].float()).abs().max().item() < 1e-3


def test_guard_zone_catches_write_past_end():
    registry = []
    device = default_device()
    buf = alloc_static((4, 8), dtype=torch.float32, device=device, name="scratch", registry=registry)
    ids = alloc_static((10,), dtype=torch.int64, device=device, name="ids", registry=registry)
    mask = alloc_static((5,), dtype=torch.bool, device=device, name="mask", registry=registry)
    assert check_guards(registry) == []
    buf.fill_(3.0)
    ids.fill_(-1)
    mask.fill_(True)
    assert check_guards(registry) == []
    # An out-of-bounds write through the underlying storage, as a kernel would do.
    flat = registry[1].flat
    flat[10:12] = 7
    assert check_guards(registry) == ["ids"]
    assert describe_guards(registry)[0] == "ids[10]: 2 guard element(s) overwritten, the first 0 past the end"


def test_guard_zone_catches_kernel_overflow():
    """An undersized kv_indices buffer: the Triton kernel writes into its guard zone."""
    device = default_device()
    registry = []
    kv_indices = alloc_static((16,), dtype=torch.int64, device=device, name="kv_indices", registry=registry)
    req_to_token = torch.arange(64, dtype=torch.int32, device=device).view(2, 32)
    kv_indptr = torch.tensor([0, 20], dtype=torch.int32, device=device)
    create_flashinfer_kv_indices_triton[(1,)](
        req_to_token,
        torch.tensor([1], device=device),
        torch.tensor([20], dtype=torch.int32, device=device),
        kv_indptr,
        None,
        kv_indices,
        req_to_token.stride(0),
    )
    assert check_guards(registry) == ["kv_indices"]
