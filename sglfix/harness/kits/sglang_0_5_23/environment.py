"""What a process needs before it builds a draft case on sglang 0.5.23's kit: ``prepare()`` (the
code base active, the kit's test utilities importable on this machine), the availability checks the
draft adapters ask for, and the unittest stand-in the kit's fixtures take."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = [
    "FixtureTestCase",
    "context_kept",
    "decide_needs_cpu_seq_lens",
    "draft_backend_factory",
    "engine_flags",
    "flash_mla_available",
    "flashinfer_available",
    "has_cuda",
    "init_then_join",
    "plans_verify_early",
    "prepare",
    "prepare_for_draft_extend",
    "publish_server_args",
    "publish_spec",
    "published",
    "server_args",
    "with_server_args",
]

_PREPARED = False


def prepare() -> None:
    """Make this process ready to import the kit: the sglang code base active, ``datasets`` stood in
    for (``sglang.test.test_utils`` imports the benchmark datasets at module level; the kit takes
    only ``server_args_variant`` from it) and ``test_utils`` imported once with a
    ``CUDA_VISIBLE_DEVICES`` it can parse (it reads the first character; CPU runs set it empty)."""
    global _PREPARED
    if _PREPARED:
        return
    from sglfix.codebases import active, standins

    if active().kit != __package__:
        raise RuntimeError(
            f"the kit {__package__} needs a code base whose kit it is active in this process "
            f"(sglfix.codebases.activate), not {active().name}"
        )
    standins.install(("datasets",))
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        if saved is not None and not saved:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        importlib.import_module("sglang.test.test_utils")
    finally:
        if saved is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    _PREPARED = True


@contextlib.contextmanager
def context_kept() -> Iterator[None]:
    """sglang's runtime context (published server args, flag groups, parallel overrides) put back
    exactly as it was when the block ends: the kit's fixtures publish and never take back.

    Each slot of the context is kept, and an object written in place (a flag group, the parallel
    context's overrides) by its leaves. Not sglang's ``snapshot_context`` (0.5.19 on): earlier
    releases lack it, and it keeps the parallel context's override table by reference, so an
    override entered in place outlives it. Before 0.5.15 the published server args are a global
    of ``server_args``, kept too."""
    import sglang.srt.server_args as server_args_module

    kept_global = getattr(server_args_module, "_global_server_args", None)
    try:
        from sglang.srt import runtime_context as rc
    except ImportError:
        rc = None
    context = rc.get_context() if rc is not None else None
    kept = {}
    if context is not None:
        kept = {name: (getattr(context, name), _leaves(getattr(context, name))) for name in _slots(context)}
    try:
        yield
    finally:
        if hasattr(server_args_module, "_global_server_args"):
            server_args_module._global_server_args = kept_global
        for name, (value, leaves) in kept.items():
            _put(context, name, value)
            _restore(value, leaves)


def _args_holder() -> tuple[Any, str]:
    """Where the published server args live: the runtime context's slot (0.5.15 on), before that a
    global of ``sglang.srt.server_args``."""
    try:
        from sglang.srt.runtime_context import get_context

        context = get_context()
        if "_server_args" in _slots(context):
            return context, "_server_args"
    except ImportError:
        pass
    import sglang.srt.server_args as server_args_module

    return server_args_module, "_global_server_args"


def server_args() -> Any:
    """The published server args (``ValueError`` when none is), wherever the release keeps them."""
    holder, name = _args_holder()
    value = getattr(holder, name)
    if value is None:
        raise ValueError("Global server args is not set yet!")
    return value


def publish_server_args(args: Any) -> None:
    """Put ``args`` (None: nothing) in place as the published server args."""
    holder, name = _args_holder()
    setattr(holder, name, args)


@contextlib.contextmanager
def published(**fields: Any) -> Iterator[None]:
    """Server args carrying ``fields`` published for the block, as the kit's mock runner publishes
    them (``override_server_args`` from 0.5.16 on; before, the kit's ``make_mock_server_args``
    through ``set_global_server_args_for_scheduler``); all put back afterwards."""
    with context_kept():
        try:
            from sglang.srt.runtime_context import get_context

            override = getattr(get_context(), "override_server_args", None)
        except ImportError:  # 0.5.13
            override = None
        if override is not None:
            with override(**fields):
                yield
            return
        from sglang.srt.server_args import set_global_server_args_for_scheduler
        from sglang.test.kits.attention_unittest.mock_server_args import make_mock_server_args

        set_global_server_args_for_scheduler(make_mock_server_args(**fields))
        yield


def _slots(obj: Any) -> tuple[str, ...]:
    if hasattr(type(obj), "__struct_fields__"):  # msgspec flag groups (0.5.19 on)
        return tuple(type(obj).__struct_fields__)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return tuple(f.name for f in dataclasses.fields(obj))
    return tuple(n for cls in type(obj).__mro__ for n in getattr(cls, "__slots__", ()))


def _leaves(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    if type(value).__module__ == "sglang.srt.runtime_context" and _slots(value):
        return {n: (getattr(value, n, None), _leaves(getattr(value, n, None))) for n in _slots(value)}
    return None


def _restore(value: Any, leaves: Any) -> None:
    if leaves is None:
        return
    if isinstance(value, dict):
        value.clear()
        value.update(leaves)
    elif isinstance(value, list):
        value[:] = leaves
    else:
        for name, (inner, inner_leaves) in leaves.items():
            _put(value, name, inner)
            _restore(inner, inner_leaves)


def _put(obj: Any, name: str, value: Any) -> None:
    # Only what was replaced: some holders refuse attribute writes (their leaves are restored in place).
    if getattr(obj, name, None) is not value:
        setattr(obj, name, value)


def publish_spec(runner: Any, **fields: Any) -> Any:
    """``fields`` (speculative sizes) published over the runner's server args, and the callable
    that puts the runner's back: an override installed on top of the kit's (0.5.16 on), else the
    fields set on the runner's own args (read from there before 0.5.16)."""
    try:
        from sglang.srt.runtime_context import get_context

        override = getattr(get_context(), "override_server_args", None)
    except ImportError:  # 0.5.13
        override = None
    if override is not None:
        # An override publishes a fresh ServerArgs of its fields alone: carry what the runner
        # published before (the kit's own fields, an earlier publication) under the new ones.
        before = getattr(runner, "_sglfix_published", None)
        if before is None:
            before = dict(getattr(getattr(runner, "_server_args_override", None), "_fields", None) or {})
        merged = {**before, **fields}
        ov = override(**merged)
        runner.server_args = ov.install()
        runner._sglfix_published = merged

        def restore_override() -> None:
            ov.restore()
            runner._sglfix_published = before

        return restore_override
    args = runner.server_args
    before = {name: getattr(args, name) for name in fields}
    for name, value in fields.items():
        setattr(args, name, value)

    def restore() -> None:
        for name, value in before.items():
            setattr(args, name, value)

    return restore


def with_server_args(function: Any, *args: Any) -> Any:
    """``function(*args)``, the published server args passed first where the release's function
    takes them (a first parameter ``server_args``: the sizing functions up to 0.5.17,
    ``decide_needs_cpu_seq_lens`` up to 0.5.18); later releases read them published."""
    import inspect

    parameters = list(inspect.signature(function).parameters)
    if parameters and parameters[0] == "server_args":
        return function(server_args(), *args)
    return function(*args)


def decide_needs_cpu_seq_lens(backends: Any) -> bool:
    """sglang's ``decide_needs_cpu_seq_lens`` over ``backends`` (the scheduler's decision)."""
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens as decide

    return with_server_args(decide, backends)


@contextlib.contextmanager
def engine_flags(env: dict[str, str]) -> Iterator[None]:
    """A scenario's engine flags set in this process for the cell (sglang reads each when it
    decides, through ``envs.NAME.get()``) and put back after: the worker runs other cells next.
    A flag this sglang does not declare is a path it does not have (a release older than the
    profile's): the cell cannot run here, said as such."""
    from sglang.srt.environ import envs

    from sglfix.common.environ import Text
    from sglfix.harness.unavailable import Unavailable

    missing = [name for name in env if not hasattr(type(envs), name)]
    if missing:
        raise Unavailable(f"this sglang declares no engine flag {missing[0]} (the path it switches is newer)")
    with contextlib.ExitStack() as stack:
        for name, value in env.items():
            stack.enter_context(Text(None, doc="a scenario's engine flag", name=name).override(value))
        yield


def plans_verify_early() -> bool:
    """Whether this process plans a verify on sglang's overlap plan stream
    (SGLANG_ENABLE_OVERLAP_PLAN_STREAM, a scenario's engine flag): the worker then calls the target
    backend's ``update_verify_buffers_to_fill_after_draft`` once the plan stream has joined the
    draft (``run_eagle_verify``). False where this sglang has no such flag."""
    from sglang.srt.environ import envs

    flag = getattr(envs, "SGLANG_ENABLE_OVERLAP_PLAN_STREAM", None)
    return bool(flag.get()) if flag is not None else False


def after_plan_join(backend: Any, batch: Any, cuda_graph_bs: int | None) -> None:
    """What ``run_eagle_verify`` does after the plan stream joined the draft, for a verify batch:
    the backend re-copies the draft-produced tree metadata (``cuda_graph_bs``: the replayed graph's
    size, None when the verify runs eagerly). Nothing without the plan stream."""
    if plans_verify_early() and batch.forward_mode.is_target_verify():
        backend.update_verify_buffers_to_fill_after_draft(batch.spec_info, cuda_graph_bs)


def init_then_join(backend: Any, batch: Any, cuda_graph_bs: int | None, init: Callable[[], Any]) -> None:
    """A metadata init as the worker completes it: ``init``, then ``after_plan_join``; the judge's
    look at the init (``guards.watch_metadata``) is held until both have run, since the launch
    reads what the fix-up left."""
    later: list = []
    backend._sglfix_judge_later = later
    try:
        init()
    finally:
        del backend._sglfix_judge_later
    after_plan_join(backend, batch, cuda_graph_bs)
    for judge in later:
        judge()


def draft_backend_factory(runner: Any, topk: int, num_steps: int) -> Any:
    """sglang's ``DraftBackendFactory`` for a draft runner; up to 0.5.17 it takes the server args
    first (the runner's), later it reads them published."""
    import inspect

    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    if "server_args" in inspect.signature(DraftBackendFactory).parameters:
        return DraftBackendFactory(runner.server_args, runner, topk, num_steps)
    return DraftBackendFactory(runner, topk, num_steps)


def prepare_for_draft_extend(
    *,
    num_accept_tokens: Any,
    batch: Any,
    predict: Any,
    num_draft_tokens: int,
    runner: Any,
    graph_runner: Any,
    hidden_states: Any = None,
) -> Any:
    """sglang's spec-v2 draft-extend glue with the draft-extend input production builds:
    ``eagle_worker_common.prepare_for_draft_extend`` from 0.5.16 on (its hidden-state option off),
    ``EagleDraftWorkerBase``'s method of the same body in 0.5.14-0.5.15 (it reads nothing of the
    worker); in 0.5.13 the worker's ``EagleDraftInput`` prepares its own extend
    (``prepare_for_extend_to_fill_draft_kvcache``), with no accept counts on it. ``hidden_states``:
    the target's hidden states the input carries (None: a draft that reads none; the data-parallel
    padding of 0.5.17-0.5.22 pads them whatever the draft)."""
    import inspect

    from sglang.srt.speculative import eagle_info

    ndt = num_draft_tokens
    if not hasattr(eagle_info.EagleDraftInput, "prepare_for_extend_to_fill_draft_kvcache"):
        draft_extend_input = eagle_info.EagleDraftExtendInput(
            hidden_states=hidden_states,
            num_correct_drafts=num_accept_tokens - 1,
            num_accept_tokens=num_accept_tokens,
            num_tokens_per_req=ndt,
            num_tokens_for_logprob_per_req=ndt,
        )
    else:  # 0.5.13
        draft_input = eagle_info.EagleDraftInput(
            hidden_states=None, num_tokens_per_req=ndt, num_tokens_for_logprob_per_req=ndt
        )
        return draft_input.prepare_for_extend_to_fill_draft_kvcache(batch, predict, ndt, runner, graph_runner)
    try:
        from sglang.srt.speculative.eagle_worker_common import prepare_for_draft_extend as glue
    except ImportError:
        from sglang.srt.speculative.base_spec_worker import EagleDraftWorkerBase

        return EagleDraftWorkerBase.prepare_for_draft_extend(
            None, draft_extend_input, batch, predict, ndt, runner, graph_runner
        )
    extra = {}
    if "return_hidden_states_before_norm" in inspect.signature(glue).parameters:
        extra["return_hidden_states_before_norm"] = False
    return glue(draft_extend_input, batch, predict, ndt, runner, graph_runner, **extra)


def boot() -> None:
    """What a worker sets up once, before its state snapshot. 0.5.13 has no runtime context to
    hold the parallel widths at one rank (later releases read them from overrides the kit sets):
    its attention and expert-parallel widths come from the process groups alone, so the worker
    brings up sglang's own single-rank groups (gloo, world size 1), as a one-GPU engine does."""
    try:
        import sglang.srt.runtime_context  # noqa: F401 - 0.5.14 on
    except ImportError:
        _single_rank_groups()
    _load_flashmla()


def _load_flashmla() -> None:
    """sglang's FlashMLA backend imports the ``flash_mla`` package at module level, for kernels
    only its forward calls. Where the package is missing the module is loaded once here over an
    inert stand-in package, with sglfix's torch FlashMLA bound to the two names it calls
    (``sglfix.harness.flashmla``), so that its toggles and mutants apply as any module's do and
    its state is in the worker's snapshot. A release without the module is left as it is."""
    import importlib

    from sglfix.harness import flashmla

    try:
        with flashmla.import_without_flash_mla():
            module = importlib.import_module("sglang.srt.layers.attention.flashmla_backend")
    except ImportError:
        return
    flashmla.install(module)


def _single_rank_groups() -> None:
    import tempfile

    from sglang.srt.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return
    # The file store's rendezvous is this process's alone: one rank, nothing to meet.
    folder = tempfile.mkdtemp(prefix="sglfix-groups-")
    store = os.path.join(folder, "store")
    try:
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{store}", backend="gloo"
        )
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def single_rank_moe() -> None:
    """0.5.16-0.5.19 derive the MoE expert-parallel width from process groups that a
    single-process kit never builds (later releases compute it from the published server args);
    held at one rank, as the kit holds the attention tensor-parallel width. Asked for by each cell
    that builds a forward batch (a worker restores sglang's state between cells)."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:  # 0.5.13: the single-rank groups of ``boot`` hold it
        return

    global _MOE_OVERRIDE
    try:
        get_parallel().moe_ep_size  # noqa: B018 - the read is the check
    except (RuntimeError, AssertionError):  # 0.5.19 raises the one, 0.5.18's group lookup the other
        # Kept referenced: a collected override generator restores the values it replaced.
        _MOE_OVERRIDE = get_parallel().override(moe_ep_size=1)
        _MOE_OVERRIDE.__enter__()


_MOE_OVERRIDE: Any = None


def has_cuda() -> bool:
    return torch.cuda.is_available()


def flashinfer_available() -> bool:
    from sglang.srt.utils import is_flashinfer_available

    return bool(is_flashinfer_available())


def flash_mla_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_mla") is not None


class FixtureTestCase:
    """The kit's fixtures take a unittest case for ``skipTest``; here that is an error, not a skip."""

    def skipTest(self, reason: str) -> None:
        if "backend is not available" in reason:
            # The release's backend cannot be built on this device (0.5.21's DSv4 needs CUDA):
            # a backend the code base lacks here, SKIP with the reason.
            from sglfix.harness.unavailable import Unavailable

            raise Unavailable(f"this sglang's kit cannot build the backend here: {reason}")
        raise RuntimeError(f"the sglang kit gave up building the fixture: {reason}")

    def assertEqual(self, a: Any, b: Any) -> None:
        assert a == b, (a, b)

    def assertTrue(self, a: Any) -> None:
        assert a


def bind_own_plan(runner: Any, batch: Any) -> None:
    """Bind ``batch`` to a plan of its final fields where the release has plans (0.5.22 on): the
    KV index translator of 0.5.19-0.5.21 reads the batch's fields directly, 0.5.18 has none."""
    bind = getattr(getattr(runner, "kv_index_translator", None), "bind_own_plan", None)
    if bind is not None:
        bind(batch)


def bind_runner_slots(runner: Any, batch: Any) -> None:
    """Bind a batch a graph runner builds over its own buffers (0.5.22 on; see ``bind_own_plan``)."""
    bind = getattr(getattr(runner, "kv_index_translator", None), "bind_runner_slots", None)
    if bind is not None:
        bind(batch)
