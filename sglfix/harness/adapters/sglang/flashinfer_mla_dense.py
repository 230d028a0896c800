"""Replays ``backend: flashinfer_mla`` scenarios of one absorbed-MLA layer (DECODE, EXTEND,
TARGET_VERIFY, DRAFT_EXTEND_V2; eager, and CUDA graph for DECODE and TARGET_VERIFY, the modes the
backend captures) through the installed sglang's own ``FlashInferMLAAttnBackend``, built as
production builds it for an MLA model (``ATTENTION_BACKENDS["flashinfer"]``): its
``init_forward_metadata*`` code, both indices updaters, the EAGLE verify / draft-extend input
builders they call (``generate_attn_arg_prefill``), its graph wrappers and sglang's sync-free
re-plans (``fast_mla_decode_plan``, ``fast_mla_prefill_plan``).

Everything but the backend is the dense adapters' (``sglang.flashinfer_dense`` over
``sglang.triton``): the case (the kit's MLA runner and ``MLATokenToKVPool``, ``sglang.case``), the
ground truth (one latent KV head: key = latent + rope, value = latent), the kit's graph runners,
the judge's hooks. Where FlashInfer can run its ``BatchMLAPagedAttentionWrapper`` plans and runs;
elsewhere ``sglfix.harness.torchfi.mla`` stands in for it, reading what FlashInfer's reads: the
host schedule of the last plan (``qo_indptr``, ``kv_indptr``, ``kv_len_arr``) and the device
``kv_indices`` at run time.

The kit's MLA runner publishes ``flashinfer_mla_disable_ragged``, as the kit's own MLA tests run:
every extend takes the paged MLA kernel (the ragged MHA prefill needs the model's decompressed
per-head K/V, which an absorbed layer does not have).

What the judge reads as metadata is what the kernel reads: the schedule of every plan a wrapper
receives is recorded (sglang's fast re-plans hand it from host arrays that no device buffer holds;
the kernel never reads the wrapper's device indptr buffers) with the wrapper's own ``kv_indices``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import Prepared
from sglfix.harness.adapters.sglang.flashinfer_dense import SglangFlashInferAdapter
from sglfix.harness.adapters.sglang.guards import guard_buffers
from sglfix.harness.adapters.sglang.mla_mha import mha_prepare, mha_run
from sglfix.harness.adapters.sglang.reports import init_reports
from sglfix.harness.adapters.sglang.triton import SglangTritonAdapter
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import Unavailable

__all__ = ["SglangFlashInferMLAAdapter", "flashinfer_mla_module"]

_MODULE = "sglang.srt.layers.attention.flashinfer_mla_backend"
# The backend's indptr buffers, shared with its indices updaters and its chunk runner (which keep
# their own names).
_SHARED = {
    "indices_updater_decode": (("kv_indptr", "kv_indptr"), ("q_indptr", "q_indptr_decode")),
    "indices_updater_prefill": (("kv_indptr", "kv_indptr"), ("qo_indptr", "qo_indptr")),
    # The MHA prefill's chunk runner (where the chunked prefix cache is on).
    "mha_chunk_kv_cache": (("kv_indptr", "kv_indptr"), ("qo_indptr", "qo_indptr")),
}


def flashinfer_mla_module() -> Any:
    """sglang's FlashInfer-MLA backend module, on the torch stand-ins where FlashInfer is missing,
    its paged MLA wrappers recording their plans (``_observed_wrappers``)."""
    import importlib

    from sglfix.harness import torchfi

    module = importlib.import_module(_MODULE)
    torchfi.install_mla(module)
    _observed_wrappers(module)
    return module


def _observed_wrappers(module: Any) -> None:
    """Bind, once per process, a subclass of the module's ``BatchMLAPagedAttentionWrapper`` whose
    instances record every plan from construction on: the backend makes its graph wrappers inside
    the capture's metadata init and plans them there."""
    cls = module.BatchMLAPagedAttentionWrapper
    if getattr(cls, "_sglfix_observed", False):
        return

    class BatchMLAPagedAttentionWrapper(cls):  # type: ignore[misc, valid-type]
        _sglfix_observed = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # What the constructor refuses is its caller's, as FlashInfer's own refusals are.
            __sglfix_passthrough__ = True  # noqa: F841
            super().__init__(*args, **kwargs)
            _observe_plan(self)

    module.BatchMLAPagedAttentionWrapper = BatchMLAPagedAttentionWrapper


class SglangFlashInferMLAAdapter(SglangFlashInferAdapter):
    name = "flashinfer_mla"
    registry_name = "flashinfer"
    persistent = ("kv_indptr", "qo_indptr", "q_indptr_decode")
    # The kernel reads each row's keys as (start, length), not as a CSR: the invariant table takes
    # the query offsets, the schedule reference below every row's read.
    metadata_fields = MetadataFields(indptr=("qo_indptr",), lengths=("kv_len",))

    def build(self, scenario: Any, *, device: str) -> Prepared:
        if not scenario.model.mla:
            raise Unavailable("the sglang flashinfer_mla adapter runs MLA layers (model.kv_lora_rank)")
        prepared = super().build(scenario, device=device)
        if scenario.model.mha_chunk is not None:
            mha_prepare(prepared.case, seed=scenario.seed)
        return prepared

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: Any) -> Any:
        if scenario.model.mha_chunk is None:
            return super().run(prepared, backend, runner, scenario=scenario, on_metadata=on_metadata)
        # The model's multi-head prefill over the metadata the runner initialised, as production
        # runs it (eagerly: a captured prefill pins the absorbed path).
        case = prepared.case
        with self._placed():
            backend.init_forward_metadata(case.forward_batch)
            return mha_run(case, backend, case.forward_batch)

    # The class sglang must build for this adapter's scenarios, and the modes its graphs capture.
    backend_class = "FlashInferMLAAttnBackend"
    # What the schedule reference compares, in the cell's words.
    reference_reads = "query rows, key lengths, each row's kv_indices"
    graph_modes: tuple[str, ...] = ("DECODE", "TARGET_VERIFY")

    def make_backend(self, prepared: Prepared) -> Any:
        flashinfer_mla_module()
        with self._placed():
            backend = SglangTritonAdapter.make_backend(self, prepared)
        # The slot ground truth the schedule reference reads (the runner's, whatever the backend keeps).
        backend._sglfix_req_to_token = prepared.case.runner.req_to_token_pool.req_to_token
        if type(backend).__name__ != self.backend_class:
            raise Unavailable(f"sglang built {type(backend).__name__} for an MLA model, not {self.backend_class}")
        # The updaters took the backend's indptr buffers at construction: hand them the guarded ones.
        for updater, names in _SHARED.items():
            owner = getattr(backend, updater, None)
            for theirs, ours in names:
                if owner is not None and hasattr(owner, theirs):
                    setattr(owner, theirs, getattr(backend, ours))
        return backend

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        if scenario.capture_bs and scenario.mode not in self.graph_modes:
            raise Unavailable(f"{self.backend_class} captures {' and '.join(self.graph_modes)}, not {scenario.mode}")
        runner = super().capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)
        if runner is not None:
            # Replays re-plan the captured wrappers through sglang's fast plans, installed at capture
            # (the full-attention child's, under a hybrid).
            full = getattr(backend, "_sglfix_full", backend)
            for table in (full.decode_cuda_graph_metadata, full.prefill_cuda_graph_metadata):
                for wrapper in table.values():
                    _observe_plan(wrapper)
        return runner

    def guard_graph_state(self, backend: Any, graphs: Any) -> None:
        guard_buffers(backend, self.graph_state(graphs))
        # init_cuda_graph_state handed its kv_indices to the fast decode plan's arguments too.
        kwargs = getattr(backend, "fast_decode_kwargs", None)
        if isinstance(kwargs, dict) and "kv_indices" in kwargs:
            kwargs["kv_indices"] = backend.cuda_graph_kv_indices

    def graph_state(self, graphs: Any) -> tuple[str, ...]:
        return ("cuda_graph_kv_indices", "cuda_graph_qo_indptr", "cuda_graph_kv_indptr", "cuda_graph_kv_lens")

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        """The live wrapper as its kernel reads it (``_planned``), judged against the batch of this
        init as it is built (``_schedule_reference``)."""
        metadata = backend.forward_metadata
        wrapper = getattr(metadata, "decode_wrapper", None) or getattr(metadata, "prefill_wrapper", None)
        planned = None if wrapper is None else _planned(wrapper)
        if planned is None:
            return []
        kind = "decode" if hasattr(metadata, "decode_wrapper") else "prefill"
        reports = backend.__dict__.setdefault("_sglfix_schedule", [])
        reports.append(_schedule_reference(planned, forward_batch, backend._sglfix_req_to_token))
        return [(f"{kind} wrapper", planned, int(forward_batch.batch_size))]

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        """Every init's schedule against its batch: capture (whose metadata replay rebuilds, and
        which the captured run computed with), replay and eager alike."""
        return init_reports(
            backend,
            "_sglfix_schedule",
            what="",
            passed=lambda n: (
                f"metadata reference: the MLA schedule of {n} metadata init(s) ({self.reference_reads}) is its batch's"
            ),
        )


def _observe_plan(wrapper: Any) -> None:
    """Record every plan of ``wrapper`` (positional, as sglang's calls and fast plans pass it:
    qo_indptr, kv_indptr, kv_indices, kv_len_arr, ...), then plan unchanged."""
    original = wrapper.plan

    def plan(qo_indptr: Any, kv_indptr: Any, kv_indices: Any, kv_len_arr: Any, *args: Any, **kwargs: Any) -> Any:
        # What fails from here on is the planning code's, which this only watches (sglfix.harness.misfit).
        __sglfix_passthrough__ = True  # noqa: F841
        wrapper._sglfix_plan = SimpleNamespace(
            qo_indptr=qo_indptr.clone(), kv_indptr=kv_indptr.clone(), kv_len=kv_len_arr.clone()
        )
        return original(qo_indptr, kv_indptr, kv_indices, kv_len_arr, *args, **kwargs)

    wrapper.plan = plan


def _planned(wrapper: Any) -> Any:
    """What FlashInfer's MLA kernel reads: the schedule of the last plan (host offsets and lengths;
    its device indptr buffers are never read) and the wrapper's own ``kv_indices`` buffer (a graph
    wrapper's is the one bound at capture, whatever a fast re-plan is handed)."""
    import torch

    plan = getattr(wrapper, "_sglfix_plan", None)
    if plan is None:
        return None
    indices = getattr(wrapper, "_kv_indices_buf", None)
    # Rows the kernel can read whole (a plan whose arrays disagree in length is the reference's to name).
    rows = min(len(plan.kv_len), len(plan.kv_indptr))
    starts = plan.kv_indptr[:rows].to("cpu", torch.int64)
    ends = starts + plan.kv_len[:rows].to("cpu", torch.int64)
    read = max(int(ends.max()), 0) if rows else 0
    # Only the entries some row reads: what lies past them (an allocation's slack, a graph
    # buffer's stale tail) is never read.
    return SimpleNamespace(
        qo_indptr=plan.qo_indptr,
        kv_starts=starts,
        kv_len=plan.kv_len,
        kv_indices=None if indices is None else indices.reshape(-1)[:read],
    )


def _schedule_reference(planned: Any, batch: Any, req_to_token: Any) -> str:
    """'' when the schedule is the batch's, else what differs first: each row ``r`` reads
    ``q_len(r)`` query rows and the first ``kv_len(r)`` slots of its ``req_to_token`` row from
    where sglang's index builders packed them (after the rows before it), where
    decode reads one query over ``seq_lens``, verify ``draft_token_num`` queries over ``seq_lens +
    draft_token_num``, and an extend its new tokens over ``seq_lens``."""
    import torch

    bs = int(batch.batch_size)
    mode, spec = batch.forward_mode, batch.spec_info
    seq = batch.seq_lens[:bs].to("cpu", torch.int64).tolist()
    rows = batch.req_pool_indices[:bs].to("cpu", torch.int64).tolist()
    if mode.is_decode_or_idle():
        q_len, kv_len = [1] * bs, seq
    elif mode.is_target_verify():
        ndt = int(spec.draft_token_num)
        q_len, kv_len = [ndt] * bs, [s + ndt for s in seq]
    else:
        ext = batch.extend_seq_lens
        q_len = [int(spec.num_tokens_per_req)] * bs if ext is None else ext[:bs].to("cpu", torch.int64).tolist()
        kv_len = seq
    qo = planned.qo_indptr.to("cpu", torch.int64).tolist()
    got_len = planned.kv_len.to("cpu", torch.int64).tolist()
    starts = planned.kv_starts.tolist()
    if min(len(got_len), len(starts), len(qo) - 1) < bs:
        return (
            f"the plan schedules {len(got_len)} key length(s), {len(starts)} key offset(s) and "
            f"{max(len(qo) - 1, 0)} query row(s) for a batch of {bs}"
        )
    for r in range(bs):
        if qo[r + 1] - qo[r] != q_len[r]:
            return f"row {r} is planned {qo[r + 1] - qo[r]} query row(s), its batch has {q_len[r]} (qo_indptr {qo[: bs + 1]})"
        if got_len[r] != kv_len[r]:
            return f"row {r} is planned {got_len[r]} key(s), its batch {kv_len[r]} (kv_len {got_len[:bs]})"
        # sglang's index builders pack the rows' keys one after the other from entry 0.
        if starts[r] != sum(got_len[:r]):
            return (
                f"row {r}'s keys are planned from kv_indices entry {starts[r]}, the index builder packs them "
                f"from entry {sum(got_len[:r])} (kv_indptr {starts[:bs]})"
            )
    indices = planned.kv_indices.to("cpu", torch.int64) if planned.kv_indices is not None else None
    table = req_to_token.to("cpu", torch.int64)
    for r in range(bs):
        want = table[rows[r], : kv_len[r]].tolist()
        got = [] if indices is None else indices[starts[r] : starts[r] + kv_len[r]].tolist()
        if got != want:
            i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            return (
                f"row {r} reads slot {got[i] if i < len(got) else None} as key {i}, its req_to_token row "
                f"{rows[r]} holds {want[i] if i < len(want) else None} there"
            )
    return ""
