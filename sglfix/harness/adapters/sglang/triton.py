"""Replays ``backend: triton`` scenarios through the installed sglang's own ``TritonAttnBackend``.

The code under test is sglang's: the backend (built through ``ATTENTION_BACKENDS``), its memory
pools, ``ForwardBatch``, spec-info classes (``EagleVerifyInput``, ``EagleDraftExtendInput``), the
spec-v2 draft-extend glue (``eagle_worker_common.prepare_for_draft_extend``, which bumps
``seq_lens`` before the metadata init) and the kit's ModelRunner stand-in and fixtures (through
``sglfix.harness.kits``, the one door to sglang's private test kit). The judge is sglfix's: the ground
truth is generated here from seeded random K/V, the reference never reads backend metadata,
invariants run after every metadata init and guard zones surround the backend's static buffers.
The scenario becomes engine objects in ``sglang.case`` (the glue's part in ``sglang.glue``), the
ground truth and reference are ``sglang.truth``'s, the guard zones and the metadata hook
``sglang.guards``'; this module is the adapter over them.

Modes: DECODE, EXTEND, TARGET_VERIFY (a seeded draft tree as the custom mask) and
DRAFT_EXTEND_V2, built by the kit fixture (``builder: kit``) or by the production glue from the
pre-step scheduler state (``builder: glue``). ``gpu_only`` leaves the CPU mirrors None, as the
spec-v2 overlap path does. Graph scenarios (``capture_bs``) go through the kit's ``GraphRunner``
(``kit("graphs")``, this version's graph runners): the backend's ``init_cuda_graph_state``, its
capture metadata at every captured size, then a replay padded the way sglang's graph runners pad (padded rows: ``seq_lens`` = the backend's fill value,
request row 0, write slot 0, draft-extend window = ``num_draft_tokens``). On CUDA the forward is
a captured ``torch.cuda.CUDAGraph``; on CPU the same capture/replay metadata code runs and the
forward runs eagerly on the same static buffers (Triton kernels under the interpreter). An EXTEND
graph (a backend that captures one: FlashInfer) goes through the kit's ``PrefillGraphRunner``, the
prefill runner under its full backend: ``capture_bs`` are its token buckets, ``full_prefill_max_req``
its request slots.

Every process that imports this sets ``TRITON_INTERPRET=1`` on CPU before triton is imported and
activates the profile's code base (``sglfix.codebases.activate``) before sglang is imported (the
worker does); which sglang version, and so which kit, is the active record's.
"""

from __future__ import annotations

from typing import Any

from sglfix.harness.adapters.base import AdapterBase, MetadataHook, Prepared
from sglfix.harness.adapters.sglang.case import build_case
from sglfix.harness.adapters.sglang.decode_plan import DecodePlanTruth, Rail, decode_plan_findings, judge_decode
from sglfix.harness.adapters.sglang.glue import run_glue
from sglfix.harness.adapters.sglang.guards import (
    PERSISTENT,
    guard_buffers,
    guard_verify_mask,
    guarded,
    watch_metadata,
)
from sglfix.harness.adapters.sglang.multistep import DraftOrDense
from sglfix.harness.adapters.sglang.truth import reference
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.kits import kit as _kit
from sglfix.harness.unavailable import Unavailable

__all__ = ["ADAPTER", "SglangTritonAdapter", "TritonAdapter"]


class SglangTritonAdapter(AdapterBase):
    name = "triton"
    # The backend's ATTENTION_BACKENDS name, its buffers that persist between metadata inits and
    # its CUDA-graph state (``init_cuda_graph_state``), guarded before anything points into them.
    registry_name = "triton"
    persistent: tuple[str, ...] = PERSISTENT
    metadata_fields = MetadataFields(
        indptr=("kv_indptr", "qo_indptr", "mask_indptr", "window_kv_indptr"),
        lengths=("max_extend_len",),
        indices={"kv_indices": "kv_indptr", "window_kv_indices": "window_kv_indptr"},
        # The split-K decode's partial results: stage 1 writes them, stage 2 reads them back.
        scratch=("attn_logits", "attn_lse", "swa_attn_logits"),
        read_to={"custom_mask": "mask_indptr"},
        # The split-K decode's split counts (and the partials' split capacity), the extend
        # kernel's grid bound over query blocks: how the work is cut, not what is computed.
        schedule=("num_kv_splits", "window_num_kv_splits", "attn_lse", "max_extend_len"),
    )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        case = build_case(scenario=scenario, device=device)
        return Prepared(case=case, num_slots=case.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        """sglang's TritonAttnBackend, built as the kit builds it (``ATTENTION_BACKENDS``), its
        persistent indptr buffers guarded; the runner's ``attn_backend`` for the glue."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        runner = prepared.case.runner
        backend = ATTENTION_BACKENDS[self.registry_name](runner)
        guard_buffers(backend, self.persistent)
        runner.attn_backend = backend
        _record_lean_requests(backend, prepared.case.lean_asked)
        # The request rows as written, before any init, for the decode tables' judge: the full
        # rail (a window layer's rail is judged through its output).
        backend._sglfix_decode_truth = DecodePlanTruth(
            rows=runner.req_to_token_pool.req_to_token.to("cpu").tolist(), window=None
        )
        return backend

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        """The graph runner, captured at the scenario's sizes (None when eager). The judge's hook
        is attached here, the first call that receives it, before any metadata init."""
        watch_metadata(backend, on_metadata)
        if not scenario.capture_bs:
            return None
        if scenario.mode == "DLLM_EXTEND" and not hasattr(backend, "_update_dllm_buffers"):
            raise Unavailable(
                "this release's TritonAttnBackend builds no DLLM_EXTEND graph metadata (_update_dllm_buffers)"
            )
        graphs = _kit("graphs")

        def guard(b: Any) -> None:
            self.guard_graph_state(b, graphs)
            guard_verify_mask(b)

        if scenario.mode == "EXTEND":
            # The prefill runner under the full backend: capture_bs are its token buckets.
            return graphs.PrefillGraphRunner(
                case=prepared.case,
                backend=backend,
                capture_tokens=list(scenario.capture_bs),
                req_slots=scenario.full_prefill_max_req,
                guard=guard,
                record=self.records_graph(backend),
            ).capture()
        return graphs.GraphRunner(
            case=prepared.case,
            backend=backend,
            capture_bs=list(scenario.capture_bs),
            guard=guard,
            record=self.records_graph(backend),
        ).capture()

    def records_graph(self, backend: Any) -> bool:
        """Whether a CUDA device records the layer into a CUDA graph (its kernels can be recorded)."""
        return True

    def guard_graph_state(self, backend: Any, graphs: Any) -> None:
        """Guard zones after the backend's CUDA-graph state, right after ``init_cuda_graph_state``."""
        guard_buffers(backend, self.graph_state(graphs))

    def graph_state(self, graphs: Any) -> tuple[str, ...]:
        return tuple(graphs.GRAPH_STATE)

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        case = prepared.case
        batch = case.forward_batch
        if case.glue is not None:
            # The glue runs the eager metadata init itself unless the graph runner takes the batch.
            batch = case.forward_batch = run_glue(case=case, backend=backend, graph_runner=runner)
        elif runner is None:
            _kit("attention").init_then_join(backend, batch, None, lambda: backend.init_forward_metadata(batch))
        if runner is not None:
            if not runner.can_run_graph(batch):
                raise Unavailable(f"no captured size fits a batch of {batch.batch_size}")
            return runner.replay(batch, q=case.q, k=case.k, v=case.v)
        return _kit("graphs").attend(backend=backend, layer=case.layer, batch=batch, q=case.q, k=case.k, v=case.v)

    def static_buffers(self, backend: Any) -> list:
        return guarded(backend)

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        metadata = backend.forward_metadata
        if metadata is not None:
            judge_decode(
                backend, forward_batch, [Rail("kv_indptr/kv_indices", metadata.kv_indptr, metadata.kv_indices)]
            )
            backend.__dict__.setdefault("_sglfix_invariance", []).extend(
                batch_invariance_findings(backend, forward_batch, metadata)
            )
        return [("", metadata, int(forward_batch.batch_size))]

    def judges_batch_invariance(self, scenario: Any) -> bool:
        """Its decode's splits are judged against each request's alone (``batch_invariance_findings``);
        its other modes' schedule fields (the extend grid bound) decide no request's reduction order."""
        return True

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        invariance = [("INVARIANT", m) for m in dict.fromkeys(getattr(backend, "_sglfix_invariance", ()))]
        return decode_plan_findings(backend) + _glue_findings(prepared.case) + invariance

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        return reference(prepared.case.truth)

    def unread_fields(self, prepared: Prepared, backend: Any) -> dict[str, str]:
        """The ForwardMetadata fields only some layers or devices read, where this cell has none
        of them: its one layer, its decode launches, its device."""
        import torch

        layer = prepared.case.layer
        out: dict[str, str] = {}
        window = getattr(layer, "sliding_window_size", None)
        if window is None or window <= -1:
            out.update(dict.fromkeys(_WINDOW_FIELDS, "read by sliding-window layers only; this layer has no window"))
        swa_v = getattr(backend, "swa_v_head_dim", None)
        if swa_v is None or getattr(layer, "v_head_dim", None) != swa_v:
            out["swa_attn_logits"] = "read by window layers whose value width differs from the full layers' only"
        if not any(prepared.case.lean_asked):
            out.update(
                dict.fromkeys(_LEAN_FIELDS, "read by the Lean decode kernel only; no launch of this cell asked for it")
            )
        if getattr(torch.version, "hip", None) is None:
            out["uneven_batch"] = "read by the decode kernels' batch rotation, which ROCm builds only"
        return out


def batch_invariance_findings(backend: Any, forward_batch: Any, metadata: Any) -> list[str]:
    """Under deterministic inference, a decode's split of each request's KV (its reduction order)
    must be the one it gets alone, whatever the batch: each request's split counts, full and
    window, against the backend's own ``get_num_kv_splits`` over that request alone. (Sharded KV,
    decode context parallelism, splits other lengths: not judged here.)"""
    import torch

    mode = forward_batch.forward_mode
    if (
        not getattr(backend, "enable_deterministic", False)
        or not mode.is_decode()
        or getattr(backend, "dcp_size", 1) > 1
    ):
        return []
    bs = int(forward_batch.batch_size)
    pairs = [("num_kv_splits", metadata.num_kv_splits, forward_batch.seq_lens[:bs])]
    window_ptr, window_splits = (
        getattr(metadata, "window_kv_indptr", None),
        getattr(metadata, "window_num_kv_splits", None),
    )
    if window_ptr is not None and window_splits is not None:
        pairs.append(("window_num_kv_splits", window_splits, window_ptr[1 : bs + 1] - window_ptr[:bs]))
    found = []
    for name, splits, lens in pairs:
        if splits is None or splits.shape[0] < bs:
            continue
        for i in range(bs):
            alone = torch.empty((1,), dtype=splits.dtype, device=splits.device)
            backend.get_num_kv_splits(alone, lens[i : i + 1])
            batched, own = int(splits[i]), int(alone[0])
            if batched != own:
                found.append(
                    f"deterministic inference: request {i}'s {name} is {batched} in this batch of {bs} and {own} "
                    "alone: the batch changes its reduction order"
                )
                break
    return found


# ForwardMetadata fields of the window layers, and of the Lean (persistent-grid) decode kernel.
_WINDOW_FIELDS = (
    "window_kv_indptr",
    "window_kv_indices",
    "window_num_kv_splits",
    "window_kv_offsets",
    "aligned_window_kv_indptr",
    "aligned_window_kv_indices",
)
_LEAN_FIELDS = ("lean_Mp", "lean_Lp", "lean_Op", "lean_locks")


def _record_lean_requests(backend: Any, asked: list[bool]) -> None:
    """Note, per decode-kernel launch of ``backend``, whether it asked for the Lean kernel
    (``enable_lean``); the launch itself is the backend's own, unchanged. A CUDA graph records
    the launches its capture made, so capture is where a replayed graph's choice is seen."""
    launch = getattr(backend, "decode_attention_fwd", None)
    if launch is None:
        return

    def decode_attention_fwd(*args: Any, **kwargs: Any) -> Any:
        asked.append(bool(kwargs.get("enable_lean")))
        return launch(*args, **kwargs)

    backend.decode_attention_fwd = decode_attention_fwd


class TritonAdapter(DraftOrDense):
    """``backend: triton`` on real sglang: the multi-step draft (DRAFT_DECODE) through
    ``sglang.triton_draft``, decode context parallelism (``dcp_size`` > 1) through
    ``sglang.triton_dcp``, every other mode through one layer of ``TritonAttnBackend`` (the adapter
    above). Each call goes to the adapter that built the cell."""

    name = "triton"
    metadata_fields = SglangTritonAdapter.metadata_fields

    def __init__(self) -> None:
        from sglfix.harness.adapters.sglang.triton_dcp import TritonDCPAdapter
        from sglfix.harness.adapters.sglang.triton_draft import TritonDraftAdapter

        self.draft, self.dense = TritonDraftAdapter(), SglangTritonAdapter()
        self.dcp = TritonDCPAdapter(self.metadata_fields)

    def _by_case(self, prepared: Prepared) -> Any:
        from sglfix.harness.adapters.sglang.triton_dcp import DcpCase

        return self.dcp if isinstance(prepared.case, DcpCase) else super()._by_case(prepared)

    def _by_backend(self, backend: Any) -> Any:
        return self.dcp if hasattr(backend, "_sglfix_rank") else super()._by_backend(backend)

    def _for_scenario(self, scenario: Any) -> Any:
        return self.dcp if scenario.dcp_size > 1 else super()._for_scenario(scenario)


ADAPTER = TritonAdapter()


def _glue_findings(case: Any) -> list[tuple[str, str]]:
    """What the draft-extend glue hands the draft model besides attention metadata: an EAGLE draft
    reads the hidden state of every window row it extends (the next round gathers the accepted
    rows' states), so the glue's forward batch captures them all (FULL); a standalone draft model
    keeps none."""
    batch = getattr(case, "forward_batch", None)
    if case.glue is None or batch is None:
        return []
    captured = getattr(batch, "capture_hidden_mode", None)
    if captured is None:
        return [
            ("INVARIANT", "the draft-extend glue's forward batch captures no hidden states (capture_hidden_mode None)")
        ]
    mode = getattr(captured, "name", str(captured))
    if mode != "FULL":
        return [
            (
                "INVARIANT",
                f"the draft-extend glue captures the {mode} hidden states of its {batch.batch_size} request(s); "
                "an EAGLE draft reads every window row's (FULL)",
            )
        ]
    return []
