"""An MLA model's multi-head prefill (``model.mha_chunk``, ``backend: flashinfer_mla``): DeepSeek's
MHA prefill driven through sglang's own model code (``DeepseekMHAForwardMixin``) over the backend,
so that the backend's chunk runner (``FlashInferMhaChunkKVRunner``: a ragged wrapper per prefix
chunk, non-causal, and one causal over the new tokens or, in one shot, over every token) decides
which keys each launch attends.

The layer is the mixin over a stand-in of DeepSeek's attention module: its projections are
seeded fixed matrices (``kv_b_proj`` decompresses the latent into per-head K/V, DeepSeek's 128 + 64 /
128 head dims), no rotary, no norm. sglang's dispatcher (``AttentionBackendRegistry``) picks the
method from the batch and the chunk capacity (``SGLANG_MAX_KV_CHUNK_CAPACITY``, the scenario's
``model.mha_chunk``; the prefix threshold published at 1 so that every prefix takes the MHA path):
one shot when every sequence fits, else chunked, each chunk's output merged into the new tokens'
(``merge_state``).

The reference never reads the chunks: every query attends its request's prefix (the pool's latents
at the layout's slots) and the new tokens up to itself, each key and value decompressed from its
latent by the same matrix, rounded to the model's dtype as the projection's output is.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from sglfix.harness.codefault import BrokenContract
from sglfix.harness.unavailable import Unavailable

__all__ = ["MHA_NOPE", "MHA_V", "mha_prepare", "mha_run"]

# DeepSeek's per-head dims of the multi-head path (FlashInfer's ragged prefill takes 192 / 128).
MHA_NOPE, MHA_V = 128, 128


def mha_prepare(case: Any, *, seed: int) -> None:
    """Publish what production's MLA runner runs the MHA prefill with (chunked prefix cache and the
    ragged wrappers on), the model's per-head dims, and replace the case's absorbed inputs and
    truth by the multi-head ones. Before the backend is built: its chunk runner reads all this."""
    import torch

    from sglfix.harness.kits import kit as _kit

    runner, model = case.runner, case.scenario.model
    _kit("attention").publish_over(runner, disable_chunked_prefix_cache=False, flashinfer_mla_disable_ragged=False)
    config = runner.model_config
    config.qk_nope_head_dim, config.v_head_dim = MHA_NOPE, MHA_V
    heads, lora, rope = model.num_heads, model.kv_lora_rank, model.qk_rope_head_dim
    gen = torch.Generator(device="cpu").manual_seed(int(seed) + 104729)
    tokens, dtype, device = case.k.shape[0], case.k.dtype, case.k.device
    q = torch.randn(tokens, heads, MHA_NOPE + rope, generator=gen).to(dtype).to(device)
    w_kv = (torch.randn(lora, heads * (MHA_NOPE + MHA_V), generator=gen) / math.sqrt(lora)).to(dtype).to(device)
    case.mha = SimpleNamespace(
        q=q, latent=case.k.reshape(tokens, lora + rope), w_kv=w_kv, heads=heads, lora=lora, rope=rope, method=None
    )
    case.truth = _mha_truth(case.truth, case=case)


def _mha_truth(absorbed: Any, *, case: Any) -> Any:
    """The absorbed truth's keys (latent + rope) decompressed per head: K = [c W_k ; k_pe], V = c W_v,
    the queries the multi-head ones; the same visibility (the prefix, then causal)."""
    import torch

    from sglfix.harness.adapters.sglang.truth import GroundTruth

    mha, scenario = case.mha, case.scenario
    bs, lmax = absorbed.k_pad.shape[:2]
    latent = absorbed.k_pad[:, :, 0]  # [bs, L, lora + rope]
    kv = (latent[..., : mha.lora].float() @ mha.w_kv.float()).to(mha.w_kv.dtype)
    kv = kv.view(bs, lmax, mha.heads, MHA_NOPE + MHA_V)
    pe = latent[..., mha.lora :].unsqueeze(2).expand(bs, lmax, mha.heads, mha.rope)
    k_pad = torch.cat([kv[..., :MHA_NOPE], pe], dim=-1)
    v_pad = kv[..., MHA_NOPE:]
    q_pad = mha.q.new_zeros((bs, absorbed.q_pad.shape[1], mha.heads, MHA_NOPE + mha.rope))
    start = 0
    for b, e in enumerate(scenario.extend_lens):
        q_pad[b, :e] = mha.q[start : start + e]
        start += e
    return GroundTruth(
        q_pad=q_pad,
        k_pad=k_pad,
        v_pad=v_pad,
        visible=absorbed.visible,
        q_valid=absorbed.q_valid,
        sm_scale=1.0 / math.sqrt(MHA_NOPE + mha.rope),
    )


class _Projection:
    """A projection of the stand-in module: a fixed output, or a fixed matrix (torch's result
    tuple, as sglang's linear layers return)."""

    def __init__(self, *, out: Any = None, weight: Any = None) -> None:
        self.out, self.weight = out, weight

    def __call__(self, x: Any) -> tuple[Any, None]:
        return (self.out if self.weight is None else x @ self.weight), None


def _layer(case: Any) -> Any:
    """sglang's ``DeepseekMHAForwardMixin`` over a stand-in of DeepSeek's attention module."""
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_mha import DeepseekMHAForwardMixin

    mha = case.mha

    class MHALayer(DeepseekMHAForwardMixin):
        pass

    layer = MHALayer()
    layer.attn_mha = RadixAttention(
        num_heads=mha.heads,
        head_dim=MHA_NOPE + mha.rope,
        scaling=case.truth.sm_scale,
        num_kv_heads=mha.heads,
        layer_id=0,
        v_head_dim=MHA_V,
    )
    layer.num_local_heads, layer.layer_id = mha.heads, 0
    layer.qk_nope_head_dim, layer.qk_rope_head_dim, layer.v_head_dim = MHA_NOPE, mha.rope, MHA_V
    layer.qk_head_dim, layer.kv_lora_rank, layer.q_lora_rank = MHA_NOPE + mha.rope, mha.lora, None
    layer.use_dsa, layer.dcp_size, layer.rotary_emb = False, 1, None
    layer.kv_cache_dtype, layer.current_attention_backend = "auto", "flashinfer"
    layer.flashinfer_mla_disable_ragged = False
    layer.q_proj = _Projection(out=mha.q.reshape(mha.q.shape[0], -1).clone())
    layer.kv_a_proj_with_mqa = _Projection(out=mha.latent.clone())
    layer.kv_b_proj = _Projection(weight=mha.w_kv)
    layer.kv_a_layernorm = lambda x: x
    layer.o_proj = lambda x: (x, None)
    layer.init_mha_forward()
    return layer


def mha_run(case: Any, backend: Any, batch: Any) -> Any:
    """The multi-head prefill of ``batch`` (its metadata initialised) as the model runs it, with the
    method sglang's dispatcher picks; returns [tokens, H, v_head_dim]."""
    import torch
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    mha = case.mha
    with (
        envs.SGLANG_MAX_KV_CHUNK_CAPACITY.override(case.scenario.model.mha_chunk),
        envs.SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD.override(1),
        torch.no_grad(),
        forward_context(ForwardContext(attn_backend=backend)),
    ):
        layer = _layer(case)
        method = AttentionBackendRegistry.get_handler("flashinfer")(layer, batch)
        mha.method = getattr(method, "name", str(method))
        hidden = mha.q.new_zeros((mha.q.shape[0], 1))
        if method == AttnForwardMethod.MHA_ONE_SHOT:
            q, k, v, fb = layer.forward_normal_one_shot_prepare(batch.positions, hidden, batch, None)
            out = layer.forward_normal_one_shot_core(q, k, v, fb)
        elif method == AttnForwardMethod.MHA_CHUNKED_KV:
            missing = _merge_missing()
            if missing:
                raise Unavailable(missing)
            q, k, v, fb = layer.forward_normal_chunked_kv_prepare(batch.positions, hidden, batch, None)
            out = layer.forward_normal_chunked_kv_core(q, k, v, fb)
        else:
            raise BrokenContract(
                f"sglang's dispatcher picked {mha.method} for an MLA extend with the multi-head prefill on "
                "(chunked prefix cache and ragged wrappers published): the MHA path is never taken"
            )
        mha.chunks = getattr(batch, "num_prefix_chunks", None)
    return out.view(mha.q.shape[0], mha.heads, MHA_V)


def _merge_missing() -> str:
    """Why the chunked path's state merge cannot run here ("" where it can): sglang merges with
    sgl_kernel's ``merge_state_v2`` on CUDA (older releases call it directly, imported on CUDA
    only), where only a stand-in of sgl_kernel may be installed."""
    import inspect

    from sglang.srt.models.deepseek_common.attention_forward_methods import forward_mha

    source = inspect.getsource(forward_mha.DeepseekMHAForwardMixin._chunked_prefix_attn_mha)
    if "merge_state_v2(" in source:
        owner: Any = forward_mha
    else:
        from sglang.srt.layers.attention import merge_state

        if not getattr(merge_state, "_is_cuda", False):
            return ""  # sglang's Triton merge, which runs wherever Triton does
        owner = merge_state
    kernel = getattr(owner, "merge_state_v2", None)
    if kernel is None:
        return (
            "this release's chunked MHA prefill merges with sgl_kernel's merge_state_v2, which it imports on CUDA only"
        )
    if getattr(kernel, "_standin_path", None):
        return "the chunked MHA prefill merges with sgl_kernel's merge_state_v2; sgl_kernel is not installed here"
    return ""
