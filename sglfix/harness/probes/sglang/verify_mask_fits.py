"""Probe ``verify-mask-fits`` (PR 33127): where the EAGLE verify tree mask is written, and whether
the tree kernel's writes fit there.

A backend with CUDA-graph state owns a verify-mask buffer sized for its largest captured batch
(``max_bs`` requests of ``num_draft_tokens x (max_context_len + num_draft_tokens)`` cells under
FULL_MASK): the tree kernel writes the mask straight into it and the replayed verify graph reads
it from there. A batch past ``max_bs`` runs eagerly and needs its own allocation; before the fix
the FULL_MASK buffer was handed to any batch, and a long-context batch past ``max_bs`` wrote past
its end.

Inputs from the scenario: ``prefix_lens`` (the verify batch's committed lengths),
``max_context_len``, ``spec`` (the draft tree's shape), ``gpu_only`` (no ``seq_lens_sum`` on the
host). The backend's graph state is sized for one request fewer than the batch: the batch runs
eagerly past ``max_bs``, its first ``max_bs`` requests are a batch the graph takes.

Real code run: the installed ``eagle_worker_common.build_eagle_verify_input`` (``fits``, the
buffer choice, ``build_tree_kernel_efficient``'s allocation) over a real ``ScheduleBatch`` and the
Triton backend's own ``VerifyMask`` (``init_cuda_graph_state``), both batches. The tree kernel is
not launched: sglfix stands at its boundary (``build_tree_kernel_efficient_func``) and computes,
from the lengths it is handed, the cells it writes. sglfix's expectation: those cells fit the
buffer it is handed (INVARIANT otherwise), and a batch the graph takes gets the backend's buffer,
the one the replay reads (INVARIANT otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglfix.harness.adapters.sglang.glue import make_schedule_batch
from sglfix.harness.fingerprint import observe
from sglfix.harness.misfit import Standin
from sglfix.harness.probes.sglang.common import bound, runners_unpublished
from sglfix.harness.unavailable import Unavailable

__all__ = ["PROBE"]

_LAUNCHES = ("build_tree_kernel_efficient_func", "sgl_build_tree_kernel_efficient")


class _KernelBoundary:
    """Stands where the tree kernel is launched: keeps what it is handed, launches nothing."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, *args: Any) -> None:
        # The launch's positional arguments (sglang's order since 0.5.17): parent_list,
        # top_scores_index, seq_lens, tree_mask, positions, the three retrieve buffers, topk,
        # spec_steps, num_verify_tokens, tree_mask_mode.
        seq_lens, tree_mask, positions = args[2], args[3], args[4]
        num_verify_tokens, tree_mask_mode = args[10], args[11]
        self.calls.append(
            {
                "seq_lens": [int(x) for x in seq_lens.tolist()],
                "numel": int(tree_mask.numel()),
                "ptr": int(tree_mask.data_ptr()),
                "ndt": int(num_verify_tokens),
                "mode": getattr(tree_mask_mode, "name", str(tree_mask_mode)),
            }
        )
        positions.zero_()


def _launch_name(utils: Any) -> str:
    """The launch build_tree_kernel_efficient makes on a GPU: sglang's own dispatcher in the newer
    releases, sgl_kernel's kernel under the module's own name in the older (unbound without a GPU)."""
    return _LAUNCHES[0] if hasattr(utils, _LAUNCHES[0]) else _LAUNCHES[1]


def _written(call: dict) -> int:
    """Cells the tree kernel writes: per request a ``ndt x (seq_len + ndt)`` block under FULL_MASK,
    ``ndt x ndt`` under QLEN_ONLY."""
    ndt, lens = call["ndt"], call["seq_lens"]
    if call["mode"] == "FULL_MASK":
        return ndt * sum(lens) + ndt * ndt * len(lens)
    return ndt * ndt * len(lens)


def _draft_outputs(*, bs: int, spec: Any, device: str) -> tuple[Any, Any, Any, Any]:
    """What the draft loop hands the verify-input builder: the bonus tokens, the parent list, the
    selected node of each draft token and the draft tokens (the shapes draft_forward returns)."""
    import torch

    topk, steps, ndt = spec.topk, spec.num_steps, spec.num_draft_tokens
    parents = topk + max(steps - 1, 0) * topk * topk if topk > 1 else steps
    bonus = torch.arange(1, bs + 1, dtype=torch.int64, device=device)
    parent_list = torch.zeros((bs, parents), dtype=torch.int64, device=device)
    top_scores_index = torch.arange(ndt - 1, dtype=torch.int64, device=device).repeat(bs, 1)
    draft_tokens = torch.ones((bs, ndt - 1), dtype=torch.int64, device=device)
    return bonus, parent_list, top_scores_index, draft_tokens


class VerifyMaskFits:
    name = "verify-mask-fits"

    def check_available(self, device: str) -> None:
        import importlib
        import importlib.util

        present = all(
            importlib.util.find_spec(m) is not None
            for m in ("sglang.srt.layers.attention.verify_mask", "sglang.srt.speculative.eagle_worker_common")
        )
        if not present or not hasattr(
            importlib.import_module("sglang.srt.speculative.eagle_worker_common"), "build_eagle_verify_input"
        ):
            # Before 0.5.17 the worker takes the backend's graph mask buffer for every verify
            # (get_verify_buffers_to_fill_after_draft): no buffer choice to probe.
            raise Unavailable("this release has no VerifyMask: its worker hands every verify the graph mask buffer")

    def run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        with runners_unpublished():
            self._run(scenario, device=device, result=result, stage=stage)

    def _run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        import torch
        from sglang.srt.speculative import eagle_utils as utils
        from sglang.srt.speculative.eagle_worker_common import build_eagle_verify_input

        from sglfix.harness.adapters.sglang.triton import SglangTritonAdapter

        stage("build")
        spec, lens = scenario.spec, [int(p) for p in scenario.prefix_lens]
        bs = len(lens)
        max_bs = bs - 1
        adapter = SglangTritonAdapter()
        sized = scenario.model_copy(update={"backend": "triton", "probe": None, "mode": "TARGET_VERIFY"})
        prepared = adapter.build(sized, device=device)
        backend = adapter.make_backend(prepared)
        runner = prepared.case.runner
        backend.init_cuda_graph_state(max_bs, max_bs * spec.num_draft_tokens)
        verify_mask = backend.verify_mask
        rows = prepared.case.forward_batch.req_pool_indices
        bad, said = [], []
        for name, batch_lens in (("past max_bs", lens), ("within max_bs", lens[:max_bs])):
            stage(f"verify input, {name}")
            n = len(batch_lens)
            bonus, parent_list, top_scores_index, draft_tokens = _draft_outputs(bs=n, spec=spec, device=device)
            boundary = _KernelBoundary()
            with bound(utils, **{_launch_name(utils): boundary}):
                verify_input = build_eagle_verify_input(
                    make_schedule_batch(
                        runner=runner,
                        req_pool_indices=rows[:n],
                        seq_lens=torch.tensor(batch_lens, dtype=torch.int64),
                        gpu_only=scenario.gpu_only,
                        out_cache_loc=None,
                        device=device,
                    ),
                    Standin(bonus_tokens=bonus),
                    parent_list,
                    top_scores_index,
                    draft_tokens,
                    None,
                    target_worker=Standin(model_runner=runner),
                    topk=spec.topk,
                    num_steps=spec.num_steps,
                    num_draft_tokens=spec.num_draft_tokens,
                    tree_mask_mode=utils.default_tree_mask_mode(),
                    device=device,
                )
            observe(f"verify input, {name}", verify_input, boundary.calls)
            stage(f"judge, {name}")
            if not boundary.calls:
                bad.append(f"{name}: the tree kernel was never launched")
                continue
            call = boundary.calls[-1]
            written = _written(call)
            own = verify_mask is not None and call["ptr"] == int(verify_mask.buffer.data_ptr())
            where = "the backend's buffer" if own else "its own allocation"
            if written > call["numel"]:
                bad.append(
                    f"{name} ({n} requests, {sum(batch_lens)} cached tokens): the tree kernel writes {written} "
                    f"{call['mode']} cells into {where} of {call['numel']}"
                )
            elif n <= max_bs and verify_mask is not None and not own:
                bad.append(
                    f"{name} ({n} requests): the mask went to a fresh allocation, the replayed verify graph reads "
                    "the backend's buffer"
                )
            elif verify_input.custom_mask is None or int(verify_input.custom_mask.data_ptr()) != call["ptr"]:
                bad.append(f"{name}: the verify input's custom_mask is not the buffer the tree kernel wrote")
            else:
                said.append(f"{name} ({n} requests): {written} cells in {where} of {call['numel']}")
        figures = {"max_bs": max_bs, "mode": getattr(getattr(verify_mask, "mode", None), "name", None)}
        if bad:
            result.add("INVARIANT", "verify tree mask: " + "; ".join(bad), **figures)
        else:
            result.add("PASS", f"verify tree mask, graph state for {max_bs}: " + "; ".join(said), **figures)


PROBE = VerifyMaskFits()
