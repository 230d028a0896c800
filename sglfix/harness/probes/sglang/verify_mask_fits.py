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
buffer choice, ``build_tree_kernel_efficient``) over a real ``ScheduleBatch`` and the Triton
backend's own ``VerifyMask`` (``init_cuda_graph_state``), both batches, from the draft outputs of a
seeded draft tree (``spec``'s shape, breadth first). sglfix stands at the tree kernel's launch
(``build_tree_kernel_efficient_func``): it computes, from the lengths it is handed, the cells the
kernel writes, and where they fit the buffer it launches sglang's own Triton build of the kernel
there (sgl_kernel's CUDA kernel is on no machine here). sglfix's expectation: those cells fit the
buffer it is handed (INVARIANT otherwise); a batch the graph takes gets the backend's buffer, the
one the replay reads (INVARIANT otherwise); and the verify input holds what the tree gives, from
its parent list alone (DIVERGE otherwise): each draft token's mask row sees the prefix and its
ancestors and itself, its position is the prefix length plus its depth, the retrieve index and
links (first child, next sibling) and the tokens are the tree's.
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
    """Stands where the tree kernel is launched: keeps what it is handed and, where ``kernel`` is
    given and the writes fit the mask it is handed, launches it there (an overflowing launch is
    the finding, never run: it would write past the buffer)."""

    def __init__(self, kernel: Callable[..., None] | None = None) -> None:
        self.calls: list[dict] = []
        self.kernel = kernel

    def __call__(self, *args: Any) -> None:
        # Reads only what the caller hands the launch, as the kernel would: what fails is the caller's.
        __sglfix_passthrough__ = True  # noqa: F841
        # The launch's positional arguments (sglang's order since 0.5.17): parent_list,
        # top_scores_index, seq_lens, tree_mask, positions, the three retrieve buffers, topk,
        # spec_steps, num_verify_tokens, tree_mask_mode.
        seq_lens, tree_mask, positions = args[2], args[3], args[4]
        num_verify_tokens, tree_mask_mode = args[10], args[11]
        call = {
            "seq_lens": [int(x) for x in seq_lens.tolist()],
            "numel": int(tree_mask.numel()),
            "ptr": int(tree_mask.data_ptr()),
            "ndt": int(num_verify_tokens),
            "mode": getattr(tree_mask_mode, "name", str(tree_mask_mode)),
            "launched": False,
        }
        self.calls.append(call)
        if self.kernel is not None and call["mode"] in ("FULL_MASK", "QLEN_ONLY") and _written(call) <= call["numel"]:
            self.kernel(*args)
            call["launched"] = True
        else:
            positions.zero_()


def _tree_kernel() -> Callable[..., None] | None:
    """sglang's own Triton build of the tree kernel (its XPU path), launched the way sglang's
    launcher does, in place of sgl_kernel's CUDA kernel, which no machine here has; None where
    the release has no such kernel."""
    try:
        from sglang.kernels.ops.speculative import spec_tree
    except ImportError:
        return None
    jit = getattr(spec_tree, "sgl_build_tree_kernel_efficient_triton", None)
    if jit is None:
        return None

    def launch(*args: Any) -> None:
        __sglfix_passthrough__ = True  # noqa: F841  (what the kernel fails on is the caller's)
        parent_list, selected, seq_lens, tree_mask, positions, r_index, r_next, r_sibling = args[:8]
        topk, depth, ndt, mode = args[8:12]
        bs = int(seq_lens.shape[0])
        jit[(bs,)](
            parent_list,
            selected,
            seq_lens,
            seq_lens.cumsum(0) - seq_lens,
            tree_mask,
            positions,
            r_index,
            r_next,
            r_sibling,
            topk=topk,
            depth=depth,
            draft_token_num=ndt,
            tree_mask_mode=int(mode),
            batch_size=bs,
            parent_list_stride=parent_list.stride(0) if parent_list.dim() > 1 else parent_list.shape[0],
            selected_index_stride=selected.stride(0),
        )

    return launch


def _launch_name(utils: Any) -> str:
    """The launch build_tree_kernel_efficient makes on a GPU: sglang's own dispatcher in the newer
    releases, sgl_kernel's kernel under the module's own name in the older (unbound without a GPU)."""
    return _LAUNCHES[0] if hasattr(utils, _LAUNCHES[0]) else _LAUNCHES[1]


def _mask_cells(*, ndt: int, lens: list[int], full: bool) -> int:
    """Cells a tree mask takes: per request a ``ndt x (seq_len + ndt)`` block under FULL_MASK,
    ``ndt x ndt`` under QLEN_ONLY."""
    return ndt * sum(lens) * full + ndt * ndt * len(lens)


def _written(call: dict) -> int:
    """Cells the tree kernel writes for the lengths it is handed."""
    return _mask_cells(ndt=call["ndt"], lens=call["seq_lens"], full=call["mode"] == "FULL_MASK")


def _draft_tree(*, spec: Any, seed: int) -> list[int]:
    """A seeded draft tree of ``num_draft_tokens`` nodes, node 0 the verified token: each node's
    parent (-1 for the root), at most ``topk`` children a node and ``num_steps`` deep, numbered
    breadth first (parents never decrease), as the draft loop's sorted scores number them."""
    import random

    rng = random.Random(seed)
    topk, steps, ndt = spec.topk, spec.num_steps, spec.num_draft_tokens
    parents, depth, children = [-1], [0], [0]
    q = 0

    def full(node: int) -> bool:
        return children[node] >= topk or depth[node] >= steps

    for i in range(1, ndt):
        # Move on when the node is full, or, once it has a child, by chance to the next one.
        while full(q) or (children[q] and q + 1 < i and not full(q + 1) and rng.random() < 0.4):
            q += 1
        parents.append(q)
        depth.append(depth[q] + 1)
        children.append(0)
        children[q] += 1
    return parents


def _draft_outputs(*, bs: int, spec: Any, device: str, tree: list[int]) -> tuple[Any, Any, Any, Any]:
    """What the draft loop hands the verify-input builder for ``tree`` (the same for every
    request): the bonus tokens, the parent list, the selected score of each draft token and the
    draft tokens (the shapes draft_forward returns). A node's score index is its parent's number
    times topk plus its rank among the parent's children; parent_list[q] holds node q's score
    index, which is how the tree kernel finds a score's parent."""
    import torch

    topk, steps, ndt = spec.topk, spec.num_steps, spec.num_draft_tokens
    width = topk + max(steps - 1, 0) * topk * topk if topk > 1 else steps
    width = max(width, ndt)
    rank: dict[int, int] = {}
    selected: list[int] = []
    for node in range(1, ndt):
        q = tree[node]
        rank[q] = rank.get(q, -1) + 1
        selected.append(q * topk + rank[q])
    parent_list = [0] * width
    for q in range(1, ndt):
        parent_list[q] = selected[q - 1]
    bonus = torch.arange(1, bs + 1, dtype=torch.int64, device=device)
    plist = torch.tensor([parent_list] * bs, dtype=torch.int64, device=device)
    top_scores_index = torch.tensor([selected] * bs, dtype=torch.int64, device=device)
    draft_tokens = (torch.arange(ndt - 1, dtype=torch.int64, device=device) + 100).repeat(bs, 1)
    return bonus, plist, top_scores_index, draft_tokens


def _ints(value: Any) -> Any:
    """A tensor's values as (nested) ints; anything else as it is, to be named in the finding."""
    import torch

    return value.to(torch.int64).cpu().tolist() if isinstance(value, torch.Tensor) else value


def _tree_facts(tree: list[int]) -> tuple[list[int], Any, list[int], list[int]]:
    """Each node's depth, which nodes it sees (``truth.tree_visibility``: its ancestors and
    itself), its first child and its next sibling (-1: none), from the parent list alone."""
    from sglfix.harness.adapters.sglang.truth import tree_visibility

    ndt = len(tree)
    depth = [0] * ndt
    for i in range(1, ndt):
        depth[i] = depth[tree[i]] + 1
    seen = tree_visibility(tree)
    first_child = [next((c for c in range(1, ndt) if tree[c] == q), -1) for q in range(ndt)]
    sibling = [-1] + [next((d for d in range(c + 1, ndt) if tree[d] == tree[c]), -1) for c in range(1, ndt)]
    return depth, seen, first_child, sibling


def _check_mask(mask: Any, *, full: bool, lens: list[int], seen: Any, prefix_filled: bool) -> str | None:
    """Each request's block of the flat mask: a draft token's row sees the whole prefix (FULL_MASK,
    where the prefix is filled) and, of the tree, its ancestors and itself."""
    import torch

    ndt, at = len(seen), 0
    for b, seq_len in enumerate(lens):
        width = seq_len + ndt if full else ndt
        block = mask[at : at + ndt * width].reshape(ndt, width)
        at += ndt * width
        for i in range(ndt):
            if full and prefix_filled and not bool(block[i, :seq_len].all()):
                k = int((block[i, :seq_len] == 0).nonzero()[0])
                return f"mask: request {b} draft token {i} does not see prefix token {k}"
            cols = block[i, seq_len:] if full else block[i]
            want = seen[i].to(torch.int64)
            if not torch.equal(cols, want):
                j = int((cols != want).nonzero()[0])
                return f"mask: request {b} draft token {i} {'sees' if int(cols[j]) else 'does not see'} draft token {j}"
    return None


def _check_tree(
    verify_input: Any, *, call: dict, lens: list[int], spec: Any, tree: list[int], prefix_filled: bool
) -> str | None:
    """What the verify input holds against the tree it was built from and the batch's lengths:
    its sizes, the mask, the positions (prefix length plus depth), the retrieve index and links
    (first child, next sibling) and the draft tokens; the first difference, or None."""
    import torch

    ndt = spec.num_draft_tokens
    for name, want in (("draft_token_num", ndt), ("topk", spec.topk), ("spec_steps", spec.num_steps)):
        have = _ints(getattr(verify_input, name, want))
        if have != want:
            return f"{name} is {have!r}, the draft was built with {want}"
    depth, seen, first_child, sibling = _tree_facts(tree)
    if not isinstance(verify_input.custom_mask, torch.Tensor):
        return f"custom_mask is {verify_input.custom_mask!r}, not a mask"
    mask = verify_input.custom_mask.reshape(-1).to(torch.int64).cpu()
    full = call["mode"] == "FULL_MASK"
    need = _mask_cells(ndt=ndt, lens=lens, full=full)
    if mask.numel() < need:
        return f"custom_mask holds {mask.numel()} cells, the tree of {len(lens)} requests needs {need}"
    wrong = _check_mask(mask, full=full, lens=lens, seen=seen, prefix_filled=prefix_filled)
    if wrong is not None:
        return f"{wrong} (tree parents {tree})"

    def field(*names: str) -> Any:
        return next((getattr(verify_input, n) for n in names if getattr(verify_input, n, None) is not None), None)

    expected = {
        ("positions",): [s + depth[i] for s in lens for i in range(ndt)],
        ("retrieve_index", "retrive_index"): [[b * ndt + i for i in range(ndt)] for b in range(len(lens))],
        ("retrieve_next_token", "retrive_next_token"): [first_child for _ in lens],
        ("retrieve_next_sibling", "retrive_next_sibling"): [sibling for _ in lens],
        ("draft_token",): [t for b in range(len(lens)) for t in [b + 1, *range(100, 100 + ndt - 1)]],
    }
    for names, want in expected.items():
        have = _ints(field(*names))
        if have != want:
            return f"{names[0]} is {have}, the tree {tree} gives {want}"
    return None


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
        tree = _draft_tree(spec=spec, seed=scenario.seed)
        kernel = _tree_kernel()
        built: list[str] = []
        bad, said = [], []
        for name, batch_lens in (("past max_bs", lens), ("within max_bs", lens[:max_bs])):
            stage(f"verify input, {name}")
            n = len(batch_lens)
            bonus, parent_list, top_scores_index, draft_tokens = _draft_outputs(
                bs=n, spec=spec, device=device, tree=tree
            )
            boundary = _KernelBoundary(kernel)
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
                if call["launched"]:
                    # The prefix columns are filled only where the backend reads them.
                    filled = verify_mask is None or bool(getattr(verify_mask, "is_read", True))
                    wrong = _check_tree(
                        verify_input, call=call, lens=batch_lens, spec=spec, tree=tree, prefix_filled=filled
                    )
                    if wrong is not None:
                        result.add("DIVERGE", f"verify input, {name}: {wrong}", tree=tree)
                    else:
                        built.append(name)
        figures = {"max_bs": max_bs, "mode": getattr(getattr(verify_mask, "mode", None), "name", None)}
        if bad:
            result.add("INVARIANT", "verify tree mask: " + "; ".join(bad), **figures)
        else:
            result.add("PASS", f"verify tree mask, graph state for {max_bs}: " + "; ".join(said), **figures)
        if built:
            result.add(
                "PASS",
                f"verify input of the tree {tree} (mask, positions, retrieve links, tokens) as the tree gives it: "
                + ", ".join(built),
                tree=tree,
            )


PROBE = VerifyMaskFits()
