"""Replays ``backend: hybrid_linear`` scenarios through the installed sglang's own
``HybridLinearAttnBackend``: a full-attention layer set served by its ``TritonAttnBackend`` and a
linear-attention layer set served by its ``GDNAttnBackend`` (Qwen3-Next's gated delta net), over
a real ``HybridReqToTokenPool`` whose Mamba pool holds the linear layers' conv and SSM states.

The hybrid backend is built as production wraps a hybrid model's backends
(``HybridLinearAttnBackend(full, linear, full_attn_layers)``), and every metadata init goes through
it: eager, capture and replay reach both sub-backends (``init_forward_metadata``,
``init_cuda_graph_state``, ``init_forward_metadata_out_graph``). Modes: DECODE, EXTEND (with
prefixes) and TARGET_VERIFY, eager and graph (decode and verify, the modes it captures).

Two judges, one per layer set:
- the full-attention layer's output against sglfix's reference, as for ``backend: triton`` (it runs
  through the hybrid's dispatch, ``forward`` -> ``_is_full_attn``);
- the linear layer set's metadata against what the batch implies (``_linear_reference``), after
  every init, capture included: each row's Mamba state slot (the pool's mapping of its request
  row; -1 for a padded row of a replayed graph, which the captured kernels skip) and the query
  start offsets its kernels split the tokens by. The GDN kernels (sglang's Triton ``fla`` kernels)
  do not run in the Triton interpreter, so on CPU these fields are judged directly rather than
  through the linear layer's output.

With ``model.linear_attention`` the linear set is a Mamba2 mixer (``Mamba2AttnBackend``) or a short
convolution (``ShortConvAttnBackend`` under ``ShortConvHybridAttnBackend``, whose conv-state handle
the model asks for per layer and which is judged after every init as well).

A multi-item scoring batch (``batch.items``, --enable-mis; EXTEND, eager) runs the hybrid over
``FlashInferAttnBackend`` instead, the one attention backend sglang scores items with: its item mask
is the FlashInfer adapter's to judge, and GDN's query segments and item branches (``mis_metadata``)
are judged after the init against the items (``hybrid_mis``).

Everything else is the Triton adapter's (``sglang.triton``): the case over the kit's dense mock
runner, the scattered slot layout, the ground truth, the kit's graph runner.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import Dispatch, Prepared
from sglfix.harness.adapters.sglang.flashinfer_dense import SglangFlashInferAdapter, flashinfer_module
from sglfix.harness.adapters.sglang.flashinfer_mla_dense import SglangFlashInferMLAAdapter
from sglfix.harness.adapters.sglang.guards import around, guard_buffers, watch_metadata
from sglfix.harness.adapters.sglang.hybrid_commit import verify_commit
from sglfix.harness.adapters.sglang.hybrid_kda import kda_graph_reference, kda_graph_view
from sglfix.harness.adapters.sglang.hybrid_mamba2 import mamba2_reference, mamba2_view
from sglfix.harness.adapters.sglang.hybrid_mis import gdn_mis_reference, gdn_mis_view
from sglfix.harness.adapters.sglang.hybrid_replayssm import (
    TRACK_INTERVAL,
    replayssm_pool_args,
    replayssm_reference,
    seed_cursors,
)
from sglfix.harness.adapters.sglang.hybrid_short_conv import short_conv_reference, short_conv_view
from sglfix.harness.adapters.sglang.hybrid_track import (
    TRACK_FIELDS,
    decode_track_reference,
    track_plan,
    track_reference,
)
from sglfix.harness.adapters.sglang.reports import init_reports, keep_report
from sglfix.harness.adapters.sglang.triton import SglangTritonAdapter
from sglfix.harness.adapters.sglang.truth import first_difference
from sglfix.harness.kits import kit as _kit
from sglfix.harness.unavailable import Unavailable

__all__ = [
    "ADAPTER",
    "HybridLinearAdapter",
    "SglangHybridAMXAdapter",
    "SglangHybridFlashInferAdapter",
    "SglangHybridFlashInferMLAAdapter",
    "SglangHybridLinearAdapter",
]

# The layer ids of the two sets: the reference's attention layer is the kit's layer 0; the
# linear layer set holds layer 1, as a hybrid model interleaves them.
FULL_LAYER, LINEAR_LAYER = 0, 1
# GDN's shapes: two key and value heads of 32 (the fla kernels' smallest tile), Qwen3-Next's
# convolution width.
GDN_HEADS, GDN_HEAD_DIM, GDN_CONV = 2, 32, 4
_MODES = ("DECODE", "EXTEND", "TARGET_VERIFY")
# A Mamba2 model's scan chunk (mamba_chunk_size; real models use 128 or 256).
MAMBA2_CHUNK = 32


class SglangHybridLinearAdapter(SglangTritonAdapter):
    name = "hybrid_linear"
    registry_name = "triton"  # the full-attention sub-backend

    def build(self, scenario: Any, *, device: str) -> Prepared:
        if scenario.mode not in _MODES:
            raise Unavailable(f"the hybrid linear-attention adapter runs {', '.join(_MODES)}, not {scenario.mode}")
        if scenario.mode == "EXTEND" and scenario.capture_bs and not scenario.breakable_prefill:
            raise Unavailable(
                "HybridLinearAttnBackend captures decode and target verify, and a prefill only under breakable "
                "graphs (cuda_graph.breakable)"
            )
        if scenario.breakable_prefill:
            from importlib.util import find_spec

            if find_spec("sglang.srt.layers.attention.linear.kda_prefill_graph") is None:
                raise Unavailable("this release's KDA backend keeps no tables for breakable prefill graphs")
        from sglang.srt.layers.attention.linear import utils as linear_utils

        if not hasattr(linear_utils, "resolve_linear_attn_backends"):
            # Before, the GDN backend took its kernel choice from a process-wide config
            # (initialize_linear_attn_config) and its pool's verify buffers from CUDA alone.
            raise Unavailable(
                "this release's GDNAttnBackend predates the per-runner kernel choice "
                "(linear.utils.resolve_linear_attn_backends) that this adapter builds it with"
            )
        if scenario.mamba_track and scenario.mode == "EXTEND" and scenario.model.linear_attention == "mamba2":
            # The track judge reads the chunked delta rules' plan (track_chunk_idx and the chunk
            # states); Mamba2's mixer snapshots through its own sequence index (track_ssm_seq_idx),
            # which no judge of sglfix reads yet: judged with the other's plan it would fail.
            raise Unavailable("a Mamba2 prefill's state snapshots (track_ssm_seq_idx) are not judged by sglfix yet")
        prepared = super().build(scenario.model_copy(update={"backend": self.registry_name}), device=device)
        prepared.case.scenario = scenario
        _hybrid_pool(prepared.case, seed=scenario.seed)
        if scenario.breakable_prefill and scenario.mamba_track:
            # A prefill that snapshots states for the radix cache runs with its extra state buffer
            # (its extra_buffer radix cache strategy): the bucket tables are captured with track rows.
            # Published before the track plan, which seeds the published args' snapshot grid.
            _kit("attention").publish_over(
                prepared.case.runner, mamba_radix_cache_strategy="extra_buffer", disable_radix_cache=False
            )
        prepared.case.track = track_plan(prepared.case, scenario) if scenario.mamba_track else None
        return prepared

    def make_backend(self, prepared: Prepared) -> Any:
        from sglang.srt.layers.attention import hybrid_linear_attn_backend as hybrid
        from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
        from sglang.srt.layers.attention.linear.utils import resolve_linear_attn_backends

        runner = prepared.case.runner
        full = self._full_backend(prepared)
        # Production stamps the kernel choice on the runner (attn_backend_wrapper) before it
        # builds the linear backend that reads it.
        runner.linear_attn_backends = resolve_linear_attn_backends()
        mixer = prepared.case.scenario.model.linear_attention or "gdn"
        if mixer == "mamba2":
            # The model's scan chunk (its config's mamba_chunk_size), small enough that a prefill
            # crosses several: the logical chunks the scan walks are judged against it.
            _set_config(runner, "mamba_chunk_size", MAMBA2_CHUNK)
        if mixer == "short_conv":
            from sglang.srt.layers.attention.linear.short_conv_backend import ShortConvAttnBackend

            # The sidecar the model reaches through the hybrid's conv_state_metadata (LFM2, ZAYA1).
            linear = ShortConvAttnBackend(runner)
            backend = hybrid.ShortConvHybridAttnBackend(full, linear, full_attn_layers=[FULL_LAYER])
        elif mixer == "kda":
            from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend

            linear = KDAAttnBackend(runner)
            backend = hybrid.HybridLinearAttnBackend(full, linear, full_attn_layers=[FULL_LAYER])
        else:
            linear = (hybrid.Mamba2AttnBackend if mixer == "mamba2" else GDNAttnBackend)(runner)
            backend = hybrid.HybridLinearAttnBackend(full, linear, full_attn_layers=[FULL_LAYER])
        backend._sglfix_mamba2_chunk = MAMBA2_CHUNK if mixer == "mamba2" else None
        # The sub-backends as built, not as the hybrid keeps them: a judge that read them back
        # through the code under test would fail with it.
        backend._sglfix_full, backend._sglfix_linear = full, linear
        backend._sglfix_real_bs = int(prepared.case.forward_batch.batch_size)
        # The batch's request rows as built, before a replay pads them in place.
        backend._sglfix_req_rows = prepared.case.forward_batch.req_pool_indices.clone()
        backend._sglfix_draft_tokens = _draft_tokens(prepared.case)
        spec = prepared.case.scenario.spec
        backend._sglfix_topk = int(spec.topk) if spec is not None else 0
        backend._sglfix_track = prepared.case.track
        scenario = prepared.case.scenario
        backend._sglfix_items = None if scenario.items is None else [scenario.items, list(scenario.extend_lens)]
        # A ReplaySSM ring's cursors, seeded: the judge's first "before".
        backend._sglfix_cursors = seed_cursors(runner.req_to_token_pool, seed=scenario.seed)
        runner.attn_backend = backend
        return backend

    def _full_backend(self, prepared: Prepared) -> Any:
        """The full-attention layer set's backend, built as the registry builds it, its persistent
        buffers guarded."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        full = ATTENTION_BACKENDS[self.registry_name](prepared.case.runner)
        guard_buffers(full, self.persistent)
        return full

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        _mark_phases(backend)  # under the judge's hook, so the phase is known when it looks
        if not (scenario.breakable_prefill or scenario.cpu_graph):
            return super().capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)
        watch_metadata(backend, on_metadata)
        graphs = _kit("graphs")
        if scenario.cpu_graph:
            return graphs.CpuGraphRunner(
                case=prepared.case,
                backend=backend,
                capture_bs=list(scenario.capture_bs),
                on_capture=lambda batch: on_metadata(backend, batch, "capture"),
            ).capture()
        return graphs.BreakablePrefillGraphRunner(
            case=prepared.case,
            backend=backend,
            capture_tokens=list(scenario.capture_bs),
            guard=lambda b: self.guard_graph_state(b, graphs),
        ).capture()

    def guard_graph_state(self, backend: Any, graphs: Any) -> None:
        guard_buffers(backend._sglfix_full, self.graph_state(graphs))

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: Any) -> Any:
        out = super().run(prepared, backend, runner, scenario=scenario, on_metadata=on_metadata)
        if scenario.mode == "TARGET_VERIFY" and scenario.accept_lens is not None:
            # The worker commits the accepted step's linear states after the verify's forward.
            backend._sglfix_commit = verify_commit(
                runner=prepared.case.runner,
                backend=backend,
                rows=backend._sglfix_req_rows,
                accept=list(scenario.accept_lens),
                spec_info=prepared.case.forward_batch.spec_info,
                seed=scenario.seed,
                stable_rows=_pp_spec(),
            )
        return out

    def static_buffers(self, backend: Any) -> list:
        return super().static_buffers(backend._sglfix_full)

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        """The full-attention backend's metadata (the invariants' indptr and indices) and the
        linear backend's, the latter judged against this init's batch as it is built."""
        rows = int(forward_batch.batch_size)
        if getattr(backend, "_sglfix_breakable", False):
            # A breakable prefill graph's capture or replay: the KDA extend reads the bucket's tables.
            tables = getattr(backend._sglfix_linear, "prefill_graph_metadata", None)
            keep_report(
                backend,
                "_sglfix_linear_reports",
                kda_graph_reference(
                    backend._sglfix_linear,
                    forward_batch,
                    backend,
                    slots=_live(backend, forward_batch)[1],
                    track=getattr(backend, "_sglfix_track", None),
                ),
            )
            view = SimpleNamespace(**kda_graph_view(tables))
            return [*self._full_views(backend._sglfix_full, forward_batch), ("linear", view, rows)]
        linear = backend._sglfix_linear.forward_metadata
        # A short-conv layer set's model asks the hybrid for its conv-state handle per layer.
        handle = backend.conv_state_metadata(LINEAR_LAYER, forward_batch) if _short_conv(backend) else None
        keep_report(
            backend,
            "_sglfix_linear_reports",
            _linear_reference(linear, forward_batch, backend)
            or _conv_reference(handle, forward_batch, backend)
            or _mis_reference(backend, forward_batch),
        )
        view = _linear_view(linear)
        view.__dict__.update(short_conv_view(handle))
        view.__dict__.update(_mis_view(backend))
        return [*self._full_views(backend._sglfix_full, forward_batch), ("linear", view, rows)]

    def _full_views(self, full: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        """The full-attention layer set's metadata views, its own adapter's."""
        return super().metadata_views(full, forward_batch)

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        # The full-attention layer set's own checks (FlashInfer's multi-item plan), then the linear set's.
        return [
            *super().check_metadata(prepared, backend._sglfix_full),
            *self._check_linear(backend),
            *_check_commit(backend),
        ]

    def _check_linear(self, backend: Any) -> list[tuple[str, str]]:
        plan = getattr(backend, "_sglfix_track", None)
        whose = {"EXTEND": "the prefill's Mamba track plan", "DECODE": "the decode step's Mamba track"}
        tracked = f" and {whose[plan.mode]}" if plan is not None else ""
        mamba2 = " and the Mamba2 metadata" if getattr(backend, "_sglfix_mamba2_chunk", None) else ""
        if _short_conv(backend):
            mamba2 = " and the conv-state handle"
        if _scored(backend):
            mamba2 = " and the multi-item query segments and item branches"
        if getattr(backend, "_sglfix_cursors", None) is not None:
            mamba2 = " and the ReplaySSM ring's cursors and flushes"
        if "_sglfix_kda_tables" in backend.__dict__:
            mamba2 = " and the breakable prefill graph's bucket tables"
        return init_reports(
            backend,
            "_sglfix_linear_reports",
            what="linear ",
            passed=lambda n: (
                f"metadata reference: the linear layers' state slots and query offsets{tracked}{mamba2} of {n} "
                "metadata init(s) are their batch's"
            ),
        )


def _short_conv(backend: Any) -> bool:
    return type(backend._sglfix_linear).__name__ == "ShortConvAttnBackend"


def _check_commit(backend: Any) -> list[tuple[str, str]]:
    if "_sglfix_commit" not in backend.__dict__:
        return []
    wrong, states = backend._sglfix_commit
    if wrong:
        return [("DIVERGE", f"post-verify commit: {wrong}")]
    return [
        (
            "PASS",
            f"post-verify commit: each request's state slot holds its last accepted step's {', '.join(states)}, "
            "and no other slot changed",
        )
    ]


def _scored(backend: Any) -> bool:
    """Whether the batch carries delimiters (some request scores items)."""
    items = getattr(backend, "_sglfix_items", None)
    return items is not None and any(request is not None for request in items[0])


def _mis_reference(backend: Any, batch: Any) -> str:
    if getattr(backend, "_sglfix_items", None) is None:
        return ""
    items, extend_lens = backend._sglfix_items
    metadata = getattr(backend._sglfix_linear, "mis_metadata", None)
    return gdn_mis_reference(metadata, items=items, extend_lens=extend_lens, device=batch.input_ids.device)


def _mis_view(backend: Any) -> dict[str, Any]:
    return gdn_mis_view(getattr(backend._sglfix_linear, "mis_metadata", None))


def _pp_spec() -> bool:
    """Whether the engine runs pipeline-parallel speculation (step states at the request rows),
    as sglang's own flag parser reads the cell's environment; False where it has no such flag."""
    from sglang.srt.environ import envs

    flag = getattr(envs, "SGLANG_ENABLE_PP_SPEC", None)
    return bool(flag is not None and flag.get())


def _live(backend: Any, batch: Any) -> tuple[int, list[int]]:
    """The batch's live rows (a replay pads past them) and their state slots, from the rows the
    caller handed in and the pool's mapping."""
    import torch

    bs = int(batch.batch_size)
    real = min(bs, backend._sglfix_real_bs) if getattr(backend, "_sglfix_phase", "eager") == "replay" else bs
    pool = backend._sglfix_linear.req_to_token_pool
    rows = backend._sglfix_rows[:real].to(torch.long)
    return real, pool.req_index_to_mamba_index_mapping[rows].to("cpu", torch.long).tolist()


def _conv_reference(handle: Any, batch: Any, backend: Any) -> str:
    if not _short_conv(backend):
        return ""
    real, want_slots = _live(backend, batch)
    return short_conv_reference(
        handle,
        batch,
        linear=backend._sglfix_linear,
        layer=LINEAR_LAYER,
        want_slots=want_slots,
        real=real,
        phase=getattr(backend, "_sglfix_phase", "eager"),
        seen=backend.__dict__.setdefault("_sglfix_conv_seen", {}),
    )


def _set_config(runner: Any, name: str, value: Any) -> None:
    """Set ``name`` on the runner's model config as a checkpoint's config carries it."""
    config = runner.model_config
    target = getattr(config, "hf_text_config", None)
    if target is None:
        target = config.hf_text_config = SimpleNamespace()
    setattr(target, name, value)


def _mark_phases(backend: Any) -> None:
    """Note on the backend which kind of init ran last (eager, capture, replay): a replay's batch
    is padded to the captured size, a capture's rows are all the runner's own."""
    around(backend, "init_forward_metadata", before=lambda forward_batch: _note(backend, forward_batch, "eager"))
    around(
        backend,
        "init_forward_metadata_out_graph",
        before=lambda forward_batch, in_capture=False: _note(
            backend, forward_batch, "capture" if in_capture else "replay"
        ),
    )
    around(
        backend,
        "init_forward_metadata_for_breakable_cuda_graph_capture",
        before=lambda forward_batch: _note(backend, forward_batch, "capture", breakable=True),
    )
    around(
        backend,
        "prepare_forward_metadata_for_breakable_cuda_graph_replay",
        before=lambda capture_metadata, forward_batch, **_: _note(backend, forward_batch, "replay", breakable=True),
    )
    # A CPU graph's capture init takes the capture's rows, not its batch.
    around(
        backend,
        "init_forward_metadata_capture_cpu_graph",
        before=lambda bs, num_tokens, req_pool_indices, *_: _note(
            backend, SimpleNamespace(req_pool_indices=req_pool_indices), "capture"
        ),
    )


def _note(backend: Any, batch: Any, phase: str, *, breakable: bool = False) -> None:
    """The phase (and whether a breakable prefill graph's), and the batch's request rows and extend
    lengths as the caller handed them: the reference must not read what the code under test wrote
    into the batch (the replay pads ``req_pool_indices`` in place)."""
    backend._sglfix_phase, backend._sglfix_breakable = phase, breakable
    backend._sglfix_rows = batch.req_pool_indices.clone()
    lens = getattr(batch, "extend_seq_lens", None)
    backend._sglfix_extend = None if lens is None else lens.clone()


def _draft_tokens(case: Any) -> int:
    spec = getattr(case.forward_batch, "spec_info", None)
    return int(getattr(spec, "draft_token_num", 0) or 0)


def _hybrid_pool(case: Any, *, seed: int) -> None:
    """Give the case's runner a ``HybridReqToTokenPool`` in place of its plain pool: the same
    request rows and token slots, plus a Mamba pool for the linear layer set whose state slots are
    dealt to the batch's request rows in a seeded order (so that a row read as a slot, or another
    row's slot, shows)."""
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    runner, batch = case.runner, case.forward_batch
    old = runner.req_to_token_pool
    rows, ctx = int(old.size), int(old.req_to_token.shape[1])
    dtype = Mamba2StateDType(conv=case.q.dtype, temporal=torch.float32)
    if case.scenario.model.linear_attention == "kda":
        # Kimi-Linear's state: its conv window stored [kernel - 1, channels], a K x V state per head.
        from sglang.srt.configs.mamba_utils import KimiLinearCacheParams, KimiLinearStateShape

        kimi = KimiLinearStateShape.create(
            tp_world_size=1, num_heads=GDN_HEADS, head_dim=GDN_HEAD_DIM, conv_kernel_size=GDN_CONV
        )
        params: Any = KimiLinearCacheParams(shape=kimi, layers=[LINEAR_LAYER], dtype=dtype)
    else:
        shape = Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=GDN_HEADS * GDN_HEAD_DIM,
            n_groups=GDN_HEADS,
            num_heads=GDN_HEADS,
            head_dim=GDN_HEAD_DIM,
            state_size=GDN_HEAD_DIM,
            conv_kernel=GDN_CONV,
        )
        params = Mamba2CacheParams(shape=shape, layers=[LINEAR_LAYER], dtype=dtype)
    draft = _draft_tokens(case)
    pool = HybridReqToTokenPool(
        size=rows,
        mamba_size=rows,
        mamba_spec_state_size=rows,
        max_context_len=ctx,
        device=case.device,
        enable_memory_saver=False,
        cache_params=params,
        mamba_layer_ids=[LINEAR_LAYER],
        enable_mamba_extra_buffer=False,
        speculative_num_draft_tokens=draft or None,
        enable_overlap_schedule=False,
        **_ple_pools(case),
        **_replayssm_pool(case),
    )
    pool.req_to_token.copy_(old.req_to_token)
    # Slot 0 is the padding slot (a padded row carries request row 0); the batch's rows get
    # distinct slots 1..rows in a seeded order.
    gen = torch.Generator(device="cpu").manual_seed(seed + 7)
    req_rows = batch.req_pool_indices.to("cpu", torch.long)
    slots = 1 + torch.randperm(rows, generator=gen)[: len(req_rows)]
    mapping = pool.req_index_to_mamba_index_mapping
    mapping[req_rows.to(mapping.device)] = slots.to(mapping.device, mapping.dtype)
    runner.req_to_token_pool = pool
    if batch.forward_mode.is_extend() and getattr(batch, "extend_start_loc", None) is None:
        # ForwardBatch.init_new sets it for every extend; the kit's dense batch leaves it to the
        # Triton backend, which computes its own. The linear layers split their tokens by it.
        lens = batch.extend_seq_lens
        batch.extend_start_loc = torch.cumsum(lens, dim=0) - lens
    if hasattr(batch, "req_to_token_pool"):
        batch.req_to_token_pool = pool
    if batch.forward_mode.is_target_verify():
        # ForwardBatch.init_new sets the extend fields for extend modes only; a verify batch has
        # none (Mamba2's metadata tells a decode-like batch by it), whatever the kit's carries.
        batch.extend_num_tokens = None


# Qwen4-Exp's per-layer-embedding side states (model.ple_states): a short-conv window of this shape
# on the linear layer, an N-gram context of this many tokens per request.
PLE_CONV_SHAPE, PLE_NGRAM = (6, 3), 5


def _pool_keeps(argument: str, *, what: str) -> None:
    """SKIP where this release's hybrid pool takes no ``argument`` (it keeps no ``what``)."""
    import inspect

    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    if argument not in inspect.signature(HybridReqToTokenPool.__init__).parameters:
        raise Unavailable(f"this release's hybrid pool keeps no {what}")


def _ple_pools(case: Any) -> dict[str, Any]:
    """The hybrid pool's arguments for a model with PLE side states, where the scenario has them."""
    if not case.scenario.model.ple_states:
        return {}
    _pool_keeps("short_conv_layer_ids", what="per-layer-embedding side states (model.ple_states)")
    return dict(
        short_conv_layer_ids=[LINEAR_LAYER],
        short_conv_state_shape=PLE_CONV_SHAPE,
        ngram_context_len=PLE_NGRAM,
        ngram_eos_token_id=0,
    )


def _replayssm_pool(case: Any) -> dict[str, Any]:
    """The hybrid pool's arguments for a ReplaySSM ring, where the scenario has one, and the radix
    track interval its flushes follow, published."""
    ring = case.scenario.model.replayssm_ring
    if ring is None:
        return {}
    _pool_keeps("enable_linear_replayssm", what="ReplaySSM ring (model.replayssm_ring)")
    _kit("attention").publish_over(case.runner, mamba_track_interval=TRACK_INTERVAL)
    return replayssm_pool_args(ring)


def _linear_view(metadata: Any) -> Any:
    """The fields of the linear backend's metadata that its kernels read (for the digest)."""
    if metadata is None:
        return SimpleNamespace()
    return SimpleNamespace(
        query_start_loc=metadata.query_start_loc,
        mamba_cache_indices=metadata.mamba_cache_indices,
        retrieve_next_token=metadata.retrieve_next_token,
        retrieve_next_sibling=metadata.retrieve_next_sibling,
        **{name: getattr(metadata, name, None) for name in TRACK_FIELDS},
        **mamba2_view(metadata),
    )


def _linear_reference(metadata: Any, batch: Any, backend: Any) -> str:
    """What is wrong with the linear backend's metadata for ``batch`` ("" when nothing): each row's
    state slot and the query start offsets, from the batch and the pool's mapping alone."""
    import torch

    if metadata is None:
        return "no linear metadata was built"
    bs = int(batch.batch_size)
    mode = batch.forward_mode
    # A replay pads the live batch to its captured size; a capture's rows are all its own.
    real, want_slots = _live(backend, batch)
    got = metadata.mamba_cache_indices
    if got is None or got.numel() < bs:
        return f"mamba_cache_indices holds {0 if got is None else got.numel()} entries for a batch of {bs}"
    got_slots = got[:bs].to("cpu", torch.long).tolist()
    if got_slots[:real] != want_slots:
        return f"mamba_cache_indices[:{real}] = {got_slots[:real]}, the requests' state slots are {want_slots}"
    if any(s != -1 for s in got_slots[real:]):
        return f"padded rows {real}..{bs - 1} read state slots {got_slots[real:]} (a padded row's is -1)"
    qsl = metadata.query_start_loc
    if qsl is None:
        return "query_start_loc is None"
    if qsl.numel() != bs + 1:
        # The kernels take the number of sequences from its length.
        return f"query_start_loc has {qsl.numel()} entries for a batch of {bs}"
    qsl = qsl.to("cpu", torch.long).tolist()
    if mode.is_decode_or_idle():
        want = list(range(real + 1)) + [real] * (bs - real)
    elif mode.is_target_verify():
        step = backend._sglfix_draft_tokens
        want = [i * step for i in range(real + 1)] + [real * step] * (bs - real)
    else:
        lens = backend._sglfix_extend[:bs].to("cpu", torch.long).tolist()
        want = [0]
        for n in lens:
            want.append(want[-1] + n)
    if qsl != want:
        return f"query_start_loc = {qsl}, the batch's token offsets are {want}"
    return (
        _by_mode(metadata, batch, backend, offsets=want, real=real, bs=bs)
        or _captured_addresses(metadata, backend, bs=bs)
        or replayssm_reference(metadata, batch, backend, real=real, slots=want_slots)
    )


# The linear metadata a captured graph's kernels read by address: a replay must hand them the
# buffers the capture of its size handed out, whatever it writes into them.
_GRAPH_FIELDS = (
    "query_start_loc",
    "mamba_cache_indices",
    "retrieve_next_token",
    "retrieve_next_sibling",
    "replayssm_write_pos",
    "replayssm_force_flush",
)


def _captured_addresses(metadata: Any, backend: Any, *, bs: int) -> str:
    """A capture records where each graph-read field lives; a replay of that size must hand the
    same buffers (a capture that handed another buffer leaves the graph reading it, stale, on
    every replay, however right the replay's own metadata is)."""
    phase = getattr(backend, "_sglfix_phase", "eager")
    if phase == "eager":
        return ""
    seen = backend.__dict__.setdefault("_sglfix_graph_addresses", {}).setdefault(bs, {})
    for name in _GRAPH_FIELDS:
        value = getattr(metadata, name, None)
        if value is None or not hasattr(value, "data_ptr"):
            continue
        if phase == "capture":
            seen.setdefault(name, value.data_ptr())
        elif name in seen and value.data_ptr() != seen[name]:
            return (
                f"a replay of size {bs} hands {name} at another address than its capture did: the "
                "captured kernels read the capture's buffer, which the replay does not refill"
            )
    return ""


def _by_mode(metadata: Any, batch: Any, backend: Any, *, offsets: list[int], real: int, bs: int) -> str:
    """What a mode adds to the slots and offsets: a Mamba2 layer set's own metadata, a prefill's
    or a decode step's Mamba track, a tree verify's links."""
    mode = batch.forward_mode
    wrong = mamba2_reference(
        metadata, batch, offsets=offsets, draft_tokens=backend._sglfix_draft_tokens, chunk=backend._sglfix_mamba2_chunk
    )
    if wrong:
        return wrong
    if mode.is_extend() and not mode.is_target_verify():
        return track_reference(metadata, batch, backend, offsets=offsets, conv=GDN_CONV - 1) or ""
    plan = getattr(backend, "_sglfix_track", None)
    if mode.is_decode_or_idle() and plan is not None and getattr(backend, "_sglfix_phase", "eager") != "capture":
        # A capture's batch tracks nothing (the runner's track slots are zero then).
        return decode_track_reference(metadata, backend, plan, real=real, bs=bs, layer=LINEAR_LAYER)
    if mode.is_target_verify():
        return _verify_links(metadata, batch, backend, real=real)
    return ""


def _verify_links(metadata: Any, batch: Any, backend: Any, *, real: int) -> str:
    """A tree (topk > 1) hands the verify kernels its links, each live row the links of its
    request's draft tree (the verify input's, which sglfix built from the tree); a chain hands
    none."""
    import torch

    tree = backend._sglfix_topk > 1
    for name in ("retrieve_next_token", "retrieve_next_sibling"):
        got_links = getattr(metadata, name, None)
        if not tree and got_links is not None:
            return f"{name} is set for a chain verify (topk {backend._sglfix_topk}): its kernels would walk a tree"
        if tree and got_links is None:
            return f"{name} is None for a tree verify (topk {backend._sglfix_topk})"
        want = getattr(batch.spec_info, name, None) if tree else None
        if want is None or got_links is None:
            continue
        have = got_links[:real].to("cpu", torch.long).tolist()
        want = want[:real].to("cpu", torch.long).tolist()
        row = first_difference(have, want)
        if row is not None:
            return (
                f"{name}[{row}] = {have[row] if row < len(have) else None}, request {row}'s draft tree "
                f"gives {want[row] if row < len(want) else None}"
            )
    return ""


class SglangHybridFlashInferAdapter(SglangHybridLinearAdapter, SglangFlashInferAdapter):
    """The hybrid over ``FlashInferAttnBackend`` for its full-attention layer set: a multi-item
    scoring batch's (sglang refuses --enable-mis with any other attention backend). Everything
    not hybrid is the FlashInfer adapter's: its stand-ins where FlashInfer is missing, its
    wrappers' planned views and its multi-item plan judge."""

    registry_name = "flashinfer"

    def _full_backend(self, prepared: Prepared) -> Any:
        flashinfer_module()
        with self._placed():
            full = super()._full_backend(prepared)
        full._sglfix_multi_item = getattr(prepared.case, "multi_item", None)
        return full


class SglangHybridFlashInferMLAAdapter(SglangHybridLinearAdapter, SglangFlashInferMLAAdapter):
    """The hybrid over ``FlashInferMLAAttnBackend`` for its full-attention layer set: Kimi-Linear's
    (MLA layers beside delta-attention ones, ``model.kv_lora_rank``). Everything not hybrid is the
    FlashInfer-MLA adapter's: the latent case, its stand-in where FlashInfer is missing, its
    schedule judge over the full child's plans, and the model's multi-head prefill
    (``model.mha_chunk``), which reaches the child's chunk metadata through the hybrid
    (``init_mha_chunk_metadata``), as a hybrid MLA model's forward does."""

    registry_name = "flashinfer"

    def build(self, scenario: Any, *, device: str) -> Prepared:
        import torch

        prepared = super().build(scenario, device=device)
        runner = prepared.case.runner
        if not hasattr(runner, "model"):
            # The test kit's MLA runner holds no model; its dense one holds an empty module, which
            # the worker's post-verify commit hands the backend (it reads no weights).
            runner.model = torch.nn.Module()
        return prepared

    def _full_backend(self, prepared: Prepared) -> Any:
        return SglangFlashInferMLAAdapter.make_backend(self, prepared)

    def guard_graph_state(self, backend: Any, graphs: Any) -> None:
        SglangFlashInferMLAAdapter.guard_graph_state(self, backend._sglfix_full, graphs)


class SglangHybridAMXAdapter(SglangHybridLinearAdapter):
    """The hybrid over sglang's CPU attention backend (``IntelAMXAttnBackend``) for its
    full-attention layer set, under sglang's CPU graph runner (``cuda_graph.cpu``): a CPU device's
    decode graphs. Where sgl_kernel is not the CPU build, its decode kernel is the torch one of
    ``sglfix.harness.amx`` over the same request rows, lengths and pool. The layer's output is judged
    as for Triton, the linear layers' metadata after every capture (the state slots of the runner's
    capture rows) and every replay (the backend's eager init on the padded batch)."""

    backend_class = "IntelAMXAttnBackend"

    def _full_backend(self, prepared: Prepared) -> Any:
        import torch
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        from sglfix.harness import amx

        if torch.device(prepared.case.device).type != "cpu":
            raise Unavailable(
                "sglang's CPU graph runner and its CPU attention backend (IntelAMXAttnBackend) serve a CPU device"
            )
        if "intel_amx" not in ATTENTION_BACKENDS:
            raise Unavailable("this release registers no CPU attention backend (intel_amx)")
        amx.install()
        return ATTENTION_BACKENDS["intel_amx"](prepared.case.runner)

    def _full_views(self, full: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        """The CPU backend's metadata: the decode kernel's split scratch (``attn_logits``)."""
        metadata = full.forward_metadata
        logits = metadata[0] if isinstance(metadata, tuple) else None
        return [("amx", SimpleNamespace(attn_logits=logits), int(forward_batch.batch_size))]


class HybridLinearAdapter(Dispatch):
    """``backend: hybrid_linear``: the hybrid over Triton, over FlashInfer for a multi-item scoring
    batch (``batch.items``), or over FlashInfer-MLA for an MLA model (Kimi-Linear's). Each call
    goes to the adapter that built the cell."""

    name = "hybrid_linear"
    metadata_fields = SglangHybridLinearAdapter.metadata_fields

    def __init__(self) -> None:
        self.triton, self.flashinfer = SglangHybridLinearAdapter(), SglangHybridFlashInferAdapter()
        self.mla, self.amx = SglangHybridFlashInferMLAAdapter(), SglangHybridAMXAdapter()

    def _by_case(self, prepared: Prepared) -> Any:
        return self._for_scenario(prepared.case.scenario)

    def _by_backend(self, backend: Any) -> Any:
        full = type(getattr(backend, "_sglfix_full", None)).__name__
        if full == self.mla.backend_class:
            return self.mla
        if full == self.amx.backend_class:
            return self.amx
        return self.flashinfer if getattr(backend, "_sglfix_items", None) is not None else self.triton

    def _for_scenario(self, scenario: Any) -> Any:
        if scenario.model.mla:
            return self.mla
        if scenario.cpu_graph:
            return self.amx
        return self.triton if scenario.items is None else self.flashinfer


ADAPTER = HybridLinearAdapter()
