"""sgl_kernel's CPU attention kernel for decode (``decode_attention_cpu``, as sglang's
``IntelAMXAttnBackend`` calls it through ``torch.ops.sgl_kernel``) as torch code, for a machine whose
sgl_kernel is not the CPU build (any machine but an AMX-enabled Xeon install).

What the kernel reads, and so what this reads: for request ``b`` of the batch, the keys and values
of the pool's slots ``req_to_token[req_pool_indices[b], :seq_lens[b]]`` (the last ``window`` of them
where the layer has a window: ``sliding_window_size + 1 > 0``); with ``key``/``value`` given it first
writes them at ``loc`` (the kernel's own KV write). A cross-attention layer (``is_cross``) attends
the request's first ``encoder_lens[b]`` slots instead. Each query head attends through its KV head
(grouped-query), scores ``q . k * sm_scale`` (tanh-capped at ``logit_cap`` when it is > 0),
softmax in float32, and writes ``o``. ``attn_logits`` is the kernel's split scratch,
``[requests, heads, splits, v_head_dim + 1]`` (the split count its third dimension), which it fills
before reading: a smaller one would be written past, so it is checked, not used. A slot outside the
pool raises ``OutOfBounds``, a tensor the kernel needs handed as None ``BrokenContract`` (on the
machine, a null read): both the code's faults, the cell's CRASH.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from sglfix.harness.codefault import BrokenContract, OutOfBounds

__all__ = ["decode_attention_cpu", "install"]


def decode_attention_cpu(  # noqa: PLR0913 - the kernel's own signature, as sglang calls it
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    o: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross: bool,
    window: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    if sinks is not None:
        raise NotImplementedError("sglfix's decode_attention_cpu models no attention sinks")
    needed = {"seq_lens": seq_lens, "req_pool_indices": req_pool_indices}
    if is_cross:
        needed["encoder_lens"] = encoder_lens
    for name, given in needed.items():
        if given is None:
            raise BrokenContract(f"decode_attention_cpu was handed no {name}")
    _check_scratch(attn_logits, requests=q.shape[0], heads=q.shape[1], v_dim=o.shape[-1])
    slots = k_buffer.shape[0]
    if key is not None and value is not None:
        if loc is None:
            raise BrokenContract("decode_attention_cpu was handed K/V to write and no slots (loc) to write them at")
        where = loc.to(torch.long)
        if where.numel() and (int(where.min()) < 0 or int(where.max()) >= slots):
            raise OutOfBounds(f"decode_attention_cpu writes slot {int(where.max())} of a pool of {slots}")
        k_buffer[where] = key.view(-1, *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[where] = value.view(-1, *v_buffer.shape[1:]).to(v_buffer.dtype)
    heads, kv_heads = q.shape[1], k_buffer.shape[1]
    group = heads // kv_heads
    for b in range(q.shape[0]):
        n = int(encoder_lens[b]) if is_cross and encoder_lens is not None else int(seq_lens[b])
        row = req_to_token[int(req_pool_indices[b]), :n].to(torch.long)
        if window > 0 and not is_cross:
            row = row[-window:]
        if row.numel() and (int(row.min()) < 0 or int(row.max()) >= slots):
            raise OutOfBounds(f"decode_attention_cpu reads slot {int(row.max())} of a pool of {slots}")
        k = k_buffer[row].float() * k_scale  # [n, KVH, D]
        v = v_buffer[row].float() * v_scale
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * sm_scale
        if logit_cap > 0:
            scores = logit_cap * torch.tanh(scores / logit_cap)
        o[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v).to(o.dtype)


def _check_scratch(attn_logits: torch.Tensor, *, requests: int, heads: int, v_dim: int) -> None:
    """The split scratch the kernel writes: a row per request and head, each split v_dim + 1 wide
    (the partial output and its log-sum-exp)."""
    want = (requests, heads, v_dim + 1)
    got = (attn_logits.shape[0], attn_logits.shape[1], attn_logits.shape[-1]) if attn_logits.dim() == 4 else None
    if got is None or got[0] < want[0] or got[1] < want[1] or got[2] < want[2]:
        raise OutOfBounds(
            f"decode_attention_cpu writes a split scratch of [{requests}, {heads}, splits, {v_dim + 1}] into attn_logits "
            f"of shape {tuple(attn_logits.shape)}"
        )


def install() -> bool:
    """Answer ``torch.ops.sgl_kernel.decode_attention_cpu`` with the torch kernel above where the
    installed sgl_kernel registers no such op; True when it did."""
    namespace: Any = torch.ops.sgl_kernel
    try:
        namespace.decode_attention_cpu  # noqa: B018 - the lookup is the test
        return False
    except (AttributeError, RuntimeError):
        namespace.decode_attention_cpu = decode_attention_cpu
        namespace.extend_attention_cpu = _extend_unmodelled
        return True


def _extend_unmodelled(*args: Any, **kwargs: Any) -> None:
    # The extend op takes the extend's lengths, offsets and masks besides what the decode kernel
    # takes: a call shaped as the decode kernel's (a decode handed to the wrong op) is one the op
    # refuses, the code's fault. Any other call is an extend sglfix does not model.
    if len(args) + len(kwargs) == len(inspect.signature(decode_attention_cpu).parameters):
        raise BrokenContract(
            "sgl_kernel.extend_attention_cpu handed the decode kernel's arguments (the op takes the extend's "
            "lengths and offsets too): the op refuses the call"
        )
    raise NotImplementedError("sglfix models sgl_kernel's decode_attention_cpu only (CPU graphs are decode-only)")
