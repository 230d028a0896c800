"""Every forward mode, eager through TritonAttnBackend, against the kit's ground truth."""

import pytest
import torch

from sglfix.backends.srt.model_executor.cuda_graph_runner import run_eager
from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import build_case
from sglfix.backends.srt.model_executor.forward_batch_info import ForwardMode
from sglfix.backends.srt.speculative.eagle_worker_v2 import EagleWorkerV2, LegacyAttnBackend
from sglfix.backends.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

PREFIX = [5, 40, 17]

MODES = {
    "extend": dict(mode="extend", prefix_lens=[5, 40, 0], extend_lens=[3, 17, 5]),
    "decode": dict(mode="decode"),
    "verify-chain": dict(mode="target_verify"),
    "verify-tree": dict(mode="target_verify", topk=2, num_steps=3, num_draft_tokens=6),
    "draft-extend-v1": dict(mode="draft_extend", accept_lens=[0, 3, 1]),
    "draft-extend-v2-kit": dict(mode="draft_extend_v2"),
    "draft-extend-v2-glue": dict(mode="draft_extend_v2", builder="glue", gpu_only=True),
    "draft-extend-v2-glue-cpu": dict(mode="draft_extend_v2", builder="glue", gpu_only=False),
}


@pytest.mark.parametrize("page_size,dtype", [(1, torch.float16), (16, torch.bfloat16)])
@pytest.mark.parametrize("name", list(MODES))
def test_eager_matches_ground_truth(name, page_size, dtype, check):
    kwargs = dict(prefix_lens=PREFIX, seed=7)
    kwargs.update(MODES[name])
    case = build_case(page_size=page_size, dtype=dtype, **kwargs)
    backend = case.make_backend()
    out = run_eager(
        backend=backend, forward_batch=case.forward_batch,
        q=case.q, k=case.k, v=case.v, layer=case.layer,
    )
    assert torch.isfinite(out.float()).all()
    assert check.max_error(case, out) < check.tolerance(dtype)


@pytest.mark.fixed_by("26738:triton-none")
@pytest.mark.parametrize("mode", ["extend", "target_verify", "draft_extend"])
def test_gpu_only_batches_run_without_cpu_mirrors(mode, check):
    extra = {"extend": dict(extend_lens=4), "draft_extend": dict(accept_lens=[1, 2, 0])}.get(mode, {})
    case = build_case(mode=mode, prefix_lens=PREFIX, gpu_only=True, seed=3, **extra)
    fb = case.forward_batch
    assert fb.seq_lens_cpu is None and fb.seq_lens_sum is None and fb.extend_prefix_lens_cpu is None
    out = run_eager(backend=case.make_backend(), forward_batch=fb, q=case.q, k=case.k, v=case.v, layer=case.layer)
    assert check.max_error(case, out) < check.tolerance(case.dtype)


@pytest.mark.fixed_by("26651:fixture", "26738:glue-constant")
def test_draft_extend_v2_conventions():
    kit = build_case(mode="draft_extend_v2", prefix_lens=PREFIX, num_draft_tokens=4)
    glue = build_case(mode="draft_extend_v2", prefix_lens=PREFIX, num_draft_tokens=4, builder="glue", gpu_only=True)
    expected = [p + 4 for p in PREFIX]
    assert kit.forward_batch.seq_lens.tolist() == expected
    assert glue.forward_batch.seq_lens.tolist() == expected
    assert glue.forward_batch.extend_seq_lens_cpu == [4, 4, 4]
    assert glue.forward_batch.seq_lens_cpu is None and glue.forward_batch.seq_lens_sum is None
    assert glue.forward_batch.extend_prefix_lens_cpu is None
    assert glue.worker.draft_extend_attn_backend is None


@pytest.mark.fixed_by("26738:overlap-guard")
def test_decide_needs_cpu_seq_lens():
    case = build_case(mode="decode", prefix_lens=[3])
    triton = case.make_backend()
    assert decide_needs_cpu_seq_lens([triton, triton, None]) is False
    assert decide_needs_cpu_seq_lens([triton, LegacyAttnBackend()]) is True
    assert EagleWorkerV2(triton, triton, None).needs_cpu_seq_lens is False


def test_scattered_slots_fill_pages_in_order():
    case = build_case(mode="extend", prefix_lens=[40, 40], extend_lens=8, page_size=16, seed=0)
    rows = case.model_runner.req_to_token_pool.req_to_token[case.forward_batch.req_pool_indices]
    for row in rows:
        slots = row[:48].to(torch.int64)
        pages = slots // 16
        # Within a page, consecutive slots in position order ...
        assert torch.equal(slots % 16, torch.arange(48, device=slots.device) % 16)
        # ... but the pages themselves are scattered, and never the reserved page 0.
        assert not torch.equal(pages[16::16], pages[:-16:16] + 1)
        assert 0 not in pages.tolist()
    assert case.mode == ForwardMode.EXTEND


def test_the_backend_key_chooses_the_backend_class_not_the_kit():
    """One scenario per ``backend:`` name, same device: the adapter registered for that name
    builds its case and makes the backend of that name's upstream module."""
    from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import default_device
    from sglfix.harness.adapters import ADAPTER_MODULES, get_adapter
    from sglfix.scenario import load_scenarios

    expected = {
        "triton": "triton_backend.TritonAttnBackend",
        "flashinfer": "flashinfer_backend.FlashInferMultiStepDraftBackend",
        "flashinfer_mla": "flashinfer_mla_backend.FlashInferMLA",
        "trtllm_mla": "trtllm_mla_backend.TRTLLMMLABackend",
        "deepseek_v4": "deepseek_v4_backend.DeepseekV4",
    }
    assert set(expected) == set(ADAPTER_MODULES)
    first = {}
    for s in load_scenarios([], builtin=True):
        first.setdefault(s.backend, s)
    assert set(first) == set(expected)
    for name, scenario in first.items():
        adapter = get_adapter(name)
        assert adapter.name == name
        backend = adapter.make_backend(adapter.build(scenario, device=str(default_device())))
        cls = type(backend)
        where = f"{cls.__module__}.{cls.__qualname__}"
        assert where.startswith("sglfix.backends.srt.layers.attention."), where
        assert where.split("attention.", 1)[1].startswith(expected[name]), (name, where)
