"""Replays ``backend: flashinfer`` scenarios of one attention layer (DECODE, EXTEND with prefixes,
TARGET_VERIFY, DRAFT_EXTEND_V2; eager and CUDA graph) through the installed sglang's own
``FlashInferAttnBackend``: its ``init_forward_metadata*`` code, its indices updaters, the EAGLE
verify / draft-extend input builders (``generate_attn_arg_prefill``) they call, its graph wrappers
and sglang's sync-free re-plans (``fast_prefill_plan``, FlashInfer's ``fast_decode_plan``). An
encoder-decoder batch (``batch.encoder_lens``; DECODE and EXTEND) takes the updaters'
``update_cross_attention``: the self layer's wrapper from each row's encoder end, the cross layer's
(``model.cross_attention``) over the encoder.

Everything but the backend is the Triton adapter's (``sglang.triton``): the case, the ground truth,
the kit's graph runners, the judge's hooks. Where FlashInfer can run (CUDA with the package) its
own wrappers plan and run; elsewhere ``sglfix.harness.torchfi`` binds torch stand-ins to the names
the backend module imports from FlashInfer, so the same metadata code runs and its plans feed a
kernel that reads what FlashInfer's reads (the device buffers at run time, the packed custom
mask, raw ``kv_indices`` memory). The backend's ``device="cuda"`` allocations are placed on the
CPU there.

An EXTEND graph runs as sglang's prefill runner under its full backend (the kit's
``PrefillGraphRunner``): the backend's full-graph prefill wrappers (``_create_full_cg_prefill_wrappers``,
its workspace sized by the SM count ``torch.cuda.get_device_properties`` answers for an H200 without
CUDA), planned paged only at each bucket's capture and over the runner's slot-padded view at replay.

The judge sees the metadata as the kernel does: every wrapper of the live metadata, its planned
``qo_indptr`` / ``kv_indptr`` / ``kv_indices`` / ``mask_indptr`` (``metadata_views``), and guard
zones after the backend's indptr buffers and its CUDA-graph state (the full-graph prefill wrappers'
buffers as soon as the backend makes them: ``guard_full_cg_prefill``).

A multi-item scoring batch (``batch.items``, ``--enable-mis``; EXTEND, eager) runs the backend's
``_process_multi_item_scoring``: its item mask (``prefix_len_ptr``, ``token_pos_in_items_ptr`` and
its stride) reaches the kernel through the paged wrapper's plan and is judged in the output. What
the output cannot show is judged after each init against the items alone (``multi_item_reference``):
the positions the backend rewrites in the batch (each item's tokens as if it alone followed the
query; the query's unchanged), and the plan's ``max_item_len_ptr`` (the kernel skips KV tiles by it:
below a request's longest item it may skip keys an item token sees, on the GPU's tile schedule).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import MetadataHook, Prepared, require_flashinfer
from sglfix.harness.adapters.sglang.decode_plan import (
    DecodePlanTruth,
    decode_plan_findings,
    judge_decode,
    wrapper_rails,
)
from sglfix.harness.adapters.sglang.reports import init_reports, keep_report
from sglfix.harness.adapters.sglang.triton import SglangTritonAdapter
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.kits import kit as _kit
from sglfix.harness.unavailable import Unavailable

__all__ = ["SglangFlashInferAdapter", "captures_draft_extend_v2", "device_answers", "flashinfer_module"]

_MODULE = "sglang.srt.layers.attention.flashinfer_backend"


def flashinfer_module() -> Any:
    """sglang's FlashInfer backend module, on the torch stand-ins where FlashInfer is missing."""
    import importlib

    from sglfix.harness import torchfi

    module = importlib.import_module(_MODULE)
    torchfi.install(module)
    return module


class SglangFlashInferAdapter(SglangTritonAdapter):
    name = "flashinfer"
    registry_name = "flashinfer"
    # One indptr per wrapper (lists), guarded element by element.
    persistent = ("kv_indptr", "qo_indptr")
    metadata_fields = MetadataFields(
        indptr=("kv_indptr", "qo_indptr", "mask_indptr"),
        indices={"kv_indices": "kv_indptr"},
        # The mask's byte offsets only locate each row's bits; the view carries the bits read.
        offsets=("mask_indptr",),
    )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        # On a GPU FlashInfer's own kernels run, or the cell is SKIP with the install hint; the
        # torch stand-ins are for machines without CUDA.
        require_flashinfer(device)
        return super().build(scenario, device=device)

    def _placed(self) -> Any:
        """The backend's ``device="cuda"`` factory calls, on the CPU where there is no CUDA."""
        import torch

        if torch.cuda.is_available():
            return contextlib.nullcontext()
        return _kit("drafts").CudaAllocations(remap=True, guard=False)

    def make_backend(self, prepared: Prepared) -> Any:
        flashinfer_module()
        with self._placed():
            backend = super().make_backend(prepared)
        # The multi-item layout as the case built it from the items, for the metadata judge.
        backend._sglfix_multi_item = getattr(prepared.case, "multi_item", None)
        # The request rows as written, before any init, for the decode plans' judge.
        case = prepared.case
        backend._sglfix_decode_truth = DecodePlanTruth(
            rows=case.runner.req_to_token_pool.req_to_token.to("cpu").tolist(),
            window=case.scenario.model.sliding_window,
        )
        return backend

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        if scenario.capture_bs and scenario.mode == "DRAFT_EXTEND_V2" and not captures_draft_extend_v2(backend):
            raise Unavailable("this release's FlashInferAttnBackend does not capture DRAFT_EXTEND_V2 in CUDA graphs")
        if scenario.capture_bs and scenario.mode == "EXTEND" and not hasattr(backend, FULL_CG_WRAPPERS):
            raise Unavailable("this release's FlashInferAttnBackend has no full-graph prefill (plain EXTEND) wrappers")
        # device_answers: the full-graph prefill workspace is sized by the device's SM count.
        with self._placed(), device_answers():
            return super().capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)

    def graph_state(self, graphs: Any) -> tuple[str, ...]:
        return ("cuda_graph_kv_indices", "cuda_graph_custom_mask", "cuda_graph_qk_indptr", "cuda_graph_qo_indptr")

    def guard_graph_state(self, backend: Any, graphs: Any) -> None:
        super().guard_graph_state(backend, graphs)
        guard_full_cg_prefill(backend)

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: MetadataHook) -> Any:
        with self._placed():
            return super().run(prepared, backend, runner, scenario=scenario, on_metadata=on_metadata)

    def judges_batch_invariance(self, scenario: Any) -> bool:
        """FlashInfer's own views, not Triton's: its decode splits are not judged against each
        request alone."""
        return False

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        """Each wrapper of the live metadata as its kernel reads it: the planned buffers."""
        metadata = backend.forward_metadata
        rows = int(forward_batch.batch_size)
        views: list[tuple[str, Any, int]] = []
        wrappers = getattr(metadata, "decode_wrappers", None) or getattr(metadata, "prefill_wrappers", None) or []
        kind = "decode" if hasattr(metadata, "decode_wrappers") else "prefill"
        # The backend's page (0.5.13 keeps none on the backend: its KV pool's).
        pool = getattr(forward_batch, "token_to_kv_pool", None)
        page_size = int(getattr(backend, "page_size", None) or getattr(pool, "page_size", None) or 1)
        for i, w in enumerate(wrappers):
            views.append((f"{kind} wrapper {i}", _planned(w, rows=rows, page_size=page_size), rows))
        if kind == "decode":
            judge_decode(backend, forward_batch, wrapper_rails(wrappers))
        layout = getattr(backend, "_sglfix_multi_item", None)
        if layout is not None:
            keep_report(backend, "_sglfix_multi_item_reports", multi_item_reference(layout, forward_batch, wrappers))
        if getattr(metadata, "use_ragged", False) and not getattr(metadata, "extend_no_prefix", True):
            ragged = backend.prefill_wrapper_ragged
            views.append(
                (
                    "ragged wrapper",
                    SimpleNamespace(qo_indptr=ragged._qo_indptr_buf, kv_indptr=ragged._kv_indptr_buf),
                    rows,
                )
            )
        return views

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        return decode_plan_findings(backend) + _check_multi_item(backend)


def _check_multi_item(backend: Any) -> list[tuple[str, str]]:
    layout = getattr(backend, "_sglfix_multi_item", None)
    if layout is not None and all(longest is None for longest in layout.longest):
        what = "the positions of every token (no request carries items: none rewritten, no item mask planned)"
    else:
        what = "the positions of every query and item token and each request's max_item_len in the plan"
    return init_reports(
        backend,
        "_sglfix_multi_item_reports",
        what="multi-item scoring, ",
        passed=lambda n: f"metadata reference: {what}, after {n} metadata init(s), are the items'",
    )


def multi_item_reference(layout: Any, forward_batch: Any, wrappers: Any) -> str:
    """What is wrong ("" for nothing) with what the backend made of a multi-item scoring batch,
    against ``layout`` (``sglang.case.MultiItemLayout``, from the items alone): every query and item
    token's position in ``forward_batch.positions`` (a delimiter's is not judged: masked from every
    query, it reaches no row that is read), and the ``max_item_len_ptr`` the paged wrapper was
    planned with, read as the kernel reads it (uint16 per request), at least the request's longest
    item."""
    from sglfix.harness.codefault import CodeFault
    from sglfix.harness.torchfi.attend import raw_unsigned

    have = forward_batch.positions.to("cpu").tolist()
    if len(have) != len(layout.positions):
        return f"the batch has {len(have)} positions for {len(layout.positions)} new tokens"
    for i, (got, want) in enumerate(zip(have, layout.positions)):
        if want is not None and got != want:
            return f"token {i} ({layout.roles[i]}) is at position {got}, want {want}"
    if all(longest is None for longest in layout.longest):
        if wrappers and getattr(wrappers[0], "_prefix_len_ptr", None) is not None:
            return "no request carries items, yet the paged prefill wrapper was planned with a multi-item mask"
        return ""
    if not wrappers:
        return "no prefill wrapper in the live metadata"
    wrapper = wrappers[0]
    if getattr(wrapper, "_prefix_len_ptr", None) is None:
        return "the paged prefill wrapper was planned without a multi-item mask (prefix_len_ptr None)"
    bound = getattr(wrapper, "_max_item_len_ptr", None)
    if bound is None:
        return "the paged prefill wrapper was planned with a multi-item mask but no max_item_len_ptr"
    for b, longest in enumerate(layout.longest):
        if longest is None:
            continue
        try:
            got = int(raw_unsigned(bound, b + 1, width=2, name="max_item_len_ptr")[b])
        except CodeFault as exc:
            return f"request {b}: {exc}"
        if got < longest:
            return (
                f"request {b}: max_item_len_ptr[{b}] = {got}, below its longest item ({longest} tokens): the "
                "kernel may skip key tiles its item tokens see"
            )
    return ""


# What torch.cuda.get_device_properties answers without CUDA: an H200's SM count.
_H200_SMS = 132


@contextlib.contextmanager
def device_answers() -> Iterator[None]:
    """Without CUDA, ``torch.cuda.get_device_properties`` answers an H200's SM count (graph state
    sized by it: FlashMLA's schedule buffer, FlashInfer's full-graph prefill workspace); put back
    after."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.get_device_properties
    torch.cuda.get_device_properties = lambda *a, **k: SimpleNamespace(multi_processor_count=_H200_SMS)
    try:
        yield
    finally:
        torch.cuda.get_device_properties = original


# The plain-EXTEND full-graph wrappers' maker, and the buffers it makes them over (one per wrapper).
FULL_CG_WRAPPERS = "_create_full_cg_prefill_wrappers"
FULL_CG_BUFFERS = ("full_cg_prefill_qo_indptr", "full_cg_prefill_kv_indptr", "full_cg_prefill_kv_indices")
# Where a FlashInfer prefill wrapper keeps the buffers it was built over.
_WRAPPER_BUFFERS = ("_qo_indptr_buf", "_paged_kv_indptr_buf", "_paged_kv_indices_buf")


def guard_full_cg_prefill(backend: Any) -> None:
    """Guard zones after the full-graph prefill wrappers' buffers (``FULL_CG_BUFFERS``), which the
    backend makes at its first prefill capture (``_create_full_cg_prefill_wrappers``, the class's
    own, looked up at each call): as soon as it has made them, before any plan writes into them,
    each is swapped for a guarded copy and every wrapper built over it is pointed at the copy."""
    from sglfix.harness.adapters.sglang.guards import guard_buffers

    if not hasattr(type(backend), FULL_CG_WRAPPERS):
        return

    def create(*args: Any, **kwargs: Any) -> Any:
        wrappers = getattr(type(backend), FULL_CG_WRAPPERS)(backend, *args, **kwargs)
        made = {name: list(getattr(backend, name, None) or ()) for name in FULL_CG_BUFFERS}
        guard_buffers(backend, FULL_CG_BUFFERS)
        copies = {
            id(old): new for name in FULL_CG_BUFFERS for old, new in zip(made[name], getattr(backend, name, None) or ())
        }
        for wrapper in wrappers or ():
            for attr in _WRAPPER_BUFFERS:
                copy = copies.get(id(getattr(wrapper, attr, None)))
                if copy is not None:
                    setattr(wrapper, attr, copy)
        return wrappers

    setattr(backend, FULL_CG_WRAPPERS, create)


def captures_draft_extend_v2(backend: Any, method: str = "_prepare_cuda_graph_metadata") -> bool:
    """Whether the backend's graph metadata (its ``method``) knows the spec-v2 draft extend (0.5.14
    on; 0.5.13's captures the spec-v1 draft extend only). Read from its source file, which a
    mutant's or a revert's swapped code object leaves as it is."""
    import inspect

    try:
        source = inspect.getsource(getattr(type(backend), method))
    except (AttributeError, OSError, TypeError):
        return True
    return "is_draft_extend_v2" in source


def _planned(wrapper: Any, *, rows: int, page_size: int) -> Any:
    """A wrapper's planned metadata under the invariant table's names (FlashInfer's own private
    buffers, which the stand-ins keep under the same names), and the custom mask as its rows read
    it (``custom_mask``)."""
    return SimpleNamespace(
        kv_indptr=getattr(wrapper, "_paged_kv_indptr_buf", None),
        kv_indices=getattr(wrapper, "_paged_kv_indices_buf", None),
        qo_indptr=getattr(wrapper, "_qo_indptr_buf", None),
        mask_indptr=getattr(wrapper, "_mask_indptr_buf", None),
        custom_mask=_mask_as_read(wrapper, rows=rows, page_size=page_size),
    )


def _mask_as_read(wrapper: Any, *, rows: int, page_size: int) -> Any:
    """The packed custom mask's bits each planned row reads, row after row (request r's bit
    ``q * kv_len + k`` from byte ``mask_indptr[r]``, little bit order, as FlashInfer's prefill
    kernels read it); None for a wrapper with no mask. Where the offsets point past the buffer, a
    sentence saying so (the kernel would read memory no mask holds)."""
    import torch

    mask, offsets = getattr(wrapper, "_custom_mask_buf", None), getattr(wrapper, "_mask_indptr_buf", None)
    parts = [
        getattr(wrapper, n, None) for n in ("_qo_indptr_buf", "_paged_kv_indptr_buf", "_paged_kv_last_page_len_buf")
    ]
    if mask is None or offsets is None or any(p is None for p in parts) or rows <= 0:
        return None
    qo, kv, last = (p.reshape(-1).to("cpu", torch.int64) for p in parts)
    if qo.numel() < rows + 1 or kv.numel() < rows + 1 or last.numel() < rows or offsets.numel() < rows:
        return None  # the invariants name a short indptr
    pages = kv[1 : rows + 1] - kv[:rows]
    kv_len = torch.where(pages > 0, (pages - 1) * page_size + last[:rows], 0)
    bits = ((qo[1 : rows + 1] - qo[:rows]) * kv_len).clamp(min=0)
    start = offsets.reshape(-1)[:rows].to("cpu", torch.int64)
    end = int((start + (bits + 7) // 8).max())
    flat = mask.reshape(-1)
    if int(start.min()) < 0 or end > flat.numel():
        return f"the rows' mask bits reach byte {end} of a {flat.numel()}-byte mask"
    packed = flat[:end].to("cpu", torch.int64)
    out = []
    for r in range(rows):
        n = int(bits[r])
        chunk = packed[int(start[r]) : int(start[r]) + (n + 7) // 8]
        out.append(((chunk[:, None] >> torch.arange(8)) & 1).reshape(-1)[:n])
    return torch.cat(out).to(torch.uint8) if out else None
