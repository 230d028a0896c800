"""Replays ``backend: triton`` scenarios through the installed sglang's own ``TritonAttnBackend``.

The code under test is sglang's: the backend (built through ``ATTENTION_BACKENDS``), its memory
pools, ``ForwardBatch``, spec-info classes (``EagleVerifyInput``, ``EagleDraftExtendInput``), the
spec-v2 draft-extend glue (``eagle_worker_common.prepare_for_draft_extend``, which bumps
``seq_lens`` before the metadata init) and the kit's ModelRunner stand-in and fixtures (through
``sglfix.harness.kits``, the one door to sglang's private test kit). The judge is sglfix's: the ground
truth is generated here from seeded random K/V, the reference never reads backend metadata,
invariants run after every metadata init and guard zones surround the backend's static buffers.

Modes: DECODE, EXTEND, TARGET_VERIFY (a seeded draft tree as the custom mask) and
DRAFT_EXTEND_V2, built by the kit fixture (``builder: kit``) or by the production glue from the
pre-step scheduler state (``builder: glue``). ``gpu_only`` leaves the CPU mirrors None, as the
spec-v2 overlap path does. Graph scenarios (``capture_bs``) go through the kit's ``GraphRunner``
(``kit("graphs")``, this version's graph runners): the backend's ``init_cuda_graph_state``, its
capture metadata at every captured size, then a replay padded the way sglang's graph runners pad (padded rows: ``seq_lens`` = the backend's fill value,
request row 0, write slot 0, draft-extend window = ``num_draft_tokens``). On CUDA the forward is
a captured ``torch.cuda.CUDAGraph``; on CPU the same capture/replay metadata code runs and the
forward runs eagerly on the same static buffers (Triton kernels under the interpreter).

Every process that imports this sets ``TRITON_INTERPRET=1`` on CPU before triton is imported and
activates the profile's code base (``sglfix.codebases.activate``) before sglang is imported (the
worker does); which sglang version, and so which kit, is the active record's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglfix.harness.adapters.base import AdapterBase, MetadataHook, Prepared, Unavailable
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.kits import kit as _kit

__all__ = ["ADAPTER", "GroundTruth", "SglangCase", "SglangTritonAdapter"]

# A graph replay pads its batch with rows that write here: page 0 is never given to a request.
_SINK_PAGE = 0
# Request rows reserved beside the batch: row 0 is the padded rows' row in every graph runner.
_MIN_POOL_ROWS = 32
# The draft model's vocabulary for the glue (it checks the window's token ids against it); the
# kit's production draft-extend harness configures its runner the same way.
_VOCAB = 64


# ----------------------------------------------------------------------------- the case


@dataclass
class GroundTruth:
    """What each query must see, padded: q [bs, Q, H, D], k/v [bs, L, Hkv, D], visible [bs, Q, L]."""

    q_pad: Any
    k_pad: Any
    v_pad: Any
    visible: Any
    q_valid: Any
    sm_scale: float


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
    k: Any  # [T, Hkv, D]
    v: Any
    truth: GroundTruth
    glue: Any = None  # for builder glue: the pre-step ScheduleBatch and the glue's inputs

    @property
    def num_slots(self) -> int:
        return int(self.runner.token_to_kv_pool.get_key_buffer(0).shape[0])


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
    """The engine's context length: the scenario's, else the longest request plus a draft window."""
    if scenario.max_context_len:
        return scenario.max_context_len
    longest = max(p + e for p, e in zip(scenario.prefix_lens, scenario.extend_lens))
    return max(64, 32 * math.ceil((longest + scenario.spec.num_draft_tokens) / 32))


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
    runner.kv_index_translator.bind_own_plan(batch)


# ----------------------------------------------------------------------------- draft tree (verify)


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


def _tree_visibility(parents: list[int]) -> Any:
    """visible[i, j]: node j is node i or one of its ancestors."""
    import torch

    n = len(parents)
    vis = torch.zeros((n, n), dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            vis[i, j] = True
            j = parents[j]
    return vis


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


# ----------------------------------------------------------------------------- building


def _new_tokens(*, scenario: Any, dtype: Any, device: str, gen: Any) -> tuple[Any, Any, Any]:
    import torch

    total = sum(scenario.extend_lens)
    m = scenario.model

    def randn(*shape: int) -> Any:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype).to(device)

    return (
        randn(total, m.num_heads, m.head_dim),
        randn(total, m.num_kv_heads, m.head_dim),
        randn(total, m.num_kv_heads, m.head_dim),
    )


def _ground_truth(
    *, scenario: Any, runner: Any, loc: Callable[[int, int], int], q: Any, k: Any, v: Any, trees: list[Any] | None
) -> GroundTruth:
    """Padded ground truth from the pool's prefix K/V (read at the layout's slots) and the new
    tokens; causal within the new tokens, or the draft tree's visibility for verify."""
    import torch

    prefix, ext = list(scenario.prefix_lens), list(scenario.extend_lens)
    bs, qmax, lmax = len(prefix), max(ext), max(p + e for p, e in zip(prefix, ext))
    pool = runner.token_to_kv_pool
    k_cache, v_cache = pool.get_key_buffer(0), pool.get_value_buffer(0)
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    q_pad = q.new_zeros((bs, qmax, heads, dim))
    k_pad = k.new_zeros((bs, lmax, kv_heads, dim))
    v_pad = torch.zeros_like(k_pad)
    visible = torch.zeros((bs, qmax, lmax), dtype=torch.bool, device=q.device)
    q_valid = torch.zeros((bs, qmax), dtype=torch.bool, device=q.device)
    start = 0
    for b, (p, e) in enumerate(zip(prefix, ext)):
        slots = torch.tensor([loc(b, i) for i in range(p)], dtype=torch.int64, device=k_cache.device)
        k_pad[b, :p], v_pad[b, :p] = k_cache[slots], v_cache[slots]
        k_pad[b, p : p + e], v_pad[b, p : p + e] = k[start : start + e], v[start : start + e]
        q_pad[b, :e] = q[start : start + e]
        q_valid[b, :e] = True
        visible[b, :e, :p] = True
        new = trees[b] if trees is not None else torch.tril(torch.ones((e, e), dtype=torch.bool))
        visible[b, :e, p : p + e] = new.to(q.device)
        start += e
    return GroundTruth(
        q_pad=q_pad, k_pad=k_pad, v_pad=v_pad, visible=visible, q_valid=q_valid, sm_scale=1.0 / math.sqrt(dim)
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
    trees = [_tree_visibility(par) for par in parents]
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


@dataclass
class GlueInputs:
    """The scheduler state before the draft extend (``seq_lens`` = accepted prefix) and what the
    worker hands ``prepare_for_draft_extend``."""

    schedule_batch: Any
    predict: Any  # next token ids, one window per request
    num_accept_tokens: Any


def _configure_draft_runner(runner: Any) -> None:
    """What ``ForwardBatch.init_new`` and the glue read of a draft runner beyond what the kit's
    stand-in sets up: the model config's derived fields, each computed the way sglang's
    ``ModelConfig`` computes it (the kit's production draft harness fills ``vocab_size`` and
    ``dtype`` likewise), and the runner's feature managers, made by ``ModelRunner``'s own init
    methods (the kit's stand-in skips ``ModelRunner.__init__``); LoRA off, as ``__init__`` leaves it."""
    from sglang.srt.configs.model_config import requires_mm_token_modalities

    config, hf = runner.model_config, runner.model_config.hf_config
    config.vocab_size = hf.vocab_size = _VOCAB
    config.dtype = runner.dtype
    config.requires_mm_token_modalities = requires_mm_token_modalities(hf.architectures, config.hf_text_config)
    config.use_ngram_embedding = getattr(hf, "use_ngram_embedding", False)
    config.ngram_embedding_n = hf.ngram_embedding_n if config.use_ngram_embedding else 0
    config.use_engram = bool(getattr(hf, "engram_layer_ids", ()))
    runner.lora_manager = None
    runner.init_ngram_embedding_manager()
    runner.maybe_init_watermark_state()


def _glue_inputs(*, batch: Any, runner: Any, scenario: Any, device: str) -> GlueInputs:
    """A real ScheduleBatch holding the pre-step state: the kit's slot layout and write slots,
    ``seq_lens`` = prefix (the glue bumps it), CPU mirrors unless gpu_only."""
    import torch
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    prefix = torch.tensor(scenario.prefix_lens, dtype=torch.int64)
    bs = len(scenario.prefix_lens)
    _configure_draft_runner(runner)
    schedule_batch = ScheduleBatch(
        reqs=[],
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
        model_config=runner.model_config,
        device=device,
        forward_mode=ForwardMode.DECODE,
        req_pool_indices=batch.req_pool_indices.to(torch.int64),
        seq_lens=prefix.to(device),
        seq_lens_cpu=None if scenario.gpu_only else prefix.clone(),
        seq_lens_sum=None if scenario.gpu_only else int(prefix.sum()),
        out_cache_loc=batch.out_cache_loc,
        multimodal_inputs=[None] * bs,
        spec_algorithm=SpeculativeAlgorithm.EAGLE,
    )
    ndt = scenario.spec.num_draft_tokens
    return GlueInputs(
        schedule_batch=schedule_batch,
        predict=batch.input_ids.to(torch.int64) % _VOCAB,
        num_accept_tokens=torch.full((bs,), ndt, dtype=torch.int32, device=device),
    )


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
    case = kit.make_case(
        name=scenario.name,
        mode=mode,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        page_size=scenario.page_size,
        prefix_lens=tuple(scenario.prefix_lens),
        extend_lens=tuple(scenario.extend_lens),
    )
    runner = kit.make_model_runner(
        case=case,
        head_dim=model.head_dim,
        dtype=dtype,
        device=device,
        max_context_len=ctx,
        pool_rows=rows,
        graph=scenario.cuda_graph,
    )
    _fill_pool(runner=runner, gen=gen)
    totals = [p + e for p, e in zip(scenario.prefix_lens, scenario.extend_lens)]
    loc = _scatter_layout(
        totals=totals,
        page_size=scenario.page_size,
        gen=gen,
        num_pages=runner.token_to_kv_pool.size // scenario.page_size,
    )
    batch = kit.make_forward_batch(case=case, runner=runner, max_context_len=ctx, device=device, loc_fn=loc)
    _move_request_rows(runner=runner, batch=batch, gen=gen)
    q, k, v = _new_tokens(scenario=scenario, dtype=dtype, device=device, gen=gen)
    trees, glue = None, None
    if scenario.mode == "TARGET_VERIFY":
        trees = _prepare_verify(batch=batch, case=case, scenario=scenario, device=device, gen=gen)
    elif scenario.mode == "DRAFT_EXTEND_V2" and scenario.builder == "glue":
        glue, batch = _glue_inputs(batch=batch, runner=runner, scenario=scenario, device=device), None
    elif scenario.mode == "DRAFT_EXTEND_V2":
        _prepare_draft_extend_kit(batch=batch, case=case, scenario=scenario, device=device)
    elif scenario.gpu_only:
        _null_cpu_mirrors(batch)
    truth = _ground_truth(scenario=scenario, runner=runner, loc=loc, q=q, k=k, v=v, trees=trees)
    layer = RadixAttention(
        num_heads=model.num_heads,
        head_dim=model.head_dim,
        scaling=truth.sm_scale,
        num_kv_heads=model.num_kv_heads,
        layer_id=0,
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
    )


# ----------------------------------------------------------------------------- forward and glue


def _run_glue(*, case: SglangCase, backend: Any, graph_runner: Any) -> Any:
    """The production spec-v2 draft-extend glue on the pre-step state: decides the CPU mirrors as
    the scheduler does (gpu_only: the draft-extend slot unset), bumps ``seq_lens`` and, unless a
    graph runner takes the batch, runs the backend's eager metadata init. Returns its ForwardBatch."""
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput
    from sglang.srt.speculative.eagle_worker_common import prepare_for_draft_extend

    glue, ndt = case.glue, case.scenario.spec.num_draft_tokens
    if case.scenario.gpu_only and decide_needs_cpu_seq_lens([backend, None]):
        raise Unavailable("the scheduler keeps CPU seq_lens for this backend set: not a gpu_only batch")
    draft_extend_input = EagleDraftExtendInput(
        hidden_states=None,
        num_correct_drafts=glue.num_accept_tokens - 1,
        num_accept_tokens=glue.num_accept_tokens,
        num_tokens_per_req=ndt,
        num_tokens_for_logprob_per_req=ndt,
    )
    return prepare_for_draft_extend(
        draft_extend_input,
        glue.schedule_batch,
        glue.predict,
        ndt,
        case.runner,
        graph_runner,
        return_hidden_states_before_norm=False,
    )


# ----------------------------------------------------------------------------- guard zones


@dataclass
class GuardedBuffer:
    """A static buffer carved out of a larger flat allocation whose tail is the sentinel
    (``sglfix.harness.guards`` reads ``name``, ``flat``, ``numel``, ``shape``)."""

    name: str
    flat: Any
    numel: int
    shape: tuple


def _guarded_copy(t: Any, *, name: str) -> tuple[Any, GuardedBuffer]:
    """An identical tensor followed by a guard zone of sentinel bytes, and its registry entry."""
    import torch

    from sglfix.harness.guards import SENTINEL_BYTE

    guard = max(64, t.numel() // 4)
    flat = torch.empty(t.numel() + guard, dtype=t.dtype, device=t.device)
    flat[t.numel() :].view(torch.uint8).fill_(SENTINEL_BYTE)
    view = flat[: t.numel()].view(t.shape)
    view.copy_(t)
    return view, GuardedBuffer(name=name, flat=flat, numel=t.numel(), shape=tuple(t.shape))


# The backend's buffers whose contents persist between metadata inits (indptrs sized for the
# request pool; the CUDA-graph state is the kit's GRAPH_STATE), guarded before anything points into them.
_PERSISTENT = ("kv_indptr", "qo_indptr", "mask_indptr", "window_kv_indptr")


def _registry(backend: Any) -> list:
    return backend.__dict__.setdefault("_sglfix_guarded", [])


def guard_buffers(backend: Any, attrs: tuple[str, ...]) -> None:
    """Swap each of the backend's contiguous tensors ``attrs`` for a guarded copy."""
    import torch

    for attr in attrs:
        t = getattr(backend, attr, None)
        if isinstance(t, torch.Tensor) and t.is_contiguous():
            view, entry = _guarded_copy(t, name=attr)
            setattr(backend, attr, view)
            _registry(backend).append(entry)


def guard_verify_mask(backend: Any) -> None:
    """The verify mask buffer (a frozen struct: swapped whole, as sglang resizes it)."""
    import msgspec

    mask = getattr(backend, "_verify_mask", None)
    if mask is None:
        return
    view, entry = _guarded_copy(mask.buffer, name="_verify_mask.buffer")
    backend._verify_mask = msgspec.structs.replace(mask, buffer=view)
    _registry(backend).append(entry)


# ----------------------------------------------------------------------------- the adapter


def _watch(backend: Any, on_metadata: MetadataHook) -> None:
    """Wrap this backend instance's metadata inits so that the judge sees every one of them:
    eager (``init_forward_metadata``), capture and replay (``init_forward_metadata_out_graph``)."""
    eager, out_graph = backend.init_forward_metadata, backend.init_forward_metadata_out_graph

    def init_forward_metadata(forward_batch: Any) -> Any:
        result = eager(forward_batch)
        on_metadata(backend, forward_batch, "eager")
        return result

    def init_forward_metadata_out_graph(forward_batch: Any, in_capture: bool = False) -> Any:
        result = out_graph(forward_batch, in_capture)
        on_metadata(backend, forward_batch, "capture" if in_capture else "replay")
        return result

    backend.init_forward_metadata = init_forward_metadata
    backend.init_forward_metadata_out_graph = init_forward_metadata_out_graph


class SglangTritonAdapter(AdapterBase):
    name = "triton"
    metadata_fields = MetadataFields(
        indptr=("kv_indptr", "qo_indptr", "mask_indptr", "window_kv_indptr"),
        lengths=("max_extend_len",),
        indices={"kv_indices": "kv_indptr", "window_kv_indices": "window_kv_indptr"},
    )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        case = build_case(scenario=scenario, device=device)
        return Prepared(case=case, num_slots=case.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        """sglang's TritonAttnBackend, built as the kit builds it (``ATTENTION_BACKENDS``), its
        persistent indptr buffers guarded; the runner's ``attn_backend`` for the glue."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        runner = prepared.case.runner
        backend = ATTENTION_BACKENDS["triton"](runner)
        guard_buffers(backend, _PERSISTENT)
        runner.attn_backend = backend
        return backend

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        """The graph runner, captured at the scenario's sizes (None when eager). The judge's hook
        is attached here, the first call that receives it, before any metadata init."""
        _watch(backend, on_metadata)
        if not scenario.capture_bs:
            return None
        graphs = _kit("graphs")

        def guard(b: Any) -> None:
            guard_buffers(b, graphs.GRAPH_STATE)
            guard_verify_mask(b)

        return graphs.GraphRunner(
            case=prepared.case, backend=backend, capture_bs=list(scenario.capture_bs), guard=guard
        ).capture()

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        case = prepared.case
        batch = case.forward_batch
        if case.glue is not None:
            # The glue runs the eager metadata init itself unless the graph runner takes the batch.
            batch = case.forward_batch = _run_glue(case=case, backend=backend, graph_runner=runner)
        elif runner is None:
            backend.init_forward_metadata(batch)
        if runner is not None:
            if not runner.can_run_graph(batch):
                raise Unavailable(f"no captured size fits a batch of {batch.batch_size}")
            return runner.replay(batch, q=case.q, k=case.k, v=case.v)
        return _kit("graphs").attend(backend=backend, layer=case.layer, batch=batch, q=case.q, k=case.k, v=case.v)

    def static_buffers(self, backend: Any) -> list:
        return list(backend.__dict__.get("_sglfix_guarded", []))

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        return [("", backend.forward_metadata, int(forward_batch.batch_size))]

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        from sglfix.harness.reference import reference_attention

        truth = prepared.case.truth
        ref = reference_attention(
            q_pad=truth.q_pad, k_pad=truth.k_pad, v_pad=truth.v_pad, mask=truth.visible, scale=truth.sm_scale
        )
        return ref, truth.q_valid


ADAPTER = SglangTritonAdapter()
