"""Every use the probes make of sglang 0.5.23's private test kit (``sglang/test/kits/``):
``kit("probes")`` of ``sglfix.harness.kits``.

What the kit needs on a CPU box, each applied only for the length of ``kit_scope`` so that a
long-lived worker's modules are left as they were (its state snapshot compares them by identity):
- its ``_seeded_rng`` reads the CUDA RNG state: a CPU stand-in seeds torch's CPU generator;
- ``sglang.test.test_utils`` (for ``server_args_variant``) imports the benchmark package, which
  imports ``datasets`` and indexes ``CUDA_VISIBLE_DEVICES`` (empty on a CPU box) at import: when
  it is not importable here, the real ``server_args_variant`` is compiled from that file alone;
- its fixtures write into leaf tensors: grad mode off;
- it publishes server args and parallel overrides and never takes them back: the runtime context
  is snapshotted and restored around the scope.
"""

from __future__ import annotations

import ast
import contextlib
import math
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .draft_replay import replay_draft_extend
from .environment import (
    bind_own_plan,
    context_kept,
    decide_needs_cpu_seq_lens,
    published,
    server_args,
    with_server_args,
)

__all__ = [
    "KIT_HIDDEN_SIZE",
    "KIT_VOCAB_SIZE",
    "DraftSetup",
    "build_eagle_draft",
    "context_kept",
    "decide_needs_cpu_seq_lens",
    "draft_context_len",
    "kit_scope",
    "published",
    "replay_draft_extend",
    "run_eagle_draft",
    "server_args",
    "with_server_args",
]

KIT_HIDDEN_SIZE = 64  # the kit's DEFAULT_HIDDEN_SIZE
KIT_VOCAB_SIZE = 64  # the kit's draft runner default
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class _TestCase:
    """What the kit's fixtures call on a unittest.TestCase. ``skipTest`` is called from inside the
    kit's ``except`` around the backend constructor: re-raise that exception, so that a constructor
    the code under test breaks is its CRASH, not a skip."""

    def skipTest(self, reason: str) -> None:
        exc = sys.exc_info()[1]
        if exc is not None:
            raise exc
        raise RuntimeError(f"the kit skipped: {reason}")

    def assertTrue(self, value: Any, msg: str | None = None) -> None:
        if not value:
            raise AssertionError(msg or "the kit's assertTrue failed")


def _cpu_seeded_rng(seed_offset: int):
    @contextlib.contextmanager
    def seeded_rng(seed: int, *, device: Any = None) -> Iterator[None]:
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed + seed_offset)
            yield
        finally:
            torch.random.set_rng_state(state)

    return seeded_rng


_SHIM: types.ModuleType | None = None


def _test_utils_shim() -> types.ModuleType | None:
    """``sglang.test.test_utils`` with only ``server_args_variant`` (and the names it reads),
    compiled from the installed file, when the module itself cannot be imported here."""
    global _SHIM
    if _SHIM is not None:
        return _SHIM
    import copy

    import msgspec
    import sglang

    path = os.path.join(os.path.dirname(sglang.__file__), "test", "test_utils.py")
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), filename=path)
    function = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "server_args_variant"),
        None,
    )
    if function is None:  # before 0.5.16 the kit's draft runner does not import it
        return None
    # The module-level constants it reads (0.5.23's _RUNNER_WRITTEN_NAMES; none before 0.5.19).
    read = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
    body = [
        n for n in tree.body if isinstance(n, ast.Assign) and any(getattr(t, "id", None) in read for t in n.targets)
    ]
    body.append(function)
    module = types.ModuleType("sglang.test.test_utils")
    module.__file__ = path
    module.__dict__.update(copy=copy, msgspec=msgspec)
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), module.__dict__)
    _SHIM = module
    return module


def _test_utils_importable() -> bool:
    if "sglang.test.test_utils" in sys.modules:
        return True
    if os.environ.get("CUDA_VISIBLE_DEVICES", "0") == "":
        return False  # its module body indexes the variable's first character
    import importlib.util

    return importlib.util.find_spec("datasets") is not None


@contextlib.contextmanager
def kit_scope(*, device: str, seed: int = 0) -> Iterator[None]:
    """The kit runs inside this: grad off, CPU RNG stand-in, test_utils shim, runtime context
    (published server args, parallel overrides) restored afterwards."""
    from unittest import mock

    from sglang.test.kits.attention_unittest.runner_modes import speculative_draft_runner as sdr

    shim = None
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(context_kept())
            stack.enter_context(torch.no_grad())
            if torch.device(device).type != "cuda":
                stack.enter_context(mock.patch.object(sdr, "_seeded_rng", _cpu_seeded_rng(seed)))
            if not _test_utils_importable():
                shim = _test_utils_shim()
                if shim is not None:
                    sys.modules["sglang.test.test_utils"] = shim
            yield
    finally:
        if shim is not None and sys.modules.get("sglang.test.test_utils") is shim:
            del sys.modules["sglang.test.test_utils"]


def draft_context_len(scenario: Any) -> int:
    """The req_to_token row length a draft fixture gets: the scenario's max_context_len, else the
    longest prefix plus every branch's draft slots (the kit lays branches out linearly), rounded
    up to 32, at least the kit's 64."""
    if scenario.max_context_len is not None:
        return scenario.max_context_len
    need = max(scenario.prefix_lens) + scenario.spec.topk * scenario.spec.num_steps
    return max(64, 32 * math.ceil(need / 32))


@dataclass
class DraftSetup:
    """A multi-step EAGLE draft built by the kit's dense draft runner: a real MockModelRunner (its
    published server args), the real Triton target backend, the real multi-step draft backend
    (``DraftBackendFactory``), a worker stand-in whose ``draft_forward`` is
    ``EagleDraftWorker.draft_forward``, and the draft batch (positions = seq_lens per branch)."""

    fixture: Any
    worker: Any
    draft_backend: Any
    target_backend: Any
    batch: Any
    settings: Any
    case: Any


def build_eagle_draft(scenario: Any, *, device: str) -> DraftSetup:
    """The kit's dense EAGLE draft fixture for ``scenario`` (call inside ``kit_scope``)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (
        DenseAttentionCase,
        build_dense_attention_fixture,
    )
    from sglang.test.kits.attention_unittest.runner_modes import speculative_draft_runner as sdr

    spec, model = scenario.spec, scenario.model
    context_len = draft_context_len(scenario)
    case = DenseAttentionCase(
        name="sglfix-probe",
        backend="triton",
        forward_mode=ForwardMode.DECODE,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        page_size=scenario.page_size,
        prefix_lens=tuple(scenario.prefix_lens),
    )
    dtype = _DTYPES[model.dtype]
    settings = sdr.EagleDraftRunnerSettings(
        topk=spec.topk,
        speculative_num_steps=spec.num_steps,
        speculative_num_draft_tokens=spec.num_draft_tokens,
        capture_batch_size=len(scenario.prefix_lens),
        hidden_size=KIT_HIDDEN_SIZE,
        vocab_size=KIT_VOCAB_SIZE,
        max_context_len=context_len,
        dtype=dtype,
        device=device,
        atol=0.0,
        rtol=0.0,
    )
    adapter = sdr.EagleDraftCudaGraphRunnerAdapter(
        build_fixture=build_dense_attention_fixture,
        make_model_forward=sdr._make_dense_model_forward,
        make_draft_inputs=sdr._make_dense_draft_inputs,
        prepare_replay_state=sdr._prepare_dense_draft_replay_state,
        make_forward_batch=sdr._make_dense_eagle_draft_forward_batch,
        check_case=sdr._check_dense_draft_cache_layout,
    )
    adapter.check_case(case, settings)
    draft_inputs = adapter.make_draft_inputs(case, settings)
    fixture, worker, draft_backend = sdr._build_eagle_draft_fixture(
        _TestCase(),
        case,
        adapter=adapter,
        build_kwargs=dict(
            head_dim=model.head_dim,
            hidden_size=KIT_HIDDEN_SIZE,
            max_context_len=context_len,
            dtype=dtype,
            device=device,
        ),
        settings=settings,
    )
    adapter.prepare_replay_state(fixture, case, draft_inputs, settings)
    batch = adapter.make_forward_batch(case, draft_inputs, settings)
    bind_own_plan(fixture.runner, batch)
    return DraftSetup(
        fixture=fixture,
        worker=worker,
        draft_backend=draft_backend,
        target_backend=fixture.backend,
        batch=batch,
        settings=settings,
        case=case,
    )


def run_eagle_draft(setup: DraftSetup) -> Any:
    """The kit's eager draft loop: the draft backend's metadata init, then ``draft_forward``."""
    from sglang.test.kits.attention_unittest.runner_modes import speculative_draft_runner as sdr

    return sdr._run_eagle_draft_eager(setup.worker, setup.batch)
