"""The FlashInfer backends' shared float workspace is made once per device and reused by every
backend after, as upstream's module-level buffer is: each backend a cell builds (a multi-step
draft builds one a step) asks for it, and a fresh 384 MiB each time filled the GPU with buffers
only the cyclic collector would free."""

from __future__ import annotations

import pytest
import torch

from sglfix.backends.kernels.ops.attention.paged_wrappers import on_device
from sglfix.backends.srt.layers.attention import flashinfer_backend, flashinfer_mla_backend


def test_on_device_reads_an_index_less_device_as_the_current_one():
    t = torch.empty(1)
    assert on_device(t, "cpu") and on_device(t, torch.device("cpu"))
    assert not on_device(t, "cuda") and not on_device(t, "cuda:0")  # never asks CUDA for a CPU tensor


@pytest.mark.parametrize("module", [flashinfer_backend, flashinfer_mla_backend])
def test_the_workspace_is_reused_on_the_cpu(module, monkeypatch):
    monkeypatch.setattr(module, "global_workspace_buffer", None)
    first = module._workspace(torch.device("cpu"))
    assert module._workspace(torch.device("cpu")) is first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA device's index")
@pytest.mark.parametrize("module", [flashinfer_backend, flashinfer_mla_backend])
def test_the_workspace_is_reused_on_the_gpu_however_the_device_is_named(module, monkeypatch):
    monkeypatch.setattr(module, "global_workspace_buffer", None)
    first = module._workspace(torch.device("cuda"))
    for name in ("cuda", f"cuda:{torch.cuda.current_device()}"):
        assert module._workspace(torch.device(name)) is first
    assert on_device(first, "cuda") and not on_device(first, "cpu")
    cpu = module._workspace(torch.device("cpu"))  # another device: a buffer of its own
    assert cpu.device.type == "cpu"
