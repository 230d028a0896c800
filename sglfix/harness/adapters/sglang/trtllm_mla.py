"""Real sglang's TRT-LLM MLA draft extend (``TRTLLMMLABackend``, DRAFT_EXTEND_V2): PR 21987's path,
metadata only.

The kernel (trtllm-gen MLA) runs on Blackwell (SM100/SM12x) only, so no attention output is
compared: the cell checks the capture/replay metadata that the kernel would read
(``decode_cuda_graph_metadata[bs]``: ``cu_seqlens_q``, ``seq_lens_q``, ``max/sum_seq_lens_q``,
``seq_lens_k``, ``block_kv_indices``), and says that the kernel did not run.

Graph scenarios follow ``EAGLEDraftExtendCudaGraphRunner``'s metadata calls:
``init_cuda_graph_state(max_bs, max_bs * N)``, ``init_forward_metadata_out_graph(batch,
in_capture=True)`` per captured size (seq_lens = the fill value), then the replay view for the
batch padded to the captured size (padded rows: seq_lens = fill, num_correct_drafts = N) and
``init_forward_metadata_out_graph``. Eager scenarios call ``init_forward_metadata``.

The judge: sglfix's invariants, plus a metadata reference from the ground truth: uniform stride
``cu_seqlens_q = arange(bs + 1) * N``, ``seq_lens_q = max_seq_len_q = N``, ``sum_seq_lens_q = N *
bs``, ``seq_lens_k = prefix + N`` (seq_lens - seq_lens_q + N), and each real row's block table =
its request's pages.

Where it runs: ``TRTLLMMLABackend`` is a ``FlashInferMLAAttnBackend``, whose constructor builds
FlashInfer wrappers: it needs CUDA and FlashInfer (its constructor does not check the chip, so an
H100 builds it and runs this metadata code). On CPU the cell is a SKIP saying so.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import AdapterBase, Prepared
from sglfix.harness.invariants import MetadataFields
from sglfix.harness.unavailable import NoOutput, Unavailable

__all__ = ["ADAPTER", "TrtllmMLADraftExtendAdapter"]

_NO_KERNEL = (
    "the trtllm-gen MLA kernel runs on SM100/SM12x (Blackwell) only: it did not run; the metadata it "
    "would read was checked"
)


class TrtllmMLADraftExtendAdapter(AdapterBase):
    name = "trtllm_mla"
    metadata_fields = MetadataFields(
        indptr=("cu_seqlens_q",),
        lengths=("seq_lens_q", "seq_lens_k", "max_seq_len_q", "max_seq_len_k", "sum_seq_lens_q"),
        block_tables={"block_kv_indices": ("seq_lens_k", "page_size")},
    )

    def check_available(self, device: str) -> None:
        import torch

        if torch.device(device).type != "cuda" or not torch.cuda.is_available():
            raise Unavailable(
                "TRTLLMMLABackend is a FlashInferMLAAttnBackend: its constructor builds FlashInfer "
                "wrappers, which need CUDA and FlashInfer (its kernel needs SM100); run on a CUDA "
                "machine with flashinfer-python for its capture/replay metadata"
            )

    def build(self, scenario: Any, *, device: str) -> Prepared:
        if scenario.mode != "DRAFT_EXTEND_V2":
            raise Unavailable(f"the sglang {self.name} adapter runs DRAFT_EXTEND_V2, not {scenario.mode}")
        from sglfix.harness.kits import kit as _kit

        kit = _kit("drafts")

        if not kit.flashinfer_available():
            raise Unavailable("TRTLLMMLABackend needs FlashInfer (pip install flashinfer-python) to be built")
        case = kit.build_trtllm_draft_extend(scenario, device=device)
        case.last = None  # the batch (view) of the last metadata init
        return Prepared(case=case, num_slots=case.num_slots)

    def make_backend(self, prepared: Prepared) -> Any:
        from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend

        # As DraftBackendFactory builds the draft-extend backend for trtllm_mla.
        return TRTLLMMLABackend(prepared.case.runner, skip_prefill=False)

    def capture(self, prepared: Prepared, backend: Any, *, scenario: Any, on_metadata: Any) -> Any:
        if not scenario.capture_bs:
            return None
        from sglfix.harness.kits import kit as _kit

        kit = _kit("drafts")

        case = prepared.case
        n = case.num_draft_tokens
        max_bs = max(scenario.capture_bs)
        backend.init_cuda_graph_state(max_bs, max_bs * n)
        fill = backend.get_cuda_graph_seq_len_fill_value()
        for bs in scenario.capture_bs:
            batch = kit.trtllm_capture_batch(bs, n=n, fill=fill, device=case.device, runner=case.runner)
            backend.init_forward_metadata_out_graph(batch, in_capture=True)
            on_metadata(backend, batch, f"capture bs={bs}")
        return SimpleNamespace(bs=scenario.graph_bs, fill=fill)

    def run(self, prepared: Prepared, backend: Any, runner: Any, *, scenario: Any, on_metadata: Any) -> Any:
        from sglfix.harness.kits import kit as _kit

        kit = _kit("drafts")

        case = prepared.case
        if runner is None:
            backend.init_forward_metadata(case.batch)
            case.last = case.batch
            on_metadata(backend, case.batch, "eager")
        else:
            view = kit.trtllm_replay_view(case.batch, bs=runner.bs, n=case.num_draft_tokens, fill=runner.fill)
            backend.init_forward_metadata_out_graph(view)
            case.last = view
            on_metadata(backend, view, f"replay bs={runner.bs}")
        return NoOutput(_NO_KERNEL)

    def static_buffers(self, backend: Any) -> list:
        return []

    def metadata_views(self, backend: Any, forward_batch: Any) -> list[tuple[str, Any, int]]:
        metadata = _metadata(backend, forward_batch.batch_size)
        view = SimpleNamespace(**vars(metadata), page_size=backend.page_size) if metadata is not None else None
        return [("", view, forward_batch.batch_size)]

    def check_metadata(self, prepared: Prepared, backend: Any) -> list[tuple[str, str]]:
        """The uniform-stride layout against the ground truth, real rows only."""
        import torch

        case = prepared.case
        view = case.last
        metadata = _metadata(backend, view.batch_size) if view is not None else None
        if view is None or metadata is None:
            return []
        n, bs, raw = case.num_draft_tokens, view.batch_size, len(case.prefix)
        findings: list[tuple[str, str]] = []

        def compare(name: str, got: Any, want: list[int]) -> None:
            if got is None:
                findings.append(("INVARIANT", f"metadata: {name} is None"))
                return
            values = got.reshape(-1).to(torch.int64).cpu().tolist()[: len(want)]
            if values != want:
                r = next((i for i, (a, b) in enumerate(zip(values, want)) if a != b), len(values))
                findings.append(
                    (
                        "DIVERGE",
                        f"metadata reference: {name}[{r}] = "
                        f"{values[r] if r < len(values) else None}, expected {want[r]} "
                        f"(uniform stride N = {n}); {name}[:{len(want)}] = {values}",
                    )
                )

        compare("cu_seqlens_q", metadata.cu_seqlens_q, [i * n for i in range(raw + 1)])
        compare("seq_lens_q", metadata.seq_lens_q, [n] * raw)
        seq_k = [p + n for p in case.prefix]
        compare("seq_lens_k", metadata.seq_lens_k, seq_k)
        for name, want in (("max_seq_len_q", n), ("sum_seq_lens_q", n * bs)):
            got = getattr(metadata, name, None)
            if got is not None and int(got) != want:
                findings.append(("DIVERGE", f"metadata reference: {name} = {int(got)}, expected {want}"))
        table = metadata.block_kv_indices
        if table is not None:
            t = table.to(torch.int64).cpu()
            for b in range(raw):
                pages = case.slots.pages[b]
                got = t[b, : len(pages)].tolist()
                if got != pages:
                    findings.append(
                        (
                            "DIVERGE",
                            f"metadata reference: block_kv_indices row {b} = {got}, the request's pages are {pages}",
                        )
                    )
                    break
        if findings:
            return findings
        return [
            (
                "PASS",
                f"metadata reference: uniform-stride layout (cu_seqlens_q, seq_lens_q/k, max/sum_seq_lens_q) "
                f"and block tables of {raw} request(s) at bs {bs}, N = {n}, match",
            )
        ]

    def reference(self, prepared: Prepared) -> tuple[Any, Any]:
        raise NotImplementedError("the sglang trtllm_mla adapter compares metadata only")


def _metadata(backend: Any, bs: int) -> Any:
    """What the kernel reads: a graph's captured metadata of size ``bs`` (refreshed in place by a
    replay), else the eager forward's."""
    captured = getattr(backend, "decode_cuda_graph_metadata", None) or {}
    return captured.get(bs, backend.forward_decode_metadata)


ADAPTER = TrtllmMLADraftExtendAdapter()
