"""Triton kernels of the attention backend: page-table construction
(``create_flashinfer_kv_indices_triton``), prefill/extend attention over a paged
prefix plus dense new tokens (``extend_attention_fwd``) and split-KV decode
attention (``decode_attention_fwd``).

They compile for CUDA and run unchanged under the Triton interpreter on CPU
tensors; ``INTERPRET`` below is the one switch that differs between the two.
"""

from .common import INTERPRET
from .decode_attention import decode_attention_fwd
from .extend_attention import extend_attention_fwd
from .kv_indices import create_flashinfer_kv_indices_triton

__all__ = [
    "INTERPRET",
    "create_flashinfer_kv_indices_triton",
    "decode_attention_fwd",
    "extend_attention_fwd",
]
