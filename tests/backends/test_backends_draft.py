"""The multi-step EAGLE draft on the FlashInfer backends (MLA and GQA) and their plain decode:
the draft page-table kernel's layout, eager and padded-graph runs against the reference, and
PRs 27460 / 27338 (draft kv_indices rows sized without the topk factor): reverting the sizing
corrupts graph replays and writes past the buffer, and the assertion names the sizes.

The revert patches are read from the toggles' YAML files, so these tests revert exactly what
``sglfix run -r`` reverts."""

from __future__ import annotations

import pytest
import torch
from builders import toggle_patches

from sglfix.backends.kernels.ops.attention.paged_wrappers import TorchDecodeWrapper
from sglfix.backends.kernels.ops.speculative import generate_draft_decode_kv_indices
from sglfix.backends.srt.speculative.eagle_utils import per_step_draft_out_cache_loc
from sglfix.backends.srt.model_executor.cuda_graph_buffer_registry import alloc_static
from sglfix.backends.srt.model_executor.cuda_graph_runner import make_runner_for_case, run_eager
from sglfix.backends.srt.speculative.eagle_draft_cuda_graph_runner import make_draft_runner_for_case, run_draft_eager
from sglfix.backends.test.kits.attention_unittest.attention_methods.draft_decode import (
    build_decode_case,
    build_draft_decode_case,
)
from sglfix.harness.guards import check_guards
from sglfix.harness.invariants import check_metadata
from sglfix.harness.reference import reference_attention

from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import default_device

# The kernels run compiled on CUDA and interpreted on CPU: the tests use whichever is here.
DEVICE = default_device()

PREFIX = [37, 90, 5]
CTX = 128
SHAPES = {
    "mla": dict(mla=True, num_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16"),
    "gqa": dict(mla=False, num_heads=4, num_kv_heads=2, head_dim=64, dtype="float16"),
}
TOLERANCE = {"mla": 2e-2, "gqa": 1e-2}
TOGGLE = {"mla": 27460, "gqa": 27338}


def _draft_case(kind, *, topk=4, num_steps=3, prefix=PREFIX, capture_bs=(4,), seed=1):
    return build_draft_decode_case(prefix_lens=prefix, topk=topk, num_steps=num_steps, seed=seed, device=DEVICE,
                                   max_context_len=CTX, capture_bs=list(capture_bs), **SHAPES[kind])


def _max_error(case, out) -> float:
    ref = reference_attention(q_pad=case.q_pad, k_pad=case.k_pad, v_pad=case.v_pad, mask=case.visible,
                              scale=case.sm_scale)
    expected = ref[case.q_valid]
    got = case.pack_output(out).to(torch.float64).reshape(expected.shape)
    return float((got - expected).abs().max())


def _run_draft(case, *, graph_bs=None, hook=None):
    backend = case.make_backend()
    if graph_bs is None:
        out = run_draft_eager(backend, case.forward_batch, case.q, case.k, case.v, case.layer, hook)
    else:
        runner = make_draft_runner_for_case(case, draft_backend=backend, capture_bs=graph_bs, on_metadata=hook)
        out = runner.replay(case.forward_batch, q=case.q, k=case.k, v=case.v)
    return backend, out


# ----------------------------------------------------------------------------- the kernel


def _expected_rows(req_to_token, req_pool_indices, seq_lens, positions, topk, num_steps, width):
    """Row ``step`` and kv_indptr row ``step`` by the kernel's write formula, in Python."""
    rows = torch.full((num_steps, width), -1, dtype=torch.int32)
    indptr = torch.zeros((num_steps, len(seq_lens) * topk + 1), dtype=torch.int32)
    for step in range(num_steps):
        iters = step + 1
        for bid, seq_len in enumerate(seq_lens):
            cum_seq_len = sum(seq_lens[:bid])
            tokens = req_to_token[req_pool_indices[bid]]
            for topk_id in range(topk):
                offset = cum_seq_len * topk + bid * iters * topk + topk_id * (seq_len + iters)
                draft = seq_len + topk_id * num_steps
                rows[step, offset : offset + seq_len] = tokens[:seq_len]
                rows[step, offset + seq_len : offset + seq_len + iters] = tokens[draft : draft + iters]
        for zid in range(1, len(seq_lens) * topk + 1):
            indptr[step, zid] = int(positions[:zid].sum()) + zid * iters
    return rows, indptr


@pytest.mark.parametrize("topk", [1, 3])
def test_draft_kv_indices_kernel_matches_the_write_formula(topk):
    num_steps, seq_lens = 3, [5, 0, 17]
    with torch.device(DEVICE):
        _check_kernel_formula(topk, num_steps, seq_lens)


def _check_kernel_formula(topk, num_steps, seq_lens):
    req_to_token = torch.arange(6 * 64, dtype=torch.int32).view(6, 64) + 1000
    req_pool_indices = torch.tensor([4, 1, 2], dtype=torch.int64)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    positions = seq_lens_t.repeat_interleave(topk).to(torch.int64)
    width = 3 * topk * 64
    kv_indices = torch.full((num_steps, width), -1, dtype=torch.int32)
    kv_indptr = torch.zeros((num_steps, 3 * topk + 1), dtype=torch.int32)
    generate_draft_decode_kv_indices[(num_steps, 3, topk)](
        req_pool_indices, req_to_token, seq_lens_t, kv_indices, kv_indptr, positions,
        req_to_token.shape[1], width, kv_indptr.shape[1], 4, 4, 16, 1,
    )
    rows, indptr = _expected_rows(req_to_token.cpu(), req_pool_indices.tolist(), seq_lens, positions.cpu(), topk,
                                  num_steps, width)
    rows, indptr, kv_indptr, kv_indices = rows.cpu(), indptr.cpu(), kv_indptr.cpu(), kv_indices.cpu()
    assert torch.equal(kv_indptr, indptr)
    for step in range(num_steps):
        used = sum(seq_lens) * topk + 3 * topk * (step + 1)
        assert int(indptr[step, -1]) == used
        assert torch.equal(kv_indices[step, :used], rows[step, :used])
        assert bool((kv_indices[step, used:] == -1).all())


def test_per_step_out_cache_loc_is_step_major():
    loc = torch.arange(2 * 3 * 4)  # [bs=2, topk=3, num_steps=4]
    steps = per_step_draft_out_cache_loc(loc, bs=2, topk=3, num_steps=4)
    assert steps.shape == (4, 6)
    assert steps[1].tolist() == [1, 5, 9, 13, 17, 21]


def test_kernel_stores_past_a_narrow_row_into_the_guard():
    """Stores are bounded by lengths, never by the row width: the last row spills past the end."""
    with torch.device(DEVICE):
        _store_past_a_narrow_row()


def _store_past_a_narrow_row():
    registry = []
    topk, num_steps = 4, 2
    req_to_token = torch.arange(2 * 64, dtype=torch.int32).view(2, 64)
    kv_indices = alloc_static((num_steps, 40), dtype=torch.int32, device=DEVICE, name="rows", registry=registry)
    kv_indptr = torch.zeros((num_steps, topk + 1), dtype=torch.int32)
    seq_lens = torch.tensor([20], dtype=torch.int32)
    generate_draft_decode_kv_indices[(num_steps, 1, topk)](
        torch.tensor([1]), req_to_token, seq_lens, kv_indices, kv_indptr,
        seq_lens.repeat_interleave(topk).to(torch.int64), 64, 40, topk + 1, 1, 2, 4, 1,
    )
    assert check_guards(registry) == ["rows"]


# ----------------------------------------------------------------------------- the stand-in kernel


def test_decode_stand_in_reads_kv_indices_at_run_time_through_raw_memory():
    """A clipped slice is read past its end into the next row (as the GPU reads it); a read past
    the allocation raises."""
    k_cache = torch.randn(16, 1, 8)
    v_cache = torch.randn(16, 1, 8)
    rows = torch.tensor([[3, 5, 7, 9], [11, 13, 2, 4]], dtype=torch.int32)
    wrapper = TorchDecodeWrapper(torch.empty(16, dtype=torch.uint8), "NHD")
    indptr = torch.tensor([0, 6], dtype=torch.int32)
    wrapper.plan(indptr, rows[0][:2], torch.ones(1, dtype=torch.int32), 2, 1, 8, 1)
    rows[1, 1] = 15  # after plan: the kernel reads the indices when it runs
    q = torch.randn(1, 2, 8)
    out = wrapper.run(q, (k_cache, v_cache))
    slots = torch.tensor([3, 5, 7, 9, 11, 15])
    probs = torch.softmax(torch.einsum("hd,ld->hl", q[0], k_cache[slots, 0]) / 8 ** 0.5, dim=-1)
    assert torch.allclose(out[0], probs @ v_cache[slots, 0], atol=1e-5)

    wrapper.plan(torch.tensor([0, 9], dtype=torch.int32), rows[0], torch.ones(1, dtype=torch.int32), 2, 1, 8, 1)
    with pytest.raises(RuntimeError, match="kv_indices read past the end of its allocation"):
        wrapper.run(q, (k_cache, v_cache))


# ----------------------------------------------------------------------------- runs vs the reference


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("topk", [1, 4])
@pytest.mark.parametrize("kind", ["mla", "gqa"])
def test_draft_matches_reference(kind, topk, graph):
    case = _draft_case(kind, topk=topk)
    backend, out = _run_draft(case, graph_bs=[4] if graph else None)  # graph: 3 requests padded to 4
    assert len(out) == case.num_steps - 1
    assert _max_error(case, out) < TOLERANCE[kind]
    assert check_guards(backend.static_buffers) == []


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("kind", ["mla", "gqa"])
def test_plain_decode_matches_reference(kind, graph):
    case = build_decode_case(prefix_lens=PREFIX, seed=2, device=DEVICE, capture_bs=[4], **SHAPES[kind])
    backend = case.make_backend()
    if graph:
        out = make_runner_for_case(case, backend=backend, capture_bs=[4]).replay(
            case.forward_batch, q=case.q, k=case.k, v=case.v)
    else:
        out = run_eager(backend=backend, forward_batch=case.forward_batch, q=case.q, k=case.k, v=case.v,
                        layer=case.layer)
    assert _max_error(case, out) < TOLERANCE[kind]
    assert check_guards(backend.static_buffers) == []


def test_mla_draft_children_plan_one_sequence_per_branch():
    """Each step plans bs * topk branch sequences (prefix + step + 1 draft tokens), one query each."""
    case = _draft_case("mla", topk=4)
    backend = case.make_backend()
    planned = {}
    for step, child in enumerate(backend.attn_backends):
        # Whatever the wrapper (FlashInfer on CUDA, the stand-in on CPU): what it is asked to plan.
        def spy(*args, _plan=child.decode_wrapper.plan, _step=step, **kwargs):
            planned[_step] = [a.cpu().clone() if isinstance(a, torch.Tensor) else a for a in args[:4]]
            return _plan(*args, **kwargs)

        child.decode_wrapper.plan = spy
    out = run_draft_eager(backend, case.forward_batch, case.q, case.k, case.v, case.layer, None)
    assert _max_error(case, out) < TOLERANCE["mla"]
    assert sorted(planned) == list(range(len(backend.attn_backends)))
    for step, child in enumerate(backend.attn_backends):
        qo_indptr, kv_indptr, _, kv_len = planned[step]
        assert qo_indptr.tolist() == list(range(13))
        assert kv_len.tolist() == [p + step + 1 for p in PREFIX for _ in range(4)]
        assert torch.equal(kv_indptr, child.page_table.kv_indptr.cpu())


# ----------------------------------------------------------------------------- PRs 27460 / 27338


@pytest.mark.parametrize("kind", ["mla", "gqa"])
def test_sizing_revert_corrupts_graph_rows_and_writes_past_the_buffer(kind, revert):
    """Without the topk factor (and without the assertion) the rows spill: the replay diverges,
    the last row writes into the guard zone and the judge sees kv_indptr overrun the slice."""
    findings = []

    def hook(backend, fb, phase):
        for i, child in enumerate(backend.attn_backends):
            findings.extend(check_metadata(child.page_table, rows=fb.batch_size * backend.topk,
                                           num_slots=10**6, phase=f"{phase} step {i}"))

    with revert(toggle_patches(f"{TOGGLE[kind]}:sizing") + toggle_patches(f"{TOGGLE[kind]}:assert")):
        case = _draft_case(kind)
        backend, out = _run_draft(case, graph_bs=[4], hook=hook)
        assert _max_error(case, out) > 0.5
        assert check_guards(backend.static_buffers) == ["draft.cuda_graph_kv_indices"]
        assert any("kv_indptr[16] = 544 exceeds kv_indices length 512" in f for f in findings), findings
        # The eager rows carry the topk factor: unaffected.
        case = _draft_case(kind)
        _, out = _run_draft(case)
        assert _max_error(case, out) < TOLERANCE[kind]
    case = _draft_case(kind)
    _, out = _run_draft(case, graph_bs=[4])
    assert _max_error(case, out) < TOLERANCE[kind]


@pytest.mark.parametrize("kind", ["mla", "gqa"])
def test_sizing_revert_alone_trips_the_assertion_naming_the_sizes(kind, revert):
    with revert(toggle_patches(f"{TOGGLE[kind]}:sizing")):
        case = _draft_case(kind)
        with pytest.raises(AssertionError, match=r"needs 580 entries \(seq_lens_sum=133, topk=4, num_steps=3\), "
                                                 r"row width 512"):
            _run_draft(case, graph_bs=[4])
        # topk 1 has no factor to miss.
        case = _draft_case(kind, topk=1)
        _, out = _run_draft(case, graph_bs=[4])
        assert _max_error(case, out) < TOLERANCE[kind]


@pytest.mark.parametrize("kind", ["mla", "gqa"])
def test_assert_revert_alone_changes_nothing(kind, revert):
    with revert(toggle_patches(f"{TOGGLE[kind]}:assert")):
        case = _draft_case(kind)
        backend, out = _run_draft(case, graph_bs=[4])
        assert _max_error(case, out) < TOLERANCE[kind]
        assert check_guards(backend.static_buffers) == []


# ----------------------------------------------------------------------------- the adapters


@pytest.mark.parametrize("kind", ["mla", "gqa"])
def test_adapter_cell_passes_and_flags_the_reverted_sizing(kind, revert):
    from sglfix.harness.cell import run_cell
    from sglfix.scenario.models import ModelShape, Scenario, SpecShape

    model = (ModelShape(num_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16") if kind == "mla"
             else ModelShape(num_heads=4, num_kv_heads=2, head_dim=64, dtype="float16"))
    scenario = Scenario(
        name=f"draft-{kind}", mode="DRAFT_DECODE", prefix_lens=tuple(PREFIX), extend_lens=(12, 12, 12),
        backend="flashinfer_mla" if kind == "mla" else "flashinfer", capture_bs=(4,), model=model,
        spec=SpecShape(topk=4, num_steps=3), max_context_len=CTX, seed=1, tolerance=TOLERANCE[kind],
    )
    assert run_cell(scenario, device=str(DEVICE)).verdict == "PASS"
    with revert(toggle_patches(str(TOGGLE[kind]))):
        result = run_cell(scenario, device=str(DEVICE))
    verdicts = {f["verdict"] for f in result.findings}
    assert result.verdict == "INVARIANT" and "DIVERGE" in verdicts, result.findings
    assert any("replay step 0: kv_indptr[16]" in f["message"] for f in result.findings)
