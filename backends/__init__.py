"""The system under test: a small, faithful reproduction of an inference engine's
Triton attention backend, its EAGLE speculative-decoding glue and its CUDA-graph
runner, with every historical fix applied.

Installed as ``sglfix.backends``. The revert patches in ``toggles/`` target the
functions of this package by dotted path, so its function bodies are written to
keep each fix on distinct, revertible source lines.

Without CUDA the Triton kernels run under the Triton interpreter. Triton decides
between compiled and interpreted functions when ``@triton.jit`` runs, including
for its own standard library at ``import triton``, so the variable must be set
before triton is first imported: importing this package first does it.
"""

import os
import sys

import torch

if not torch.cuda.is_available():
    if "TRITON_INTERPRET" not in os.environ and "triton" in sys.modules:
        # Setting it now would mix interpreted kernels with compiled standard
        # functions (tl.cdiv, tl.max, ...), which fails at the first launch.
        raise ImportError(
            "triton was imported before sglfix.backends on a machine without CUDA; "
            "set TRITON_INTERPRET=1 before importing triton (or import "
            "sglfix.backends first)"
        )
    os.environ.setdefault("TRITON_INTERPRET", "1")
