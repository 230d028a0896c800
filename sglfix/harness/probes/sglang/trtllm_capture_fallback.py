"""Probe ``trtllm-capture-fallback`` (PR 32288): which attention path the TRT-LLM MLA backend's
``forward_extend`` takes for a speculative batch captured after a prefill that fell back to
FlashInfer.

``TRTLLMMLABackend`` falls back to its parent's (FlashInfer MLA's) ragged prefill for an extend on
a cached prefix when chunked prefix caching is off, and keeps that decision in
``forward_prefill_metadata``. An eager target-verify / draft-extend metadata init clears it; the
CUDA-graph capture of those modes does not. Before the fix ``forward_extend`` honoured the stale
flag for any extend-like mode: the captured verify or draft-extend graph ran FlashInfer's prefill
path, bound to the wrappers planned for the last prefill, which fault at replay (upstream: an
illegal address). The fix takes the fallback for genuine extends only.

Inputs from the scenario: ``prefix_lens`` (the prefill's cached prefixes; it extends each by
``spec.num_draft_tokens`` new tokens, then the same requests are captured in ``mode``), ``model``
(heads; the MLA latent sizes default to DeepSeek's), ``page_size``.

Real code run: the installed ``TRTLLMMLABackend`` (its constructor, the prefill metadata init with
``disable_chunked_prefix_cache`` published, its FlashInfer-MLA parent's prefill planning,
``init_cuda_graph_state``, the capture-time ``init_forward_metadata_out_graph``, ``forward_extend``
up to the kernel launch). Kernels are not launched: sglfix stands at both launches (the
trtllm-gen MLA kernel, which runs on Blackwell only, and the parent's ``forward_extend``) and
records which one the captured batch reaches. Where FlashInfer cannot run (CPU), its MLA wrappers
are sglfix's torch stand-ins (``torchfi.install_mla``) and the device queries the constructor makes
of FlashInfer and sglang's JIT kernels (SM count, the fused KV-concat kernel, the zero-KV fixup
module) are answered as for a device without those kernels. sglfix's expectation: the prefill took
the fallback (else the probe cannot judge: SKIP), and the captured batch reaches the trtllm-gen
kernel (INVARIANT otherwise).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from sglfix.harness.adapters.base import require_flashinfer
from sglfix.harness.fingerprint import observe
from sglfix.harness.misfit import Standin
from sglfix.harness.probes.sglang.common import bound, runners_unpublished
from sglfix.harness.unavailable import Unavailable

__all__ = ["PROBE"]

_TRT = "sglang.srt.layers.attention.trtllm_mla_backend"
_FIMLA = "sglang.srt.layers.attention.flashinfer_mla_backend"
# The TRT-LLM MLA backend's own capture state (not its FlashInfer-MLA parent's).
_CAPTURE_STATE = (
    "forward_prefill_metadata",
    "forward_decode_metadata",
    "decode_cuda_graph_metadata",
    "decode_cuda_graph_kv_indices",
)
# FlashInfer's own sizing of the trtllm-gen multi-CTA counter (flashinfer.utils).
_COUNTER_ALIGN = 8


class _Launches:
    """Stands at the two launches ``forward_extend`` can reach; records which, launches nothing."""

    def __init__(self, v_head_dim: int) -> None:
        self.v_head_dim = v_head_dim
        self.reached: list[str] = []
        self.handed: list[Any] = []  # what each launch was handed (a fingerprint's evidence)

    def trtllm(self, **kwargs: Any) -> Any:
        import torch

        self.reached.append("trtllm-gen MLA kernel")
        # The launch's metadata, not its data (the query is the probe's random input).
        self.handed.append({k: v for k, v in kwargs.items() if k not in ("query", "kv_cache", "workspace_buffer")})
        query = kwargs["query"]
        return torch.zeros((*query.shape[:-1], self.v_head_dim), dtype=query.dtype, device=query.device)

    def fallback(self, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        self.reached.append("FlashInfer MLA prefill fallback")
        self.handed.append(forward_batch)
        return torch.zeros((q.shape[0], layer.tp_q_head_num * layer.v_head_dim), dtype=q.dtype, device=q.device)


def _sm_count(device: Any) -> int:
    return 132  # an H100/H200's; it only sizes the multi-CTA counter buffer


def _counter_bytes(batch_size: int, num_qo_heads: int, sm_count: int) -> int:
    return -(-max(batch_size * num_qo_heads, sm_count) // _COUNTER_ALIGN) * _COUNTER_ALIGN * 4


class _NoJit:
    """A JIT module that cannot be built without CUDA: built lazily, used by no path judged here."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise Unavailable(f"sglang's JIT kernel {self._name} needs CUDA")


def _device_answers(trt: Any, launches: _Launches, *, cuda: bool) -> dict[str, Any]:
    """What the probe binds in the TRT-LLM MLA module: the trtllm-gen launch replaced by the
    recorder (on every device), and on CPU the device queries answered as for a device without
    FlashInfer's and sglang's CUDA kernels."""
    real = vars(trt).get("flashinfer")
    utils = (
        real.utils
        if real is not None
        else SimpleNamespace(get_device_sm_count=_sm_count, get_trtllm_gen_multi_ctas_kv_counter_bytes=_counter_bytes)
    )
    values: dict[str, Any] = {
        "flashinfer": SimpleNamespace(
            utils=utils, decode=SimpleNamespace(trtllm_batch_decode_with_kv_cache_mla=launches.trtllm)
        )
    }
    if not cuda:
        values["_jit_fixup_module"] = lambda dtype: _NoJit("fixup_zero_kv")
        values["can_use_set_mla_kv_concat_q"] = lambda nope, rope: False
    return values


class TrtllmCaptureFallback:
    name = "trtllm-capture-fallback"

    def check_available(self, device: str) -> None:
        require_flashinfer(device)
        metadata = getattr(importlib.import_module(_TRT), "TRTLLMMLAPrefillMetadata", None)
        if "fallback_to_flashinfer_impl" not in getattr(metadata, "__dataclass_fields__", {}):
            raise Unavailable("this release's TRTLLMMLABackend has no FlashInfer prefill fallback")

    def run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        with runners_unpublished():
            self._run(scenario, device=device, result=result, stage=stage)

    def _run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        import torch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        from sglfix.harness import torchfi
        from sglfix.harness.kits import kit
        from sglfix.scenario.models import MLA_KV_LORA_RANK, MLA_ROPE_DIM

        stage("build")
        drafts = kit("drafts")
        drafts.prepare()
        cuda = torch.device(device).type == "cuda"
        trt, fimla = importlib.import_module(_TRT), importlib.import_module(_FIMLA)
        torchfi.install_mla(fimla)
        ndt = scenario.spec.num_draft_tokens
        model = scenario.model
        latent = SimpleNamespace(
            num_heads=model.num_heads,
            kv_lora_rank=model.kv_lora_rank or MLA_KV_LORA_RANK,
            qk_rope_head_dim=model.qk_rope_head_dim or MLA_ROPE_DIM,
        )
        prefill, runner = drafts.trtllm_prefill_case(
            scenario, model=latent, new_tokens=ndt, device=device, disable_chunked_prefix_cache=True
        )
        launches = _Launches(latent.kv_lora_rank)
        placed = contextlib.nullcontext() if cuda else drafts.CudaAllocations(remap=True, guard=False)
        bs = len(scenario.prefix_lens)
        with placed, bound(trt, **_device_answers(trt, launches, cuda=cuda)):
            backend = trt.TRTLLMMLABackend(runner)
            stage("prefill metadata")
            backend.init_forward_metadata(prefill)
            stale = backend.forward_prefill_metadata
            if stale is None or not stale.fallback_to_flashinfer_impl:
                raise Unavailable("the prefill did not take the FlashInfer fallback: nothing stale to capture over")
            stage(f"{scenario.mode} capture")
            backend.init_cuda_graph_state(bs, bs * ndt)
            mode = ForwardMode[scenario.mode]
            batch = drafts.trtllm_capture_batch(
                bs, n=ndt, fill=backend.get_cuda_graph_seq_len_fill_value(), device=device, runner=runner
            )
            if mode == ForwardMode.TARGET_VERIFY:
                batch.forward_mode = mode
                batch.spec_info = Standin(
                    draft_token_num=ndt,
                    num_tokens_per_req=ndt,
                    ragged_verify_layout=None,
                    topk=scenario.spec.topk,
                    spec_steps=scenario.spec.num_steps,
                )
            backend.init_forward_metadata_out_graph(batch, in_capture=True)
            stage(f"{scenario.mode} forward")
            layer = Standin(
                tp_q_head_num=latent.num_heads,
                v_head_dim=latent.kv_lora_rank,
                head_dim=latent.kv_lora_rank + latent.qk_rope_head_dim,
                layer_id=0,
                scaling=1.0 / (latent.kv_lora_rank + latent.qk_rope_head_dim) ** 0.5,
            )
            tokens = bs * ndt
            dtype = runner.dtype
            q = torch.randn((tokens, latent.num_heads, latent.kv_lora_rank), dtype=dtype, device=device)
            q_rope = torch.randn((tokens, latent.num_heads, latent.qk_rope_head_dim), dtype=dtype, device=device)
            k = torch.randn((tokens, 1, latent.kv_lora_rank), dtype=dtype, device=device)
            k_rope = torch.randn((tokens, 1, latent.qk_rope_head_dim), dtype=dtype, device=device)
            with bound(fimla.FlashInferMLAAttnBackend, forward_extend=launches.fallback):
                backend.forward_extend(q, k, k, layer, batch, False, q_rope, k_rope)
            # What the captured path reads: the launch it reached and what that was handed, and
            # the backend's own capture metadata (the stale prefill flag, the decode metadata a
            # replay reads). The FlashInfer-MLA parent's state (its wrappers, its graph buffers,
            # its plan for the prefill) is read by no launch of this cell: its own cells judge it.
            # The verify mask is left out wherever it shows: the backend declares it unread
            # (is_read=False), and verify-mask-fits judges its layout and size.
            mask = getattr(backend, "_verify_mask", None)  # releases before 0.5.16 build none
            built = {k: getattr(backend, k, None) for k in _CAPTURE_STATE}
            unread = [mask.buffer] if mask is not None and not mask.is_read else []
            observe("trtllm capture", launches.reached, launches.handed, built, unread=unread)
        stage("judge")
        where = f"{scenario.mode} captured at {bs} after a prefill on prefixes {list(scenario.prefix_lens)}"
        if launches.reached == ["trtllm-gen MLA kernel"]:
            result.add("PASS", f"{where}: forward_extend reached the trtllm-gen MLA kernel", reached=launches.reached)
        else:
            result.add(
                "INVARIANT",
                f"{where}: forward_extend reached {', '.join(launches.reached) or 'no launch'}; the graph would replay "
                "the FlashInfer wrappers planned for that prefill",
                reached=launches.reached,
            )


PROBE = TrtllmCaptureFallback()
