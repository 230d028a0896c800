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

import math
from typing import Any

import torch

from sglfix.harness.torchfi.attend import raw_entries

__all__ = ["BatchMLAPagedAttentionWrapper"]

_LOG2E = 1.0 / math.log(2.0)
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
        # kv_len_arr (host), num_heads, head_dim_ckv, causal.
        qo_indptr, kv_indptr, kv_len_arr, num_heads, head_dim_ckv, causal = args[3:9]
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_len_arr", kv_len_arr)):
            if not torch.is_tensor(t) or t.device.type != "cpu":
                raise ValueError(f"the MLA host plan needs {name} in host memory")
        schedule = (
            [int(x) for x in qo_indptr.tolist()],
            [int(x) for x in kv_indptr.tolist()],
            [int(x) for x in kv_len_arr.tolist()],
            int(num_heads),
            int(head_dim_ckv),
            bool(causal),
        )
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
        qo, kv_indptr, kv_len, num_heads, _head_dim_ckv, causal = self._schedule
        rows = q_nope.shape[0]
        if rows != qo[-1]:
            raise ValueError(f"q_nope has {rows} rows, the plan counted {qo[-1]}")
        page = self._page_size
        ckv = ckv_cache.reshape(-1, ckv_cache.shape[-1])
        kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])
        pages_needed = max((kv_indptr[r] + math.ceil(kv_len[r] / page) for r in range(len(kv_len))), default=0)
        indices = raw_entries(self._kv_indices_buf, pages_needed, name="kv_indices")  # type: ignore[arg-type]
        result = torch.zeros((rows, num_heads, ckv.shape[-1]), dtype=torch.float32, device=q_nope.device)
        lse_out = torch.full((rows, num_heads), -math.inf, dtype=torch.float32, device=q_nope.device)
        for r in range(len(kv_len)):
            q0, q1, k_len = qo[r], qo[r + 1], kv_len[r]
            if q1 == q0 or k_len == 0:
                continue
            n_pages = math.ceil(k_len / page)
            pages = indices[kv_indptr[r] : kv_indptr[r] + n_pages].to(torch.int64)
            slots = (pages[:, None] * page + torch.arange(page, device=pages.device)[None, :]).reshape(-1)[:k_len]
            keys_c, keys_p = ckv[slots].float(), kpe[slots].float()
            scores = torch.einsum("qhd,kd->qhk", q_nope[q0:q1].float(), keys_c)
            scores = (scores + torch.einsum("qhd,kd->qhk", q_pe[q0:q1].float(), keys_p)) * self._sm_scale
            if causal:
                q_len = q1 - q0
                pos = torch.arange(q_len, device=scores.device) + (k_len - q_len)
                visible = torch.arange(k_len, device=scores.device)[None, :] <= pos[:, None]
                scores = scores.masked_fill(~visible[:, None, :], -math.inf)
            row_lse = torch.logsumexp(scores, dim=-1)
            weights = torch.exp(scores - row_lse[..., None]).nan_to_num(0.0)
            result[q0:q1] = torch.einsum("qhk,kd->qhd", weights, keys_c)
            lse_out[q0:q1] = row_lse * _LOG2E
        o = result.to(q_nope.dtype)
        if out is not None:
            out.copy_(o)
            o = out
        if lse is not None:
            lse.copy_(lse_out)
        return (o, lse_out) if return_lse else o
