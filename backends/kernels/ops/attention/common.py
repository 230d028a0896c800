"""Settings shared by the kernels: interpreter detection and block sizes."""

import os

# Read once, after backends/__init__.py had its chance to set it.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# The interpreter (triton 3.9) computes tl.dot on bfloat16 operands wrongly, and
# fp16 dots in numpy do not accumulate in fp32. Under the interpreter the kernels
# therefore upcast dot operands to fp32; compiled kernels keep fp16/bf16 operands
# with fp32 accumulation. One constexpr value per platform: no extra compiles.
DOT_FP32 = INTERPRET


def block_sizes(head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_D, BLOCK_M, BLOCK_N) for a head dim, fixed so each head dim compiles once."""
    block_d = 16
    while block_d < head_dim:
        block_d *= 2
    return block_d, 32, 32
