"""sglang 0.5.23's CUDA-graph runners, as the Triton adapter drives one attention layer through
them: ``kit("graphs")`` of ``sglfix.harness.kits``.

``GraphRunner`` drives the attention backend as ``CudaGraphRunner`` / ``EAGLEDraftExtendCudaGraphRunner``
do in this version: the static input buffers, the capture metadata per captured size, the padding
of a replay and the view each runner hands ``init_forward_metadata_out_graph`` (decode and verify
through the decode runner's own ``build_replay_fb_view``, with its ``encoder_lens`` buffer for an
encoder-decoder model; a draft extend through the draft-extend runner's own replay method,
``execute``, run on these buffers).
``PrefillGraphRunner`` does the same for a plain EXTEND as ``PrefillCudaGraphRunner`` under its full
backend drives it: one graph per token bucket over a fixed number of request slots, the replay's
slot-padded view built by the runner's own ``_prepare_forward_metadata_for_replay``.
On CUDA the forward is a captured ``torch.cuda.CUDAGraph``; on CPU the same capture/replay metadata
code runs and the forward runs eagerly on the same static buffers. ``attend`` is one layer's
forward as a model forward runs it (the backend published in the forward context).

Nothing here judges: the adapter hands ``GraphRunner`` its guard (the guard zones around the
graph state, ``GRAPH_STATE``), and the judge reads the metadata through the adapter's hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sglfix.harness.unavailable import Unavailable

from .environment import bind_runner_slots, init_then_join

__all__ = ["GRAPH_STATE", "GraphRunner", "PrefillGraphRunner", "attend", "publish_full_prefill"]

# TritonAttnBackend's CUDA-graph state (init_cuda_graph_state), guarded before capture.
GRAPH_STATE = (
    "cuda_graph_kv_indices",
    "cuda_graph_num_kv_splits",
    "cuda_graph_attn_logits",
    "cuda_graph_attn_lse",
    "cuda_graph_window_kv_indices",
)


def attend(*, backend: Any, layer: Any, batch: Any, q: Any, k: Any, v: Any) -> Any:
    """One attention layer through sglang's RadixAttention, the backend published in the forward
    context as a model forward does; returns [tokens, H, D]. ``k = v = None``: a layer that brings
    no K/V of its own (an encoder-decoder model's cross layer over its cached encoder), called with
    None as Mllama's and Whisper's decoders call it."""
    import torch
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    def flat(t: Any) -> Any:
        return None if t is None else t.reshape(t.shape[0], -1)

    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        out = layer(flat(q), flat(k), flat(v), batch)
    return out.view(q.shape[0], q.shape[1], -1)


@dataclass
class _Captured:
    """One captured size: its static ForwardBatch, the metadata object capture built, the graph."""

    batch: Any
    metadata: Any
    graph: Any = None
    output: Any = None
    # A prefill capture: each wrapper's host-side row count its run() was checked against.
    rows: Any = None
    # A composite backend's parts (a hybrid's full and linear backends): each one's metadata as
    # this size's capture left it.
    parts: tuple[tuple[Any, Any], ...] = ()


def _parts_metadata(backend: Any) -> tuple[tuple[Any, Any], ...]:
    """The metadata each part of a hybrid backend (its full and linear backends) holds now; none
    for any other backend (every backend has an ``attn_backend_list``, None where it has no parts;
    a multi-step draft's step backends are the multi-step runners' own)."""
    if getattr(backend, "linear_attn_backend", None) is None:
        return ()
    return tuple((b, getattr(b, "forward_metadata", None)) for b in backend.attn_backend_list or ())


def _put_back(backend: Any, captured: _Captured) -> None:
    """The metadata this size's capture built, back where the graph's kernels read it: a captured
    graph holds its own size's views, so a replay never reads another size's, whichever size was
    captured last; a composite backend's parts each hold theirs."""
    backend.forward_metadata = captured.metadata
    for part, metadata in captured.parts:
        part.forward_metadata = metadata


# The draft-extend runner's buffers that are this runner's own: the capture bound slices of them.
_DRAFT_EXTEND_BUFFERS = (
    "input_ids",
    "req_pool_indices",
    "out_cache_loc",
    "positions",
    "seq_lens",
    "seq_lens_cpu",
    "extend_seq_lens",
    "num_correct_drafts",
    "num_accept_tokens",
)


def _record_cuda_graph(captured: _Captured, *, backend: Any, body: Any) -> None:
    """CUDA: the capture's two warm-ups on a side stream, each followed by the backend's reset of
    what the warm-up mutated (sglang's capture_one post_warmup_hook), then ``body`` recorded into a
    torch.cuda.CUDAGraph, its output the graph's buffer."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    hook = getattr(backend, "on_after_cuda_graph_warmup", None)
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()
            if hook is not None:
                hook()
    torch.cuda.current_stream().wait_stream(stream)
    captured.graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured.graph):
        captured.output = body()


class GraphRunner:
    """Capture and replay of one attention layer, the way this version's graph runners drive
    the backend: static input buffers sized for the largest captured batch, the backend's
    capture metadata per size (``init_forward_metadata_out_graph(in_capture=True)`` then
    ``init_forward_metadata_in_graph``), and a replay that copies the live batch into the buffers,
    pads it to the captured size and calls ``init_forward_metadata_out_graph`` on a view of them
    (decode/verify: ``build_replay_fb_view``; draft extend: ``EAGLEDraftExtendCudaGraphRunner.execute``).
    """

    def __init__(
        self, *, case: Any, backend: Any, capture_bs: list[int], guard: Callable[[Any], None], record: bool = True
    ) -> None:
        """``record``: on CUDA, record each size's body into a ``torch.cuda.CUDAGraph`` and replay
        that. False where the layer's kernel cannot be recorded (a torch stand-in that reads its
        lengths on the host): the body then runs as on CPU, at capture and again over each replay's
        metadata, and the backend's capture and replay are the runner's all the same."""
        import torch

        self.case, self.backend = case, backend
        self.capture_bs = sorted(capture_bs)
        self.width = self._tokens_per_request()
        self.max_bs = self.capture_bs[-1]
        self.max_tokens = self.max_bs * self.width
        self.fill = self._seq_len_fill_value()
        # The decode runner's encoder_lens buffer of an encoder-decoder model, filled once with
        # hf_config.max_source_positions (0 where the config has none) and never reset: padded rows
        # keep that fill, live rows are copied over it at each replay.
        config = getattr(getattr(case, "runner", None), "model_config", None)
        self.is_encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        self.encoder_len_fill = (
            getattr(getattr(config, "hf_config", None), "max_source_positions", 0) if self.is_encoder_decoder else 0
        )
        self.cuda = torch.device(case.device).type == "cuda"
        self.record = record and self.cuda
        backend.init_cuda_graph_state(max_bs=self.max_bs, max_num_tokens=self.max_tokens)
        guard(backend)  # before anything points into the graph state
        self.buffers = self._static_buffers()
        self.captured: dict[int, _Captured] = {}

    def _tokens_per_request(self) -> int:
        mode = self.case.scenario.mode
        if mode == "DECODE":
            return 1
        if mode in ("TARGET_VERIFY", "DRAFT_EXTEND_V2"):
            return self.case.scenario.spec.num_draft_tokens
        if mode == "DLLM_EXTEND":  # the decode runner at the diffusion LM's block size
            return self.case.scenario.extend_lens[0]
        raise Unavailable(f"sglang's graph runners do not capture {mode} for the Triton backend")

    def _seq_len_fill_value(self) -> int:
        """Padded rows' seq_lens, as each of sglang's runners resolves it."""
        if self.case.scenario.mode == "DRAFT_EXTEND_V2":
            from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as runner

            # 0.5.20 on widens it for a DSA KPool; before, the runner took the backend's value.
            resolve = getattr(runner, "resolve_draft_extend_seq_len_fill_value", None)
            if resolve is not None:
                return resolve(self.backend, self.width)
        return self.backend.get_cuda_graph_seq_len_fill_value()

    def _static_buffers(self) -> SimpleNamespace:
        """The runner's input buffers, initialised as sglang's graph runners initialise them."""
        import torch

        dev, n, bs = self.case.device, self.max_tokens, self.max_bs
        q, k, v = self.case.q, self.case.k, self.case.v
        tracks = getattr(getattr(self.case, "forward_batch", None), "mamba_track_mask", None) is not None

        def tokens(t: Any) -> Any:  # a static q/k/v buffer; none where the layer takes no K/V
            return None if t is None else torch.zeros((n,) + tuple(t.shape[1:]), dtype=t.dtype, device=dev)

        return SimpleNamespace(
            input_ids=torch.zeros((n,), dtype=torch.int64, device=dev),
            positions=torch.zeros((n,), dtype=torch.int64, device=dev),
            out_cache_loc=torch.zeros((n,), dtype=torch.int64, device=dev),
            req_pool_indices=torch.zeros((bs,), dtype=torch.int64, device=dev),
            seq_lens=torch.full((bs,), self.fill, dtype=torch.int64, device=dev),
            seq_lens_cpu=torch.full((bs,), self.fill, dtype=torch.int64),
            extend_seq_lens=torch.full((bs,), self.width, dtype=torch.int32, device=dev),
            num_correct_drafts=torch.full((bs,), self.width, dtype=torch.int32, device=dev),
            num_accept_tokens=torch.full((bs,), self.width, dtype=torch.int32, device=dev),
            # Sized as the runners' buffers size it (0.5.16-0.5.23 alike): the backend copies it
            # into its own verify-mask buffer at capture, which 0.5.16 sizes tokens x context.
            custom_mask=torch.ones(((bs * self.fill + n) * self.width,), dtype=torch.bool, device=dev),
            # The decode runner's Mamba track slots, registered where the batch tracks states
            # (zero-padded, as sglang pads its index buffers).
            mamba_track_indices=torch.zeros((bs,), dtype=torch.int64, device=dev) if tracks else None,
            mamba_track_mask=torch.zeros((bs,), dtype=torch.bool, device=dev) if tracks else None,
            # The decode runner's (DecodeInputBuffers, the registry's FILL_ONCE slot): int32.
            encoder_lens=(
                torch.full((bs,), self.encoder_len_fill, dtype=torch.int32, device=dev)
                if self.is_encoder_decoder
                else None
            ),
            q=tokens(q),
            k=tokens(k),
            v=tokens(v),
        )

    # -- capture

    def _capture_spec_info(self, bs: int) -> Any:
        """What the runner hands the backend at capture: verify input over the custom-mask buffer,
        draft-extend input of the full window, nothing for decode."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleDraftExtendInput, EagleVerifyInput

        spec, b = self.case.scenario.spec, self.buffers
        if self.case.scenario.mode == "TARGET_VERIFY":
            return EagleVerifyInput(
                draft_token=None,
                custom_mask=b.custom_mask,
                positions=None,
                retrieve_index=None,
                retrieve_next_token=None,
                retrieve_next_sibling=None,
                retrieve_cum_len=None,
                spec_steps=spec.num_steps,
                topk=spec.topk,
                draft_token_num=spec.num_draft_tokens,
                capture_hidden_mode=CaptureHiddenMode.FULL,
                seq_lens_sum=None,
                seq_lens_cpu=None,
            )
        if self.case.scenario.mode == "DRAFT_EXTEND_V2":
            return EagleDraftExtendInput(
                hidden_states=None,
                num_correct_drafts=b.num_correct_drafts[:bs],
                num_accept_tokens=b.num_accept_tokens[:bs],
                num_tokens_per_req=self.width,
                num_tokens_for_logprob_per_req=1,
            )
        return None

    def _capture_batch(self, bs: int) -> Any:
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        b, n = self.buffers, bs * self.width
        draft_extend = self.case.scenario.mode == "DRAFT_EXTEND_V2"
        batch = ForwardBatch(
            forward_mode=self.case.mode,
            batch_size=bs,
            input_ids=b.input_ids[:n],
            req_pool_indices=b.req_pool_indices[:bs],
            seq_lens=b.seq_lens[:bs],
            seq_lens_cpu=b.seq_lens_cpu[:bs],
            out_cache_loc=b.out_cache_loc[:n],
            seq_lens_sum=int(b.seq_lens_cpu[:bs].sum()),
            positions=b.positions[:n],
            extend_seq_lens=b.extend_seq_lens[:bs] if draft_extend else None,
            extend_seq_lens_cpu=[self.width] * bs if draft_extend else None,
            spec_info=self._capture_spec_info(bs),
        )
        if b.mamba_track_indices is not None:
            batch.mamba_track_indices = b.mamba_track_indices[:bs]
            batch.mamba_track_mask = b.mamba_track_mask[:bs]
        if b.encoder_lens is not None:
            batch.encoder_lens = b.encoder_lens[:bs]
        bind_runner_slots(self.case.runner, batch)
        return batch

    def capture(self) -> GraphRunner:
        for bs in reversed(self.capture_bs):  # sglang captures the largest size first
            self.captured[bs] = self._capture_one(bs)
        return self

    def _capture_one(self, bs: int) -> _Captured:
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        batch = self._capture_batch(bs)
        with forward_context(ForwardContext(attn_backend=self.backend)):
            self.backend.init_forward_metadata_out_graph(batch, in_capture=True)
        captured = _Captured(batch=batch, metadata=self.backend.forward_metadata, parts=_parts_metadata(self.backend))
        if self.record:
            _record_cuda_graph(captured, backend=self.backend, body=lambda: self._forward(captured, bs))
        else:
            # No graph (CPU, or a kernel that cannot be recorded): the capture forward is the
            # warm-up every runner performs first; its output stands for the graph's buffer.
            captured.output = self._forward(captured, bs)
        return captured

    def _forward(self, captured: _Captured, bs: int) -> Any:
        """The captured body: the in-graph metadata step, then the layer on the static buffers."""
        n = bs * self.width
        self.backend.init_forward_metadata_in_graph(captured.batch)
        return attend(
            backend=self.backend,
            layer=self.case.layer,
            batch=captured.batch,
            q=self.buffers.q[:n],
            k=None if self.buffers.k is None else self.buffers.k[:n],
            v=None if self.buffers.v is None else self.buffers.v[:n],
        )

    # -- replay

    def can_run_graph(self, forward_batch: Any) -> bool:
        """The draft-extend runner's test: uniform window of the captured width, a size that fits."""
        spec_info = forward_batch.spec_info
        width = getattr(spec_info, "num_tokens_per_req", -1) if spec_info is not None else -1
        if width > 0 and width != self.width:
            return False
        # The decode runner's: a batch with a request without encoder tokens runs eagerly.
        if self.is_encoder_decoder and not bool((forward_batch.encoder_lens > 0).all()):
            return False
        return forward_batch.seq_lens.numel() <= self.max_bs

    can_run = can_run_graph  # the runners' name for it in 0.5.13

    def _graph_bs(self, raw_bs: int) -> int:
        return next(bs for bs in self.capture_bs if bs >= raw_bs)

    def _load(self, batch: Any, *, raw_bs: int, bs: int) -> None:
        """Decode / verify: copy the live batch into the buffers; padded rows as sglang pads them
        (a draft extend's are the draft-extend runner's own, ``_execute_draft_extend``)."""
        b, raw_n = self.buffers, raw_bs * self.width
        if bs != raw_bs:
            b.seq_lens.fill_(self.fill)
            b.seq_lens_cpu.fill_(self.fill)
            b.out_cache_loc.zero_()
            b.positions.zero_()
            b.req_pool_indices.zero_()
        b.input_ids[:raw_n].copy_(batch.input_ids)
        b.seq_lens[:raw_bs].copy_(batch.seq_lens)
        b.out_cache_loc[:raw_n].copy_(batch.out_cache_loc)
        b.positions[:raw_n].copy_(batch.positions)
        b.req_pool_indices[:raw_bs].copy_(batch.req_pool_indices)
        if batch.seq_lens_cpu is not None:
            b.seq_lens_cpu[:raw_bs].copy_(batch.seq_lens_cpu)
        if b.mamba_track_indices is not None:
            if bs != raw_bs:
                b.mamba_track_indices.zero_()
                b.mamba_track_mask.zero_()
            b.mamba_track_indices[:raw_bs].copy_(batch.mamba_track_indices)
            b.mamba_track_mask[:raw_bs].copy_(batch.mamba_track_mask)
        if b.encoder_lens is not None:  # filled once: the padded rows keep the fill
            b.encoder_lens[:raw_bs].copy_(batch.encoder_lens)

    def _decode_view(self, batch: Any, *, raw_bs: int, bs: int) -> Any:
        """Decode / verify: the decode graph runner's own replay view."""
        import inspect

        try:
            from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view
        except ImportError:  # 0.5.13: the graph runner's module before the runner package
            from sglang.srt.model_executor.cuda_graph_runner import build_replay_fb_view

        n = bs * self.width
        extra = {}
        if "global_num_tokens_cpu" in inspect.signature(build_replay_fb_view).parameters:  # 0.5.20 on
            extra["global_num_tokens_cpu"] = None
        return build_replay_fb_view(
            forward_batch=batch,
            buffers=self.buffers,
            bs=bs,
            raw_bs=raw_bs,
            num_tokens=n,
            seq_len_fill_value=self.fill,
            capture_forward_mode=self.case.mode,
            is_encoder_decoder=self.is_encoder_decoder,
            **extra,
        )

    def replay(self, batch: Any, *, q: Any, k: Any, v: Any) -> Any:
        """The replay of the smallest captured size that fits ``batch``; output of its real rows."""
        raw_bs = batch.batch_size
        bs = self._graph_bs(raw_bs)
        captured = self.captured[bs]
        raw_n, n = q.shape[0], bs * self.width
        for name, src in (("q", q), ("k", k), ("v", v)):
            buf = getattr(self.buffers, name)
            if buf is None:  # a layer that takes no K/V
                continue
            buf[:raw_n].copy_(src)
            buf[raw_n:n].zero_()
        _put_back(self.backend, captured)
        if self.case.scenario.mode == "DRAFT_EXTEND_V2":
            return self._execute_draft_extend(batch, captured=captured, bs=bs)[:raw_n].clone()
        self._load(batch, raw_bs=raw_bs, bs=bs)
        view = self._decode_view(batch, raw_bs=raw_bs, bs=bs)
        init_then_join(self.backend, batch, bs, lambda: self.backend.init_forward_metadata_out_graph(view))
        return self._launch(captured, bs)[:raw_n].clone()

    def _launch(self, captured: _Captured, bs: int) -> Any:
        if captured.graph is not None:
            captured.graph.replay()
            return captured.output
        return self._forward(captured, bs)

    def _execute_draft_extend(self, batch: Any, *, captured: _Captured, bs: int) -> Any:
        """Draft extend: the installed ``EAGLEDraftExtendCudaGraphRunner``'s own replay method
        (``execute``) over these buffers, this backend its draft-extend backend: it pads the batch
        into the buffers, hands the backend its batch view and launches the graph, which runs the
        layer here."""
        from sglfix.harness.kits.sglang_0_5_23.draft_replay import extend_buffers, replay_draft_extend

        b, dev = self.buffers, self.case.device
        own = {name: getattr(b, name) for name in _DRAFT_EXTEND_BUFFERS}
        buffers = extend_buffers(max_bs=self.max_bs, width=self.width, fill=self.fill, device=dev, **own)
        ran: list[Any] = []
        replay_draft_extend(
            self.backend,
            batch,
            capture_bs=self.capture_bs,
            width=self.width,
            fill=self.fill,
            device=dev,
            buffers=buffers,
            launch=lambda _view: ran.append(self._launch(captured, bs)),
        )
        # A replay that launched nothing leaves the output buffer as the last run left it.
        return ran[0] if ran else captured.output


# -- the prefill runner under the full backend

# The prefill runner's static per-request buffers (``_PREFILL_STATIC_FIELDS``, int64, one row per
# request-pool row): a captured graph reads them at fixed addresses.
_PREFILL_STATIC = (
    "seq_lens",
    "extend_seq_lens",
    "extend_prefix_lens",
    "extend_start_loc",
    "req_pool_indices",
    "orig_seq_lens",
)


def publish_full_prefill(
    runner: Any, *, capture_tokens: list[int], req_slots: int | None, breakable: bool = False
) -> None:
    """What ``--cuda-graph-config '{"prefill": {"backend": "full", "bs": capture_tokens,
    "full_prefill_max_req": req_slots}}'`` publishes over the kit runner's server args (its decode
    phase kept), and the chunked-prefix cache off, as sglang's model runner turns it off for a
    non-MLA model (``maybe_disable_chunked_prefix_cache``): the full prefill runner then captures
    no chunked-prefix variant. With ``breakable`` the prefill backend is "breakable" (no request
    slots). Nothing where the release has no such config."""
    from .attention import publish_over

    try:
        from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
        from sglang.srt.runtime_context import get_exec
    except ImportError:
        return
    decode = get_exec().graph.cuda_graph_config.decode
    if breakable:
        prefill = PhaseConfig(backend=Backend.BREAKABLE, bs=sorted(capture_tokens))
    else:
        prefill = PhaseConfig(backend=Backend.FULL, bs=sorted(capture_tokens), full_prefill_max_req=req_slots)
    publish_over(
        runner, cuda_graph_config=CudaGraphConfig(decode=decode, prefill=prefill), disable_chunked_prefix_cache=True
    )


class PrefillGraphRunner:
    """A plain EXTEND captured and replayed as sglang's ``PrefillCudaGraphRunner`` does under the
    full backend (``cuda_graph_config.prefill.backend = "full"``), for one attention layer.

    Capture, one graph per token bucket (``capture_tokens``, the config's prefill ``bs``: aggregate
    token counts, largest first), each over ``req_slots`` request slots (``full_prefill_max_req``):
    ``capture_prepare``'s batch (the bucket as the fewest requests of at most the context length,
    then zero-length sentinel requests up to the slot count; no prefix; request rows 0..slots-1)
    over the runner's static buffers, and ``init_forward_metadata_out_graph(batch,
    in_capture=True)`` (the backend's capture-stable wrappers). The layer runs as the captured
    body runs it: inside the runner's prefill graph scope (RadixAttention's full-graph attention,
    the batch's ``global_num_token_non_padded_cpu`` rows).

    Replay, ``load_batch``: the batch's tokens padded to the smallest bucket that holds them (the
    token buffers' tail zeroed: input ids, positions, write slot 0), its requests copied into the
    static request buffers, the slots past them sentinels (zero lengths, request row 0, start at
    the end of the real tokens); then the runner's own ``_prepare_forward_metadata_for_replay``
    (run on these buffers) hands the backend its slot-padded view. On CUDA the recorded graph
    replays; on CPU the body runs again over the captured batch and the replay's plans.
    """

    def __init__(
        self,
        *,
        case: Any,
        backend: Any,
        capture_tokens: list[int],
        req_slots: int | None,
        guard: Callable[[Any], None],
        record: bool = True,
    ) -> None:
        import torch

        if req_slots is None:
            raise Unavailable(
                "an EXTEND graph is captured over cuda_graph.full_prefill_max_req request slots; none given"
            )
        try:
            from sglang.srt.model_executor.runner import prefill_cuda_graph_runner as module
            from sglang.srt.model_executor.runner_utils import prefill_graph  # noqa: F401
        except ImportError as exc:
            raise Unavailable(
                "this release has no prefill graph scope (sglang 0.5.23's prefill runner); "
                "sglfix replays its prefill graphs, full and breakable, from 0.5.23 on"
            ) from exc
        self.case, self.backend = case, backend
        self.runner_class = module.PrefillCudaGraphRunner
        tokens = getattr(module, "get_prefill_num_tokens_to_capture", sorted)(capture_tokens)
        pool = case.runner.req_to_token_pool
        self.max_bs = pool.size  # the runner's static request buffers span the request pool
        # cuda_graph_setup: the slots capped by the pool, the buckets by what slots x context hold.
        self.req_slots = min(req_slots, self.max_bs)
        self.context_len = case.runner.model_config.context_len
        self.capture_tokens = sorted(n for n in tokens if n <= self.req_slots * self.context_len)
        if not self.capture_tokens:
            raise Unavailable(f"no prefill bucket of {list(tokens)} fits {self.req_slots} slots of the context")
        self.max_tokens = self.capture_tokens[-1]
        self.padding_factor = getattr(module, "_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR", 2)
        self.cuda = torch.device(case.device).type == "cuda"
        self.record = record and self.cuda
        guard(backend)  # before the first capture makes the backend's full-graph wrappers
        self.buffers = self._static_buffers()
        self.captured: dict[int, _Captured] = {}

    def _static_buffers(self) -> SimpleNamespace:
        """The registry's token slots, the static request buffers and the slot-padded host
        lengths, as the runner allocates them; q/k/v for the layer's inputs in the graph."""
        import torch

        dev, n = self.case.device, self.max_tokens

        def tokens(t: Any) -> Any:
            return None if t is None else torch.zeros((n,) + tuple(t.shape[1:]), dtype=t.dtype, device=dev)

        return SimpleNamespace(
            input_ids=torch.zeros((n,), dtype=torch.int64, device=dev),
            positions=torch.zeros((n,), dtype=torch.int64, device=dev),
            out_cache_loc=torch.zeros((n,), dtype=torch.int64, device=dev),
            static={name: torch.zeros((self.max_bs,), dtype=torch.int64, device=dev) for name in _PREFILL_STATIC},
            seq_lens_cpu=torch.zeros((self.req_slots,), dtype=torch.int64),
            q=tokens(self.case.q),
            k=tokens(self.case.k),
            v=tokens(self.case.v),
        )

    # -- capture

    def _capture_batch(self, n: int, *, sentinels: bool = True) -> Any:
        """``capture_prepare``: the bucket as the fewest requests of at most the context length,
        then (under the full backend, ``sentinels``) zero-length sentinels up to the slot count."""
        import dataclasses

        import torch
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        b, s, dev = self.buffers, self.buffers.static, self.case.device
        seq = [min(self.context_len, n - start) for start in range(0, n, self.context_len)]
        if sentinels:
            seq += [0] * (self.req_slots - len(seq))
        bs = len(seq)
        starts = [0]
        for length in seq[:-1]:
            starts.append(starts[-1] + length)
        lengths = torch.tensor(seq, dtype=torch.int64, device=dev)
        s["seq_lens"][:bs].copy_(lengths)
        s["extend_seq_lens"][:bs].copy_(lengths)
        s["extend_prefix_lens"][:bs].zero_()
        s["extend_start_loc"][:bs].copy_(torch.tensor(starts, dtype=torch.int64, device=dev))
        s["req_pool_indices"][:bs].copy_(torch.arange(bs, device=dev))
        s["orig_seq_lens"][:bs].copy_(lengths)
        extra = {}
        if "full_prefill_cuda_graph_capture" in {f.name for f in dataclasses.fields(ForwardBatch)}:
            extra["full_prefill_cuda_graph_capture"] = True
        batch = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=bs,
            input_ids=b.input_ids[:n],
            req_pool_indices=s["req_pool_indices"][:bs],
            seq_lens=s["seq_lens"][:bs],
            orig_seq_lens=s["orig_seq_lens"][:bs],
            seq_lens_cpu=torch.tensor(seq),
            out_cache_loc=b.out_cache_loc[:n],
            seq_lens_sum=n,
            return_logprob=False,
            extend_num_tokens=n,
            extend_seq_lens=s["extend_seq_lens"][:bs],
            extend_prefix_lens=s["extend_prefix_lens"][:bs],
            extend_start_loc=s["extend_start_loc"][:bs],
            extend_prefix_lens_cpu=[0] * bs,
            extend_seq_lens_cpu=list(seq),
            extend_logprob_start_lens_cpu=list(seq),
            positions=b.positions[:n],
            global_num_token_non_padded_cpu=n,
            global_forward_mode=ForwardMode.EXTEND,
            **extra,
        )
        bind_runner_slots(self.case.runner, batch)
        return batch

    def capture(self) -> PrefillGraphRunner:
        for n in reversed(self.capture_tokens):  # sglang captures the largest bucket first
            self.captured[n] = self._capture_one(n)
        return self

    def _capture_one(self, n: int) -> _Captured:
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        batch = self._capture_batch(n)
        with forward_context(ForwardContext(attn_backend=self.backend)):
            self.backend.init_forward_metadata_out_graph(batch, in_capture=True)
        captured = _Captured(batch=batch, metadata=self.backend.forward_metadata)
        # What FlashInfer's run() checks on the host, the query against the plan's rows, it checks
        # at capture only: a replay launches what the capture recorded (see ``_launch``).
        captured.rows = [getattr(w, "_qo_indptr_last", None) for w in _wrappers(captured.metadata)]
        if self.record:
            _record_cuda_graph(captured, backend=self.backend, body=lambda: self._forward(captured, n))
        else:
            captured.output = self._forward(captured, n)
        return captured

    def _forward(self, captured: _Captured, n: int, *, full_graph: bool = True) -> Any:
        """The captured body's attention: the layer in the runner's prefill graph scope (a full
        graph unless ``full_graph`` is off) over the captured batch and the static q/k/v rows of
        the bucket."""
        from sglang.srt.model_executor.runner_utils.forward_batch import set_forward_batch
        from sglang.srt.model_executor.runner_utils.prefill_graph import prefill_graph_scope

        b = self.buffers
        with set_forward_batch(captured.batch), prefill_graph_scope(full_graph=full_graph):
            return attend(
                backend=self.backend,
                layer=self.case.layer,
                batch=captured.batch,
                q=b.q[:n],
                k=None if b.k is None else b.k[:n],
                v=None if b.v is None else b.v[:n],
            )

    # -- replay

    def _bucket(self, num_tokens: int) -> int:
        return int(self.runner_class._pad_to_bucket(num_tokens, self.capture_tokens))

    def can_run_graph(self, forward_batch: Any) -> bool:
        """``can_replay_locally``'s tests a plain EXTEND meets: no more requests than the slots, a
        bucket that holds its tokens, at most twice the tokens once padded."""
        num_tokens = len(forward_batch.input_ids)
        if forward_batch.batch_size > self.req_slots or num_tokens > self.max_tokens:
            return False
        return self._bucket(num_tokens) <= num_tokens * self.padding_factor

    can_run = can_run_graph

    def _load(self, batch: Any, *, raw_n: int, n: int, q: Any, k: Any, v: Any) -> None:
        """``load_batch``: the token slots' padded tail zeroed and the live rows copied (the
        registry's ``fill_from``), then the request buffers and their sentinel tail."""
        import torch

        b = self.buffers
        for name, src in (
            ("input_ids", batch.input_ids),
            ("positions", batch.positions),
            ("out_cache_loc", batch.out_cache_loc),
            ("q", q),
            ("k", k),
            ("v", v),
        ):
            buf = getattr(b, name)
            if buf is None:  # a layer that takes no K/V
                continue
            buf[raw_n:n].zero_()
            buf[:raw_n].copy_(src)
        s, bs, r = b.static, batch.batch_size, self.req_slots
        start_loc = batch.extend_start_loc
        if start_loc is None:
            # ForwardBatch.init_new sets it for every extend batch; the kit's fixture leaves it out.
            lengths = batch.extend_seq_lens.to(torch.int64)
            start_loc = torch.cumsum(lengths, 0) - lengths
        s["seq_lens"][:bs].copy_(batch.seq_lens)
        s["extend_seq_lens"][:bs].copy_(batch.extend_seq_lens)
        s["extend_prefix_lens"][:bs].copy_(batch.extend_prefix_lens)
        s["extend_start_loc"][:bs].copy_(start_loc)
        s["req_pool_indices"][:bs].copy_(batch.req_pool_indices)
        if batch.orig_seq_lens is not None:
            s["orig_seq_lens"][:bs].copy_(batch.orig_seq_lens)
        if bs < r:
            s["seq_lens"][bs:r].zero_()
            s["extend_seq_lens"][bs:r].zero_()
            s["extend_prefix_lens"][bs:r].zero_()
            s["extend_start_loc"][bs:r].fill_(raw_n)
            s["req_pool_indices"][bs:r].zero_()
            s["orig_seq_lens"][bs:r].zero_()

    def _prepare_replay_metadata(self, batch: Any, n: int) -> None:
        """The runner's own ``_prepare_forward_metadata_for_replay`` on these buffers (a runner
        built without its constructor, which would capture a model): the slot-padded view it
        hands ``init_forward_metadata_out_graph``."""
        from sglfix.harness.misfit import Standin

        runner = _bare_runner(
            self.runner_class,
            self.backend,
            _is_full_backend=True,
            _capture_req_slots=self.req_slots,
            _prefill_static_buffers=self.buffers.static,
            _full_cg_seq_lens_cpu=self.buffers.seq_lens_cpu,
            use_captured_attn_metadata=False,
            attn_metadata_buffers=None,
        )
        static_batch = Standin(input_ids=self.buffers.input_ids[:n], max_seq_len_override=None)
        runner._prepare_forward_metadata_for_replay(batch, static_batch, self._key(n))

    def _key(self, n: int) -> Any:
        """The runner's key of the ``n``-token bucket: a ShapeKey where its replay step takes one
        (0.5.23), the token count before."""
        import inspect

        if "shape_key" not in inspect.signature(self.runner_class._prepare_forward_metadata_for_replay).parameters:
            return n
        from sglang.srt.model_executor.runner.shape_key import ShapeKey

        return ShapeKey(size=n)

    def replay(self, batch: Any, *, q: Any, k: Any, v: Any) -> Any:
        """The replay of the smallest bucket that holds the batch's tokens; its real rows' output."""
        raw_n = q.shape[0]
        n = self._bucket(raw_n)
        captured = self.captured[n]
        self._load(batch, raw_n=raw_n, n=n, q=q, k=k, v=v)
        # The graph's kernels read the wrappers capture planned: put their metadata back.
        self.backend.forward_metadata = captured.metadata
        self._prepare_replay_metadata(batch, n)
        return self._launch(captured, n)[:raw_n].clone()

    def _launch(self, captured: _Captured, n: int) -> Any:
        if captured.graph is not None:
            captured.graph.replay()
            return captured.output
        # The body runs again here: the host-side row check of each wrapper's run() is the one
        # its capture passed (``_qo_indptr_last``, FlashInfer's own name), not this replay's plan's.
        wrappers = _wrappers(captured.metadata)
        planned = [getattr(w, "_qo_indptr_last", None) for w in wrappers]
        try:
            for w, rows in zip(wrappers, captured.rows):
                if rows is not None:
                    w._qo_indptr_last = rows
            return self._forward(captured, n)
        finally:
            for w, rows in zip(wrappers, planned):
                if rows is not None:
                    w._qo_indptr_last = rows


def _wrappers(metadata: Any) -> list:
    return list(getattr(metadata, "prefill_wrappers", None) or [])


# -- the prefill runner under the breakable backend


class BreakablePrefillGraphRunner(PrefillGraphRunner):
    """A plain EXTEND under sglang's breakable prefill backend (``cuda_graph_config.prefill.backend
    = "breakable"``) over a backend that keeps the tables it captured
    (``use_captured_forward_metadata_for_breakable_cuda_graph``: a Kimi-Linear hybrid, whose
    delta-attention extend stays inside the graph on per-bucket tables).

    Capture, one per token bucket, largest first: ``capture_prepare``'s batch under the breakable
    backend (the bucket as the fewest requests of at most the context length, no sentinel slots,
    request rows 0..n-1, over the runner's static buffers), then the runner's own
    ``_init_forward_metadata_for_capture``, which asks the backend for the bucket's tables
    (``init_forward_metadata_for_breakable_cuda_graph_capture``) and keeps them per bucket.

    Replay, ``load_batch``: the token buffers padded to the bucket, the batch's requests copied into
    the static request buffers (no sentinels), then the runner's own
    ``_prepare_forward_metadata_for_replay``, which hands the backend the bucket's kept tables to
    refresh in place for this batch (``prepare_forward_metadata_for_breakable_cuda_graph_replay``).
    The attention layer is a break: it runs eagerly, over the bucket's token rows, on the metadata
    this replay built; the graph segments around it hold no attention, so nothing is recorded.
    """

    def __init__(self, *, case: Any, backend: Any, capture_tokens: list[int], guard: Callable[[Any], None]) -> None:
        if not getattr(backend, "use_captured_forward_metadata_for_breakable_cuda_graph", False):
            raise Unavailable(
                "this backend keeps no captured tables under breakable prefill graphs "
                "(use_captured_forward_metadata_for_breakable_cuda_graph is off)"
            )
        pool = case.runner.req_to_token_pool
        super().__init__(
            case=case, backend=backend, capture_tokens=capture_tokens, req_slots=pool.size, guard=guard, record=False
        )
        # The runner's own metadata steps under the captured-metadata contract.
        self.runner = _bare_runner(
            self.runner_class,
            backend,
            _is_full_backend=False,
            use_captured_attn_metadata=True,
            attn_metadata_buffers={},
        )

    def _capture_one(self, n: int) -> _Captured:
        import dataclasses

        # capture_prepare under the breakable backend: no zero-length sentinel requests.
        batch = self._capture_batch(n, sentinels=False)
        if "full_prefill_cuda_graph_capture" in {f.name for f in dataclasses.fields(batch)}:
            batch.full_prefill_cuda_graph_capture = False
        with _host_placed():
            self.runner._init_forward_metadata_for_capture(batch, self._key(n))
        captured = _Captured(batch=batch, metadata=self.runner.attn_metadata_buffers[self._key(n)])
        # The capture's body runs its attention break eagerly over the capture batch (its output
        # is the capture's, not kept): the layer must run on what the capture built.
        captured.output = self._forward(captured, n, full_graph=False)
        return captured

    def can_run_graph(self, forward_batch: Any) -> bool:
        """``can_replay_locally``'s tests: a bucket that holds the tokens, at most twice them once
        padded, and no more requests than the backend's tables hold (its
        ``prefill_cuda_graph_max_batch_size``)."""
        num_tokens = len(forward_batch.input_ids)
        if num_tokens > self.max_tokens:
            return False
        limit = getattr(self.backend, "prefill_cuda_graph_max_batch_size", None)
        if limit is not None and forward_batch.batch_size > limit:
            return False
        return self._bucket(num_tokens) <= num_tokens * self.padding_factor

    can_run = can_run_graph

    def replay(self, batch: Any, *, q: Any, k: Any, v: Any) -> Any:
        """The bucket's tables refreshed for ``batch`` and the layer over the bucket's token rows;
        the batch's rows of its output."""
        import copy

        raw_n = q.shape[0]
        n = self._bucket(raw_n)
        self._load(batch, raw_n=raw_n, n=n, q=q, k=k, v=v)
        b = self.buffers
        static = copy.copy(batch)
        static.input_ids, static.positions, static.out_cache_loc = b.input_ids[:n], b.positions[:n], b.out_cache_loc[:n]
        static.max_seq_len_override = None
        with _host_placed():
            self.runner._prepare_forward_metadata_for_replay(batch, static, self._key(n))
        # The attention break runs eagerly, over the bucket's rows, on this replay's metadata.
        return self._forward(_Captured(batch=static, metadata=None), n, full_graph=False)[:raw_n].clone()


def _host_placed() -> Any:
    """Without CUDA, the kit's placement of the code's CUDA-only allocations (``CudaAllocations``:
    a pinned host tensor, such as a bucket's table staging, an ordinary one); nothing with CUDA."""
    import contextlib

    import torch

    from .allocations import CudaAllocations

    return contextlib.nullcontext() if torch.cuda.is_available() else CudaAllocations(remap=True, guard=False)


def _bare_runner(runner_class: Any, backend: Any, **state: Any) -> Any:
    """A ``runner_class`` instance built without its constructor (which would capture or compile a
    model), holding ``state`` and a model runner whose attention backend is ``backend``: the
    runner's own metadata steps run on it."""
    from sglfix.harness.misfit import Standin

    runner = object.__new__(runner_class)
    runner.__dict__.update(model_runner=Standin(attn_backend=backend), **state)
    return runner


# -- the CPU graph runner


class CpuGraphRunner:
    """A DECODE captured and replayed as sglang's ``CPUGraphRunner`` does on a CPU device (its decode
    graphs, torch.compile off: the same metadata steps, the body run eagerly), for one layer.

    Capture, largest size first: the backend's CPU graph state for the largest size
    (``init_cpu_graph_state``), then per size a decode batch over the runner's static buffers (request
    rows 0, lengths the backend's fill value, write slot 0) and the backend's capture init
    (``init_forward_metadata_capture_cpu_graph``), the layer run over it as the capture's warm-up
    runs the model. ``on_capture(batch)`` is called after each capture init, with the batch it saw.

    Replay: the installed ``CPUGraphRunner.prepare_replay`` (a runner built without its constructor,
    which would compile a model): a captured size takes the batch itself, any other the captured
    batch of the next size padded (fill lengths, request row 0, slot 0) with the batch's rows
    copied in; both through the backend's eager ``init_forward_metadata``. The layer then runs over
    the batch it returned.
    """

    def __init__(self, *, case: Any, backend: Any, capture_bs: list[int], on_capture: Callable[[Any], None]) -> None:
        import torch

        try:
            from sglang.srt.model_executor import cpu_graph_runner as module
        except ImportError as exc:
            raise Unavailable("this release has no CPU graph runner (model_executor.cpu_graph_runner)") from exc
        self.case, self.backend, self.module = case, backend, module
        self.capture_bs = sorted(capture_bs)
        self.max_bs = self.capture_bs[-1]
        backend.init_cpu_graph_state(self.max_bs, self.max_bs)  # one token per request: decode only
        self.fill = backend.get_cpu_graph_seq_len_fill_value()
        self.on_capture = on_capture
        dev, n = case.device, self.max_bs
        self.buffers = SimpleNamespace(
            input_ids=torch.zeros((n,), dtype=torch.int64, device=dev),
            req_pool_indices=torch.zeros((n,), dtype=torch.int64, device=dev),
            seq_lens=torch.full((n,), self.fill, dtype=torch.int64, device=dev),
            out_cache_loc=torch.zeros((n,), dtype=torch.int64, device=dev),
            positions=torch.zeros((n,), dtype=torch.int64, device=dev),
            mrope_positions=torch.zeros((3, n), dtype=torch.int64, device=dev),
            q=torch.zeros((n, *case.q.shape[1:]), dtype=case.q.dtype, device=dev),
            k=torch.zeros((n, *case.k.shape[1:]), dtype=case.k.dtype, device=dev),
            v=torch.zeros((n, *case.v.shape[1:]), dtype=case.v.dtype, device=dev),
        )
        self.captured: dict[int, Any] = {}

    def capture(self) -> CpuGraphRunner:
        for bs in reversed(self.capture_bs):
            self.captured[bs] = self._capture_one(bs)
        return self

    def _capture_one(self, bs: int) -> Any:
        import inspect

        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        b = self.buffers
        batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=b.input_ids[:bs],
            req_pool_indices=b.req_pool_indices[:bs],
            seq_lens=b.seq_lens[:bs],
            out_cache_loc=b.out_cache_loc[:bs],
            seq_lens_sum=int(b.seq_lens[:bs].sum()),
            return_logprob=False,
            positions=b.positions[:bs],
            mrope_positions=b.mrope_positions[:, :bs],
            global_forward_mode=ForwardMode.DECODE,
        )
        bind_runner_slots(self.case.runner, batch)
        # The write slots joined the capture init's arguments in 0.5.23 (the CPU backend translates them
        # for its window pool); an older release takes none.
        takes_loc = (
            "out_cache_loc" in inspect.signature(type(self.backend).init_forward_metadata_capture_cpu_graph).parameters
        )
        loc = (batch.out_cache_loc,) if takes_loc else ()
        with forward_context(ForwardContext(attn_backend=self.backend)):
            self.backend.init_forward_metadata_capture_cpu_graph(
                bs, bs, batch.req_pool_indices, batch.seq_lens, *loc, None, batch.forward_mode, None
            )
        self.on_capture(batch)
        attend(backend=self.backend, layer=self.case.layer, batch=batch, q=b.q[:bs], k=b.k[:bs], v=b.v[:bs])
        return batch

    def can_run_graph(self, forward_batch: Any) -> bool:
        return forward_batch.batch_size <= self.max_bs

    can_run = can_run_graph

    def replay(self, batch: Any, *, q: Any, k: Any, v: Any) -> Any:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        b, raw_bs = self.buffers, batch.batch_size
        runner = _bare_runner(
            self.module.CPUGraphRunner,
            self.backend,
            graphs=dict.fromkeys(self.captured, True),
            graphs_cross={},
            captured_forward_batches=self.captured,
            captured_forward_batches_cross={},
            capture_bs=self.capture_bs,
            seq_len_fill_value=self.fill,
            is_encoder_decoder=False,
            mrope_positions=b.mrope_positions,
            captured_req_width=1,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        if getattr(batch, "capture_hidden_mode", None) is None:
            batch.capture_hidden_mode = CaptureHiddenMode.NULL  # what ForwardBatch.init_new sets for a plain decode
        replayed = runner.prepare_replay(batch, skip=True)
        bs = replayed.batch_size
        for name, src in (("q", q), ("k", k), ("v", v)):
            buf = getattr(b, name)
            buf[raw_bs:bs].zero_()
            buf[:raw_bs].copy_(src)
        out = attend(backend=self.backend, layer=self.case.layer, batch=replayed, q=b.q[:bs], k=b.k[:bs], v=b.v[:bs])
        return out[:raw_bs].clone()
