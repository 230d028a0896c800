"""The paged attention kernels the FlashInfer backends call, chosen by device.

On CUDA with ``flashinfer`` importable the backends get FlashInfer's own
``BatchMLAPagedAttentionWrapper`` (absorbed MLA over a latent cache) and
``BatchDecodeWithPagedKVCacheWrapper`` (GQA decode). Anywhere else they get torch stand-ins
with the same constructor / ``plan`` / ``run`` signatures the backends use, consuming exactly
the same metadata the same way, so that a metadata bug shows the same symptom on CPU:

- ``plan`` refuses what FlashInfer 0.7's ``plan`` refuses (MLA: inconsistent CSR offsets and
  lengths; graph mode: reserved buffers of the wrong size), keeps host copies of the offsets
  and lengths (as FlashInfer's host-side planner does) and only a *reference* to the device
  ``kv_indices``; in CUDA-graph mode it copies the metadata into the caller's reserved buffers,
  like FlashInfer's graph staging (the MLA fast re-plan, ``_cached_module.plan``, checks nothing);
- ``run`` reads ``kv_indices`` at run time, through raw memory from the buffer's first
  element on, for as many entries as the host plan says: a row that is too narrow is read
  past its logical end into whatever lies next in the same allocation, as the GPU kernel
  reads it. A read past the end of the allocation itself raises (on the GPU: an illegal
  address or garbage).

The stand-ins compute one padded, masked batch per call (no Python loop over requests).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

__all__ = [
    "flashinfer_available",
    "make_workspace_buffer",
    "on_device",
    "make_mla_paged_wrapper",
    "make_decode_wrapper",
    "TorchMLAPagedWrapper",
    "TorchDecodeWrapper",
]

# FlashInfer's float workspace (upstream's SGLANG_FLASHINFER_WORKSPACE_SIZE); the stand-ins
# need none.
FLASHINFER_WORKSPACE_BYTES = 384 * 1024 * 1024


def flashinfer_available(device: torch.device | str) -> bool:
    """FlashInfer's kernels run only on CUDA, and only where the package is installed."""
    if torch.device(device).type != "cuda":
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


def on_device(tensor: torch.Tensor, device: torch.device | str) -> bool:
    """Whether ``tensor`` lives on ``device``, an index-less ``cuda`` meaning the current GPU.
    Devices compared as given never match there (``torch.device("cuda") != torch.device("cuda:0")``),
    so a buffer kept for reuse would be made again by every backend that asks for it."""
    d = torch.device(device)
    if tensor.device.type != d.type:
        return False
    if d.index is None:
        return d.type != "cuda" or tensor.device.index == torch.cuda.current_device()
    return tensor.device.index == d.index


def make_workspace_buffer(device: torch.device | str) -> torch.Tensor:
    size = FLASHINFER_WORKSPACE_BYTES if flashinfer_available(device) else 16
    return torch.empty(size, dtype=torch.uint8, device=device)


def make_mla_paged_wrapper(workspace: torch.Tensor, **kwargs: Any):
    """``BatchMLAPagedAttentionWrapper(workspace, use_cuda_graph=..., qo_indptr=..., kv_indptr=...,
    kv_indices=..., kv_len_arr=..., backend=...)`` or its stand-in."""
    if flashinfer_available(workspace.device):
        from flashinfer import BatchMLAPagedAttentionWrapper

        return BatchMLAPagedAttentionWrapper(workspace, **kwargs)
    return TorchMLAPagedWrapper(workspace, **kwargs)


def make_decode_wrapper(workspace: torch.Tensor, layout: str, **kwargs: Any):
    """``BatchDecodeWithPagedKVCacheWrapper(workspace, layout, use_cuda_graph=..., use_tensor_cores=...,
    paged_kv_indptr_buffer=..., paged_kv_indices_buffer=..., paged_kv_last_page_len_buffer=...,
    backend=...)`` or its stand-in."""
    if flashinfer_available(workspace.device):
        from flashinfer import BatchDecodeWithPagedKVCacheWrapper

        return BatchDecodeWithPagedKVCacheWrapper(workspace, layout, **kwargs)
    return TorchDecodeWrapper(workspace, layout, **kwargs)


# ----------------------------------------------------------------------------- shared helpers


def _host(t: torch.Tensor) -> torch.Tensor:
    # A snapshot: FlashInfer's planner consumes the host values when plan() runs.
    return t.detach().to("cpu", torch.int64).clone()


def _check_int32(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must have dtype torch.int32, got {t.dtype}.")


def _check_csr(qo_indptr, kv_indptr, kv_indices, kv_len_arr, page_size: int) -> None:
    """FlashInfer's plan-time CSR checks (>= 0.7, for a batch of consistent shape): offsets start
    at 0 and never decrease, fit kv_indices, and count ceil(kv_len / page_size) pages each."""
    batch_size = qo_indptr.numel() - 1
    if kv_indptr.numel() != batch_size + 1 or kv_len_arr.numel() != batch_size:
        return
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        values = t.to("cpu", torch.int64)
        if int(values[0]) != 0:
            raise ValueError(f"{name} metadata must start at zero.")
        if bool((values[1:] < values[:-1]).any()):
            raise ValueError(f"{name} metadata must be nondecreasing.")
    kv_values = kv_indptr.to("cpu", torch.int64)
    if int(kv_values[-1]) > kv_indices.numel():
        raise ValueError(
            f"kv_indices metadata has {kv_indices.numel()} entries but kv_indptr[-1] is {int(kv_values[-1])}."
        )
    kv_lens = kv_len_arr.to("cpu", torch.int64)
    if bool((kv_lens < 0).any()):
        raise ValueError("kv_len_arr metadata must be nonnegative.")
    if not torch.equal((kv_lens + page_size - 1) // page_size, kv_values[1:] - kv_values[:-1]):
        raise ValueError("CSR metadata page counts in kv_indptr must equal ceil(kv_len_arr / page_size).")


def _stage(target: torch.Tensor, source: torch.Tensor, name: str, *, allow_larger: bool) -> None:
    """Graph mode: copy ``source`` into the caller's reserved buffer (a no-op when both are the
    same memory), refusing a buffer of the wrong size as FlashInfer does."""
    if (allow_larger and target.shape[0] < source.shape[0]) or (
        not allow_larger and target.shape != source.shape
    ):
        raise ValueError(
            f"CUDA graph reserved {name} buffer has insufficient or incompatible capacity "
            f"({tuple(target.shape)} for {tuple(source.shape)})."
        )
    target[: source.shape[0]].copy_(source)


def _read_indices(indices: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` entries of memory from ``indices``' first element on, as a kernel given its
    pointer reads them: past a clipped slice's end this is what lies next in the allocation."""
    available = indices.untyped_storage().nbytes() // indices.element_size() - indices.storage_offset()
    if count > available:
        raise RuntimeError(
            f"kv_indices read past the end of its allocation: the plan reads {count} entries from "
            f"the buffer's first element, only {available} exist there ({indices.numel()} in the tensor)"
        )
    return torch.as_strided(indices, (count,), (1,), indices.storage_offset())


def _gather_pages(
    indices: torch.Tensor,
    starts: torch.Tensor,
    kv_lens: torch.Tensor,
    page_size: int,
    num_pages: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per request ``b`` and token ``l < kv_lens[b]``: (page, offset in page, valid mask), each
    [B, Lmax]. Pages are read from ``indices[starts[b] + l // page_size]`` at call time."""
    device = indices.device
    lmax = int(kv_lens.max()) if kv_lens.numel() else 0
    pos = torch.arange(lmax, dtype=torch.int64)
    valid = pos[None, :] < kv_lens[:, None]
    slot = starts[:, None] + pos[None, :] // page_size
    count = int(slot[valid].max()) + 1 if bool(valid.any()) else 0
    flat = _read_indices(indices, count).to("cpu", torch.int64)
    pages = torch.zeros_like(slot)
    pages[valid] = flat[slot[valid]]
    bad = valid & ((pages < 0) | (pages >= num_pages))
    if bool(bad.any()):
        b, l = (int(x) for x in bad.nonzero()[0])
        raise RuntimeError(
            f"kv_indices[{int(slot[b, l])}] = {int(pages[b, l])} (request {b}, token {l}) is outside "
            f"the KV cache of {num_pages} pages"
        )
    offsets = (pos % page_size)[None, :].expand_as(pages)
    return pages.to(device), offsets.to(device), valid.to(device)


# ----------------------------------------------------------------------------- MLA


class _HostPlanModule:
    """What FlashInfer's compiled MLA module offers ``fast_mla_decode_plan``: ``plan`` from host
    arrays only (it never sees the device kv_indices)."""

    def __init__(self, wrapper: "TorchMLAPagedWrapper"):
        self._wrapper = wrapper

    def plan(
        self,
        float_workspace_buffer: torch.Tensor,
        int_workspace_buffer: torch.Tensor,
        pin_memory_int_workspace_buffer: torch.Tensor,
        qo_indptr_cpu: torch.Tensor,
        kv_indptr_cpu: torch.Tensor,
        kv_len_arr_cpu: torch.Tensor,
        num_heads: int,
        head_dim_ckv: int,
        causal: bool,
    ) -> tuple:
        w = self._wrapper
        w._host_qo_indptr = _host(qo_indptr_cpu)
        w._host_kv_indptr = _host(kv_indptr_cpu)
        w._host_kv_len = _host(kv_len_arr_cpu)
        w._num_heads = num_heads
        w._head_dim_ckv = head_dim_ckv
        w._causal = causal
        return (len(kv_len_arr_cpu), num_heads, head_dim_ckv, causal)


class TorchMLAPagedWrapper:
    """Stand-in for ``flashinfer.BatchMLAPagedAttentionWrapper`` (absorbed MLA, legacy flat CSR
    ``plan`` and split-tensor ``run``)."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        use_cuda_graph: bool = False,
        qo_indptr: Optional[torch.Tensor] = None,
        kv_indptr: Optional[torch.Tensor] = None,
        kv_indices: Optional[torch.Tensor] = None,
        kv_len_arr: Optional[torch.Tensor] = None,
        backend: str = "auto",
    ) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._use_cuda_graph = use_cuda_graph
        self._qo_indptr_buf = qo_indptr
        self._kv_indptr_buf = kv_indptr
        self._kv_indices_buf = kv_indices
        self._kv_len_arr_buf = kv_len_arr
        self._backend = backend
        # Mirrors of FlashInfer's planned state that fast_mla_decode_plan uses.
        self._int_workspace_buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
        self._pin_memory_int_workspace_buffer = torch.empty(0, dtype=torch.uint8)
        self._cached_module: Optional[_HostPlanModule] = None
        self._host_qo_indptr: Optional[torch.Tensor] = None

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_len_arr: torch.Tensor,
        num_heads: int,
        head_dim_ckv: int,
        head_dim_kpe: int,
        page_size: int,
        causal: bool,
        sm_scale: float,
        q_data_type: torch.dtype,
        kv_data_type: torch.dtype,
        use_profiler: bool = False,
    ) -> None:
        _check_int32(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr)
        if kv_indptr.numel() < kv_len_arr.numel() + 1:
            raise ValueError("kv_indptr needs one offset per request plus one.")
        _check_csr(qo_indptr, kv_indptr, kv_indices, kv_len_arr, page_size)
        if self._use_cuda_graph:
            for name, reserved in (("qo_indptr", self._qo_indptr_buf), ("kv_indptr", self._kv_indptr_buf),
                                   ("kv_indices", self._kv_indices_buf), ("kv_len_arr", self._kv_len_arr_buf)):
                if reserved is None:
                    raise ValueError(f"CUDA graph mode requires a reserved {name} buffer.")
            _stage(self._qo_indptr_buf, qo_indptr, "qo_indptr", allow_larger=False)
            _stage(self._kv_indptr_buf, kv_indptr, "kv_indptr", allow_larger=False)
            _stage(self._kv_indices_buf, kv_indices, "kv_indices", allow_larger=True)
            _stage(self._kv_len_arr_buf, kv_len_arr, "kv_len_arr", allow_larger=False)
        else:
            self._kv_indices_buf = kv_indices
        self._cached_module = _HostPlanModule(self)
        self._cached_module.plan(
            self._float_workspace_buffer,
            self._int_workspace_buffer,
            self._pin_memory_int_workspace_buffer,
            qo_indptr.cpu(),
            kv_indptr.cpu(),
            kv_len_arr.cpu(),
            num_heads,
            head_dim_ckv,
            causal,
        )
        self._head_dim_kpe = head_dim_kpe
        self._page_size = page_size
        self._sm_scale = sm_scale
        self._q_data_type = q_data_type
        self._kv_data_type = kv_data_type

    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: Optional[torch.Tensor] = None,
        lse: Optional[torch.Tensor] = None,
        return_lse: bool = False,
        **unused: Any,
    ) -> torch.Tensor:
        if self._host_qo_indptr is None:
            raise RuntimeError("BatchMLAPagedAttentionWrapper.run() called before plan().")
        if return_lse or lse is not None:
            raise NotImplementedError("the MLA stand-in does not return the log-sum-exp")
        qo_indptr, kv_indptr, kv_lens = self._host_qo_indptr, self._host_kv_indptr, self._host_kv_len
        num_req = kv_lens.numel()
        page_size = self._page_size
        ckv_cache = ckv_cache.reshape(-1, page_size, ckv_cache.shape[-1]) if ckv_cache.dim() == 2 else ckv_cache
        kpe_cache = kpe_cache.reshape(-1, page_size, kpe_cache.shape[-1]) if kpe_cache.dim() == 2 else kpe_cache
        if out is None:
            out = torch.empty_like(q_nope)
        if num_req == 0:
            return out
        device = q_nope.device

        q_lens = qo_indptr[1 : num_req + 1] - qo_indptr[:num_req]
        qmax = int(q_lens.max())
        rows = torch.arange(qmax, dtype=torch.int64)
        q_valid = rows[None, :] < q_lens[:, None]
        q_idx = torch.where(q_valid, qo_indptr[:num_req, None] + rows[None, :], 0)

        pages, offsets, kv_valid = _gather_pages(
            self._kv_indices_buf, kv_indptr[:num_req], kv_lens, page_size, ckv_cache.shape[0]
        )
        lmax = kv_valid.shape[1]
        ckv = ckv_cache[pages, offsets].float()  # [B, L, Dc]
        kpe = kpe_cache[pages, offsets].float()  # [B, L, Dr]
        q_idx_d, q_valid_d = q_idx.to(device), q_valid.to(device)
        qn = q_nope[q_idx_d].float()  # [B, Q, H, Dc]
        qp = q_pe[q_idx_d].float()
        scores = (torch.einsum("bqhd,bld->bhql", qn, ckv) + torch.einsum("bqhd,bld->bhql", qp, kpe)) * self._sm_scale
        visible = kv_valid[:, None, None, :].expand(num_req, 1, qmax, lmax)
        if self._causal:
            # Aligned to the end of the KV: row r of a q_len-row request sees kv_len - q_len + r + 1 tokens.
            limit = (kv_lens[:, None] - q_lens[:, None] + rows[None, :] + 1).to(device)  # [B, Q]
            visible = visible & (torch.arange(lmax, device=device)[None, None, :] < limit[:, :, None])[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        o = torch.einsum("bhql,bld->bqhd", probs, ckv)
        out[q_idx_d[q_valid_d]] = o[q_valid_d].to(out.dtype)
        return out


# ----------------------------------------------------------------------------- GQA decode


class TorchDecodeWrapper:
    """Stand-in for ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` (one query per request, NHD
    paged K/V, grouped heads)."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: Optional[torch.Tensor] = None,
        paged_kv_indices_buffer: Optional[torch.Tensor] = None,
        paged_kv_last_page_len_buffer: Optional[torch.Tensor] = None,
        backend: str = "auto",
        jit_args: Optional[Sequence[Any]] = None,
    ) -> None:
        if kv_layout != "NHD":
            raise NotImplementedError("the decode stand-in reads NHD caches only")
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        if use_cuda_graph:
            for name, buf in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                              ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                              ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)):
                if not torch.is_tensor(buf):
                    raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode")
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:
                raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")
        else:
            self._fixed_batch_size = 0
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._use_cuda_graph = use_cuda_graph
        self._use_tensor_cores = use_tensor_cores
        self._backend = backend
        self._host_indptr: Optional[torch.Tensor] = None
        self._sm_scale: Optional[float] = None
        self._logits_soft_cap: Optional[float] = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        data_type: Any = None,
        sm_scale: Optional[float] = None,
        non_blocking: bool = True,
        **unused: Any,
    ) -> None:
        batch_size = len(last_page_len)
        if self._use_cuda_graph:
            if batch_size != self._fixed_batch_size:
                raise ValueError(
                    f"The batch size should be fixed in cudagraph mode, the runtime batch size {batch_size} "
                    f"mismatches the batch size set during initialization {self._fixed_batch_size}"
                )
            if len(indices) > len(self._paged_kv_indices_buf):
                raise ValueError("The size of indices should be less than or equal to the allocated buffer")
            self._paged_kv_indptr_buf.copy_(indptr)
            self._paged_kv_last_page_len_buf.copy_(last_page_len)
            self._paged_kv_indices_buf[: len(indices)].copy_(indices)
        else:
            self._paged_kv_indptr_buf = indptr
            self._paged_kv_indices_buf = indices
            self._paged_kv_last_page_len_buf = last_page_len
        self._host_indptr = _host(indptr)[: batch_size + 1]
        self._host_last_page_len = _host(last_page_len)[:batch_size]
        self._batch_size = batch_size
        self._num_qo_heads = num_qo_heads
        self._num_kv_heads = num_kv_heads
        self._head_dim = head_dim
        self._page_size = page_size
        self._window_left = window_left
        if logits_soft_cap is not None:
            self._logits_soft_cap = logits_soft_cap
        if sm_scale is not None:
            self._sm_scale = sm_scale

    begin_forward = plan

    def forward(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        pos_encoding_mode: str = "NONE",
        q_scale: Optional[float] = None,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        window_left: int = -1,
        logits_soft_cap: Optional[float] = None,
        sm_scale: Optional[float] = None,
        rope_scale: Optional[float] = None,
        rope_theta: Optional[float] = None,
    ) -> torch.Tensor:
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        *args: Any,
        q_scale: Optional[float] = None,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        out: Optional[torch.Tensor] = None,
        lse: Optional[torch.Tensor] = None,
        return_lse: bool = False,
        **unused: Any,
    ) -> torch.Tensor:
        if self._host_indptr is None:
            raise RuntimeError("BatchDecodeWithPagedKVCacheWrapper.run() called before plan().")
        if return_lse or lse is not None:
            raise NotImplementedError("the decode stand-in does not return the log-sum-exp")
        k_cache, v_cache = paged_kv_cache if isinstance(paged_kv_cache, tuple) else paged_kv_cache.unbind(1)
        # FlashInfer reads a 3-D NHD cache as pages of one token.
        if k_cache.dim() == 3:
            k_cache, v_cache = k_cache.unsqueeze(-3), v_cache.unsqueeze(-3)
        page_size = k_cache.shape[1]
        bs = self._batch_size
        indptr = self._host_indptr
        num_pages = indptr[1:] - indptr[:-1]
        kv_lens = torch.where(num_pages > 0, (num_pages - 1) * page_size + self._host_last_page_len, 0)
        pages, offsets, valid = _gather_pages(self._paged_kv_indices_buf, indptr[:bs], kv_lens, page_size,
                                              k_cache.shape[0])
        k = k_cache[pages, offsets].float()  # [B, L, Hkv, D]
        v = v_cache[pages, offsets].float()
        hkv, dim = k.shape[2], k.shape[3]
        group = q.shape[1] // hkv
        qg = q[:bs].float().view(bs, hkv, group, dim)
        scale = self._sm_scale if self._sm_scale is not None else 1.0 / math.sqrt(dim)
        scores = torch.einsum("bkgd,blkd->bkgl", qg, k) * scale
        if k_scale is not None:
            scores = scores * k_scale
        cap = self._logits_soft_cap
        if cap is not None and cap > 0:
            scores = cap * torch.tanh(scores / cap)
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        o = torch.einsum("bkgl,blkd->bkgd", probs, v)
        if v_scale is not None:
            o = o * v_scale
        if out is None:
            out = torch.empty_like(q)
        out[:bs] = o.reshape(bs, hkv * group, dim).to(out.dtype)
        return out
