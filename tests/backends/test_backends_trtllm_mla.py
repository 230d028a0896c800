"""The trtllm MLA backend (draft extend): the block-table kernel, eager and graph-replay
outputs against the reference, and PR 21987 (graph replay must keep the captured
num_draft_tokens query layout whatever the accept lengths)."""

import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglfix.backends.kernels.ops.attention.flashmla_kv_indices import (
    create_flashmla_kv_indices_triton,
    get_num_page_per_block_flashmla,
)
from sglfix.backends.srt.model_executor.cuda_graph_runner import make_runner_for_case, run_eager
from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import default_device
from sglfix.backends.test.kits.attention_unittest.attention_methods.mla_draft_extend import (
    build_mla_draft_extend_case,
)
from sglfix.harness.guards import check_guards
from sglfix.harness.invariants import MetadataFields, check_metadata

REPLAY = (
    "sglfix.backends.srt.layers.attention.trtllm_mla_backend.TRTLLMMLABackend."
    "init_forward_metadata_replay_cuda_graph"
)
# PR 21987 reverted as upstream 0.5.9 had it, flat (the conftest helper drops nesting): the
# runner always hands accept_length_cpu over, so the `else` fast path is never taken here.
PRE_21987 = [
    (
        REPLAY,
        [
            (
                "metadata.max_seq_len_q = num_tokens_per_bs\n"
                "metadata.sum_seq_lens_q = num_tokens_per_bs * bs",
                "metadata.max_seq_len_q = max(spec_info.accept_length_cpu[:bs]) + 1\n"
                "metadata.sum_seq_lens_q = sum(spec_info.accept_length_cpu[:bs]) + bs",
            ),
            (
                "metadata.cu_seqlens_q[: bs + 1].copy_(\n"
                "torch.arange(0, bs * num_tokens_per_bs + 1, step=num_tokens_per_bs,\n"
                "dtype=torch.int32, device=seq_lens.device)\n"
                ")\n"
                "metadata.seq_lens_q[:bs].fill_(num_tokens_per_bs)",
                "accept_length = spec_info.accept_length[:bs]\n"
                "extend_seq_lens = accept_length + 1\n"
                "metadata.cu_seqlens_q[1:].copy_(torch.cumsum(extend_seq_lens, dim=0, dtype=torch.int32))\n"
                "metadata.seq_lens_q.copy_(extend_seq_lens)",
            ),
            (
                "seq_lens = seq_lens[:bs] - metadata.seq_lens_q[:bs] + metadata.max_seq_len_q",
                "seq_lens = seq_lens[:bs] - metadata.seq_lens_q + metadata.max_seq_len_q",
            ),
        ],
    )
]

PREFIX = [5, 70, 33]
N = 4
MODES = ["DRAFT_EXTEND", "DRAFT_EXTEND_V2"]
FIELDS = MetadataFields(
    indptr=("cu_seqlens_q",),
    lengths=("seq_lens_q", "seq_lens_k", "max_seq_len_q", "max_seq_len_k", "sum_seq_lens_q"),
    block_tables={"block_kv_indices": ("seq_lens_k", "page_size")},
)


@pytest.fixture
def toggle_21987(tmp_path):
    """A registry of toggles/21987.yaml alone (the YAML itself, not the flat copy above)."""
    from sglfix.toggling.registry import load_registry

    shutil.copy(Path(__file__).parents[2] / "toggles" / "21987.yaml", tmp_path / "21987.yaml")
    return load_registry(tmp_path)


def _case(mode, *, accept_lens=(1, 3, 0), page_size=32, prefix=PREFIX, capture_bs=None, seed=7):
    return build_mla_draft_extend_case(
        mode=mode, prefix_lens=prefix, accept_lens=accept_lens, num_draft_tokens=N, page_size=page_size,
        num_heads=16, dtype=torch.bfloat16, seed=seed, device=default_device(), capture_bs=capture_bs,
    )


def _invariant_hook(found):
    def hook(backend, fb, phase):
        md = backend.forward_decode_metadata
        view = SimpleNamespace(**vars(md), page_size=backend.page_size)
        found.extend(check_metadata(view, fields=FIELDS, rows=len(fb.req_pool_indices),
                                    num_slots=fb.token_to_kv_pool.num_slots, phase=phase))
    return hook


def _graph_out(case, hook=None):
    backend = case.make_backend()
    runner = make_runner_for_case(case, backend=backend, capture_bs=[4], on_metadata=hook)
    return runner.replay(case.forward_batch, q=case.q, k=case.k, v=case.v), backend


# ---------------------------------------------------------------- block table


@pytest.mark.parametrize("page_size", [1, 32, 64])
def test_block_table_kernel_matches_python(page_size):
    gen = torch.Generator().manual_seed(page_size)
    rows, width_tokens = 6, 300
    req_to_token = torch.randint(0, 50, (rows, width_tokens), generator=gen, dtype=torch.int32) * page_size
    req_pool_indices = torch.tensor([4, 1, 5, 2], dtype=torch.int64)
    seq_lens = torch.tensor([0, 1, page_size + 1, 3 * page_size if page_size > 1 else 257], dtype=torch.int32)
    max_blocks = get_num_page_per_block_flashmla(page_size)
    dev = default_device()
    table = torch.full((4, max_blocks), -1, dtype=torch.int32, device=dev)
    create_flashmla_kv_indices_triton[(4,)](
        req_to_token.to(dev), req_pool_indices.to(dev), seq_lens.to(dev), None, table, req_to_token.stride(0),
        max_blocks, PAGED_SIZE=page_size,
    )
    table = table.cpu()
    expect = torch.full_like(table, -1)
    for b, (r, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        pages = math.ceil(n / page_size)
        expect[b, :pages] = req_to_token[r, torch.arange(pages) * page_size] // page_size
    assert torch.equal(table, expect)


def test_padded_block_count_meets_both_constraints():
    backend = _case("DRAFT_EXTEND", page_size=32).make_backend()
    assert backend._calc_padded_blocks(1) == 128  # lcm(128 / 32, 4096 / 32)
    assert backend._calc_padded_blocks(128 * 32 + 1) == 256
    assert _case("DRAFT_EXTEND", page_size=64).make_backend()._calc_padded_blocks(100) == 64


# ---------------------------------------------------------------- outputs


@pytest.mark.parametrize("page_size", [1, 32, 64])
@pytest.mark.parametrize("mode", MODES)
def test_eager_matches_reference(mode, page_size, check):
    case = _case(mode, page_size=page_size)
    found = []
    out = run_eager(backend=case.make_backend(), forward_batch=case.forward_batch, q=case.q, k=case.k,
                    v=case.v, layer=case.layer, on_metadata=_invariant_hook(found))
    assert out.shape == (case.num_tokens, 16, 512)
    assert check.max_error(case, out) < check.tolerance(case.dtype)
    assert found == []


@pytest.mark.fixed_by("21987:uniform-stride")
@pytest.mark.parametrize("mode", MODES)
def test_padded_graph_replay_matches_reference_and_eager(mode, check):
    eager_case = _case(mode)
    eager = run_eager(backend=eager_case.make_backend(), forward_batch=eager_case.forward_batch,
                      q=eager_case.q, k=eager_case.k, v=eager_case.v, layer=eager_case.layer)
    case = _case(mode, capture_bs=[4])  # fresh pools: eager wrote the new latents already
    found = []
    out, backend = _graph_out(case, hook=_invariant_hook(found))
    assert check.max_error(case, out) < check.tolerance(case.dtype)
    assert (out.float() - eager.float()).abs().max().item() < check.tolerance(case.dtype)
    assert found == []
    assert check_guards(backend.static_buffers) == []
    md = backend.forward_decode_metadata
    assert md.cu_seqlens_q.tolist() == [0, 4, 8, 12, 16]
    assert md.seq_lens_k.tolist() == [p + N for p in PREFIX] + [1]  # padded row: fill value 1


# ---------------------------------------------------------------- PR 21987


@pytest.mark.parametrize("mode", MODES)
def test_21987_revert_diverges_on_graph_replay_with_unequal_accept_lengths(mode, check, revert):
    with revert(PRE_21987):
        out, backend = _graph_out(_case(mode, capture_bs=[4]))
        case = _case(mode, capture_bs=[4])
        assert check.max_error(case, out) > 10 * check.tolerance(case.dtype)
        # The shift: max(accept) + 1 - (accept + 1) extra positions per request.
        assert backend.forward_decode_metadata.seq_lens_k.tolist()[:3] == [p + N + 3 - a for p, a in
                                                                         zip(PREFIX, (1, 3, 0))]
        # Eager metadata comes from extend_seq_lens: unaffected.
        eager_case = _case(mode)
        eager = run_eager(backend=eager_case.make_backend(), forward_batch=eager_case.forward_batch,
                          q=eager_case.q, k=eager_case.k, v=eager_case.v, layer=eager_case.layer)
        assert check.max_error(eager_case, eager) < check.tolerance(eager_case.dtype)


def test_21987_revert_hides_when_every_request_accepts_everything(check, revert):
    with revert(PRE_21987):
        case = _case("DRAFT_EXTEND", accept_lens=(N - 1,) * 3, capture_bs=[4])
        out, _ = _graph_out(case)
        assert check.max_error(case, out) < check.tolerance(case.dtype)


@pytest.mark.parametrize(
    "ids, accept_lens, diverges",
    [
        (["21987"], (1, 3, 0), True),
        (["21987:uniform-stride"], (1, 3, 0), True),
        # max(accept) + 1 == num_draft_tokens: the reverted max is the captured one.
        (["21987:fixed-max-sum"], (1, 3, 0), False),
        (["21987:fixed-max-sum"], (1, 1, 0), True),
        # The runner always hands accept_length_cpu over: the removed branch never runs.
        (["21987:no-cpu-fast-path"], (1, 3, 0), False),
        (["21987"], (N - 1,) * 3, False),
    ],
)
def test_21987_toggle_parts(ids, accept_lens, diverges, check, toggle_21987):
    from sglfix.toggling.revert import revert

    held = revert(ids, registry=toggle_21987)
    try:
        case = _case("DRAFT_EXTEND_V2", accept_lens=accept_lens, capture_bs=[4])
        out, _ = _graph_out(case)
    finally:
        held.restore()
    assert (check.max_error(case, out) > 10 * check.tolerance(case.dtype)) == diverges


# ---------------------------------------------------------------- helpers


def test_pad_and_unpad_draft_extend_round_trip():
    backend = _case("DRAFT_EXTEND").make_backend()
    lens = torch.tensor([2, 4, 1], dtype=torch.int32)
    cu = torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    q = torch.randn(7, 2, 3)
    padded = backend.pad_draft_extend_query(q, torch.zeros(3, 4, 2, 3), lens, cu)
    assert torch.equal(padded[1], q[2:6]) and torch.equal(padded[2, 0], q[6])
    assert padded[0, 2:].abs().sum() == 0 and padded[2, 1:].abs().sum() == 0
    assert torch.equal(backend.unpad_draft_extend_output(padded, cu, lens, 7), q)


def test_block_table_invariant_flags_live_pages_outside_the_pool():
    fields = MetadataFields(block_tables={"block_kv_indices": ("seq_lens_k", "page_size")})
    table = torch.tensor([[3, 9, -1], [2, -1, 7]], dtype=torch.int32)
    md = SimpleNamespace(block_kv_indices=table, seq_lens_k=torch.tensor([40, 20]), page_size=32)
    # 10 pages of 32 slots: row 0 reads pages 3 and 9, row 1 page 2 only.
    assert check_metadata(md, fields=fields, rows=2, num_slots=320, phase="p") == []
    md.seq_lens_k = torch.tensor([40, 33])  # row 1 now reads its -1 entry
    assert check_metadata(md, fields=fields, rows=2, num_slots=320, phase="p") == [
        "p: block_kv_indices[1, 1] = -1 outside the KV pool's pages [0, 10)"
    ]
    md.seq_lens_k = torch.tensor([40, 20])
    assert check_metadata(md, fields=fields, rows=2, num_slots=288, phase="p") == [
        "p: block_kv_indices[0, 1] = 9 outside the KV pool's pages [0, 9)"
    ]
    md.seq_lens_k = torch.tensor([97, 0])
    assert check_metadata(md, fields=fields, rows=2, num_slots=320, phase="p") == [
        "p: seq_lens_k[0] = 97 needs 4 pages, block_kv_indices has 3 columns",
        "p: block_kv_indices[0, 2] = -1 outside the KV pool's pages [0, 10)",
    ]


def test_adapter_cell_passes_and_the_revert_diverges(toggle_21987):
    from sglfix.harness.cell import run_cell
    from sglfix.scenario.models import ModelShape, Scenario, SpecShape
    from sglfix.toggling.revert import revert

    scenario = Scenario(
        name="trtllm-mla-draft-extend-unit", mode="DRAFT_EXTEND", backend="trtllm_mla",
        prefix_lens=tuple(PREFIX), extend_lens=(N,) * 3, accept_lens=(1, 3, 0), capture_bs=(4,),
        page_size=64, model=ModelShape(num_heads=16, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16"),
        spec=SpecShape(num_draft_tokens=N), tolerance=2e-2,
    )
    device = str(default_device())
    assert run_cell(scenario, device=device).verdict == "PASS"
    held = revert(["21987"], registry=toggle_21987)
    try:
        result = run_cell(scenario, device=device, toggles=["21987"])
    finally:
        held.restore()
    assert result.verdict == "DIVERGE", result.findings
