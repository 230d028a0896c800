"""The ground truth of a FlashInfer multi-step draft's attention on real sglang (CUDA + FlashInfer),
sglfix's judge: seeded prefix K/V per request, each (request, branch, step)'s draft K/V and the
attention steps' queries; written at the slot ground truth's slots for the real step backends to
attend (``attend_steps``), and the reference computed from the truth alone: branch (b, j) at step
i attends b's prefix, then its own draft tokens of steps 0..i."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglfix.harness.codefault import BrokenContract

__all__ = ["attend_steps", "draft_layer", "draft_reference", "draft_truth"]


def draft_truth(case: Any, scenario_seed: int, *, mla: bool) -> SimpleNamespace:
    """Ground truth for the real forward: prefix K/V per request, each (request, branch, step)'s
    draft K/V, and the queries of the attention steps; in the model dtype, on the device."""
    import torch

    model = case.runner.model_config
    gen = torch.Generator().manual_seed(int(scenario_seed) + 7919)
    heads = model.num_attention_heads
    if mla:
        dim, dim_v, kv_heads = model.kv_lora_rank + model.qk_rope_head_dim, model.kv_lora_rank, 1
    else:
        dim, dim_v, kv_heads = model.head_dim, model.head_dim, model.num_key_value_heads
    slots = case.slots
    bs, topk, steps = slots.batch_size, slots.topk, slots.num_steps

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(case.dtype).to(case.device)

    prefix_k = [rand(p, kv_heads, dim) for p in slots.prefix_lens]
    draft_k = rand(bs, topk, steps, kv_heads, dim)
    if mla:  # the latent: values are its first kv_lora_rank entries
        prefix_v = [k[..., :dim_v] for k in prefix_k]
        draft_v = draft_k[..., :dim_v]
    else:
        prefix_v = [rand(p, kv_heads, dim) for p in slots.prefix_lens]
        draft_v = rand(bs, topk, steps, kv_heads, dim)
    q = rand(bs, topk, max(steps - 1, 1), heads, dim)
    return SimpleNamespace(
        prefix_k=prefix_k,
        prefix_v=prefix_v,
        draft_k=draft_k,
        draft_v=draft_v,
        q=q,
        heads=heads,
        kv_heads=kv_heads,
        dim=dim,
        dim_v=dim_v,
        scale=dim**-0.5,
        # A sliding-window layer: the query at position p sees the keys at p - window .. p.
        window=getattr(case.kit_case, "sliding_window_size", None),
    )


def draft_layer(truth: SimpleNamespace) -> Any:
    from sglang.srt.layers.radix_attention import RadixAttention

    return RadixAttention(
        num_heads=truth.heads,
        head_dim=truth.dim,
        scaling=truth.scale,
        num_kv_heads=truth.kv_heads,
        layer_id=0,
        v_head_dim=truth.dim_v,
        sliding_window_size=-1 if truth.window is None else truth.window,
    )


def _write(pool: Any, layer: Any, loc: Any, k: Any, v: Any, *, mla: bool) -> None:
    # An MLA pool stores the whole latent + rope row its set_kv_buffer is handed (the value is
    # its latent part); its set_mla_kv_buffer, a Triton kernel in older releases, is the model's
    # write path, not the ground truth's.
    pool.set_kv_buffer(layer, loc, k, v)


def attend_steps(case: Any, backend: Any, view: Any, *, mla: bool) -> Any:
    """Every attention step through its real step backend over the metadata just built: the
    prefix K/V and each step's draft K/V written at their slots, the step's queries (one per
    branch; padded rows zero) attended; output packed (request, branch, step)."""
    import torch
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    truth = case.truth = draft_truth(case, case.seed, mla=mla)
    layer = draft_layer(truth)
    pool = case.runner.token_to_kv_pool
    slots = case.slots
    bs, topk, steps = slots.batch_size, slots.topk, slots.num_steps
    dev = case.device
    loc = torch.tensor([s for row in slots.prefix for s in row], dtype=torch.int64, device=dev)
    if loc.numel():
        _write(pool, layer, loc, torch.cat(truth.prefix_k), torch.cat(truth.prefix_v), mla=mla)
    draft_loc = torch.tensor(slots.draft, dtype=torch.int64, device=dev)  # [bs, topk, steps]
    _write(
        pool,
        layer,
        draft_loc.reshape(-1),
        truth.draft_k.reshape(bs * topk * steps, truth.kv_heads, -1),
        truth.draft_v.reshape(bs * topk * steps, truth.kv_heads, -1),
        mla=mla,
    )
    rows = view.batch_size * topk
    outs = []
    have = len(backend.attn_backends)
    if have < steps - 1:  # the engine's draft loop indexes one step backend per step
        raise BrokenContract(f"the multi-step draft backend has {have} step backend(s) for {steps - 1} draft step(s)")
    for i in range(steps - 1):
        q = torch.zeros(rows, truth.heads, truth.dim, dtype=case.dtype, device=dev)
        q[: bs * topk] = truth.q[:, :, i].reshape(bs * topk, truth.heads, truth.dim)
        step_view = SimpleNamespace(**vars(view))
        step_view.out_cache_loc = torch.zeros(rows, dtype=torch.int64, device=dev)
        step_view.out_cache_loc[: bs * topk] = draft_loc[:, :, i].reshape(-1)
        step = backend.attn_backends[i]
        with torch.no_grad(), forward_context(ForwardContext(attn_backend=step)):
            out = step.forward_decode(q.reshape(rows, -1), None, None, layer, step_view, save_kv_cache=False)
        outs.append(out.reshape(rows, truth.heads, truth.dim_v)[: bs * topk])
    # [bs * topk, steps - 1, H, Dv] -> packed in (request, branch, step) order
    case.output = torch.stack(outs, dim=1).reshape(-1, truth.heads, truth.dim_v)
    return case.output


def draft_reference(case: Any) -> tuple[Any, Any]:
    """Branch (b, j) at step i attends b's prefix, then its own draft tokens of steps 0..i; on a
    sliding-window layer only those within the window of its position."""
    import torch

    from sglfix.harness.reference import reference_attention

    truth = case.truth
    slots = case.slots
    bs, topk, steps = slots.batch_size, slots.topk, slots.num_steps
    nq = steps - 1
    longest = max(slots.prefix_lens) + nq
    rows = bs * topk
    dev = truth.q.device
    k_pad = torch.zeros(rows, longest, truth.kv_heads, truth.dim, dtype=truth.q.dtype, device=dev)
    v_pad = torch.zeros(rows, longest, truth.kv_heads, truth.dim_v, dtype=truth.q.dtype, device=dev)
    mask = torch.zeros(rows, nq, longest, dtype=torch.bool, device=dev)
    for b, p in enumerate(slots.prefix_lens):
        for j in range(topk):
            r = b * topk + j
            k_pad[r, :p], v_pad[r, :p] = truth.prefix_k[b], truth.prefix_v[b]
            k_pad[r, p : p + nq], v_pad[r, p : p + nq] = truth.draft_k[b, j, :nq], truth.draft_v[b, j, :nq]
            for i in range(nq):
                # Step i's query is the depth-i draft token, at position p + i.
                oldest = 0 if truth.window is None else max(0, p + i - truth.window)
                mask[r, i, oldest : p + i + 1] = True
    q_pad = truth.q[:, :, :nq].reshape(rows, nq, truth.heads, truth.dim)
    ref = reference_attention(q_pad=q_pad, k_pad=k_pad, v_pad=v_pad, mask=mask, scale=truth.scale)
    return ref, torch.ones(rows, nq, dtype=torch.bool, device=dev)
