"""The worker's commit after a hybrid model's verify (``batch.accept_lens`` on a ``hybrid_linear``
TARGET_VERIFY): sglang's ``commit_mamba_states_after_verify``, which asks the hybrid backend to
move each request's state at its last accepted draft step into the request's own state slot
(``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``).

During the verify the linear layers keep one state per draft step in the pool's intermediate
caches (the SSM state and the conv window after each step, per batch row); the accepted path
decides which one becomes the request's state. The judge fills those caches and the persistent
ones with seeded values before the commit, then checks, from the accepted paths and the pool's
request-to-slot mapping alone, that each request's slot holds its last accepted step's SSM state
and conv window, and that no other slot changed. Naming the row and step a wrong slot holds
makes the finding readable ("request 1's slot 7 holds row 0's step 2").

The commit's scatter kernels are Triton kernels that refuse tensors off CUDA; on CPU torch
stand-ins (``standin_scatters``) take their place in the kernel module and do what the kernels
do with the same arguments: per request, skip a negative step and any index out of range, else
copy ``src[:, row, step]`` into ``dst[:, slot]`` (through the conv view's strides).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

__all__ = ["accept_paths", "standin_scatters", "verify_commit"]

_KERNELS = "sglang.kernels.ops.mamba.mamba_state_scatter_triton"


def accept_paths(spec_info: Any, accept: list[int], *, draft_tokens: int, topk: int) -> list[list[int]]:
    """Each request's accepted nodes, root first: a chain's first ``a + 1`` rows; in a tree the
    first path of ``a`` drafts below the root in the order the verify input's links walk it
    (``retrieve_next_token`` down, ``retrieve_next_sibling`` across), as a verify accepts."""
    import torch

    if topk <= 1:
        return [list(range(a + 1)) for a in accept]
    down = spec_info.retrieve_next_token.to("cpu", torch.long).tolist()
    across = spec_info.retrieve_next_sibling.to("cpu", torch.long).tolist()
    paths = []
    for b, a in enumerate(accept):
        path = _first_path(down[b], across[b], [0], a, draft_tokens)
        if path is None:
            raise ValueError(
                f"request {b}'s draft tree is {_depth(down[b], across[b], 0, draft_tokens)} drafts deep, "
                f"batch.accept_lens[{b}] is {a}"
            )
        paths.append(path)
    return paths


def _children(down: list[int], across: list[int], node: int, n: int) -> list[int]:
    out, child = [], down[node]
    while 0 <= child < n and len(out) < n:
        out.append(child)
        child = across[child]
    return out


def _first_path(down: list[int], across: list[int], path: list[int], left: int, n: int) -> list[int] | None:
    if left == 0:
        return path
    for child in _children(down, across, path[-1], n):
        found = _first_path(down, across, [*path, child], left - 1, n)
        if found is not None:
            return found
    return None


def _depth(down: list[int], across: list[int], node: int, n: int) -> int:
    return max((1 + _depth(down, across, c, n) for c in _children(down, across, node, n)), default=0)


def verify_commit(
    *, runner: Any, backend: Any, rows: Any, accept: list[int], spec_info: Any, seed: int, stable_rows: bool
) -> tuple[str, list[str]]:
    """Run the worker's commit for accept lengths ``accept`` over the batch rows ``rows`` and
    judge the pool's states after it: (what is wrong, "" when all is right; the states judged).
    ``stable_rows``: the verify kept each request's step states at its request row (pipeline-parallel
    speculation, ``SGLANG_ENABLE_PP_SPEC``: a row of a delayed micro-batch stays put), else at its
    batch row."""
    import torch
    from sglang.srt.speculative.spec_utils import commit_mamba_states_after_verify

    pool = backend._sglfix_linear.req_to_token_pool
    caches = pool.get_speculative_mamba2_params_all_layers()
    dtn, bs = backend._sglfix_draft_tokens, len(accept)
    paths = accept_paths(spec_info, accept, draft_tokens=dtn, topk=backend._sglfix_topk)
    rows = rows[:bs].to(torch.long)
    slots = pool.req_index_to_mamba_index_mapping[rows.to(pool.req_index_to_mamba_index_mapping.device)]
    slots = slots.to("cpu", torch.long).tolist()
    gen = torch.Generator(device="cpu").manual_seed(seed + 11)
    side = _side_states(pool)
    # Seeded values everywhere the commit reads or writes: every (row, step) its own.
    seeded = [caches.temporal, caches.intermediate_ssm, *caches.conv, *_bases(caches.intermediate_conv_window)]
    for t in seeded + [t for _, state, steps_of in side for t in (state, steps_of)]:
        t.copy_(_seeded(t, gen))
    temporal, conv = caches.temporal.clone(), [c.clone() for c in caches.conv]
    steps = caches.intermediate_ssm.clone()
    windows = [w.clone() for w in caches.intermediate_conv_window]
    side_before = [(what, state.clone(), steps_of.clone()) for what, state, steps_of in side]

    device = caches.temporal.device
    accept_index = torch.full((bs, max(len(p) for p in paths)), -1, dtype=torch.int32)
    for b, path in enumerate(paths):
        accept_index[b, : len(path)] = torch.tensor([b * dtn + n for n in path], dtype=torch.int32)
    accept_lens = torch.tensor([len(p) for p in paths], dtype=torch.int32)
    batch = SimpleNamespace(
        req_pool_indices=rows.to(device),
        seq_lens=None,
        forward_mode=_target_verify(),
        mamba_track_indices=None,
        tree_cache=None,
    )
    with _serving_a_hybrid(runner), standin_scatters(device):
        commit_mamba_states_after_verify(
            SimpleNamespace(model_runner=runner), batch, accept_lens.to(device), accept_index.to(device), dtn
        )
    source = rows.tolist() if stable_rows else list(range(bs))
    want = {slot: (source[b], path[-1], b) for b, (slot, path) in enumerate(zip(slots, paths))}
    judged = [("SSM state", caches.temporal, temporal, steps)]
    judged += [
        (f"conv window (conv state {i})", c, b, w) for i, (c, b, w) in enumerate(zip(caches.conv, conv, windows))
    ]
    judged += [(what, state, before, steps_of) for (what, state, _), (_, before, steps_of) in zip(side, side_before)]
    wrong = next((wrong for what, got, before, of in judged if (wrong := _judge(what, got, before, of, want))), "")
    return wrong, [what for what, *_ in judged]


def _side_states(pool: Any) -> list[tuple[str, Any, Any]]:
    """A model's per-layer-embedding side states (Qwen4-Exp's PLE) as (what, state, per-step
    state), each with the slot at dim 1 and (row, step) at dims 1, 2 as the linear states have
    them; none where the pool keeps none (a release without them, or a model without them)."""
    out = []
    conv = getattr(pool, "short_conv_pool", None)
    if conv is not None and conv.conv_state is not None and conv.intermediate_conv_state is not None:
        out.append(("short-conv side state", conv.conv_state, conv.intermediate_conv_state))
    ngram = getattr(pool, "ngram_pool", None)
    if ngram is not None and ngram.context is not None and ngram.intermediate_context is not None:
        # No layer dim: the N-gram context is one per request (sglang unsqueezes it the same way).
        out.append(("N-gram context", ngram.context.unsqueeze(0), ngram.intermediate_context.unsqueeze(0)))
    return out


def _seeded(t: Any, gen: Any) -> Any:
    """Seeded values of ``t``'s shape and dtype: every entry its own (token ids for an integer state)."""
    import torch

    if t.dtype.is_floating_point:
        return torch.randn(t.shape, generator=gen).to(t.dtype)
    return torch.randint(1, 1 << 20, t.shape, generator=gen).to(t.dtype)


def _judge(what: str, got: Any, before: Any, steps: Any, want: dict[int, tuple[int, int, int]]) -> str:
    """``got[:, slot]`` for every slot: the step state ``want`` names (source row, step, request),
    else unchanged."""
    import torch

    for slot in range(got.shape[1]):
        have = got[:, slot]
        if slot in want:
            row, step, b = want[slot]
            if torch.equal(have, steps[:, row, step]):
                continue
            return f"request {b}'s state slot {slot} {_holds(have, before[:, slot], steps)} for its {what}, its last accepted step is {step}"
        if not torch.equal(have, before[:, slot]):
            return f"state slot {slot}, no request's, {_holds(have, before[:, slot], steps)} for its {what} after the commit (it must not change)"
    return ""


def _holds(have: Any, before: Any, steps: Any) -> str:
    import torch

    if torch.equal(have, before):
        return "kept its state (nothing committed)"
    for b in range(steps.shape[1]):
        for s in range(steps.shape[2]):
            if torch.equal(have, steps[:, b, s]):
                return f"holds row {b}'s step {s}"
    return "holds no step's state"


def _bases(views: list[Any]) -> list[Any]:
    """The buffers under the conv windows (an overlapping view per layer set): filled once each."""
    out, seen = [], set()
    for view in views:
        base = view if view._base is None else view._base
        if base.data_ptr() not in seen:
            seen.add(base.data_ptr())
            out.append(base)
    return out


def _target_verify() -> Any:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode.TARGET_VERIFY


@contextlib.contextmanager
def _serving_a_hybrid(runner: Any) -> Iterator[None]:
    """The commit serves a hybrid model only (``mambaish_config`` of the runner's model config):
    the kit's tiny model answers as Qwen3-Next, whose gated-delta-net layers this runner holds,
    for the commit's call."""
    from sglang.srt.configs.qwen3_next import Qwen3NextConfig

    config = runner.model_config
    old = config.hf_config
    config.hf_config = Qwen3NextConfig()
    try:
        yield
    finally:
        config.hf_config = old


@contextlib.contextmanager
def standin_scatters(device: Any) -> Iterator[None]:
    """The scatter kernels' torch stand-ins in their module, where there is no CUDA."""
    import importlib

    import torch

    if torch.device(device).type == "cuda":
        yield
        return
    module = importlib.import_module(_KERNELS)
    names = ("fused_mamba_state_scatter_with_mask", "fused_conv_window_scatter_with_mask")
    saved = {name: getattr(module, name) for name in (*names, "fused_conv_window_scatter_multi")}
    for name in names:
        setattr(module, name, _scatter)
    module.fused_conv_window_scatter_multi = _scatter_multi
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)


def _scatter(dst: Any, src: Any, dst_indices_raw: Any, step_indices_raw: Any, src_indices_raw: Any = None) -> None:
    """What the scatter kernels do, request by request: a negative step or an index out of range
    is skipped (the kernels' bounds check), else ``dst[:, slot] = src[:, row, step]``."""
    import torch

    _check_call(dst, src, dst_indices_raw, step_indices_raw, src_indices_raw)
    steps = step_indices_raw.to("cpu", torch.long).tolist()
    slots = dst_indices_raw.to("cpu", torch.long).tolist()
    rows = list(range(len(steps))) if src_indices_raw is None else src_indices_raw.to("cpu", torch.long).tolist()
    for slot, step, row in zip(slots, steps, rows):
        if step < 0 or not (0 <= slot < dst.shape[1] and 0 <= row < src.shape[1] and step < src.shape[2]):
            continue
        dst[:, slot] = src[:, row, step]


def _check_call(dst: Any, src: Any, dst_indices: Any, steps: Any, rows: Any) -> None:
    """What the kernels' wrappers refuse (a ValueError or a failed attribute there): the code
    under test's call, never the stand-in's fault."""
    import torch

    from sglfix.harness.codefault import BrokenContract

    for name, given in (("dst", dst), ("src", src), ("dst_indices_raw", dst_indices), ("step_indices_raw", steps)):
        if not isinstance(given, torch.Tensor):
            raise BrokenContract(f"the commit hands the state scatter {type(given).__name__} for {name}, not a tensor")
    if rows is not None and (not isinstance(rows, torch.Tensor) or rows.shape != steps.shape):
        raise BrokenContract("the commit hands the state scatter source rows that do not match its step indices")
    if dst_indices.ndim != 1 or steps.ndim != 1 or dst_indices.shape[0] != steps.shape[0]:
        raise BrokenContract(
            f"the commit hands the state scatter {tuple(dst_indices.shape)} slots for {tuple(steps.shape)} steps"
        )
    if dst.shape[0] != src.shape[0] or dst.shape[2:] != src.shape[3:]:
        raise BrokenContract(f"the commit scatters states of {tuple(src.shape)} into {tuple(dst.shape)}")


def _scatter_multi(
    pairs: Any, dst_indices_raw: Any, step_indices_raw: Any, dst_indices2_raw: Any = None, step_indices2_raw: Any = None
) -> None:
    for dst, src in pairs:
        _scatter(dst, src, dst_indices_raw, step_indices_raw)
        if step_indices2_raw is not None:
            _scatter(dst, src, dst_indices2_raw, step_indices2_raw)
