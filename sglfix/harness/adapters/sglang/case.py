"""Scenario -> engine objects for ``backend: triton`` on real sglang: the kit's mock runner with
real pools filled with seeded random K/V, a scattered slot layout, request rows where a scheduler
would put them, the ForwardBatch of the mode (DECODE, EXTEND, TARGET_VERIFY with a seeded draft
tree as the custom mask, DRAFT_EXTEND_V2 by the kit fixture) or, for ``builder: glue``, the glue's
inputs (``glue``), the layer, the new tokens and the ground truth (``truth``).

``gpu_only`` leaves the CPU mirrors None, as the spec-v2 overlap path does.

An encoder-decoder scenario (``batch.encoder_lens``) lays out each request's row as production's
scheduler does: its encoder tokens' slots first (``req_to_token[r, :enc]``, scattered like the rest),
its decoder tokens after them; ``seq_lens`` and positions count decoder tokens only, the batch
carries ``encoder_lens`` (and its CPU mirror) and an empty ``encoder_out_cache_loc`` (the encoder is
cached), the runner's model is an encoder-decoder one. The layer is the self-attention layer, or
with ``model.cross_attention`` the cross layer, which the model calls with no K/V of its own
(``k = v = None``: it writes nothing and reads the cached encoder).

A multi-item scoring scenario (``batch.items``) is a batch as sglang's score API packs it under
``--enable-mis`` (published over the runner's server args before the backend is built): each
request's new tokens are its query, then a delimiter (token 9999) before every item and one after
the last; the batch carries each request's delimiter offsets in its new tokens
(``multi_item_delimiter_indices``, CPU int64, as ``ForwardBatch.init_new`` builds them; empty for a
request given as null, and None for a batch whose requests are all null). The truth sees each item
token the cached prefix, the query and its own item's tokens up to itself, a delimiter the prefix
and query alone (``truth.item_visibility``); the positions the backend must leave in the batch come
from the items alone (``MultiItemLayout``).

An MLA scenario (``model.kv_lora_rank``) builds the kit's MLA case and runner instead: one latent
KV head of ``kv_lora_rank + qk_rope_head_dim`` values (``MLATokenToKVPool``), the layer's value the
latent part of its key (absorbed MLA), queries of the key's width; everything else is shared.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglfix.harness.adapters.sglang.glue import glue_inputs
from sglfix.harness.adapters.sglang.truth import GroundTruth, encoder_truth, ground_truth, tree_visibility
from sglfix.harness.kits import kit as _kit
from sglfix.harness.unavailable import Unavailable

__all__ = ["MIS_DELIMITER", "MultiItemLayout", "SglangCase", "build_case", "multi_item_layout"]

# A graph replay pads its batch with rows that write here: page 0 is never given to a request.
_SINK_PAGE = 0
# Request rows reserved beside the batch: row 0 is the padded rows' row in every graph runner.
_MIN_POOL_ROWS = 32


@dataclass
class SglangCase:
    """One scenario built through sglang: its runner, batch (or the glue's inputs) and ground truth."""

    scenario: Any
    mode: Any  # sglang ForwardMode
    device: str
    runner: Any  # the kit's MockModelRunner (real pools, server args published)
    kit_case: Any
    layer: Any  # sglang RadixAttention, layer 0
    forward_batch: Any  # the ForwardBatch; for builder glue, the one the glue built (after run)
    q: Any  # [T, H, D] packed in request order
    k: Any  # [T, Hkv, D]; None for a cross-attention layer (the cached encoder is its K/V)
    v: Any
    truth: GroundTruth
    glue: Any = None  # for builder glue: the pre-step ScheduleBatch and the glue's inputs
    # Per decode-kernel launch of the backend (recorded by the adapter): whether it asked for the
    # Lean (persistent-grid) kernel, the only reader of the lean_* buffers.
    lean_asked: list[bool] = field(default_factory=list)
    # A multi-item scoring batch (batch.items): what the backend must make of it, from the items.
    multi_item: MultiItemLayout | None = None

    @property
    def num_slots(self) -> int:
        return int(self.runner.token_to_kv_pool.get_key_buffer(0).shape[0])


# sglang's MIS_DELIMITER_TOKEN_ID (srt/constants.py): the token the score API packs between items.
MIS_DELIMITER = 9999


@dataclass
class MultiItemLayout:
    """A multi-item scoring batch as the items alone say it must be: per new token (packed in
    request order) the position the backend must leave in ``forward_batch.positions`` (None for a
    delimiter: masked from every query, its position reaches no row anyone reads), and per request
    its longest item (None: a request without delimiters)."""

    positions: list[int | None]
    longest: list[int | None]
    delimiters: list[list[int]]  # per request: delimiter offsets in its new tokens
    roles: list[str]  # per new token, what it is, for a finding


def multi_item_layout(*, items: Any, prefix_lens: Any, extend_lens: Any) -> MultiItemLayout:
    """Request b's new tokens: its query (``extend - sum(items) - len(items) - 1`` tokens, at
    positions ``prefix + i``), then per item a delimiter and the item's tokens, then a closing
    delimiter. Each item is placed as if it alone followed the query (single-item scoring): its
    j-th token (from 1) at ``prefix + query + j - 1``. A null request keeps its positions."""
    positions: list[int | None] = []
    longest: list[int | None] = []
    delimiters: list[list[int]] = []
    roles: list[str] = []
    for b, (request, p, e) in enumerate(zip(items, prefix_lens, extend_lens)):
        if request is None:
            positions += range(p, p + e)
            roles += (f"request {b} (no items), token {i}" for i in range(e))
            longest.append(None)
            delimiters.append([])
            continue
        query = e - sum(request) - len(request) - 1
        mine: list[int | None] = list(range(p, p + query))
        roles += (f"request {b}, query token {i}" for i in range(query))
        for m, length in enumerate(request):
            mine.append(None)  # the delimiter before the item
            mine += range(p + query, p + query + length)
            roles.append(f"request {b}, delimiter {m}")
            roles += (f"request {b}, item {m} token {j}" for j in range(length))
        mine.append(None)  # the closing delimiter
        roles.append(f"request {b}, closing delimiter")
        positions += mine
        longest.append(max(request, default=0))
        delimiters.append([i for i, pos in enumerate(mine) if pos is None])
    return MultiItemLayout(positions=positions, longest=longest, delimiters=delimiters, roles=roles)


def _prepare_multi_item(*, batch: Any, layout: MultiItemLayout) -> None:
    """The batch's multi-item scoring inputs as ``ForwardBatch.init_new`` sets them under
    ``--enable-mis``: one CPU int64 tensor of delimiter offsets per request (empty for a request
    without delimiters), the delimiter token in ``input_ids`` at those offsets; none at all (None)
    where no request carries delimiters (init_new builds the list only when one does: a generate
    batch under --enable-mis)."""
    import torch

    # A scoring request generates nothing; a batch of them only is a prefill-only batch, which
    # GDN's multi-item path requires (a request without delimiters is a /generate one).
    batch.is_prefill_only = all(layout.delimiters)
    if not any(layout.delimiters):
        batch.multi_item_delimiter_indices = None
        return
    batch.multi_item_delimiter_indices = [torch.tensor(at, dtype=torch.int64) for at in layout.delimiters]
    ids = torch.arange(len(layout.positions), dtype=torch.int64) % MIS_DELIMITER
    ids[torch.tensor([i for i, pos in enumerate(layout.positions) if pos is None], dtype=torch.int64)] = MIS_DELIMITER
    batch.input_ids = ids.to(batch.input_ids.device)


def _forward_mode(name: str) -> Any:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    try:
        return ForwardMode[name]
    except KeyError:
        from sglfix.codebases import active

        raise Unavailable(f"{active().label} has no ForwardMode.{name}") from None


def _dtype(name: str) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def _max_context_len(scenario: Any) -> int:
    """The engine's context length: the scenario's, else the longest request (its encoder tokens
    included) plus a draft window."""
    if scenario.max_context_len:
        return scenario.max_context_len
    longest = max(n + p + e for n, p, e in zip(_encoder_lens(scenario), scenario.prefix_lens, scenario.extend_lens))
    return max(64, 32 * math.ceil((longest + scenario.spec.num_draft_tokens) / 32))


def _encoder_lens(scenario: Any) -> list[int]:
    """Encoder tokens per request ahead of its decoder tokens (0 for a decoder-only model)."""
    enc = getattr(scenario, "encoder_lens", None)
    return list(enc) if enc is not None else [0] * len(scenario.prefix_lens)


def _place_encoder(
    *, runner: Any, batch: Any, encoder_lens: list[int], row_loc: Callable[[int, int], int]
) -> list[list[int]]:
    """An encoder-decoder batch's rows as production's scheduler leaves them: request b's row holds
    its encoder tokens' slots at ``[0, enc)`` and its decoder tokens' after them (the kit wrote the
    decoder's at ``[0, seq)``); ``encoder_lens`` and its CPU mirror on the batch, and no encoder
    write (``encoder_out_cache_loc`` empty: the encoder is cached). Returns each request's encoder
    slots, for the cross layer's truth."""
    import torch

    table = runner.req_to_token_pool.req_to_token
    dev = batch.seq_lens.device
    slots = []
    for b, (n, seq) in enumerate(zip(encoder_lens, batch.seq_lens.tolist())):
        row = [row_loc(b, j) for j in range(n + seq)]
        table[b, : n + seq] = torch.tensor(row, dtype=table.dtype, device=table.device)
        slots.append(row[:n])
    batch.encoder_lens = torch.tensor(encoder_lens, dtype=torch.int64, device=dev)
    batch.encoder_lens_cpu = list(encoder_lens)
    batch.encoder_out_cache_loc = torch.zeros(0, dtype=torch.int64, device=dev)
    _kit("attention").make_encoder_decoder(runner)
    return slots


def _scatter_layout(*, totals: list[int], page_size: int, num_pages: int, gen: Any) -> Callable[[int, int], int]:
    """(request, position) -> KV slot, every request's pages drawn from one random permutation of
    the pool's pages (the sink page excluded): requests interleave and no page order is monotone, so a
    wrong index lands on another token's random K/V, never on the right one by luck."""
    import torch

    needed = [math.ceil(t / page_size) for t in totals]
    perm = [p for p in torch.randperm(num_pages, generator=gen).tolist() if p != _SINK_PAGE]
    if sum(needed) > len(perm):
        raise ValueError(f"the KV pool has {len(perm)} free pages, the batch needs {sum(needed)}")
    pages, start = [], 0
    for n in needed:
        pages.append(perm[start : start + n])
        start += n

    def loc(req: int, pos: int) -> int:
        return pages[req][pos // page_size] * page_size + pos % page_size

    return loc


def _fill_pool(*, runner: Any, gen: Any) -> None:
    """Random K/V in every slot of the pool, so that reading a wrong slot reads wrong numbers."""
    import torch

    pool = runner.token_to_kv_pool
    for buf in (pool.get_key_buffer(0), pool.get_value_buffer(0)):
        buf.copy_(torch.randn(buf.shape, generator=gen, dtype=torch.float32).to(buf.dtype))


def _move_request_rows(*, runner: Any, batch: Any, gen: Any) -> None:
    """The kit writes request b's ``req_to_token`` row at row b; move the rows to random rows past
    row 0 (the graph runners' padding row, all zeros = the sink slot), as a scheduler would, and
    bind the batch to a plan of its final fields."""
    import torch

    table = runner.req_to_token_pool.req_to_token
    bs = len(batch.req_pool_indices)
    rows = torch.randperm(table.shape[0] - 1, generator=gen)[:bs] + 1
    kept = table[:bs].clone()
    table.zero_()
    table[rows.to(table.device)] = kept
    batch.req_pool_indices = rows.to(dtype=batch.req_pool_indices.dtype, device=batch.req_pool_indices.device)
    _kit("attention").bind_own_plan(runner, batch)


def _draft_tree(*, num_draft_tokens: int, topk: int, num_steps: int, gen: Any) -> tuple[list[int], list[int]]:
    """Parents (-1 for the root) and depths of a seeded draft tree in BFS order: node 0 is the
    verified token, each node has at most ``topk`` children, depth at most ``num_steps``; a chain
    when ``topk == 1``."""
    import torch

    parents, depth, children = [-1], [0], [0]
    for i in range(1, num_draft_tokens):
        open_nodes = [j for j in range(i) if children[j] < topk and depth[j] < num_steps]
        if not open_nodes:
            raise ValueError(
                f"num_draft_tokens={num_draft_tokens} does not fit a tree of topk={topk}, num_steps={num_steps}"
            )
        j = open_nodes[-1] if topk == 1 else open_nodes[int(torch.randint(len(open_nodes), (1,), generator=gen))]
        parents.append(j)
        depth.append(depth[j] + 1)
        children.append(0)
        children[j] += 1
    return parents, depth


def _retrieve_tensors(parents: list[int]) -> tuple[Any, Any, Any]:
    """EAGLE's tree walk tensors for one request: index, first child, next sibling (-1: none)."""
    import torch

    n = len(parents)
    first_child, next_sibling = [-1] * n, [-1] * n
    last_child: dict[int, int] = {}
    for i in range(1, n):
        p = parents[i]
        if first_child[p] < 0:
            first_child[p] = i
        else:
            next_sibling[last_child[p]] = i
        last_child[p] = i
    return torch.arange(n), torch.tensor(first_child), torch.tensor(next_sibling)


def _new_tokens(*, scenario: Any, dtype: Any, device: str, gen: Any) -> tuple[Any, Any, Any]:
    import torch

    total = sum(scenario.extend_lens)
    m = scenario.model

    def randn(*shape: int) -> Any:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype).to(device)

    if m.mla:
        # Absorbed MLA: the key is the latent row and its rope part, the value the latent row.
        width = m.kv_lora_rank + m.qk_rope_head_dim
        q, k = randn(total, m.num_heads, width), randn(total, 1, width)
        return q, k, k[..., : m.kv_lora_rank].clone()
    return (
        randn(total, m.num_heads, m.head_dim),
        randn(total, m.num_kv_heads, m.head_dim),
        randn(total, m.num_kv_heads, m.head_dim),
    )


def _null_cpu_mirrors(batch: Any, *, keep_extend_seq_lens: bool = False) -> None:
    """gpu_only: the spec-v2 overlap path leaves every CPU mirror None (no device->host sync)."""
    batch.seq_lens_cpu = None
    batch.seq_lens_sum = None
    batch.extend_prefix_lens_cpu = None
    if not keep_extend_seq_lens:
        batch.extend_seq_lens_cpu = None


def _verify_spec_info(*, batch: Any, scenario: Any, parents: list[list[int]], trees: list[Any], device: str) -> Any:
    """sglang's EagleVerifyInput for the seeded trees: the custom mask row-major per request
    (``ndt`` rows of prefix + ``ndt`` columns: all prefix, then the tree's visibility)."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    spec = scenario.spec
    masks = []
    for p, tree in zip(scenario.prefix_lens, trees):
        rows = torch.ones((spec.num_draft_tokens, p + spec.num_draft_tokens), dtype=torch.bool)
        rows[:, p:] = tree
        masks.append(rows.reshape(-1))
    walks = [_retrieve_tensors(par) for par in parents]
    bs = len(parents)
    return EagleVerifyInput(
        draft_token=batch.input_ids,
        custom_mask=torch.cat(masks).to(device),
        positions=batch.positions,
        retrieve_index=torch.stack([w[0] + b * spec.num_draft_tokens for b, w in enumerate(walks)]).to(device),
        retrieve_next_token=torch.stack([w[1] for w in walks]).to(device),
        retrieve_next_sibling=torch.stack([w[2] for w in walks]).to(device),
        retrieve_cum_len=(torch.arange(bs + 1, dtype=torch.int32) * spec.num_draft_tokens).to(device),
        spec_steps=spec.num_steps,
        topk=spec.topk,
        draft_token_num=spec.num_draft_tokens,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=batch.seq_lens_sum,
        seq_lens_cpu=batch.seq_lens_cpu,
    )


def _prepare_verify(*, batch: Any, case: Any, scenario: Any, device: str, gen: Any) -> list[Any]:
    """Verify: the kit's fixture (seq_lens = cached prefix), a seeded tree per request as the
    custom mask, positions at prefix + depth. Returns the trees' visibility for the truth."""
    kit = _kit("attention")
    import torch

    kit.prepare_target_verify_batch(batch=batch, case=case, device=device)
    spec = scenario.spec
    shapes = [
        _draft_tree(num_draft_tokens=spec.num_draft_tokens, topk=spec.topk, num_steps=spec.num_steps, gen=gen)
        for _ in scenario.prefix_lens
    ]
    parents = [s[0] for s in shapes]
    trees = [tree_visibility(par) for par in parents]
    batch.positions = torch.cat(
        [torch.tensor(d, dtype=torch.int64) + p for (_, d), p in zip(shapes, scenario.prefix_lens)]
    ).to(device)
    if scenario.gpu_only:
        _null_cpu_mirrors(batch)
    batch.spec_info = _verify_spec_info(batch=batch, scenario=scenario, parents=parents, trees=trees, device=device)
    return trees


def _prepare_draft_extend_kit(*, batch: Any, case: Any, scenario: Any, device: str) -> None:
    """DRAFT_EXTEND_V2 by the kit fixture (PR 26651 ``fixture``) and its spec input. gpu_only keeps
    ``extend_seq_lens_cpu``: production's glue supplies it as a host constant even then."""
    kit = _kit("attention")
    kit.set_draft_extend_v2_prefix_lens(batch=batch, case=case, device=device)
    batch.spec_info = kit.make_draft_extend_v2_input(batch=batch, case=case, device=device)
    if scenario.gpu_only:
        _null_cpu_mirrors(batch, keep_extend_seq_lens=True)
        batch.spec_info.seq_lens_cpu = None


def _serve_diffusion_lm(runner: Any, *, canvas: int) -> None:
    """What serving a diffusion LM publishes (``--dllm-algorithm``; the backend then sizes its block
    extend by the runner's ``decode_num_tokens_per_req``), and the block size the model's config
    gives the runner (SDAR's 4, LLaDA2's 32: here the scenario's canvas)."""
    kit = _kit("attention")
    kit.publish_over(runner, dllm_algorithm="LowConfidence")
    runner.decode_num_tokens_per_req = lambda **_: canvas


def _published_spec(scenario: Any) -> tuple[int, int, int] | None:
    """The speculative sizes production publishes for a mode that lays out draft tokens (the
    runner publishes them over the kit's chain convention where they differ)."""
    if scenario.mode not in ("DRAFT_EXTEND_V2", "TARGET_VERIFY"):
        return None
    s = scenario.spec
    return (s.topk, s.num_steps, s.num_draft_tokens)


def build_case(*, scenario: Any, device: str) -> SglangCase:
    """Pools, layout, batch (or the glue's inputs) and ground truth for ``scenario``."""
    kit = _kit("attention")
    import torch
    from sglang.srt.layers.radix_attention import RadixAttention

    mode = _forward_mode(scenario.mode)
    dtype, model = _dtype(scenario.model.dtype), scenario.model
    gen = torch.Generator(device="cpu").manual_seed(scenario.seed)
    ctx = _max_context_len(scenario)
    bs = len(scenario.prefix_lens)
    rows = max(_MIN_POOL_ROWS, bs + 1, (scenario.graph_bs or 0) + 1)
    shape = dict(
        name=scenario.name,
        mode=mode,
        model=model,
        page_size=scenario.page_size,
        prefix_lens=tuple(scenario.prefix_lens),
        extend_lens=tuple(scenario.extend_lens),
        backend=scenario.backend,
    )
    sizing = dict(
        dtype=dtype,
        device=device,
        max_context_len=ctx,
        pool_rows=rows,
        graph=scenario.cuda_graph,
        spec=_published_spec(scenario),
    )
    if model.mla:
        # sglang selects FlashInfer's MLA backend as "flashinfer" on an MLA model.
        case = kit.make_mla_case(**{**shape, "backend": "flashinfer"})
        runner = kit.make_mla_model_runner(case=case, model=model, **sizing)
    else:
        case = kit.make_case(**shape)
        runner = kit.make_model_runner(case=case, head_dim=model.head_dim, **sizing)
    if scenario.deterministic:
        # What --enable-deterministic-inference publishes; the backend reads it when it is built.
        kit.publish_over(runner, enable_deterministic_inference=True)
    if scenario.items is not None:
        # What --enable-mis publishes; the backend reads it when it is built.
        kit.publish_over(runner, enable_mis=True)
    if scenario.mode == "DLLM_EXTEND":
        _serve_diffusion_lm(runner, canvas=scenario.extend_lens[0])
    if scenario.mode == "EXTEND" and scenario.capture_bs:
        # What a full prefill CUDA graph's --cuda-graph-config publishes (capture_bs: its token buckets).
        _kit("graphs").publish_full_prefill(
            runner,
            capture_tokens=list(scenario.capture_bs),
            req_slots=scenario.full_prefill_max_req,
            breakable=scenario.breakable_prefill,
        )
    _fill_pool(runner=runner, gen=gen)
    # An encoder-decoder row: the encoder's tokens, then the decoder's (decoder position i at i + enc).
    enc = _encoder_lens(scenario)
    totals = [n + p + e for n, p, e in zip(enc, scenario.prefix_lens, scenario.extend_lens)]
    # Under decode context parallelism sglang's allocator hands out pages of page_size x dcp_size
    # slots, so that a position's slot modulo dcp_size is its owner rank's.
    alloc_page = scenario.page_size * scenario.dcp_size
    row_loc = _scatter_layout(
        totals=totals,
        page_size=alloc_page,
        gen=gen,
        num_pages=runner.token_to_kv_pool.size // alloc_page,
    )

    def loc(req: int, pos: int) -> int:
        return row_loc(req, enc[req] + pos)

    batch = kit.make_forward_batch(case=case, runner=runner, max_context_len=ctx, device=device, loc_fn=loc)
    encoder_slots = None
    if scenario.encoder_lens is not None:
        encoder_slots = _place_encoder(runner=runner, batch=batch, encoder_lens=enc, row_loc=row_loc)
    _move_request_rows(runner=runner, batch=batch, gen=gen)
    q, k, v = _new_tokens(scenario=scenario, dtype=dtype, device=device, gen=gen)
    trees, glue = None, None
    if scenario.mode == "TARGET_VERIFY":
        trees = _prepare_verify(batch=batch, case=case, scenario=scenario, device=device, gen=gen)
    elif scenario.mode == "DRAFT_EXTEND_V2" and scenario.builder == "glue":
        glue, batch = glue_inputs(batch=batch, runner=runner, scenario=scenario, device=device), None
    elif scenario.mode == "DRAFT_EXTEND_V2":
        _prepare_draft_extend_kit(batch=batch, case=case, scenario=scenario, device=device)
    elif scenario.gpu_only:
        _null_cpu_mirrors(batch)
    multi_item = None
    if scenario.items is not None:
        multi_item = multi_item_layout(
            items=scenario.items, prefix_lens=scenario.prefix_lens, extend_lens=scenario.extend_lens
        )
        _prepare_multi_item(batch=batch, layout=multi_item)
    if model.cross_attention:
        # The cross layer brings no K/V: its queries see the cached encoder, all of it.
        truth = encoder_truth(scenario=scenario, runner=runner, slots=encoder_slots, q=q)
        k = v = None
    else:
        truth = ground_truth(
            scenario=scenario, runner=runner, loc=loc, q=q, k=k, v=v, trees=trees, items=scenario.items
        )
    if model.mla:
        layer = RadixAttention(
            num_heads=model.num_heads,
            head_dim=q.shape[-1],
            scaling=truth.sm_scale,
            num_kv_heads=1,
            layer_id=0,
            v_head_dim=model.kv_lora_rank,
        )
    else:
        from sglang.srt.layers.radix_attention import AttentionType

        layer = RadixAttention(
            num_heads=model.num_heads,
            head_dim=model.head_dim,
            scaling=truth.sm_scale,
            num_kv_heads=model.num_kv_heads,
            layer_id=0,
            # A window model's full-attention layer: the backend keeps the window, the layer none.
            sliding_window_size=-1 if model.sliding_window is None or model.full_layer else model.sliding_window,
            is_cross_attention=model.cross_attention,
            # A diffusion LM's layer (SDAR's, LLaDA2's): no causal mask, the canvas attends both ways.
            **({"attn_type": AttentionType.ENCODER_ONLY} if scenario.mode == "DLLM_EXTEND" else {}),
        )
    return SglangCase(
        scenario=scenario,
        mode=mode,
        device=device,
        runner=runner,
        kit_case=case,
        layer=layer,
        forward_batch=batch,
        q=q,
        k=k,
        v=v,
        truth=truth,
        glue=glue,
        multi_item=multi_item,
    )
