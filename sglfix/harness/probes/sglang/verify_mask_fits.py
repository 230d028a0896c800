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
            _as_bytes(tree_mask),
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


def _as_bytes(tree_mask: Any) -> Any:
    """The mask as the CUDA kernel writes it: a bool per byte through the buffer's data pointer,
    whatever dtype the caller allocated (a float buffer gets its cells' bytes, not its elements)."""
    import torch

    if tree_mask.dtype in (torch.bool, torch.uint8) or not tree_mask.is_contiguous():
        return tree_mask
    return tree_mask.view(-1).view(torch.uint8)


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


# A mask cell holds 0 or 1 once written; the poison (``sglfix.harness.poison``) is any other byte.
_UNWRITTEN = "the mask's memory was never filled: on a GPU it holds whatever was there"


def _mask_bytes(mask: Any) -> Any:
    """The mask's cells as integers, a one-byte mask (bool, uint8) by its raw bytes: a bool's
    unwritten ``0xA5`` reads as True, and only its byte tells it from a written 1."""
    import torch

    flat = mask.reshape(-1)
    if flat.dtype in (torch.bool, torch.uint8):
        flat = flat.contiguous().view(torch.uint8)
    return flat.to(torch.int64).cpu()


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
            if full and prefix_filled and not bool((block[i, :seq_len] == 1).all()):
                k = int((block[i, :seq_len] != 1).nonzero()[0])
                if int(block[i, k]) > 1:
                    return f"mask: request {b} draft token {i}, prefix token {k}: a byte nothing wrote ({_UNWRITTEN})"
                return f"mask: request {b} draft token {i} does not see prefix token {k}"
            cols = block[i, seq_len:] if full else block[i]
            if bool((cols > 1).any()):
                j = int((cols > 1).nonzero()[0])
                return f"mask: request {b} draft token {i}, draft token {j}: a byte nothing wrote ({_UNWRITTEN})"
            want = seen[i].to(torch.int64)
            if not torch.equal(cols, want):
                j = int((cols != want).nonzero()[0])
                return f"mask: request {b} draft token {i} {'sees' if int(cols[j]) else 'does not see'} draft token {j}"
    return None


def _check_tree(
    verify_input: Any, *, call: dict, lens: list[int], spec: Any, tree: list[int], prefix_filled: bool, slots: Any
) -> str | None:
    """What the verify input holds against the tree it was built from and the batch's lengths:
    its sizes, the mask, the positions (prefix length plus depth), the retrieve index and links
    (first child, next sibling) and the draft tokens; the first difference, or None."""
    import torch

    ndt = spec.num_draft_tokens
    wrong = _check_shape(verify_input, spec=spec)
    if wrong is not None:
        return wrong
    depth, seen, first_child, sibling = _tree_facts(tree)
    if not isinstance(verify_input.custom_mask, torch.Tensor):
        return f"custom_mask is {verify_input.custom_mask!r}, not a mask"
    mask = _mask_bytes(verify_input.custom_mask)
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
    return _check_prepared(verify_input, lens=lens, ndt=ndt, slots=slots)


def _check_shape(verify_input: Any, *, spec: Any) -> str | None:
    """The sizes a verify input carries for the target's verify forward: the draft's shape, and
    ``num_tokens_per_req`` / ``num_tokens_for_logprob_per_req`` (the rows per request the verify
    forward plans and pads by, and the logits it keeps), both the draft token count; and that it
    says it is a verify input (``spec_input_type``)."""
    ndt = spec.num_draft_tokens
    sizes = (
        ("draft_token_num", ndt),
        ("topk", spec.topk),
        ("spec_steps", spec.num_steps),
        ("num_tokens_per_req", ndt),
        ("num_tokens_for_logprob_per_req", ndt),
    )
    for name, want in sizes:
        have = _ints(getattr(verify_input, name, want))
        if have != want:
            return f"{name} is {have!r}, the draft was built with {want} draft tokens ({spec.topk} x {spec.num_steps})"
    is_verify = getattr(verify_input, "is_verify_input", None)
    if callable(is_verify) and not is_verify():
        return f"spec_input_type is {getattr(verify_input, 'spec_input_type', None)!r}, not a verify input"
    return None


def _check_prepared(verify_input: Any, *, lens: list[int], ndt: int, slots: Any) -> str | None:
    """Where the chain builder (``build_chain_tree``: topk 1 on a GPU, mask unread) also hands the
    verify forward its KV write slots: draft token ``i`` of a request writes the slot its request
    row holds at ``seq_len + i``; without that builder there are none."""
    prepared = getattr(verify_input, "prepared_out_cache_loc", None)
    if prepared is None:
        return None
    want = [int(slots[b][s + i]) for b, s in enumerate(lens) for i in range(ndt)]
    have = _ints(prepared)
    if have != want:
        return f"prepared_out_cache_loc is {have}, the requests' rows give {want}"
    return None


def _check_idle(verify_input: Any, *, spec: Any) -> str | None:
    """An idle rank's verify input: the draft's sizes, and no rows in any tensor (a retrieve
    buffer keeps its ``num_draft_tokens`` columns)."""
    import torch

    wrong = _check_shape(verify_input, spec=spec)
    if wrong is not None:
        return wrong
    for name in (
        "draft_token",
        "custom_mask",
        "positions",
        "retrieve_index",
        "retrieve_next_token",
        "retrieve_next_sibling",
    ):
        value = getattr(verify_input, name, None)
        if not isinstance(value, torch.Tensor) or value.shape[0] != 0:
            return f"{name} is {getattr(value, 'shape', value)!r}, an idle batch has no rows"
        if name.startswith("retrieve") and tuple(value.shape) != (0, spec.num_draft_tokens):
            return f"{name} has shape {tuple(value.shape)}, an idle batch keeps (0, {spec.num_draft_tokens})"
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
        from sglfix.harness.adapters.sglang.triton import SglangTritonAdapter

        stage("build")
        spec, lens = scenario.spec, [int(p) for p in scenario.prefix_lens]
        max_bs = len(lens) - 1
        adapter = SglangTritonAdapter()
        sized = scenario.model_copy(update={"backend": "triton", "probe": None, "mode": "TARGET_VERIFY"})
        prepared = adapter.build(sized, device=device)
        backend = adapter.make_backend(prepared)
        backend.init_cuda_graph_state(max_bs, max_bs * spec.num_draft_tokens)
        verify = _Verify(
            scenario=scenario,
            device=device,
            runner=prepared.case.runner,
            backend=backend,
            rows=prepared.case.forward_batch.req_pool_indices,
            tree=_draft_tree(spec=spec, seed=scenario.seed),
            kernel=_tree_kernel(),
        )
        # The Triton backend reads the mask (FULL_MASK); a backend that never reads it (FlashMLA,
        # TRT-LLM MLA, DeepSeek-V4) owns one from the same factory with is_read=False.
        for owner, mask in (("read", backend.verify_mask), ("unread", _unread_mask(backend, spec, max_bs, device))):
            backend._verify_mask = mask
            if backend.verify_mask is not mask:
                # A release that keeps the mask elsewhere: the owner could not be swapped, and the
                # builder would be judged against a mask it was never handed.
                raise Unavailable("this release's Triton backend does not hand out its verify mask as _verify_mask")
            verify.owner(owner, mask, max_bs=max_bs, stage=stage)
        stage("verify input, idle")
        verify.idle()
        figures = {"max_bs": max_bs, "mode": getattr(getattr(backend.verify_mask, "mode", None), "name", None)}
        if verify.bad:
            result.add("INVARIANT", "verify tree mask: " + "; ".join(verify.bad), **figures)
        else:
            result.add("PASS", f"verify tree mask, graph state for {max_bs}: " + "; ".join(verify.said), **figures)
        for wrong in verify.wrong:
            result.add("DIVERGE", wrong, tree=verify.tree)
        if verify.built and not verify.wrong:
            result.add(
                "PASS",
                f"verify input of the tree {verify.tree} (mask, positions, retrieve links, tokens) as the tree "
                "gives it: " + ", ".join(verify.built),
                tree=verify.tree,
            )


def _as_read(verify_input: Any, calls: list[dict]) -> Any:
    """The verify input as the verify forward reads it: its fields, the mask cut to the cells the
    tree kernel wrote (the attention kernels read no further; a larger allocation changes
    nothing they see)."""
    import torch

    fields = dict(sorted(vars(verify_input).items()))
    mask = fields.get("custom_mask")
    if calls and isinstance(mask, torch.Tensor):
        fields["custom_mask"] = mask.reshape(-1)[: _written(calls[-1])]
    return fields


def _unplaced(calls: list[dict]) -> list[dict]:
    """The launches as the digest sees them: where the mask sits in memory differs from run to
    run, and how large its allocation is beyond the cells written changes nothing a kernel reads
    (both are judged: the backend's buffer or not, the writes within it)."""
    return [{k: v for k, v in call.items() if k not in ("ptr", "numel")} for call in calls]


def _unread_mask(backend: Any, spec: Any, max_bs: int, device: str) -> Any:
    """The verify mask a backend that never reads it allocates for ``max_bs`` (sglang's own
    factory, as FlashMLA's and TRT-LLM MLA's graph state call it)."""
    from sglang.srt.layers.attention.verify_mask import maybe_create_verify_mask

    return maybe_create_verify_mask(
        is_draft_runner=False,
        skip_prefill=False,
        max_bs=max_bs,
        max_context_len=backend.max_context_len,
        num_draft_tokens=spec.num_draft_tokens,
        device=device,
        is_read=False,
    )


class _Verify:
    """Builds verify inputs through the installed ``build_eagle_verify_input`` and judges them:
    the mask owner's layout, where the tree kernel writes and what the input holds."""

    def __init__(
        self, *, scenario: Any, device: str, runner: Any, backend: Any, rows: Any, tree: list[int], kernel: Any
    ) -> None:
        self.scenario, self.device, self.runner, self.backend = scenario, device, runner, backend
        self.rows, self.tree, self.kernel = rows, tree, kernel
        self.slots = runner.req_to_token_pool.req_to_token[rows.to(runner.req_to_token_pool.req_to_token.device)].cpu()
        self.bad: list[str] = []
        self.said: list[str] = []
        self.wrong: list[str] = []
        self.built: list[str] = []

    def build(self, batch_lens: list[int], *, idle: bool = False) -> tuple[Any, list[dict]]:
        import torch
        from sglang.srt.speculative import eagle_utils as utils
        from sglang.srt.speculative.eagle_worker_common import build_eagle_verify_input

        spec, n = self.scenario.spec, len(batch_lens)
        bonus, parent_list, top_scores_index, draft_tokens = _draft_outputs(
            bs=n, spec=spec, device=self.device, tree=self.tree
        )
        boundary = _KernelBoundary(self.kernel)
        with bound(utils, **{_launch_name(utils): boundary}):
            verify_input = build_eagle_verify_input(
                make_schedule_batch(
                    runner=self.runner,
                    req_pool_indices=self.rows[:n],
                    seq_lens=torch.tensor(batch_lens, dtype=torch.int64),
                    gpu_only=self.scenario.gpu_only,
                    out_cache_loc=None,
                    device=self.device,
                    idle=idle,
                ),
                Standin(bonus_tokens=bonus),
                parent_list,
                top_scores_index,
                draft_tokens,
                None,
                target_worker=Standin(model_runner=self.runner),
                topk=spec.topk,
                num_steps=spec.num_steps,
                num_draft_tokens=spec.num_draft_tokens,
                tree_mask_mode=utils.default_tree_mask_mode(),
                device=self.device,
            )
        return verify_input, boundary.calls

    def owner(self, owner: str, verify_mask: Any, *, max_bs: int, stage: Callable[[str], None]) -> None:
        """Both batches (past and within ``max_bs``) against one mask owner."""
        wrong = _check_owner(verify_mask, owner=owner, max_bs=max_bs, spec=self.scenario.spec, backend=self.backend)
        if wrong is not None:
            self.bad.append(wrong)
        lens = [int(p) for p in self.scenario.prefix_lens]
        for batch, batch_lens in (("past max_bs", lens), ("within max_bs", lens[:max_bs])):
            name = batch if owner == "read" else f"{batch}, mask unread"
            stage(f"verify input, {name}")
            verify_input, calls = self.build(batch_lens)
            observe(f"verify input, {name}", _as_read(verify_input, calls), _unplaced(calls))
            stage(f"judge, {name}")
            self.judge(name, verify_input, calls, batch_lens=batch_lens, verify_mask=verify_mask, max_bs=max_bs)

    def judge(
        self, name: str, verify_input: Any, calls: list[dict], *, batch_lens: list[int], verify_mask: Any, max_bs: int
    ) -> None:
        n = len(batch_lens)
        chain = not calls and getattr(verify_input, "prepared_out_cache_loc", None) is not None
        if not calls:
            if not chain:
                self.bad.append(f"{name}: the tree kernel was never launched")
                return
            # The chain builder wrote the whole input itself, straight into the mask it was handed.
            calls = [
                {
                    "mode": "QLEN_ONLY",
                    "ndt": self.scenario.spec.num_draft_tokens,
                    "seq_lens": batch_lens,
                    "numel": int(verify_input.custom_mask.numel()),
                    "ptr": int(verify_input.custom_mask.data_ptr()),
                    "launched": True,
                }
            ]
        call = calls[-1]
        if call["mode"] not in ("FULL_MASK", "QLEN_ONLY"):
            self.bad.append(f"{name}: the tree kernel was handed mask mode {call['mode']}, not the owner's layout")
            return
        written = _written(call)
        own = verify_mask is not None and call["ptr"] == int(verify_mask.buffer.data_ptr())
        where = "the backend's buffer" if own else "its own allocation"
        if written > call["numel"]:
            self.bad.append(
                f"{name} ({n} requests, {sum(batch_lens)} cached tokens): the tree kernel writes {written} "
                f"{call['mode']} cells into {where} of {call['numel']}"
            )
        elif n <= max_bs and verify_mask is not None and not own:
            self.bad.append(
                f"{name} ({n} requests): the mask went to a fresh allocation, the replayed verify graph reads "
                "the backend's buffer"
            )
        elif verify_input.custom_mask is None or int(verify_input.custom_mask.data_ptr()) != call["ptr"]:
            self.bad.append(f"{name}: the verify input's custom_mask is not the buffer the tree kernel wrote")
        else:
            by = " by the chain builder" if chain else ""
            self.said.append(f"{name} ({n} requests): {written} {call['mode']} cells{by} in {where} of {call['numel']}")
            if call["launched"]:
                # The prefix columns are filled only where the backend reads them.
                filled = verify_mask is None or bool(getattr(verify_mask, "is_read", True))
                wrong = _check_tree(
                    verify_input,
                    call=call,
                    lens=batch_lens,
                    spec=self.scenario.spec,
                    tree=self.tree,
                    prefix_filled=filled,
                    slots=self.slots,
                )
                if wrong is not None:
                    self.wrong.append(f"verify input, {name}: {wrong}")
                else:
                    self.built.append(name)

    def idle(self) -> None:
        """A rank with no requests: the idle input, the draft's sizes and no rows."""
        verify_input, calls = self.build([], idle=True)
        observe("verify input, idle", verify_input, _unplaced(calls))
        wrong = _check_idle(verify_input, spec=self.scenario.spec)
        if calls:
            self.bad.append("idle: the tree kernel was launched for a batch of no requests")
        elif wrong is not None:
            self.wrong.append(f"verify input, idle: {wrong}")
        else:
            self.built.append("idle")


def _check_owner(verify_mask: Any, *, owner: str, max_bs: int, spec: Any, backend: Any) -> str | None:
    """The graph state's mask as its owner needs it: FULL_MASK (every request's prefix columns,
    the layout the Triton kernel reads) where the backend reads it, QLEN_ONLY where it does not
    (kilobytes, not a max_context_len-wide buffer), with room for ``max_bs`` requests' writes."""
    if verify_mask is None:
        return f"{owner} mask: the graph state for {max_bs} owns no verify mask"
    mode = getattr(verify_mask.mode, "name", str(verify_mask.mode))
    want_mode = "FULL_MASK" if owner == "read" else "QLEN_ONLY"
    if mode != want_mode or bool(verify_mask.is_read) != (owner == "read"):
        return f"{owner} mask: {mode}, is_read={verify_mask.is_read}; a backend that {'reads' if owner == 'read' else 'never reads'} it needs {want_mode}"
    if int(verify_mask.max_bs) != max_bs:
        return f"{owner} mask: max_bs {verify_mask.max_bs}, the graph state was sized for {max_bs}"
    ndt = spec.num_draft_tokens
    need = _mask_cells(ndt=ndt, lens=[int(backend.max_context_len)] * max_bs, full=mode == "FULL_MASK")
    if int(verify_mask.buffer.numel()) < need:
        return f"{owner} mask: {verify_mask.buffer.numel()} cells, {max_bs} requests at the context limit write {need}"
    return None


PROBE = VerifyMaskFits()
