"""The multi-step EAGLE draft cases on sglang 0.5.23's kit: DeepSeek-V4's NextN draft through the
kit's DSv4 fixture, FlashInfer GQA and MLA drafts over the kit's mock runners, each configured as
an EAGLE draft worker with the slot ground truth in its ``req_to_token`` and the draft batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .draft_batches import make_draft_batch
from .environment import FixtureTestCase, prepare
from .slots import DraftSlots

__all__ = [
    "DSV4_PAGE_SIZE",
    "DraftCase",
    "build_draft",
    "build_dsv4_draft",
    "mla_runner",
    "round_up",
    "torch_dtype",
]

DSV4_PAGE_SIZE = 256


def torch_dtype(name: str) -> torch.dtype:
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def _draft_settings(
    *,
    topk: int,
    num_steps: int,
    capture_bs: int,
    hidden_size: int,
    max_context_len: int,
    dtype: torch.dtype,
    device: str,
) -> Any:
    from sglang.test.kits.attention_unittest.runner_modes.speculative_draft_runner import EagleDraftRunnerSettings

    return EagleDraftRunnerSettings(
        topk=topk,
        speculative_num_steps=num_steps,
        speculative_num_draft_tokens=num_steps + 1,
        capture_batch_size=capture_bs,
        hidden_size=hidden_size,
        vocab_size=64,
        max_context_len=max_context_len,
        dtype=dtype,
        device=device,
        atol=0.0,
        rtol=0.0,
    )


@dataclass
class DraftCase:
    """A multi-step draft case on real sglang: the kit's runner configured as an EAGLE draft worker,
    the slot ground truth, and the draft batch."""

    family: str  # "dsv4", "flashinfer", "flashinfer_mla", "triton"
    runner: Any
    slots: DraftSlots
    batch: Any
    topk: int
    num_steps: int
    num_slots: int
    device: str
    dtype: torch.dtype
    hidden_size: int
    capture_bs: tuple[int, ...] | None
    kit_case: Any = None
    fixture: Any = None
    notes: list[str] = field(default_factory=list)


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def build_dsv4_draft(scenario: Any, *, device: str) -> DraftCase:
    """DeepSeek-V4's NextN draft (SWA-only, page size 256, topk 1) through the kit's DSv4 fixture."""
    prepare()
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.attention_methods.dsv4_attention import (
        DSV4_HEAD_DIM,
        DSV4AttentionCase,
        build_dsv4_attention_fixture,
    )
    from sglang.test.kits.attention_unittest.runner_modes.speculative_draft_runner import (
        _configure_runner_for_eagle_draft,
    )

    topk, num_steps = scenario.spec.topk, scenario.spec.num_steps
    prefix = tuple(scenario.prefix_lens)
    bs = len(prefix)
    dtype = torch_dtype(scenario.model.dtype)
    longest = max(prefix) + topk * num_steps + 1
    max_context_len = round_up(max(scenario.max_context_len or 0, longest, DSV4_PAGE_SIZE), DSV4_PAGE_SIZE)
    capture = tuple(scenario.capture_bs) if scenario.capture_bs else None
    pool_bs = max(capture) if capture else bs
    swa_size = round_up(pool_bs * max_context_len + 1, DSV4_PAGE_SIZE)
    case = DSV4AttentionCase(
        name=scenario.name,
        backend="dsv4",
        forward_mode=ForwardMode.DECODE,
        num_heads=scenario.model.num_heads,
        page_size=DSV4_PAGE_SIZE,
        prefix_lens=prefix,
    )
    fixture = build_dsv4_attention_fixture(
        FixtureTestCase(),
        case,
        swa_size=swa_size,
        max_context_len=max_context_len,
        dtype=dtype,
        device=device,
        disable_cuda_graph=capture is None,
        runner_batch_size=pool_bs,
    )
    runner = fixture.runner
    settings = _draft_settings(
        topk=topk,
        num_steps=num_steps,
        capture_bs=pool_bs,
        hidden_size=DSV4_HEAD_DIM,
        max_context_len=max_context_len,
        dtype=dtype,
        device=device,
    )
    _configure_runner_for_eagle_draft(runner, case, settings)
    slots = DraftSlots.allocate(prefix, topk=topk, num_steps=num_steps, num_slots=swa_size, seed=scenario.seed)
    runner.req_to_token_pool.req_to_token.zero_()
    slots.fill_req_to_token(runner.req_to_token_pool.req_to_token)
    batch = make_draft_batch(slots, device=device, hidden_size=DSV4_HEAD_DIM, dtype=dtype, runner=runner)
    return DraftCase(
        family="dsv4",
        runner=runner,
        slots=slots,
        batch=batch,
        topk=topk,
        num_steps=num_steps,
        num_slots=swa_size,
        device=device,
        dtype=dtype,
        hidden_size=DSV4_HEAD_DIM,
        capture_bs=capture,
        kit_case=case,
        fixture=fixture,
    )


def build_draft(scenario: Any, *, device: str, mla: bool, backend: str = "flashinfer", page_size: int = 1) -> DraftCase:
    """The kit's dense (GQA) or MLA mock runner, configured as an EAGLE draft worker whose decode
    backend is ``backend`` (``flashinfer``, ``flashmla`` for an MLA one at page size 64, or
    ``triton`` for a dense one); no target backend is built. At a page size past 1 the draft is a
    chain whose requests' tokens lie on their own pages."""
    prepare()
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.runner_modes.speculative_draft_runner import (
        _configure_runner_for_eagle_draft,
    )

    model = scenario.model
    topk, num_steps = scenario.spec.topk, scenario.spec.num_steps
    prefix = tuple(scenario.prefix_lens)
    bs = len(prefix)
    dtype = torch_dtype(model.dtype)
    capture = tuple(scenario.capture_bs) if scenario.capture_bs else None
    pool_bs = max(capture) if capture else bs
    longest = max(prefix) + topk * num_steps
    max_context_len = scenario.max_context_len or round_up(longest + 8, max(32, page_size))
    common = dict(
        name=scenario.name,
        backend=backend,
        forward_mode=ForwardMode.DECODE,
        num_heads=model.num_heads,
        page_size=page_size,
        prefix_lens=prefix,
    )
    if mla:
        from sglang.test.kits.attention_unittest.attention_methods.mla_attention import MLAAttentionCase

        case = MLAAttentionCase(**common)
        runner, hidden_size = mla_runner(
            case,
            model,
            dtype=dtype,
            device=device,
            max_context_len=max_context_len,
            graphs=capture is not None,
            pool_bs=pool_bs,
        )
    else:
        from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (
            DenseAttentionCase,
            MockModelRunner,
            TinyModelConfig,
        )

        # A sliding-window model: the runner publishes its window (the draft backend's window rail).
        window = {} if model.sliding_window is None else {"sliding_window_size": model.sliding_window}
        case = DenseAttentionCase(num_kv_heads=model.num_kv_heads, **common, **window)
        hidden_size = model.num_heads * model.head_dim
        config = TinyModelConfig(
            num_heads=model.num_heads,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            hidden_size=hidden_size,
            context_len=max_context_len,
            **window,
        )
        runner = MockModelRunner(
            case=case,
            model_config=config,
            dtype=dtype,
            device=device,
            max_context_len=max_context_len,
            head_dim=model.head_dim,
            disable_cuda_graph=capture is None,
            runner_batch_size=pool_bs,
        )
    settings = _draft_settings(
        topk=topk,
        num_steps=num_steps,
        capture_bs=pool_bs,
        hidden_size=hidden_size,
        max_context_len=max_context_len,
        dtype=dtype,
        device=device,
    )
    _configure_runner_for_eagle_draft(runner, case, settings)
    num_slots = int(runner.token_to_kv_pool.size)
    if page_size > 1:
        if topk != 1:
            raise ValueError(f"a paged draft case is a chain (topk 1), not topk {topk}")
        slots = DraftSlots.paged(
            prefix, num_steps=num_steps, page_size=page_size, num_slots=num_slots, seed=scenario.seed
        )
    else:
        slots = DraftSlots.allocate(prefix, topk=topk, num_steps=num_steps, num_slots=num_slots, seed=scenario.seed)
    runner.req_to_token_pool.req_to_token.zero_()
    slots.fill_req_to_token(runner.req_to_token_pool.req_to_token)
    batch = make_draft_batch(slots, device=device, hidden_size=hidden_size, dtype=dtype, runner=runner)
    return DraftCase(
        family="flashinfer_mla" if mla and backend == "flashinfer" else backend,
        runner=runner,
        slots=slots,
        batch=batch,
        topk=topk,
        num_steps=num_steps,
        num_slots=num_slots,
        device=device,
        dtype=dtype,
        hidden_size=hidden_size,
        capture_bs=capture,
        kit_case=case,
    )


def mla_runner(
    case: Any, model: Any, *, dtype: Any, device: str, max_context_len: int, graphs: bool, pool_bs: int
) -> tuple[Any, int]:
    """The kit's MLA mock runner (latent cache of kv_lora_rank + qk_rope_head_dim) for ``case``,
    and its hidden size."""
    from sglang.test.kits.attention_unittest.attention_methods.mla_attention import (
        MockMLAModelRunner,
        TinyMLAModelConfig,
    )

    hidden_size = model.kv_lora_rank + model.qk_rope_head_dim
    config = TinyMLAModelConfig(
        num_heads=model.num_heads,
        kv_lora_rank=model.kv_lora_rank,
        qk_rope_head_dim=model.qk_rope_head_dim,
        hidden_size=hidden_size,
        context_len=max_context_len,
    )
    runner = MockMLAModelRunner(
        case=case,
        model_config=config,
        dtype=dtype,
        device=device,
        max_context_len=max_context_len,
        kv_lora_rank=model.kv_lora_rank,
        qk_rope_head_dim=model.qk_rope_head_dim,
        disable_cuda_graph=not graphs,
        runner_batch_size=pool_bs,
    )
    return runner, hidden_size
