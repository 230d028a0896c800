"""What a process needs before it builds a draft case on sglang 0.5.23's kit: ``prepare()`` (the
code base active, the kit's test utilities importable on this machine), the availability checks the
draft adapters ask for, and the unittest stand-in the kit's fixtures take."""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

__all__ = ["FixtureTestCase", "flash_mla_available", "flashinfer_available", "has_cuda", "prepare"]

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


def single_rank_moe() -> None:
    """0.5.18-0.5.19 derive the MoE expert-parallel width from process groups that a
    single-process kit never builds (later releases compute it from the published server args);
    held at one rank, as the kit holds the attention tensor-parallel width. Asked for by each cell
    that builds a forward batch (a worker restores sglang's state between cells)."""
    from sglang.srt.runtime_context import get_parallel

    global _MOE_OVERRIDE
    try:
        get_parallel().moe_ep_size  # noqa: B018 - the read is the check
    except RuntimeError:
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
            from sglfix.harness.adapters.base import Unavailable

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
