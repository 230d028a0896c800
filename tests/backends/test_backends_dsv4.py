"""The DeepSeek-V4 backend's decode path (sliding-window MLA, page size 256): its Triton kernels
against torch, the multi-step EAGLE draft and plain decode, eager and through padded CUDA graphs,
against a reference that sees each query's window only, and PR 26239 (a draft child baking the
whole all-steps out_cache_loc into its metadata): reverted, the eager draft trips the decode
metadata's one-row-per-request assertion while graphs still write and read the right slots.

The revert patches are read from the toggle's YAML file, so these tests revert exactly what
``sglfix run -r`` reverts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from builders import toggle_patches

from sglfix.backends.kernels.ops.attention.swa_decode import store_kv_at_locs, swa_decode_attention_fwd
from sglfix.backends.srt.model_executor.cuda_graph_runner import make_runner_for_case, run_eager
from sglfix.backends.srt.speculative.eagle_draft_cuda_graph_runner import make_draft_runner_for_case, run_draft_eager
from sglfix.backends.srt.speculative.eagle_utils import per_step_draft_out_cache_loc
from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import default_device
from sglfix.backends.test.kits.attention_unittest.attention_methods.dsv4_draft import (
    build_dsv4_decode_case,
    build_dsv4_draft_decode_case,
)
from sglfix.harness.guards import check_guards
from sglfix.harness.invariants import MetadataFields, check_metadata
from sglfix.harness.reference import compare_outputs, reference_attention

# The kernels run compiled on CUDA and interpreted on CPU: the tests use whichever is here.
DEVICE = default_device()

# Under the window (128); over it with the draft crossing the 256 page; a window spanning two pages.
PREFIX = [37, 254, 300]
SHAPE = dict(num_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16")
TOLERANCE = 2e-2


def _draft_case(num_steps, *, prefix=PREFIX, capture_bs=(4,), seed=1):
    return build_dsv4_draft_decode_case(prefix_lens=prefix, num_steps=num_steps, seed=seed, device=DEVICE,
                                        capture_bs=list(capture_bs), **SHAPE)


def _decode_case(*, prefix=PREFIX, capture_bs=(4,), seed=2):
    return build_dsv4_decode_case(prefix_lens=prefix, seed=seed, device=DEVICE, capture_bs=list(capture_bs), **SHAPE)


def _bad_rows(case, out, *, visible=None) -> int:
    """Query rows off the reference (the judge's rule), against ``visible`` or the case's window."""
    ref = reference_attention(q_pad=case.q_pad, k_pad=case.k_pad, v_pad=case.v_pad,
                              mask=case.visible if visible is None else visible, scale=case.sm_scale)
    return compare_outputs(out=case.pack_output(out), ref=ref, q_valid=case.q_valid, tolerance=TOLERANCE).bad_rows


def _run_draft(case, *, graph_bs=None, hook=None):
    backend = case.make_backend()
    if graph_bs is None:
        out = run_draft_eager(backend, case.forward_batch, case.q, case.k, None, case.layer, hook)
    else:
        runner = make_draft_runner_for_case(case, draft_backend=backend, capture_bs=graph_bs, on_metadata=hook)
        out = runner.replay(case.forward_batch, q=case.q, k=case.k)
    return backend, out


def _run_decode(case, *, graph_bs=None):
    backend = case.make_backend()
    if graph_bs is None:
        out = run_eager(backend=backend, forward_batch=case.forward_batch, q=case.q, k=case.k, v=case.v,
                        layer=case.layer)
    else:
        out = make_runner_for_case(case, backend=backend, capture_bs=graph_bs).replay(
            case.forward_batch, q=case.q, k=case.k, v=case.v)
    return backend, out


def _step_slots(case) -> torch.Tensor:
    fb = case.forward_batch
    return per_step_draft_out_cache_loc(fb.out_cache_loc, bs=fb.batch_size, topk=case.topk, num_steps=case.num_steps)


def _assert_steps_wrote_their_slots(case):
    """Draft token i of every request sits at step i's slot of out_cache_loc."""
    cache = case.model_runner.token_to_kv_pool.get_key_buffer(0)
    slots = _step_slots(case)
    for i in range(case.num_steps - 1):
        assert torch.equal(cache[slots[i]], case.k[i].to(cache.dtype)), f"step {i} wrote elsewhere"


# ----------------------------------------------------------------------------- the kernels


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_window_kernel_matches_torch(dtype):
    """Row t attends indices[t, :lengths[t]] (clamped to the row, -1 skipped); heads not a multiple
    of the head block; a row with nothing to see gives zeros."""
    gen = torch.Generator().manual_seed(0)
    num_slots, heads, dim, dv = 700, 20, 576, 512
    cache = torch.randn(num_slots, 1, dim, generator=gen).to(dtype).to(DEVICE)
    q = torch.randn(6, heads, dim, generator=gen).to(dtype).to(DEVICE)
    indices = torch.randint(0, num_slots, (6, 128), generator=gen, dtype=torch.int32)
    indices[2, 5] = indices[4, 90] = -1
    lengths = torch.tensor([1, 128, 37, 0, 100, 500], dtype=torch.int32)
    out = swa_decode_attention_fwd(q, cache, indices.to(DEVICE), lengths.to(DEVICE), v_head_dim=dv, sm_scale=0.07)

    expected = torch.zeros(6, heads, dv, dtype=torch.float64)
    for t in range(6):
        row = indices[t, : min(int(lengths[t]), 128)]
        row = row[row >= 0].long()
        if row.numel():
            k = cache.cpu()[row, 0].double()
            probs = torch.softmax(torch.einsum("hd,ld->hl", q.cpu()[t].double(), k) * 0.07, dim=-1)
            expected[t] = probs @ k[:, :dv]
    err = (out.cpu().double() - expected).abs() / (1 + expected.abs())
    assert float(err.max()) < TOLERANCE
    assert bool((out[3] == 0).all())


def test_store_kernel_writes_the_latent_at_the_locations_only():
    cache = torch.randn(512, 1, 576).bfloat16().to(DEVICE)
    before = cache.clone()
    k = torch.randn(3, 1, 576).bfloat16().to(DEVICE)
    loc = torch.tensor([300, 7, 511], device=DEVICE)
    store_kv_at_locs(k, loc, cache)
    assert torch.equal(cache[loc], k)
    untouched = torch.ones(512, dtype=torch.bool)
    untouched[loc.cpu()] = False
    assert torch.equal(cache.cpu()[untouched], before.cpu()[untouched])


# ----------------------------------------------------------------------------- runs vs the reference


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("num_steps", [2, 4])
def test_draft_matches_reference(num_steps, graph):
    case = _draft_case(num_steps)
    backend, out = _run_draft(case, graph_bs=[4] if graph else None)  # graph: 3 requests padded to 4
    assert len(out) == num_steps - 1
    assert _bad_rows(case, out) == 0
    _assert_steps_wrote_their_slots(case)
    assert check_guards(backend.static_buffers) == []


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_plain_decode_matches_reference(graph):
    case = _decode_case()
    backend, out = _run_decode(case, graph_bs=[4] if graph else None)
    assert _bad_rows(case, out) == 0
    cache = case.model_runner.token_to_kv_pool.get_key_buffer(0)
    assert torch.equal(cache[case.forward_batch.out_cache_loc], case.k.to(cache.dtype))
    assert check_guards(backend.static_buffers) == []


def test_the_window_is_what_the_judge_sees():
    """Requests past the window read only its 128 latest tokens: against a reference that sees the
    whole sequence, their rows (and only theirs) diverge."""
    case = _draft_case(3)
    _, out = _run_draft(case)
    bs, qmax, lmax = case.visible.shape
    query_pos = torch.tensor(case.prefix_lens)[:, None] + torch.arange(qmax)[None, :]
    whole = (torch.arange(lmax)[None, None, :] <= query_pos[:, :, None]).to(case.visible.device)
    assert int(case.visible.sum(-1).max()) == 128
    assert torch.equal(case.visible[0], whole[0])
    assert _bad_rows(case, out, visible=whole) == 4  # 2 requests past the window x 2 steps


def test_eager_children_bake_their_steps_slots_and_windows():
    """Child i: this step's slots as raw_out_loc, a window ending at its own draft token (through
    req_to_token, across the 256 page), and the page table of that sequence."""
    case = _draft_case(4)
    backend, _ = _run_draft(case)
    fb = case.forward_batch
    req_to_token = fb.req_to_token_pool.req_to_token
    slots = _step_slots(case)
    for i in range(3):
        core = backend.attn_backends[i].forward_metadata.core_attn_metadata
        seq = [p + i + 1 for p in PREFIX]
        assert torch.equal(core.raw_out_loc, slots[i])
        assert torch.equal(core.swa_out_cache_loc, slots[i])
        assert core.seq_lens_casual.tolist() == seq
        assert core.swa_topk_lengths.tolist() == [min(s, 128) for s in seq]
        assert core.page_table.shape[1] == -(-max(seq) // 256)
        for b, r in enumerate(fb.req_pool_indices.tolist()):
            n = min(seq[b], 128)
            window = req_to_token[r, seq[b] - 1 - torch.arange(n, device=DEVICE)]
            assert torch.equal(core.swa_page_indices[b, :n], window)
            assert bool((core.swa_page_indices[b, n:] == -1).all())
            pages = req_to_token[r, : max(seq) : 256] // 256
            assert torch.equal(core.page_table[b], pages)
    # The last child serves no attention step: the eager init leaves it alone, as upstream.
    assert backend.attn_backends[3].forward_metadata is None


def test_adapter_views_pass_the_invariants_and_catch_a_whole_buffer():
    from sglfix.harness.adapters.deepseek_v4 import ADAPTER

    case = _draft_case(3)
    num_slots = case.model_runner.token_to_kv_pool.num_slots
    findings = []

    def hook(backend, fb, phase):
        views = ADAPTER.metadata_views(backend, fb)
        assert [label for label, _, _ in views] == ["step 0", "step 1"]
        for label, view, rows in views:
            findings.extend(check_metadata(view, fields=ADAPTER.metadata_fields, rows=rows, num_slots=num_slots,
                                           phase=f"{phase} {label}"))

    _run_draft(case, hook=hook)
    _run_draft(case, graph_bs=[4], hook=hook)
    assert findings == []

    views = ADAPTER.metadata_views(case.make_backend(), case.forward_batch)
    assert views == [("step 0", None, 3), ("step 1", None, 3)]
    backend, _ = _run_draft(case)
    _, view, rows = ADAPTER.metadata_views(backend, case.forward_batch)[0]
    view.raw_out_loc = case.forward_batch.out_cache_loc  # what the pre-fix child baked
    found = check_metadata(view, fields=ADAPTER.metadata_fields, rows=rows, num_slots=num_slots, phase="eager")
    assert found == ["eager: raw_out_loc has 9 entries (shape (9,)) for 3 rows, not one per row"]


def test_locations_invariant_wants_one_slot_per_row_inside_the_pool():
    fields = MetadataFields(locations=("loc",))
    check = lambda loc: check_metadata(SimpleNamespace(loc=loc), fields=fields, rows=3, num_slots=100, phase="p")
    assert check(torch.tensor([0, 5, 99])) == []
    assert check(torch.tensor([0, 5])) == ["p: loc has 2 entries (shape (2,)) for 3 rows, not one per row"]
    assert check(torch.tensor([0, 100, -1])) == ["p: loc[1] = 100 outside the KV pool [0, 100)"]
    assert check(torch.zeros(3, 1, dtype=torch.int64))[0].startswith("p: loc has 3 entries (shape (3, 1))")
    assert check_metadata(SimpleNamespace(loc=None), fields=fields, rows=3, num_slots=100, phase="p") == []


# ----------------------------------------------------------------------------- PR 26239


@pytest.mark.parametrize("num_steps", [2, 4])
def test_backend_slice_revert_trips_the_eager_assertion_naming_the_shapes(num_steps, revert):
    with revert(toggle_patches("26239:backend-slice")):
        case = _draft_case(num_steps)
        with pytest.raises(AssertionError, match=rf"req_pool_indices.shape=torch.Size\(\[3\]\) "
                                                 rf"seq_lens.shape=torch.Size\(\[3\]\) "
                                                 rf"out_cache_loc.shape=torch.Size\(\[{3 * num_steps}\]\)"):
            _run_draft(case)
        # Graphs never reach it: capture bakes one dummy slot per request, replay truncates the
        # all-steps buffer, and a step's store reads its live slice at forward time.
        case = _draft_case(num_steps)
        backend, out = _run_draft(case, graph_bs=[4])
        assert _bad_rows(case, out) == 0
        _assert_steps_wrote_their_slots(case)
        assert check_guards(backend.static_buffers) == []
        # Plain decode hands one slot per request either way.
        case = _decode_case()
        assert _bad_rows(case, _run_decode(case)[1]) == 0
    case = _draft_case(num_steps)
    assert _bad_rows(case, _run_draft(case)[1]) == 0


def test_worker_helper_revert_changes_nothing(revert):
    """The worker's inline reshape is the helper's layout: a refactor, not a fix on its own."""
    with revert(toggle_patches("26239:worker-helper")):
        for graph_bs in (None, [4]):
            case = _draft_case(3)
            _, out = _run_draft(case, graph_bs=graph_bs)
            assert _bad_rows(case, out) == 0
            _assert_steps_wrote_their_slots(case)


# ----------------------------------------------------------------------------- the adapter


def test_adapter_cell_passes_and_crashes_eagerly_without_the_slice(revert):
    from sglfix.harness.cell import run_cell
    from sglfix.scenario.models import ModelShape, Scenario, SpecShape

    def scenario(capture_bs):
        return Scenario(
            name="dsv4-draft", mode="DRAFT_DECODE", prefix_lens=tuple(PREFIX), extend_lens=(3, 3, 3),
            backend="deepseek_v4", capture_bs=capture_bs, page_size=256,
            model=ModelShape(num_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16"),
            spec=SpecShape(topk=1, num_steps=3), seed=1, tolerance=TOLERANCE,
        )

    for capture_bs in (None, (4,)):
        result = run_cell(scenario(capture_bs), device=str(DEVICE))
        assert result.verdict == "PASS", result.findings
    with revert(toggle_patches("26239")):
        eager = run_cell(scenario(None), device=str(DEVICE))
        graph = run_cell(scenario((4,)), device=str(DEVICE))
    assert eager.verdict == "CRASH", eager.findings
    assert "out_cache_loc.shape=torch.Size([9])" in eager.key_figure
    assert "init_forward_metadata_decode" in eager.key_figure
    assert graph.verdict == "PASS", graph.findings
