"""Each applied fix matters: reverting its source lines (as the toggles' YAML
patches will) changes the outcome the way the upstream bug did."""

import pytest
import torch

from sglfix.backends.srt.model_executor.cuda_graph_runner import make_runner_for_case, run_eager
from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import build_case

TB = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend."
CAPTURE = TB + "init_forward_metadata_capture_cuda_graph"
REPLAY = TB + "init_forward_metadata_replay_cuda_graph"
EAGER = TB + "init_forward_metadata"

# PR 26651
KV_LENS = [
    (CAPTURE, [("kv_lens = seq_lens - extend_seq_lens", "kv_lens = seq_lens")]),
    (REPLAY, [("kv_lens = seq_lens - extend_seq_lens", "kv_lens = seq_lens")]),
]
CLAMP = [
    (CAPTURE, [("kv_lens = torch.clamp(kv_lens, min=0)", "")]),
    (REPLAY, [("kv_lens = torch.clamp(kv_lens, min=0)", "")]),
]
FIXTURE = [
    (
        "sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention._set_draft_extend_v2_prefix_lens",
        [("seq_lens = prefix_lens + num_draft_tokens", "seq_lens = prefix_lens")],
    )
]

# PR 26738
OVERLAP = [
    (
        "sglfix.backends.srt.managers.overlap_utils.decide_needs_cpu_seq_lens",
        [
            (
                'return any(getattr(b, "needs_cpu_seq_lens", True) for b in attn_backends if b is not None)',
                "return any(b.needs_cpu_seq_lens for b in attn_backends)",
            )
        ],
    )
]
TRITON_NONE = [
    (
        EAGER,
        [
            ("if seq_lens_sum is None:\nseq_lens_sum = bs * self.max_context_len", ""),
            (
                "if forward_batch.extend_prefix_lens_cpu is not None:\n"
                "kv_indices_len = sum(forward_batch.extend_prefix_lens_cpu)\n"
                "else:\n"
                "kv_indices_len = bs * self.max_context_len",
                "kv_indices_len = sum(forward_batch.extend_prefix_lens_cpu)",
            ),
            (
                "if forward_batch.extend_seq_lens_cpu is not None:\n"
                "max_extend_len = max(forward_batch.extend_seq_lens_cpu)\n"
                "else:\n"
                "max_extend_len = int(forward_batch.extend_seq_lens.max().item())",
                "max_extend_len = max(forward_batch.extend_seq_lens_cpu)",
            ),
        ],
    )
]
GLUE_CONSTANT = [
    (
        "sglfix.backends.srt.speculative.eagle_worker_v2.prepare_for_draft_extend_v2",
        [("forward_batch.extend_seq_lens_cpu = [num_draft_tokens] * bs", "pass")],
    )
]

PREFIX = [5, 40, 17]


def _graph_error(check, *, builder, hook=None, gpu_only=False):
    case = build_case(mode="draft_extend_v2", prefix_lens=PREFIX, seed=3, builder=builder, gpu_only=gpu_only)
    runner = make_runner_for_case(case, backend=case.make_backend(), capture_bs=[4], on_metadata=hook)
    out = runner.replay(case.forward_batch, q=case.q, k=case.k, v=case.v)
    return check.max_error(case, out)


def _eager(case):
    return run_eager(
        backend=case.make_backend(), forward_batch=case.forward_batch,
        q=case.q, k=case.k, v=case.v, layer=case.layer,
    )


def test_26651_triton_kv_lens_revert_diverges_on_graph_path(revert, check):
    with revert(KV_LENS):
        assert _graph_error(check, builder="kit") > 0.1
        assert _graph_error(check, builder="glue", gpu_only=True) > 0.1
        # The eager path takes its page table from extend_prefix_lens: unaffected.
        case = build_case(mode="draft_extend_v2", prefix_lens=PREFIX, seed=3)
        assert check.max_error(case, _eager(case)) < 1e-2
    assert _graph_error(check, builder="kit") < 1e-2


def test_26651_clamp_revert_corrupts_padded_metadata_only(revert, check):
    monotone = {}

    def hook(backend, fb, phase):
        indptr = backend.forward_metadata.kv_indptr
        monotone[phase] = bool((indptr[1:] >= indptr[:-1]).all())

    with revert(CLAMP):
        # Real rows stay right while kv_indptr goes backwards in the padded row.
        assert _graph_error(check, builder="kit", hook=hook) < 1e-2
        assert monotone == {"capture": False, "replay": False}
    _graph_error(check, builder="kit", hook=hook)
    assert monotone == {"capture": True, "replay": True}


def test_26651_fixture_and_kernel_revert_together_mask_the_bug(revert, check):
    with revert(FIXTURE):
        # Fixed backend + old fixture: the kit batch is inconsistent, graphs diverge.
        assert _graph_error(check, builder="kit") > 0.1
        assert _graph_error(check, builder="glue") < 1e-2
    with revert(FIXTURE + KV_LENS):
        # Both reverted: kit scenarios pass again, production (glue) diverges.
        assert _graph_error(check, builder="kit") < 1e-2
        assert _graph_error(check, builder="glue") > 0.1


@pytest.mark.parametrize("gpu_only", [True, False])
def test_26738_overlap_revert_crashes_the_glue(revert, gpu_only):
    # gpu_only: the draft-extend slot is None; otherwise a backend without the flag.
    with revert(OVERLAP):
        with pytest.raises(AttributeError):
            build_case(mode="draft_extend_v2", prefix_lens=PREFIX, builder="glue", gpu_only=gpu_only)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(mode="target_verify"),
        dict(mode="draft_extend_v2", builder="glue"),
        dict(mode="draft_extend", accept_lens=[1, 0, 2]),
    ],
    ids=["verify", "draft-extend-v2-glue", "draft-extend-v1"],
)
def test_26738_triton_none_revert_crashes_gpu_only_paths(revert, kwargs):
    case = build_case(prefix_lens=PREFIX, gpu_only=True, **kwargs)
    with revert(TRITON_NONE):
        with pytest.raises(TypeError):
            _eager(case)
        # With the CPU mirrors present the old code was fine.
        full = build_case(prefix_lens=PREFIX, gpu_only=False, **kwargs)
        _eager(full)


def test_26738_glue_constant_revert_is_correct_but_reads_the_device(revert, check):
    with revert(GLUE_CONSTANT):
        case = build_case(mode="draft_extend_v2", prefix_lens=PREFIX, builder="glue", gpu_only=True)
        assert case.forward_batch.extend_seq_lens_cpu is None
        assert check.max_error(case, _eager(case)) < 1e-2
    case = build_case(mode="draft_extend_v2", prefix_lens=PREFIX, builder="glue", gpu_only=True)
    assert case.forward_batch.extend_seq_lens_cpu == [case.num_draft_tokens] * 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_26738_glue_constant_revert_syncs_on_cuda(revert):
    def run():
        case = build_case(mode="draft_extend_v2", prefix_lens=PREFIX, builder="glue", gpu_only=True)
        backend = case.make_backend()
        _eager(case)  # compile first, outside the checked region
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            run_eager(backend=backend, forward_batch=case.forward_batch, q=case.q, k=case.k, v=case.v, layer=case.layer)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    run()
    with revert(GLUE_CONSTANT):
        with pytest.raises(RuntimeError):
            run()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["decode", "target_verify", "draft_extend_v2"])
def test_graph_replay_is_sync_free_on_cuda(mode):
    case = build_case(mode=mode, prefix_lens=PREFIX, builder="glue" if mode == "draft_extend_v2" else "kit", gpu_only=True)
    runner = make_runner_for_case(case, backend=case.make_backend(), capture_bs=[4])
    runner.replay(case.forward_batch, q=case.q, k=case.k, v=case.v)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        runner.replay(case.forward_batch, q=case.q, k=case.k, v=case.v)
    finally:
        torch.cuda.set_sync_debug_mode("default")
