"""FlashInfer's ``BatchMLAPagedAttentionWrapper`` (the absorbed-MLA paged kernel) as torch code, for
real sglang's FlashInfer-MLA and TRT-LLM-MLA backends where FlashInfer cannot run.

What FlashInfer's MLA kernel reads, and so what this one reads: the schedule its compiled module
builds on the host at ``plan`` (``_cached_module.plan``, also what sglang's sync-free re-plans call)
from ``qo_indptr``, ``kv_indptr`` and ``kv_len_arr`` in host memory; at run time the device
``kv_indices`` (pages) from the planned buffer, through raw memory. Request ``r``'s query rows are
``qo_indptr[r] .. qo_indptr[r + 1]``, its keys the first ``kv_len_arr[r]`` tokens of the pages
``kv_indices[kv_indptr[r] ..]``; causal aligns query row ``i`` of a ``q_len``-row request to
position ``kv_len - q_len + i``. Scores are ``q_nope . ckv + q_pe . kpe`` scaled by ``sm_scale``;
the output is the softmax over the same latent ``ckv`` rows (the absorbed value); the log-sum-exp is
base 2, as FlashInfer returns it.

The flat CSR ``plan`` (positional or keyword, sglang's form) is the one modelled; FlashInfer 0.7's
``MLAPlanMetadata`` form and its backends' other run contracts are refused by name.
"""

from __future__ import annotations

from typing import Any

import torch

from sglfix.harness.torchfi.attend import Batch, attend, host_int64

__all__ = ["BatchMLAPagedAttentionWrapper"]

_PLAN_ARGS = (
    "qo_indptr",
    "kv_indptr",
    "kv_indices",
    "kv_len_arr",
    "num_heads",
    "head_dim_ckv",
    "head_dim_kpe",
    "page_size",
    "causal",
    "sm_scale",
    "q_data_type",
    "kv_data_type",
)


class _MLAHostPlanner:
    """The compiled module's host planner: the schedule is the host arrays it is handed."""

    def __init__(self, wrapper: BatchMLAPagedAttentionWrapper) -> None:
        self._wrapper = wrapper

    def plan(self, *args: Any) -> tuple:
        # FlashInfer's order: the float, int and pinned workspaces, qo_indptr, kv_indptr,
        # kv_len_arr (host), num_heads, head_dim_ckv, causal; the heads and width come with q.
        qo_indptr, kv_indptr, kv_len_arr = args[3:6]
        causal = args[8]
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_len_arr", kv_len_arr)):
            if not torch.is_tensor(t) or t.device.type != "cpu":
                raise ValueError(f"the MLA host plan needs {name} in host memory")
        schedule = (host_int64(qo_indptr), host_int64(kv_indptr), host_int64(kv_len_arr), bool(causal))
        self._wrapper._schedule = schedule
        return schedule


class BatchMLAPagedAttentionWrapper:
    """``flashinfer.BatchMLAPagedAttentionWrapper``: absorbed MLA over a paged latent cache."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        use_cuda_graph: bool = False,
        qo_indptr: torch.Tensor | None = None,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
        kv_len_arr: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        if use_cuda_graph and any(t is None for t in (qo_indptr, kv_indptr, kv_indices, kv_len_arr)):
            raise ValueError("cuda graph mode needs qo_indptr, kv_indptr, kv_indices and kv_len_arr buffers")
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = torch.empty(0, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.empty(0, dtype=torch.uint8)
        self.device = float_workspace_buffer.device
        self._use_cuda_graph = use_cuda_graph
        self._qo_indptr_buf = qo_indptr
        self._kv_indptr_buf = kv_indptr
        self._kv_indices_buf = kv_indices
        self._kv_len_arr_buf = kv_len_arr
        self._backend = backend
        self._cached_module: _MLAHostPlanner | None = None
        self._schedule: tuple | None = None
        self._causal = False
        self._page_size = 1
        self._sm_scale: float | None = None

    def plan(self, *args: Any, **kwargs: Any) -> None:
        if "metadata" in kwargs:
            raise NotImplementedError("the MLA stand-in models the flat CSR plan sglang makes, not MLAPlanMetadata")
        if len(args) > len(_PLAN_ARGS):
            raise TypeError(f"plan() takes {len(_PLAN_ARGS)} positional arguments but {len(args)} were given")
        given = dict(zip(_PLAN_ARGS, args))
        for name, value in kwargs.items():
            if name in given:
                raise TypeError(f"plan() got multiple values for argument {name!r}")
            given[name] = value
        missing = [name for name in _PLAN_ARGS if given.get(name) is None]
        if missing:
            raise TypeError("plan() missing required arguments: " + ", ".join(missing))
        qo_indptr, kv_indptr, kv_indices, kv_len_arr = (
            given["qo_indptr"],
            given["kv_indptr"],
            given["kv_indices"],
            given["kv_len_arr"],
        )
        if self._use_cuda_graph:
            self._qo_indptr_buf.copy_(qo_indptr)  # type: ignore[union-attr]
            self._kv_indptr_buf.copy_(kv_indptr)  # type: ignore[union-attr]
            self._kv_indices_buf[: len(kv_indices)].copy_(kv_indices)  # type: ignore[index]
            self._kv_len_arr_buf.copy_(kv_len_arr)  # type: ignore[union-attr]
        else:
            self._qo_indptr_buf = qo_indptr.to(self.device)
            self._kv_indptr_buf = kv_indptr.to(self.device)
            self._kv_indices_buf = kv_indices.to(self.device)
            self._kv_len_arr_buf = kv_len_arr.to(self.device)
        self._causal = bool(given["causal"])
        self._page_size = int(given["page_size"])
        self._sm_scale = float(given["sm_scale"])
        if self._cached_module is None:
            self._cached_module = _MLAHostPlanner(self)
        self._cached_module.plan(
            self._float_workspace_buffer,
            self._int_workspace_buffer,
            self._pin_memory_int_workspace_buffer,
            qo_indptr.to("cpu"),
            kv_indptr.to("cpu"),
            kv_len_arr.to("cpu"),
            given["num_heads"],
            given["head_dim_ckv"],
            self._causal,
        )

    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        **options: Any,
    ) -> Any:
        unknown = set(options) - {"profiler_buffer", "kv_len", "page_table", "return_lse_base_on_e"}
        if unknown:
            raise TypeError(f"run() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        if self._schedule is None:
            raise RuntimeError("BatchMLAPagedAttentionWrapper.run() called before plan()")
        qo, kv_indptr, kv_len, causal = self._schedule
        if q_nope.shape[0] != int(qo[-1]):
            raise ValueError(f"q_nope has {q_nope.shape[0]} rows, the plan counted {int(qo[-1])}")
        # Absorbed MLA is attention with one KV head whose key is the latent row and its rope part
        # and whose value is the latent row: the stand-ins' one kernel computes it.
        page, d_ckv = self._page_size, ckv_cache.shape[-1]
        keys = torch.cat([ckv_cache, kpe_cache], dim=-1).reshape(-1, page, 1, d_ckv + kpe_cache.shape[-1])
        batch = Batch(
            rows=len(kv_len),
            qo_indptr=qo,
            kv_starts=kv_indptr[: len(kv_len)],
            kv_lens=kv_len,
            causal=causal,
            kv_indices=self._kv_indices_buf,
            page_size=page,
            sm_scale=self._sm_scale,
        )
        if out is None:
            out = torch.full((*q_nope.shape[:2], d_ckv), float("nan"), dtype=q_nope.dtype, device=q_nope.device)
        o, lse_out = attend(
            batch, torch.cat([q_nope, q_pe], dim=-1), keys, ckv_cache.reshape(-1, page, 1, d_ckv), out=out
        )
        if lse is not None:
            lse.copy_(lse_out)
        return (o, lse_out) if return_lse else o
