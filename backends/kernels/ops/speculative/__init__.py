"""Speculative-decoding kernels: the multi-step EAGLE draft's per-step page tables
(``generate_draft_decode_kv_indices``) and its per-step write slots."""

from .cache_locs import generate_draft_decode_kv_indices, per_step_draft_out_cache_loc

__all__ = ["generate_draft_decode_kv_indices", "per_step_draft_out_cache_loc"]
