"""Replays ``backend: flashmla`` scenarios of one absorbed-MLA layer (DECODE, TARGET_VERIFY and
DRAFT_EXTEND_V2 through FlashMLA's decode kernel; DRAFT_DECODE, the multi-step draft, in
``sglang.flashmla_draft``, eager and CUDA graph; EXTEND through the
FlashInfer-MLA parent) through the installed sglang's own ``FlashMLABackend``, built as production
builds it (``ATTENTION_BACKENDS["flashmla"]``): its metadata code (the page tables
``create_flashmla_kv_indices_triton`` fills, the schedule ``get_mla_metadata`` makes, the graph
buffers they are copied into at capture and replay), page size 64.

Where the ``flash_mla`` package is missing (on CPU, and on a GPU without it) sglang's FlashMLA
interface imports over an inert stand-in package and ``sglfix.harness.flashmla`` stands in for its
two calls, reading what FlashMLA reads: the block table, the lengths handed to the kernel and the
schedule, whose runs decide which pages are attended. On CPU the graph state's SM count is an
H200's (132): the backend sizes its schedule buffer by it. The stand-in reads those on the host, so
a GPU records no ``torch.cuda.CUDAGraph`` over it: the graph cells capture and replay the metadata
as the runner does, and the stand-in runs over the replayed metadata, as on CPU.

The judge: the output against sglfix's reference; every init's FlashMLA metadata against its batch
(each row's block table is its request's pages up to its key length, the schedule covers those
pages and its split counts agree, the draft extend's key lengths); the EXTEND parent's as in
``sglang.flashinfer_mla_dense``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import Prepared
from sglfix.harness.adapters.sglang.flashinfer_dense import captures_draft_extend_v2
from sglfix.harness.adapters.sglang.flashinfer_mla_dense import SglangFlashInferMLAAdapter
from sglfix.harness.adapters.sglang.flashmla_module import device_answers, flashmla_module
from sglfix.harness.adapters.sglang.multistep import DraftOrDense
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import Unavailable

__all__ = ["ADAPTER", "FlashMLAAdapter", "SglangFlashMLAAdapter", "device_answers", "flashmla_module"]


class SglangFlashMLAAdapter(SglangFlashInferMLAAdapter):
    name = "flashmla"
    registry_name = "flashmla"
    backend_class = "FlashMLABackend"
    graph_modes = ("DECODE", "TARGET_VERIFY", "DRAFT_EXTEND_V2")
    reference_reads = "key lengths, each row's pages (block table, or the extend's kv_indices), the split schedule"
    metadata_fields = MetadataFields(
        indptr=("qo_indptr",),
        lengths=("kv_len",),
        block_tables={"block_kv_indices": ("kv_len", "page_size")},
    )

    def make_backend(self, prepared: Prepared) -> Any:
        module = flashmla_module()
        backend = super().make_backend(prepared)
        backend._sglfix_standin = module._sglfix_standin
        return backend

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        if (
            scenario.capture_bs
            and scenario.mode == "DRAFT_EXTEND_V2"
            and not captures_draft_extend_v2(backend, "init_forward_metadata_out_graph")
        ):
            raise Unavailable("this release's FlashMLABackend does not capture DRAFT_EXTEND_V2 in CUDA graphs")
        with device_answers():
            return super().capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)

    def records_graph(self, backend: Any) -> bool:
        # The stand-in reads lengths and the schedule on the host, which a CUDA graph cannot
        # record: on a GPU without flash_mla the graph cells capture and replay the metadata as
        # the runner does and run the stand-in over it, as on CPU.
        return not backend._sglfix_standin

    def graph_state(self, graphs: Any) -> tuple[str, ...]:
        return (
            "cuda_graph_kv_indices",
            "cuda_graph_mla_metadata",
            "cuda_graph_num_splits",
            "cuda_graph_draft_extend_seq_lens_k",
        )

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        metadata = backend.forward_metadata
        if not hasattr(metadata, "block_kv_indices"):
            return super().metadata_views(backend, forward_batch)  # EXTEND: the FlashInfer-MLA parent's
        view, report = _flashmla_view(backend, metadata, forward_batch)
        backend.__dict__.setdefault("_sglfix_schedule", []).append(report)
        return [("flashmla", view, int(forward_batch.batch_size))]


def _host(t: Any) -> list[int] | None:
    import torch

    return t.reshape(-1).to("cpu", torch.int64).tolist() if isinstance(t, torch.Tensor) else None


def _kernel_lens(backend: Any, metadata: Any, batch: Any) -> list[int] | None:
    """The key lengths the forward hands the kernel for this batch (None: it hands none)."""
    bs, mode = int(batch.batch_size), batch.forward_mode
    if mode.is_draft_extend_v2():
        lens = _host(metadata.seq_lens_k)
        return None if lens is None else lens[:bs]
    extra = int(backend.num_draft_tokens) if mode.is_target_verify() else 0
    return [s + extra for s in (_host(batch.seq_lens) or [])[:bs]]


def _want_lens(backend: Any, batch: Any) -> list[int]:
    """The key lengths the batch implies: decode reads seq_lens keys, verify seq_lens +
    num_draft_tokens, a draft extend its window-aligned length (a graph runner's view hands it
    already in seq_lens)."""
    bs, mode = int(batch.batch_size), batch.forward_mode
    seq = (_host(batch.seq_lens) or [])[:bs]
    ndt = int(backend.num_draft_tokens or 0)
    if mode.is_target_verify():
        return [s + ndt for s in seq]
    ext = _host(getattr(batch, "extend_seq_lens", None)) if mode.is_draft_extend_v2() else None
    if ext is not None:
        return [s - e + ndt for s, e in zip(seq, ext[:bs])]
    return seq


def _flashmla_view(backend: Any, metadata: Any, batch: Any) -> tuple[Any, str]:
    """What FlashMLA's kernel reads of this init (the block table up to each row's key length,
    the lengths, the schedule) and '' when it is the batch's, else what differs first."""
    import torch

    from sglfix.harness import flashmla

    page = flashmla.PAGE
    bs = int(batch.batch_size)
    kv_len = _kernel_lens(backend, metadata, batch)
    want_len = _want_lens(backend, batch)
    table, meta, splits = metadata.block_kv_indices, metadata.flashmla_metadata, _host(metadata.num_splits)
    report = ""
    if kv_len is None or len(kv_len) < bs:
        report = f"the kernel is handed {None if kv_len is None else len(kv_len)} key length(s) for {bs} rows"
    elif kv_len != want_len:
        report = f"the kernel is handed key lengths {kv_len}, the batch's are {want_len}"
    kv_len = (kv_len or [])[:bs]
    need = [(max(n, 0) + page - 1) // page for n in kv_len]
    read = torch.full((bs, max(need, default=0)), -1, dtype=torch.int64)
    host = table.to("cpu", torch.int64) if isinstance(table, torch.Tensor) and table.dim() == 2 else None
    if not report and (host is None or host.shape[0] < bs or host.shape[1] < max(need, default=0)):
        shape = None if host is None else tuple(host.shape)
        report = f"the block table {shape} is smaller than {bs} rows x {max(need, default=0)} pages"
    if not report:
        rows = (_host(batch.req_pool_indices) or [])[:bs]
        slots = backend._sglfix_req_to_token.to("cpu", torch.int64)
        for r in range(bs):
            read[r, : need[r]] = host[r, : need[r]]
            want = [int(slots[rows[r], p * page]) // page for p in range(need[r])]
            got = read[r, : need[r]].tolist()
            if got != want:
                i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
                report = f"row {r}'s block table names page {got[i]} as its page {i}, its request's is {want[i]}"
                break
    if not report and getattr(backend, "_sglfix_standin", False):
        # The schedule in the stand-in's form (FlashMLA's own is opaque): every page each row
        # reads is in one of its runs, and num_splits counts the runs.
        if not (isinstance(meta, torch.Tensor) and meta.dim() == 2 and meta.shape[1] >= 4) or splits is None:
            report = "the schedule (flashmla_metadata [parts, 8] and num_splits [bs + 1]) is missing or malformed"
        else:
            ranges, touches = flashmla.covered_pages(meta, bs)
            for r in range(bs):
                missing = [p for p in range(need[r]) if not flashmla.in_ranges(ranges[r], p)]
                if missing:
                    report = f"the schedule leaves row {r}'s page(s) {missing[:3]} of {need[r]} unattended"
                    break
                if len(splits) < r + 2 or splits[r + 1] - splits[r] != touches[r]:
                    given = splits[r + 1] - splits[r] if len(splits) > r + 1 else None
                    report = f"num_splits gives row {r} {given} split(s), the schedule {touches[r]}"
                    break
                if splits[r] != sum(touches[:r]):
                    report = f"num_splits starts row {r}'s partial results at {splits[r]}, the runs before it are {sum(touches[:r])}"
                    break
    view = SimpleNamespace(
        block_kv_indices=read,
        kv_len=torch.tensor(kv_len, dtype=torch.int64),
        page_size=page,
        flashmla_metadata=meta if isinstance(meta, torch.Tensor) else None,
        num_splits=None if splits is None else torch.tensor(splits[: bs + 1], dtype=torch.int64),
    )
    return view, report


class FlashMLAAdapter(DraftOrDense):
    """``backend: flashmla`` on real sglang: the multi-step draft (DRAFT_DECODE) through
    ``sglang.flashmla_draft``, every other mode through one layer of ``FlashMLABackend`` (above)."""

    name = "flashmla"
    metadata_fields = MetadataFields(
        indptr=("qo_indptr", "kv_indptr"),
        lengths=("kv_len",),
        indices={"kv_indices": "kv_indptr"},
        block_tables={"block_kv_indices": ("kv_len", "page_size")},
    )

    def __init__(self) -> None:
        from sglfix.harness.adapters.sglang.flashmla_draft import FlashMLADraftAdapter

        self.draft, self.dense = FlashMLADraftAdapter(), SglangFlashMLAAdapter()


ADAPTER = FlashMLAAdapter()
