"""The system under test: a small, faithful reproduction of an inference engine's
Triton attention backend, its EAGLE speculative-decoding glue and its CUDA-graph
runner, with every historical fix applied.

Installed as ``sglfix.backends``. The revert patches in ``toggles/`` target the
functions of this package by dotted path, so its function bodies are written to
keep each fix on distinct, revertible source lines.

Without CUDA the Triton kernels run under the Triton interpreter. The variable
must be set before anything imports ``triton``, hence here, at package import.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
