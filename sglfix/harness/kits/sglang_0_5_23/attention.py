"""sglang 0.5.23's private attention test kit (``sglang.test.kits.attention_unittest``) as the Triton
adapter uses it: ``kit("attention")`` of ``sglfix.harness.kits``.

What the adapter takes from the kit, and why:
- ``DenseAttentionCase`` / ``TinyModelConfig`` / ``MockModelRunner``: the kit's ModelRunner
  stand-in is a real ``ModelRunner`` subclass that publishes server args (read by the backends
  through ``sglang.srt.runtime_context``) and owns real ``ReqToTokenPool`` / ``MHATokenToKVPool``
  and the runner's ``KVIndexTranslator``;
- ``_make_forward_batch``: a real ``ForwardBatch`` bound to its own KV plan, from a slot layout;
- ``_set_draft_extend_v2_prefix_lens``: the DRAFT_EXTEND_V2 fixture that PR 26651's ``fixture``
  part reverts. It is looked up on the kit module at each call (the module defines it twice; the
  name resolves to the later definition, the toggle's target), so a revert applied in this
  process is what runs;
- ``_make_eagle_draft_extend_v2_input``: the fixture's spec input (``EagleDraftExtendInput`` with
  the per-request window lengths the Triton capture/replay reads);
- ``_prepare_target_verify_batch``: the verify fixture (``seq_lens`` = cached tokens only);
- ``MLAAttentionCase`` / ``MockMLAModelRunner`` and the MLA module's ``_make_forward_batch``: the
  same for a latent (MLA) layer, one KV head of ``kv_lora_rank + qk_rope_head_dim`` values in a
  real ``MLATokenToKVPool`` (the runner publishes ``flashinfer_mla_disable_ragged``: every extend
  takes the paged MLA kernel, as the kit's own MLA tests run it).

Nothing here judges: the kit's own references and asserts (``assert_close``,
``assert_cg_metadata_well_formed``) are never called; the judge stays sglfix's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .environment import (
    bind_own_plan,
    decide_needs_cpu_seq_lens,
    engine_flags,
    init_then_join,
    prepare_for_draft_extend,
    publish_server_args,
    publish_spec,
    server_args,
    single_rank_moe,
)

__all__ = [
    "DENSE",
    "DRAFT_EXTEND",
    "KIT_VERSION",
    "TARGET_VERIFY",
    "bind_own_plan",
    "decide_needs_cpu_seq_lens",
    "engine_flags",
    "init_then_join",
    "make_case",
    "make_draft_extend_v2_input",
    "make_encoder_decoder",
    "make_forward_batch",
    "make_mla_case",
    "make_mla_model_runner",
    "make_model_runner",
    "prepare_for_draft_extend",
    "prepare_target_verify_batch",
    "publish_over",
    "published_now",
    "restore_server_args",
    "server_args",
    "set_draft_extend_v2_prefix_lens",
    "single_rank_moe",
    "track_published",
]

KIT_VERSION = "0.5.23"
_KIT = "sglang.test.kits.attention_unittest"
DENSE = f"{_KIT}.attention_methods.dense_attention"
MLA = f"{_KIT}.attention_methods.mla_attention"
DRAFT_EXTEND = f"{_KIT}.runner_modes.speculative_draft_extend_runner"
TARGET_VERIFY = f"{_KIT}.runner_modes.speculative_target_verify_runner"

# (the kit's override object, the server args it published) of the runners made here; the next
# case un-publishes them first, so that a long-lived worker starts each cell from the same state.
_published: list[tuple[Any, Any]] = []


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def _kit_function(module: str, name: str) -> Callable:
    """A kit function looked up at call time: a revert swaps the code of the object the module
    name resolves to, and a stale reference taken at import would still be that object anyway."""
    return getattr(_module(module), name)


def make_case(
    *,
    name: str,
    mode: Any,
    model: Any,
    page_size: int,
    prefix_lens: tuple[int, ...],
    extend_lens: tuple[int, ...],
    backend: str = "triton",
) -> Any:
    """The kit's case record for a batch of ``backend`` (the name its model runner publishes as the
    attention backend) over ``model`` (a scenario's: heads, KV heads, window); with a sliding
    window, the kit's model runner publishes it (``sliding_window_size``, read by the backend)."""
    dense = _module(DENSE)
    window = {} if model.sliding_window is None else {"sliding_window_size": model.sliding_window}
    return dense.DenseAttentionCase(
        name=name,
        backend=backend,
        forward_mode=mode,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        page_size=page_size,
        prefix_lens=tuple(prefix_lens),
        extend_lens=tuple(extend_lens),
        **window,
    )


def make_model_runner(
    *,
    case: Any,
    head_dim: int,
    dtype: Any,
    device: str,
    max_context_len: int,
    pool_rows: int,
    graph: bool,
    spec: tuple[int, int, int] | None = None,
) -> Any:
    """The kit's ``MockModelRunner`` with ``pool_rows`` request rows; it publishes its server args.

    The previous runner's published args are restored first (see ``restore_server_args``).
    ``hidden_size`` only sizes the kit's projection modules, which the adapters do not use.
    ``spec`` (topk, num_steps, num_draft_tokens): the speculative sizes production publishes,
    where they differ from the kit's chain (the kit always publishes num_steps = num_draft_tokens
    - 1, topk 0: a tree draft's backend would then size its graph layout for a chain).
    """
    dense = _module(DENSE)
    restore_server_args()
    config = dense.TinyModelConfig(
        num_heads=case.num_heads,
        num_kv_heads=case.num_kv_heads,
        head_dim=head_dim,
        hidden_size=case.num_heads * head_dim,
        context_len=max_context_len,
        **({} if case.sliding_window_size is None else {"sliding_window_size": case.sliding_window_size}),
    )
    return _tracked(
        lambda: dense.MockModelRunner(
            case=case,
            model_config=config,
            dtype=dtype,
            device=device,
            max_context_len=max_context_len,
            head_dim=head_dim,
            disable_cuda_graph=not graph,
            runner_batch_size=pool_rows,
        ),
        spec,
    )


def make_encoder_decoder(runner: Any) -> None:
    """The kit runner's model made an encoder-decoder one, as sglang's Mllama / Whisper configs
    say: ``is_encoder_decoder`` (the FlashInfer backend then builds its self and cross wrappers,
    the decode graph runner its ``encoder_lens`` buffer) and ``is_multimodal`` (production's
    encoder-decoder models are multimodal: an extend plans the paged wrappers, never the ragged
    one). Its ``hf_config`` is the kit's, without ``max_source_positions``, as Mllama's."""
    config = runner.model_config
    config.is_encoder_decoder = True
    config.is_multimodal = True


def make_mla_case(
    *,
    name: str,
    mode: Any,
    model: Any,
    page_size: int,
    prefix_lens: tuple[int, ...],
    extend_lens: tuple[int, ...],
    backend: str = "flashinfer",
) -> Any:
    """The kit's MLA case record (one latent KV head; ``backend`` is the name its runner publishes:
    production selects FlashInfer's MLA backend as ``flashinfer`` on an MLA model)."""
    return _module(MLA).MLAAttentionCase(
        name=name,
        backend=backend,
        forward_mode=mode,
        num_heads=model.num_heads,
        page_size=page_size,
        prefix_lens=tuple(prefix_lens),
        extend_lens=tuple(extend_lens),
    )


def make_mla_model_runner(
    *,
    case: Any,
    model: Any,
    dtype: Any,
    device: str,
    max_context_len: int,
    pool_rows: int,
    graph: bool,
    spec: tuple[int, int, int] | None = None,
) -> Any:
    """``make_model_runner`` for an MLA case: the kit's ``MockMLAModelRunner`` over ``model``'s
    latent sizes, its server args tracked and the speculative sizes published alike."""
    from .draft_cases import mla_runner

    restore_server_args()
    return _tracked(
        lambda: mla_runner(
            case, model, dtype=dtype, device=device, max_context_len=max_context_len, graphs=graph, pool_bs=pool_rows
        )[0],
        spec,
    )


def _tracked(build: Callable[[], Any], spec: tuple[int, int, int] | None) -> Any:
    """A kit mock runner made by ``build``, the server args it publishes remembered for
    ``restore_server_args``, and the speculative sizes published over them where they differ
    from the kit's chain."""
    before = published_now()
    runner = build()
    track_published(runner, before=before)
    if spec is not None and (spec[0] > 1 or spec[1] != spec[2] - 1):
        topk, num_steps, num_draft_tokens = spec
        publish_over(
            runner,
            speculative_eagle_topk=topk,
            speculative_num_steps=num_steps,
            speculative_num_draft_tokens=num_draft_tokens,
        )
    return runner


def track_published(runner: Any, *, before: Any) -> None:
    """Remember the server args a kit mock runner published over ``before``, for
    ``restore_server_args``."""
    override = getattr(runner, "_server_args_override", None)  # 0.5.16 on
    _published.append(
        (override.restore if override is not None else lambda: publish_server_args(before), runner.server_args)
    )


def publish_over(runner: Any, **fields: Any) -> None:
    """``fields`` published over the runner's server args, put back by ``restore_server_args``."""
    restore = publish_spec(runner, **fields)
    _published.append((restore, runner.server_args))


def published_now() -> Any:
    """The server args published now (None: none)."""
    try:
        return server_args()
    except ValueError:  # nothing published
        return None


def restore_server_args() -> None:
    """Un-publish the server args of the runners this module made, newest first, each only while
    it is still the published one: a runner built since (another adapter's) owns the slot then,
    and restoring under it would bring back a state older than its own."""
    while _published:
        restore, args = _published.pop()
        if published_now() is args:
            restore()


def make_forward_batch(
    *, case: Any, runner: Any, max_context_len: int, device: str, loc_fn: Callable[[int, int], int]
) -> Any:
    """The kit's ForwardBatch for ``case`` over the slot layout ``loc_fn(request, position)``:
    fills ``req_to_token`` rows 0..bs-1, sets ``out_cache_loc``/``positions`` and the CPU mirrors,
    and binds the batch to its own KV plan (the MLA module's builder for an MLA case)."""
    make = _kit_function(MLA if type(case).__name__ == "MLAAttentionCase" else DENSE, "_make_forward_batch")
    return make(case, runner, max_context_len=max_context_len, device=device, loc_fn=loc_fn)


def set_draft_extend_v2_prefix_lens(*, batch: Any, case: Any, device: str) -> None:
    """The kit's DRAFT_EXTEND_V2 fixture: ``seq_lens`` as production has it before the metadata
    init (prefix + draft window), with its CPU mirrors. PR 26651 ``fixture`` reverts it."""
    _kit_function(DRAFT_EXTEND, "_set_draft_extend_v2_prefix_lens")(batch, case, device=device)


def make_draft_extend_v2_input(*, batch: Any, case: Any, device: str) -> Any:
    """The kit's ``EagleDraftExtendInput`` for a DRAFT_EXTEND_V2 batch, with
    ``extend_seq_lens_tensor`` / ``extend_seq_lens_cpu`` set per request."""
    return _kit_function(DRAFT_EXTEND, "_make_eagle_draft_extend_v2_input")(case, batch, device=device)


def prepare_target_verify_batch(*, batch: Any, case: Any, device: str) -> None:
    """The kit's verify fixture: ``seq_lens`` (and mirrors) count the cached prefix only."""
    _kit_function(TARGET_VERIFY, "_prepare_target_verify_batch")(batch, case, device)
