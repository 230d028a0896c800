"""Speculative-decoding kernels: the multi-step EAGLE draft's per-step page tables
(``generate_draft_decode_kv_indices``)."""

from .cache_locs import generate_draft_decode_kv_indices

__all__ = ["generate_draft_decode_kv_indices"]
