"""Torch stand-ins for the FlashInfer 0.7 wrappers sglang's FlashInfer backend drives, with the
constructor, ``plan`` / ``begin_forward``, ``forward`` / ``run`` / ``forward_return_lse`` signatures
and the private state sglang's own fast re-plans (``fast_prefill_plan``) reach into.

``plan`` does what FlashInfer's does with the metadata: refuses what it refuses (a batch size other
than the graph's, indices longer than the reserved buffer, a graph re-plan with more rows than the
first), in CUDA-graph mode copies the metadata into the caller's reserved buffers (FlashInfer's
graph staging), otherwise keeps references to the caller's device tensors, packs a boolean custom
mask per request (``segment_packbits``, little bit order, at ``qo_len * kv_len`` per request), keeps
the multi-item scoring arrays (``prefix_len_ptr``, ``token_pos_in_items_ptr`` and its stride,
``max_item_len_ptr``) by reference, and hands the host copies of the offsets to its planner
(``_cached_module.plan``), which fixes the batch the launch covers. ``fast_decode_plan`` is FlashInfer's: in graph mode it copies nothing (the
caller wrote the buffers), and its host offsets may come from ``global_override_indptr_cpu``.

``run`` computes ``sglfix.harness.torchfi.attend`` over the buffers as they are at run time.
"""

from __future__ import annotations

from typing import Any

import torch

from sglfix.harness.torchfi.attend import Batch, attend, host_int64

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "fast_decode_plan",
    "merge_state",
    "segment_packbits",
]


def segment_packbits(
    x: torch.Tensor, indptr: torch.Tensor, bitorder: str = "little"
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's ``segment_packbits``: each segment ``x[indptr[i]:indptr[i+1]]`` packed into
    ``ceil(len / 8)`` bytes of its own."""
    bounds = host_int64(indptr)
    lengths = bounds[1:] - bounds[:-1]
    packed_lengths = (lengths + 7) // 8
    new_indptr = torch.zeros_like(bounds)
    new_indptr[1:] = torch.cumsum(packed_lengths, 0)
    bits = x.detach().to("cpu", torch.bool)
    out = torch.zeros(int(new_indptr[-1]), dtype=torch.uint8)
    weights = (2 ** torch.arange(8, dtype=torch.int64)) if bitorder == "little" else (2 ** torch.arange(7, -1, -1))
    for i in range(lengths.numel()):
        seg = bits[int(bounds[i]) : int(bounds[i + 1])].to(torch.int64)
        seg = torch.nn.functional.pad(seg, (0, int(packed_lengths[i]) * 8 - seg.numel()))
        out[int(new_indptr[i]) : int(new_indptr[i + 1])] = (seg.view(-1, 8) * weights).sum(1).to(torch.uint8)
    return out.to(x.device), new_indptr.to(device=indptr.device, dtype=indptr.dtype)


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor):
    """FlashInfer's ``merge_state``: two partial attentions and their log2-sum-exp merged."""
    s_a, s_b = s_a.float(), s_b.float()
    top = torch.maximum(s_a, s_b)
    top = torch.where(torch.isinf(top) & (top < 0), 0.0, top)
    w_a, w_b = torch.exp2(s_a - top), torch.exp2(s_b - top)
    total = w_a + w_b
    v = (v_a.float() * w_a[..., None] + v_b.float() * w_b[..., None]) / torch.where(total > 0, total, 1.0)[..., None]
    return v.to(v_a.dtype), torch.log2(total) + top


# What FlashInfer's forward methods take besides the operands and ``causal``.
_FORWARD_OPTIONS = frozenset(
    {
        "pos_encoding_mode",
        "use_fp16_qk_reduction",
        "q_scale",
        "k_scale",
        "v_scale",
        "window_left",
        "logits_soft_cap",
        "sm_scale",
        "rope_scale",
        "rope_theta",
    }
)


_DECODE_TOO_LONG = "The size of indices should be less than or equal to the allocated buffer"


def _kv_lens(indptr: torch.Tensor, last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    pages = indptr[1:] - indptr[:-1]
    return torch.where(pages > 0, (pages - 1) * page_size + last_page_len, 0)


def _tensor(name: str, value: Any) -> torch.Tensor:
    if not torch.is_tensor(value):
        raise ValueError(f"{name} should be a torch.Tensor in cuda graph mode")
    return value


class _HostPlanner:
    """What FlashInfer's compiled module offers a re-plan: ``plan`` from host arrays only. The
    schedule it returns fixes how many requests the launch covers."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper

    def plan(self, *args: Any) -> tuple:
        # Prefill-style: (fws, iws, pws, qo_indptr, kv_indptr, kv_lens, total_rows, batch_size, ...);
        # decode: (fws, iws, pws, indptr, batch_size, ...).
        rows = int(args[7]) if torch.is_tensor(args[4]) else int(args[4])
        self._wrapper._planned_rows = rows
        return ("torch", rows)


class _Common:
    def _init_common(self, float_workspace_buffer: torch.Tensor, kv_layout: str, use_cuda_graph: bool, backend: str):
        if kv_layout != "NHD":
            raise NotImplementedError("the FlashInfer stand-ins read NHD caches only")
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._int_workspace_buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
        self._pin_memory_int_workspace_buffer = torch.empty(0, dtype=torch.uint8)
        self._use_cuda_graph = use_cuda_graph
        self._backend = "fa2" if backend == "auto" else backend
        self._cached_module: _HostPlanner | None = None
        self._plan_info: Any = None
        self._planned_rows = 0
        self._causal = False
        self._window_left = -1
        self._logits_soft_cap: float | None = None
        self._sm_scale: float | None = None
        self._block_tables = None
        self._qo_indptr_last = 0
        # What the kernel variant a full plan() picked was compiled with: FlashInfer selects its JIT
        # module by window_left >= 0 and logits_soft_cap > 0 *at plan time*; a window or a cap
        # given only at run time is not applied by a variant compiled without it.
        self._compiled_window = False
        self._compiled_soft_cap = False

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def _set_run_options(self, **options: Any) -> None:
        for key in ("causal", "window_left", "logits_soft_cap", "sm_scale"):
            if key in options:
                setattr(self, f"_{key}", options[key])

    def _select_variant(self, window_left: int, logits_soft_cap: float | None) -> None:
        self._compiled_window = window_left >= 0
        self._compiled_soft_cap = logits_soft_cap is not None and logits_soft_cap > 0

    def _scaled(self, batch: Batch, k_scale: float | None, v_scale: float | None) -> Batch:
        """The launch's scalars and window, as the compiled variant applies them."""
        batch.sm_scale = self._sm_scale
        batch.logits_soft_cap = self._logits_soft_cap if self._compiled_soft_cap else None
        batch.window_left = self._window_left if self._compiled_window else -1
        batch.k_scale, batch.v_scale = k_scale, v_scale
        return batch

    def _forward(self, operands: tuple, options: dict, *, causal: bool | None = None, return_lse: bool = False):
        """FlashInfer's ``forward`` / ``forward_return_lse`` (sglang calls them with keywords): the
        run options are set on the wrapper, then ``run`` (a window or a cap given here applies
        only where the plan compiled one in)."""
        unknown = set(options) - _FORWARD_OPTIONS
        if unknown:
            raise TypeError(f"forward() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        self._set_run_options(
            window_left=options.get("window_left", -1),
            logits_soft_cap=options.get("logits_soft_cap"),
            sm_scale=options.get("sm_scale"),
            **({} if causal is None else {"causal": causal}),
        )
        scales = {key: options[key] for key in ("k_scale", "v_scale") if key in options}
        if return_lse:
            scales["return_lse"] = True
        return self.run(*operands, **scales)

    def _plan_on_host(self, *args: Any) -> None:
        """The planner's host-side schedule (the module comes with the first plan)."""
        if self._cached_module is None:
            self._cached_module = _HostPlanner(self)
        self._plan_info = self._cached_module.plan(*args)

    def _check_graph_batch(self, batch_size: int, indices: torch.Tensor, *, too_long: str) -> None:
        """FlashInfer's graph-mode refusals: another batch size than the graph's, indices longer
        than the reserved buffer (``too_long``: the wrapper's own words)."""
        if batch_size != self._fixed_batch_size:
            raise ValueError(
                f"The batch size should be fixed in cudagraph mode, the runtime batch size {batch_size} "
                f"mismatches the batch size set during initialization {self._fixed_batch_size}"
            )
        if len(indices) > len(self._paged_kv_indices_buf):  # type: ignore[attr-defined]
            raise ValueError(too_long)

    def _require_plan(self, what: str) -> None:
        if self._plan_info is None:
            raise RuntimeError(f"{what}.run() called before plan()")

    def _check_rows(self, q: torch.Tensor) -> None:
        """FlashInfer's prefill run checks the query against the rows the plan counted (on the host)."""
        if q.size(0) != self._qo_indptr_last:
            raise ValueError(
                f"q.shape[0] ({q.size(0)}) does not match qo_indptr[-1] ({self._qo_indptr_last}). For ragged "
                "prefill, q must have shape [total_tokens, num_heads, head_dim] where total_tokens = qo_indptr[-1]."
            )


class BatchDecodeWithPagedKVCacheWrapper(_Common):
    """``flashinfer.BatchDecodeWithPagedKVCacheWrapper``: one query row per request."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: Any = None,
        jit_kwargs: Any = None,
    ) -> None:
        self._init_common(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        if use_cuda_graph:
            _tensor("paged_kv_indptr_buffer", paged_kv_indptr_buffer)
            _tensor("paged_kv_indices_buffer", paged_kv_indices_buffer)
            last = _tensor("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)
            self._fixed_batch_size = len(last)
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:  # type: ignore[arg-type]
                raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")
        else:
            self._fixed_batch_size = 0
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._use_tensor_cores = use_tensor_cores
        self._page_size = 1

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
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        data_type: Any = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        non_blocking: bool = True,
        **unused: Any,
    ) -> None:
        batch_size = len(last_page_len)
        if self.is_cuda_graph_enabled:
            self._check_graph_batch(batch_size, indices, too_long=_DECODE_TOO_LONG)
            self._paged_kv_indptr_buf.copy_(indptr)  # type: ignore[union-attr]
            self._paged_kv_last_page_len_buf.copy_(last_page_len)  # type: ignore[union-attr]
            self._paged_kv_indices_buf[: len(indices)].copy_(indices)  # type: ignore[index]
        else:
            self._paged_kv_indptr_buf = indptr.to(self.device)
            self._paged_kv_indices_buf = indices.to(self.device)
            self._paged_kv_last_page_len_buf = last_page_len.to(self.device)
        self._select_variant(window_left, logits_soft_cap)
        self._finish_plan(indptr.to("cpu"), batch_size, page_size, window_left, logits_soft_cap, sm_scale)

    begin_forward = plan

    def _finish_plan(self, indptr_host, batch_size, page_size, window_left, logits_soft_cap, sm_scale) -> None:
        ws = (self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer)
        self._plan_on_host(*ws, indptr_host, batch_size)
        self._page_size = page_size
        self._set_run_options(window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale)

    def forward(self, q: torch.Tensor, paged_kv_cache: Any, **options: Any) -> torch.Tensor:
        return self._forward((q, paged_kv_cache), options)

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        *args: Any,
        out: torch.Tensor | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        **unused: Any,
    ) -> torch.Tensor:
        self._require_plan("BatchDecodeWithPagedKVCacheWrapper")
        rows = self._planned_rows
        indptr = host_int64(self._paged_kv_indptr_buf[: rows + 1])  # type: ignore[index]
        last = host_int64(self._paged_kv_last_page_len_buf[:rows])  # type: ignore[index]
        batch = Batch(
            rows=rows,
            qo_indptr=torch.arange(rows + 1, dtype=torch.int64),
            kv_starts=indptr[:rows],
            kv_lens=_kv_lens(indptr, last, self._page_size),
            causal=False,
            kv_indices=self._paged_kv_indices_buf,
            page_size=self._page_size,
        )
        k_cache, v_cache = paged_kv_cache if isinstance(paged_kv_cache, (tuple, list)) else paged_kv_cache.unbind(1)
        o, _ = attend(self._scaled(batch, k_scale, v_scale), q, k_cache, v_cache, out=out)
        return o


def fast_decode_plan(
    self: BatchDecodeWithPagedKVCacheWrapper,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    pos_encoding_mode: str = "NONE",
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    q_data_type: Any = None,
    kv_data_type: Any = None,
    data_type: Any = None,
    sm_scale: float | None = None,
    rope_scale: float | None = None,
    rope_theta: float | None = None,
    non_blocking: bool = True,
    fixed_split_size: int | None = None,
    disable_split_kv: bool = False,
    q_len_per_req: int = 1,
    global_override_indptr_cpu: torch.Tensor | None = None,
) -> None:
    """FlashInfer's ``fast_decode_plan``: no copy into the graph buffers (the caller wrote them),
    host offsets from ``global_override_indptr_cpu`` when given; needs a prior ``plan``."""
    batch_size = len(last_page_len)
    if self.is_cuda_graph_enabled:
        self._check_graph_batch(batch_size, indices, too_long=_DECODE_TOO_LONG)
    else:
        self._paged_kv_indptr_buf = indptr
        self._paged_kv_indices_buf = indices
        self._paged_kv_last_page_len_buf = last_page_len
    if self._cached_module is None:
        raise RuntimeError("Error in standard plan: fast_decode_plan needs a prior plan() (no _cached_module)")
    host = global_override_indptr_cpu if global_override_indptr_cpu is not None else indptr.cpu()
    self._finish_plan(host, batch_size, page_size, window_left, logits_soft_cap, sm_scale)


class BatchPrefillWithPagedKVCacheWrapper(_Common):
    """``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` (FA2): query rows per request against the
    paged cache, causal, windowed or under a packed custom mask."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        paged_kv_indptr_buf: torch.Tensor | None = None,
        paged_kv_indices_buf: torch.Tensor | None = None,
        paged_kv_last_page_len_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: Any = None,
        jit_kwargs: Any = None,
        variant_owns_mask: bool = False,
    ) -> None:
        self._init_common(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        if use_cuda_graph:
            qo = _tensor("qo_indptr_buf", qo_indptr_buf)
            _tensor("paged_kv_indptr_buf", paged_kv_indptr_buf)
            _tensor("paged_kv_indices_buf", paged_kv_indices_buf)
            _tensor("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf)
            self._fixed_batch_size = len(qo) - 1
            if len(paged_kv_indptr_buf) != self._fixed_batch_size + 1:  # type: ignore[arg-type]
                raise ValueError("The length of paged_kv_indptr_buf should be batch_size + 1.")
            if len(paged_kv_last_page_len_buf) != self._fixed_batch_size:  # type: ignore[arg-type]
                raise ValueError("The length of paged_kv_last_page_len_buf should be batch_size.")
        else:
            self._fixed_batch_size = 0
        self._qo_indptr_buf = qo_indptr_buf
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        self._custom_mask_buf = custom_mask_buf
        self._mask_indptr_buf = mask_indptr_buf
        self._max_total_num_rows: int | None = None
        self._page_size = 1
        self._prefix_len_ptr: torch.Tensor | None = None
        self._token_pos_in_items_ptr: torch.Tensor | None = None
        self._token_pos_in_items_len = 0
        self._max_item_len_ptr: torch.Tensor | None = None

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        o_data_type: Any = None,
        non_blocking: bool = True,
        prefix_len_ptr: torch.Tensor | None = None,
        token_pos_in_items_ptr: torch.Tensor | None = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: torch.Tensor | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
        **unused: Any,
    ) -> None:
        batch_size = len(qo_indptr) - 1
        # Multi-item scoring: FlashInfer keeps the four by reference, on every plan (None clears
        # them), and its run selects MaskMode::kMultiItemScoring whenever prefix_len_ptr is set.
        self._prefix_len_ptr = prefix_len_ptr
        self._token_pos_in_items_ptr = token_pos_in_items_ptr
        self._token_pos_in_items_len = token_pos_in_items_len
        self._max_item_len_ptr = max_item_len_ptr
        mask_indptr = None
        if custom_mask is not None or packed_custom_mask is not None:
            lengths = _kv_lens(paged_kv_indptr, paged_kv_last_page_len, page_size)
            mask_indptr = torch.zeros_like(qo_indptr)
            mask_indptr[1:] = torch.cumsum((qo_indptr[1:] - qo_indptr[:-1]) * lengths, 0)
        if packed_custom_mask is None and custom_mask is not None:
            packed_custom_mask, mask_indptr = segment_packbits(custom_mask.contiguous().view(-1), mask_indptr)
        qo_host = qo_indptr.to("cpu")
        total_rows = int(qo_host[-1])
        self._qo_indptr_last = total_rows
        if self.is_cuda_graph_enabled:
            if self._max_total_num_rows is None:
                self._max_total_num_rows = total_rows
            elif total_rows > self._max_total_num_rows:
                raise ValueError(
                    f"qo_indptr[-1] ({total_rows}) exceeds the maximum total number of rows "
                    f"({self._max_total_num_rows}) of the first plan in cuda graph mode"
                )
            self._check_graph_batch(
                batch_size,
                paged_kv_indices,
                too_long="The length of paged_kv_indices exceeds the allocated buffer size.",
            )
            self._qo_indptr_buf.copy_(qo_indptr)  # type: ignore[union-attr]
            self._paged_kv_indptr_buf.copy_(paged_kv_indptr)  # type: ignore[union-attr]
            self._paged_kv_last_page_len_buf.copy_(paged_kv_last_page_len)  # type: ignore[union-attr]
            self._paged_kv_indices_buf[: len(paged_kv_indices)].copy_(paged_kv_indices)  # type: ignore[index]
            if packed_custom_mask is not None:
                _tensor("custom_mask_buf", self._custom_mask_buf)
                _tensor("mask_indptr_buf", self._mask_indptr_buf)
                self._custom_mask_buf[: len(packed_custom_mask)].copy_(packed_custom_mask)  # type: ignore[index]
                self._mask_indptr_buf.copy_(mask_indptr)  # type: ignore[union-attr]
        else:
            self._qo_indptr_buf = qo_indptr.to(self.device)
            self._paged_kv_indptr_buf = paged_kv_indptr.to(self.device)
            self._paged_kv_indices_buf = paged_kv_indices.to(self.device)
            self._paged_kv_last_page_len_buf = paged_kv_last_page_len.to(self.device)
            if packed_custom_mask is not None:
                self._custom_mask_buf = packed_custom_mask.to(self.device)
                self._mask_indptr_buf = mask_indptr.to(self.device)  # type: ignore[union-attr]
            else:
                self._custom_mask_buf = None
                self._mask_indptr_buf = None
        kv_host = paged_kv_indptr.to("cpu")
        lens_host = _kv_lens(host_int64(kv_host), host_int64(paged_kv_last_page_len), page_size)
        self._plan_on_host(
            self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer,
            qo_host, kv_host, lens_host, self._max_total_num_rows or total_rows, batch_size,
            num_qo_heads, num_kv_heads, page_size, self.is_cuda_graph_enabled, head_dim_qk,
            head_dim_vo or head_dim_qk, causal, window_left, -1, disable_split_kv, 0, 0,
        )  # fmt: skip
        self._page_size = page_size
        self._select_variant(window_left, logits_soft_cap)
        self._set_run_options(
            causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale
        )

    begin_forward = plan

    def forward(self, q: torch.Tensor, paged_kv_cache: Any, causal: bool = False, **options: Any) -> torch.Tensor:
        return self._forward((q, paged_kv_cache), options, causal=causal)

    def forward_return_lse(self, q: torch.Tensor, paged_kv_cache: Any, causal: bool = False, **options: Any):
        return self._forward((q, paged_kv_cache), options, causal=causal, return_lse=True)

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: Any,
        *args: Any,
        k_scale: float | None = None,
        v_scale: float | None = None,
        out: torch.Tensor | None = None,
        return_lse: bool = False,
        **unused: Any,
    ):
        self._require_plan("BatchPrefillWithPagedKVCacheWrapper")
        self._check_rows(q)
        rows = self._planned_rows
        indptr = host_int64(self._paged_kv_indptr_buf[: rows + 1])  # type: ignore[index]
        last = host_int64(self._paged_kv_last_page_len_buf[:rows])  # type: ignore[index]
        masked = self._custom_mask_buf is not None
        batch = Batch(
            rows=rows,
            qo_indptr=host_int64(self._qo_indptr_buf[: rows + 1]),  # type: ignore[index]
            kv_starts=indptr[:rows],
            kv_lens=_kv_lens(indptr, last, self._page_size),
            causal=self._causal,
            kv_indices=self._paged_kv_indices_buf,
            page_size=self._page_size,
            mask=self._custom_mask_buf if masked else None,
            mask_indptr=host_int64(self._mask_indptr_buf[:rows]) if masked else None,  # type: ignore[index]
            prefix_len_ptr=self._prefix_len_ptr,
            token_pos_in_items_ptr=self._token_pos_in_items_ptr,
            token_pos_in_items_len=self._token_pos_in_items_len,
            max_item_len_ptr=self._max_item_len_ptr,
        )
        k_cache, v_cache = paged_kv_cache if isinstance(paged_kv_cache, (tuple, list)) else paged_kv_cache.unbind(1)
        o, lse = attend(self._scaled(batch, k_scale, v_scale), q, k_cache, v_cache, out=out)
        return (o, lse) if return_lse else o

    def run_return_lse(self, q: torch.Tensor, paged_kv_cache: Any, *args: Any, **kwargs: Any):
        return self.run(q, paged_kv_cache, *args, return_lse=True, **kwargs)


class BatchPrefillWithRaggedKVCacheWrapper(_Common):
    """``flashinfer.BatchPrefillWithRaggedKVCacheWrapper``: each request's query rows against its
    own contiguous K/V rows (the new tokens of an extend)."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        kv_indptr_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: Any = None,
        jit_kwargs: Any = None,
    ) -> None:
        self._init_common(float_workspace_buffer, kv_layout, use_cuda_graph, backend)
        self._qo_indptr_buf = qo_indptr_buf
        self._kv_indptr_buf = kv_indptr_buf

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        **unused: Any,
    ) -> None:
        if custom_mask is not None or packed_custom_mask is not None:
            raise NotImplementedError("the ragged stand-in takes no custom mask (sglang gives none)")
        if self.is_cuda_graph_enabled:
            self._qo_indptr_buf.copy_(qo_indptr)  # type: ignore[union-attr]
            self._kv_indptr_buf.copy_(kv_indptr)  # type: ignore[union-attr]
        else:
            self._qo_indptr_buf = qo_indptr.to(self.device)
            self._kv_indptr_buf = kv_indptr.to(self.device)
        qo_host, kv_host = qo_indptr.to("cpu"), kv_indptr.to("cpu")
        self._qo_indptr_last = int(qo_host[-1])
        self._plan_on_host(
            self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer,
            qo_host, kv_host, kv_host[1:] - kv_host[:-1], int(qo_host[-1]), len(qo_host) - 1,
        )  # fmt: skip
        self._select_variant(window_left, logits_soft_cap)
        self._set_run_options(
            causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale
        )

    begin_forward = plan

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, **options: Any):
        return self._forward((q, k, v), options, causal=causal)

    def forward_return_lse(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, **options: Any
    ):
        return self._forward((q, k, v), options, causal=causal, return_lse=True)

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *args: Any,
        out: torch.Tensor | None = None,
        return_lse: bool = False,
        **unused: Any,
    ):
        self._require_plan("BatchPrefillWithRaggedKVCacheWrapper")
        self._check_rows(q)
        rows = self._planned_rows
        kv = host_int64(self._kv_indptr_buf[: rows + 1])  # type: ignore[index]
        if int(kv[rows]) > k.shape[0]:
            raise RuntimeError(f"kv_indptr reaches row {int(kv[rows])} of {k.shape[0]} K/V rows")
        batch = Batch(
            rows=rows,
            qo_indptr=host_int64(self._qo_indptr_buf[: rows + 1]),  # type: ignore[index]
            kv_starts=kv[:rows],
            kv_lens=kv[1:] - kv[:-1],
            causal=self._causal,
        )
        o, lse = attend(self._scaled(batch, None, None), q, k, v, out=out)
        return (o, lse) if return_lse else o

    def run_return_lse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any):
        return self.run(q, k, v, *args, return_lse=True, **kwargs)
