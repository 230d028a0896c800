"""sglang 0.5.23's attention test kit, for the multi-step EAGLE draft families (DeepSeek-V4, FlashInfer
GQA and MLA) and TRT-LLM MLA draft extend: ``kit("drafts")`` of ``sglfix.harness.kits``.

What comes from the kit: its mock model runners (real ``ModelRunner`` subclasses with real memory
pools, publishing server args through ``sglang.srt.runtime_context``), its DSv4 fixture, and its
``_configure_runner_for_eagle_draft`` (server args of an EAGLE draft worker). The backends are
built the way production builds them (``DraftBackendFactory(...).create_decode_backend()``).
What is sglfix's: the slot layout (scattered, from the scenario's seed), the forward batches, the
emulation of the EAGLE draft CUDA-graph runner's metadata calls on a machine without CUDA, the
guard zones, the CPU placement of the code's ``device="cuda"`` allocations, and every check.

Nothing here imports sglang at module level: call ``prepare()`` first (the code base must be
active, so that sglang's missing CUDA-only packages are stood in for).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from sglfix.harness.guards import SENTINEL_BYTE

__all__ = [
    "SGLANG_ROOT",
    "CudaAllocations",
    "DraftSlots",
    "GuardedBuffer",
    "HostStepRecorder",
    "PagedSlots",
    "build_dsv4_draft",
    "build_flashinfer_draft",
    "build_trtllm_draft_extend",
    "flash_mla_available",
    "flashinfer_available",
    "has_cuda",
    "host_step_children",
    "lift_mla_topk_gate",
    "make_capture_batch",
    "make_draft_batch",
    "mla_steps_recorded",
    "pad_for_replay",
    "prepare",
    "trtllm_capture_batch",
    "trtllm_replay_view",
]

SGLANG_ROOT = "sglang"
DSV4_PAGE_SIZE = 256
_PREPARED = False


# ----------------------------------------------------------------------------- environment


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


def has_cuda() -> bool:
    return torch.cuda.is_available()


def flashinfer_available() -> bool:
    from sglang.srt.utils import is_flashinfer_available

    return bool(is_flashinfer_available())


def flash_mla_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_mla") is not None


class _TestCase:
    """The kit's fixtures take a unittest case for ``skipTest``; here that is an error, not a skip."""

    def skipTest(self, reason: str) -> None:
        raise RuntimeError(f"the sglang kit gave up building the fixture: {reason}")

    def assertEqual(self, a: Any, b: Any) -> None:
        assert a == b, (a, b)

    def assertTrue(self, a: Any) -> None:
        assert a


# ----------------------------------------------------------------------------- slots


@dataclass
class DraftSlots:
    """Ground truth of a multi-step draft batch: request ``b``'s prefix slots, and the slot of its
    branch ``j``'s draft token of step ``s``; all distinct, scattered over ``[1, num_slots)``.

    ``req_to_token`` rows hold the prefix at positions ``0..prefix-1`` and branch ``j``'s step ``s``
    at ``prefix + j * num_steps + s`` (where sglang's draft kernels read them, page size 1);
    ``out_cache_loc`` is laid out ``[bs, topk, num_steps]``."""

    prefix_lens: tuple[int, ...]
    topk: int
    num_steps: int
    prefix: list[list[int]]
    draft: list[list[list[int]]]  # [b][j][s]

    @classmethod
    def allocate(
        cls, prefix_lens: tuple[int, ...], *, topk: int, num_steps: int, num_slots: int, seed: int
    ) -> DraftSlots:
        need = sum(prefix_lens) + len(prefix_lens) * topk * num_steps
        if need > num_slots - 1:
            raise ValueError(f"the batch needs {need} KV slots, the pool has {num_slots - 1}")
        gen = torch.Generator().manual_seed(int(seed))
        order = (torch.randperm(num_slots - 1, generator=gen)[:need] + 1).tolist()
        it = iter(order)
        prefix = [[next(it) for _ in range(p)] for p in prefix_lens]
        draft = [[[next(it) for _ in range(num_steps)] for _ in range(topk)] for _ in prefix_lens]
        return cls(tuple(prefix_lens), topk, num_steps, prefix, draft)

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    def fill_req_to_token(self, req_to_token: torch.Tensor) -> None:
        width = req_to_token.shape[1]
        for b, p in enumerate(self.prefix_lens):
            end = p + self.topk * self.num_steps
            if end > width:
                raise ValueError(
                    f"request {b}: prefix {p} + {self.topk} x {self.num_steps} draft slots need "
                    f"{end} req_to_token columns, the pool has {width} (raise max_context_len)"
                )
            row = self.prefix[b] + [self.draft[b][j][s] for j in range(self.topk) for s in range(self.num_steps)]
            req_to_token[b, :end] = torch.tensor(row, dtype=req_to_token.dtype, device=req_to_token.device)

    def out_cache_loc(self) -> list[int]:
        return [
            self.draft[b][j][s] for b in range(self.batch_size) for j in range(self.topk) for s in range(self.num_steps)
        ]

    def step_slots(self, step: int) -> list[int]:
        """The slots step ``step`` writes, one per (request, branch): the reference for the per-step
        slice of the multi-step ``out_cache_loc``."""
        return [self.draft[b][j][step] for b in range(self.batch_size) for j in range(self.topk)]

    def step_page_table(self, step: int) -> tuple[list[int], list[int]]:
        """(kv_indptr, kv_indices) the draft step ``step`` must attend: per (request, branch), the
        prefix then the branch's own draft slots of steps ``0..step``."""
        indptr, indices = [0], []
        for b in range(self.batch_size):
            for j in range(self.topk):
                row = self.prefix[b] + self.draft[b][j][: step + 1]
                indices += row
                indptr.append(indptr[-1] + len(row))
        return indptr, indices


@dataclass
class PagedSlots:
    """Ground truth of a paged batch: request ``b``'s tokens live on its own pages (distinct page
    ids, scattered over the pool), token ``pos`` at slot ``page * page_size + pos % page_size``."""

    seq_lens: tuple[int, ...]
    page_size: int
    pages: list[list[int]]  # [b] -> page ids, ceil(seq_len / page_size) of them

    @classmethod
    def allocate(cls, seq_lens: tuple[int, ...], *, page_size: int, num_slots: int, seed: int) -> PagedSlots:
        counts = [(n + page_size - 1) // page_size for n in seq_lens]
        num_pages = num_slots // page_size
        if sum(counts) > num_pages - 1:
            raise ValueError(f"the batch needs {sum(counts)} pages, the pool has {num_pages - 1}")
        gen = torch.Generator().manual_seed(int(seed))
        order = (torch.randperm(num_pages - 1, generator=gen)[: sum(counts)] + 1).tolist()
        pages, at = [], 0
        for c in counts:
            pages.append(order[at : at + c])
            at += c
        return cls(tuple(seq_lens), page_size, pages)

    def slot(self, b: int, pos: int) -> int:
        return self.pages[b][pos // self.page_size] * self.page_size + pos % self.page_size

    def fill_req_to_token(self, req_to_token: torch.Tensor) -> None:
        for b, n in enumerate(self.seq_lens):
            row = [self.slot(b, pos) for pos in range(n)]
            req_to_token[b, :n] = torch.tensor(row, dtype=req_to_token.dtype, device=req_to_token.device)


# ----------------------------------------------------------------------------- allocations


@dataclass
class GuardedBuffer:
    """A buffer the code under test allocated, followed by a guard zone of sentinel bytes (the
    layout ``sglfix.harness.guards`` checks)."""

    name: str
    shape: tuple
    flat: torch.Tensor
    numel: int


_FACTORIES = {torch.zeros: "zeros", torch.empty: "empty", torch.ones: "ones", torch.full: "full"}


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _caller_in(root: str, *, skip: int = 2) -> str:
    frame = sys._getframe(skip)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == root or name.startswith(root + "."):
            qual = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            return f"{qual}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class CudaAllocations(TorchFunctionMode):
    """Watches the factory calls (``zeros``/``empty``/``ones``/``full``) that sglang makes with
    ``device="cuda"`` while it is active.

    * ``remap``: without CUDA, such a tensor is made on the CPU instead (sglang's multi-step draft
      backends hard-code ``device="cuda"`` for their kv_indices rows; everything else about the call
      is unchanged).
    * ``guard``: 2-D integer buffers (the per-step kv_indices rows) are carved from a larger flat
      allocation whose tail is sentinel bytes, so a write past the buffer's end is caught by the
      judge's guard check (``guarded``).
    """

    def __init__(self, *, remap: bool, guard: bool = True, guard_min: int = 4096) -> None:
        super().__init__()
        self.remap = remap
        self.guard = guard
        self.guard_min = guard_min
        self.guarded: list[GuardedBuffer] = []
        self.remapped = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        kind = _FACTORIES.get(func)
        if kind is None or not _is_cuda(kwargs.get("device")):
            return func(*args, **kwargs)
        if self.remap and not torch.cuda.is_available():
            kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)
            self.remapped += 1
        dtype = kwargs.get("dtype")
        size = args[0] if args else kwargs.get("size", ())
        shape = (
            tuple(size) if isinstance(size, (tuple, list, torch.Size)) else tuple(args[: len(args) - (kind == "full")])
        )
        if not (self.guard and len(shape) == 2 and dtype in (torch.int32, torch.int64)):
            return func(*args, **kwargs)
        numel = int(shape[0]) * int(shape[1])
        extra = max(numel, self.guard_min)
        flat = torch.empty(numel + extra, dtype=dtype, device=kwargs["device"])
        flat[numel:].view(torch.uint8).fill_(SENTINEL_BYTE)
        body = flat[:numel]
        if kind == "zeros":
            body.zero_()
        elif kind == "ones":
            body.fill_(1)
        elif kind == "full":
            body.fill_(args[1] if len(args) > 1 else kwargs["fill_value"])
        view = body.view(shape)
        self.guarded.append(GuardedBuffer(name=_caller_in(SGLANG_ROOT), shape=shape, flat=flat, numel=numel))
        return view


# ----------------------------------------------------------------------------- host-only step backends


class HostStepRecorder:
    """Stands in for one step's FlashInfer backend on a machine without FlashInfer/CUDA.

    The multi-step draft backend's own code runs unchanged (its constructor, the row sizing in
    ``init_cuda_graph_state``, ``common_template``'s size check and its Triton kernel that fills the
    rows); each step's page table that it hands to its step backend (``spec_info.kv_indptr`` /
    ``spec_info.kv_indices``) is recorded here instead of being planned into FlashInfer. Nothing of
    FlashInfer runs: attention output is not computed."""

    def __init__(
        self,
        model_runner: Any,
        skip_prefill: bool = False,
        kv_indptr_buf: Any = None,
        kv_last_page_len_buf: Any = None,
        q_indptr_decode_buf: Any = None,
        **_: Any,
    ) -> None:
        self.max_context_len = model_runner.model_config.context_len
        self.kv_indptr_buf = kv_indptr_buf
        self.kv_indices_buf: torch.Tensor | None = None
        self.page_table: SimpleNamespace | None = None
        self.calls: list[str] = []

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1  # FlashInferAttnBackend's and FlashInferMLAAttnBackend's value in 0.5.23

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf: Any = None) -> None:
        self.kv_indices_buf = kv_indices_buf
        self.calls.append("init_cuda_graph_state")

    def _record(self, forward_batch: Any, how: str) -> None:
        spec = forward_batch.spec_info
        self.page_table = SimpleNamespace(kv_indptr=spec.kv_indptr.clone(), kv_indices=spec.kv_indices.clone())
        self.calls.append(how)

    def init_forward_metadata(self, forward_batch: Any) -> None:
        self._record(forward_batch, "init_forward_metadata")

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        # The multi-step backend hands an inner view (build_inner_fb_view) sharing the batch's spec_info.
        self._record(forward_batch, "capture" if in_capture else "replay")

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        pass


@contextlib.contextmanager
def host_step_children(module: Any, class_name: str) -> Iterator[None]:
    """While the multi-step draft backend is constructed, its per-step FlashInfer backends are
    ``HostStepRecorder``s (restored at once afterwards)."""
    original = getattr(module, class_name)
    setattr(module, class_name, HostStepRecorder)
    try:
        yield
    finally:
        setattr(module, class_name, original)


_MLA_GATE = {
    "target": "sglang.srt.layers.attention.flashinfer_mla_backend.FlashInferMLAMultiStepDraftBackend.__init__",
    "edits": [
        {
            "match": "if topk > 1:\n    raise ValueError(\n"
            '        "Currently Flashinfer MLA only supports topk=1 for speculative decoding"\n    )\n',
            "replacement": "",
        }
    ],
}
MLA_GATE_NOTE = (
    "FlashInferMLAMultiStepDraftBackend refuses topk > 1 in sglang 0.5.23 (the bug of PR 27460 is "
    "latent there); the harness lifted that gate for this construction only, as upstream's "
    "repro script does"
)


@contextlib.contextmanager
def lift_mla_topk_gate() -> Iterator[None]:
    from sglfix.patching.patcher import CodePatcher

    with CodePatcher(patches=[_MLA_GATE]):
        yield


def mla_steps_recorded(*, topk: int) -> str | None:
    """Why sglang's MLA step backends are recorded rather than run on CUDA for ``topk``, or None.

    With the topk gate lifted, the step backends' CUDA-graph ``qo_indptr`` buffer (sized for
    ``max_bs`` rows) cannot even capture ``bs * topk`` rows. What PR 27460 fixed is the multi-step
    backend's own sizing and kernel, which still run for real."""
    if topk <= 1:
        return None
    return (
        "topk > 1: sglang's MLA step backends are recorded, not run (their CUDA-graph "
        "qo_indptr buffer holds max_bs rows); the multi-step backend's sizing and its "
        "kv-indices kernel run on the GPU"
    )


# ----------------------------------------------------------------------------- batches


def make_draft_batch(slots: DraftSlots, *, device: str, hidden_size: int, dtype: torch.dtype, runner: Any) -> Any:
    """The EAGLE multi-step draft ``ForwardBatch`` (DECODE, spec_info an ``EagleDraftInput``) as the
    draft worker hands it to the draft backend: seq_lens = prefix, out_cache_loc for every step."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    bs, topk = slots.batch_size, slots.topk
    spec_info = EagleDraftInput(
        topk_p=torch.full((bs, topk), 1.0 / topk, dtype=torch.float32, device=device),
        topk_index=torch.arange(bs * topk, dtype=torch.int64, device=device).view(bs, topk),
        hidden_states=torch.zeros(bs, hidden_size, dtype=dtype, device=device),
        capture_hidden_mode=CaptureHiddenMode.LAST,
        num_tokens_per_req=topk,
        num_tokens_for_logprob_per_req=topk,
    )
    seq_lens = torch.tensor(slots.prefix_lens, dtype=torch.int32, device=device)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=bs,
        input_ids=None,
        req_pool_indices=torch.arange(bs, dtype=torch.int32, device=device),
        seq_lens=seq_lens,
        seq_lens_cpu=torch.tensor(slots.prefix_lens, dtype=torch.int32),
        out_cache_loc=torch.tensor(slots.out_cache_loc(), dtype=torch.int64, device=device),
        seq_lens_sum=sum(slots.prefix_lens),
        positions=seq_lens.repeat_interleave(topk).to(torch.int64),
        spec_algorithm=SpeculativeAlgorithm.EAGLE,
        spec_info=spec_info,
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    runner.kv_index_translator.bind_own_plan(batch)
    return batch


def make_capture_batch(
    bs: int, *, topk: int, num_steps: int, fill: int, device: str, hidden_size: int, dtype: torch.dtype, runner: Any
) -> Any:
    """The batch ``EAGLEDraftCudaGraphRunner.capture_one_shape`` builds from its static buffers:
    seq_lens = the fill value, everything else zero."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    spec_info = EagleDraftInput(
        topk_p=torch.zeros((bs, topk), dtype=torch.float32, device=device),
        topk_index=torch.zeros((bs, topk), dtype=torch.int64, device=device),
        hidden_states=torch.zeros(bs, hidden_size, dtype=dtype, device=device),
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    seq_lens = torch.full((bs,), fill, dtype=torch.int64, device=device)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=bs,
        input_ids=None,
        req_pool_indices=torch.zeros((bs,), dtype=torch.int64, device=device),
        seq_lens=seq_lens,
        seq_lens_cpu=torch.full((bs,), fill, dtype=torch.int64),
        out_cache_loc=torch.zeros((bs * topk * num_steps,), dtype=torch.int64, device=device),
        seq_lens_sum=int(bs * fill),
        positions=torch.zeros((bs * topk,), dtype=torch.int64, device=device),
        spec_algorithm=SpeculativeAlgorithm.EAGLE,
        spec_info=spec_info,
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    runner.kv_index_translator.bind_own_plan(batch)
    return batch


def pad_for_replay(batch: Any, *, bs: int, topk: int, num_steps: int, fill: int) -> Any:
    """What ``EAGLEDraftCudaGraphRunner.execute`` hands ``init_forward_metadata_out_graph`` for a batch
    of ``raw_bs`` requests replayed at the captured size ``bs``: padded rows have seq_lens = fill,
    req_pool_indices / positions / out_cache_loc 0, seq_lens_sum grown by the padding."""
    raw_bs = batch.batch_size
    if bs == raw_bs:
        return SimpleNamespace(**vars(batch), num_padding=0)

    def pad(t: torch.Tensor, n: int, value: int) -> torch.Tensor:
        out = torch.full((n,), value, dtype=t.dtype, device=t.device)
        out[: t.numel()] = t
        return out

    view = dict(vars(batch))
    view.update(
        batch_size=bs,
        seq_lens=pad(batch.seq_lens, bs, fill),
        seq_lens_cpu=pad(batch.seq_lens_cpu, bs, fill) if batch.seq_lens_cpu is not None else None,
        req_pool_indices=pad(batch.req_pool_indices, bs, 0),
        positions=pad(batch.positions, bs * topk, 0),
        out_cache_loc=pad(batch.out_cache_loc, bs * topk * num_steps, 0),
        seq_lens_sum=batch.seq_lens_sum + (bs - raw_bs) * fill,
        num_padding=bs - raw_bs,
    )
    return SimpleNamespace(**view)


# ----------------------------------------------------------------------------- cases


def _torch_dtype(name: str) -> torch.dtype:
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

    family: str  # "dsv4", "flashinfer", "flashinfer_mla"
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


def _round_up(x: int, m: int) -> int:
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
    dtype = _torch_dtype(scenario.model.dtype)
    longest = max(prefix) + topk * num_steps + 1
    max_context_len = _round_up(max(scenario.max_context_len or 0, longest, DSV4_PAGE_SIZE), DSV4_PAGE_SIZE)
    capture = tuple(scenario.capture_bs) if scenario.capture_bs else None
    pool_bs = max(capture) if capture else bs
    swa_size = _round_up(pool_bs * max_context_len + 1, DSV4_PAGE_SIZE)
    case = DSV4AttentionCase(
        name=scenario.name,
        backend="dsv4",
        forward_mode=ForwardMode.DECODE,
        num_heads=scenario.model.num_heads,
        page_size=DSV4_PAGE_SIZE,
        prefix_lens=prefix,
    )
    fixture = build_dsv4_attention_fixture(
        _TestCase(),
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


def build_flashinfer_draft(scenario: Any, *, device: str, mla: bool) -> DraftCase:
    """The kit's dense (GQA) or MLA mock runner, configured as an EAGLE draft worker whose decode
    backend is ``flashinfer``; no target backend is built (FlashInfer's need CUDA)."""
    prepare()
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.runner_modes.speculative_draft_runner import (
        _configure_runner_for_eagle_draft,
    )

    model = scenario.model
    topk, num_steps = scenario.spec.topk, scenario.spec.num_steps
    prefix = tuple(scenario.prefix_lens)
    bs = len(prefix)
    dtype = _torch_dtype(model.dtype)
    capture = tuple(scenario.capture_bs) if scenario.capture_bs else None
    pool_bs = max(capture) if capture else bs
    longest = max(prefix) + topk * num_steps
    max_context_len = scenario.max_context_len or _round_up(longest + 8, 32)
    common = dict(
        name=scenario.name,
        backend="flashinfer",
        forward_mode=ForwardMode.DECODE,
        num_heads=model.num_heads,
        page_size=1,
        prefix_lens=prefix,
    )
    if mla:
        from sglang.test.kits.attention_unittest.attention_methods.mla_attention import MLAAttentionCase

        case = MLAAttentionCase(**common)
        runner, hidden_size = _mla_runner(
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

        case = DenseAttentionCase(num_kv_heads=model.num_kv_heads, **common)
        hidden_size = model.num_heads * model.head_dim
        config = TinyModelConfig(
            num_heads=model.num_heads,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            hidden_size=hidden_size,
            context_len=max_context_len,
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
    slots = DraftSlots.allocate(prefix, topk=topk, num_steps=num_steps, num_slots=num_slots, seed=scenario.seed)
    runner.req_to_token_pool.req_to_token.zero_()
    slots.fill_req_to_token(runner.req_to_token_pool.req_to_token)
    batch = make_draft_batch(slots, device=device, hidden_size=hidden_size, dtype=dtype, runner=runner)
    return DraftCase(
        family="flashinfer_mla" if mla else "flashinfer",
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


def _mla_runner(
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


def build_trtllm_draft_extend(scenario: Any, *, device: str) -> SimpleNamespace:
    """A TRT-LLM MLA draft extend (v2) as the spec-v2 glue hands it to the draft-extend backend:
    every request extends a window of ``num_draft_tokens`` rows (the captured layout), seq_lens =
    prefix + num_draft_tokens, and the accept lengths only feed the spec input
    (``num_correct_drafts``; ``num_accept_tokens_cpu`` as the kit fills it). The kit's MLA mock
    runner holds the pools and publishes the server args (speculative_num_draft_tokens)."""
    prepare()
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput
    from sglang.test.kits.attention_unittest.attention_methods.mla_attention import MLAAttentionCase

    model = scenario.model
    n = scenario.spec.num_draft_tokens
    prefix = tuple(scenario.prefix_lens)
    accept = tuple(scenario.accept_lens or (n - 1,) * len(prefix))
    bs = len(prefix)
    dtype = _torch_dtype(model.dtype)
    capture = tuple(scenario.capture_bs) if scenario.capture_bs else None
    pool_bs = max(capture) if capture else bs
    page = scenario.page_size
    max_context_len = _round_up(max(scenario.max_context_len or 0, max(prefix) + n + 1), page)
    case = MLAAttentionCase(
        name=scenario.name,
        backend="trtllm_mla",
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        num_heads=model.num_heads,
        page_size=page,
        prefix_lens=prefix,
        extend_lens=(n,) * bs,
    )
    runner, _hidden_size = _mla_runner(
        case,
        model,
        dtype=dtype,
        device=device,
        max_context_len=max_context_len,
        graphs=capture is not None,
        pool_bs=pool_bs,
    )
    seq_lens = tuple(p + n for p in prefix)
    num_slots = int(runner.token_to_kv_pool.size)
    slots = PagedSlots.allocate(seq_lens, page_size=page, num_slots=num_slots, seed=scenario.seed)
    runner.req_to_token_pool.req_to_token.zero_()
    slots.fill_req_to_token(runner.req_to_token_pool.req_to_token)
    seq = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    extend = torch.full((bs,), n, dtype=torch.int32, device=device)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        batch_size=bs,
        input_ids=torch.zeros(bs * n, dtype=torch.int64, device=device),
        req_pool_indices=torch.arange(bs, dtype=torch.int32, device=device),
        seq_lens=seq,
        seq_lens_cpu=seq.cpu(),
        seq_lens_sum=sum(seq_lens),
        out_cache_loc=torch.tensor(
            [slots.slot(b, p + t) for b, p in enumerate(prefix) for t in range(n)], dtype=torch.int64, device=device
        ),
        positions=torch.tensor([p + t for p in prefix for t in range(n)], dtype=torch.int64, device=device),
    )
    batch.extend_seq_lens, batch.extend_seq_lens_cpu = extend, [n] * bs
    batch.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=device)
    batch.extend_prefix_lens_cpu = list(prefix)
    batch.extend_start_loc = torch.arange(bs, dtype=torch.int32, device=device) * n
    batch.extend_num_tokens = bs * n
    runner.kv_index_translator.bind_own_plan(batch)
    correct = torch.tensor(accept, dtype=torch.int32, device=device)
    spec = EagleDraftExtendInput(
        hidden_states=None,
        num_correct_drafts=correct,
        num_accept_tokens=correct + 1,
        num_accept_tokens_cpu=[a + 1 for a in accept],
        input_ids=batch.input_ids,
        seq_lens=batch.seq_lens,
        seq_lens_cpu=batch.seq_lens_cpu,
        req_pool_indices=batch.req_pool_indices,
        positions=batch.positions,
        capture_hidden_mode=CaptureHiddenMode.LAST,
        num_tokens_per_req=n,
        num_tokens_for_logprob_per_req=1,
    )
    spec.extend_seq_lens_tensor, spec.extend_seq_lens_cpu = extend, [n] * bs
    if scenario.gpu_only:
        batch.seq_lens_cpu = None
        batch.seq_lens_sum = None
        spec.seq_lens_cpu = None
        spec.num_accept_tokens_cpu = None
    batch.spec_info = spec
    return SimpleNamespace(
        case=case,
        runner=runner,
        slots=slots,
        batch=batch,
        num_draft_tokens=n,
        accept=accept,
        prefix=prefix,
        page_size=page,
        dtype=dtype,
        device=device,
        num_slots=num_slots,
        capture_bs=capture,
        max_context_len=max_context_len,
    )


def trtllm_replay_view(batch: Any, *, bs: int, n: int, fill: int) -> SimpleNamespace:
    """What ``EAGLEDraftExtendCudaGraphRunner.execute`` hands the draft-extend backend for a batch
    of ``raw_bs`` requests replayed at the captured size ``bs``: padded rows have seq_lens = fill,
    req_pool_indices / positions / out_cache_loc 0 and num_correct_drafts = num_accept_tokens =
    extend lengths = the captured width."""
    raw_bs = batch.batch_size
    spec = batch.spec_info

    def pad(t: Any, size: int, value: int) -> Any:
        if t is None:
            return None
        out = torch.full((size,), value, dtype=t.dtype, device=t.device)
        out[: t.numel()] = t
        return out

    spec.num_correct_drafts = pad(spec.num_correct_drafts, bs, n)
    spec.num_accept_tokens = pad(spec.num_accept_tokens, bs, n)
    spec.extend_seq_lens_tensor = pad(spec.extend_seq_lens_tensor, bs, n)
    spec.extend_seq_lens_cpu = list(spec.extend_seq_lens_cpu or [n] * raw_bs) + [n] * (bs - raw_bs)
    sum_ = batch.seq_lens_sum
    return SimpleNamespace(
        batch_size=bs,
        forward_mode=batch.forward_mode,
        input_ids=batch.input_ids,
        req_pool_indices=pad(batch.req_pool_indices, bs, 0),
        seq_lens=pad(batch.seq_lens, bs, fill),
        seq_lens_sum=None if sum_ is None else sum_ + (bs - raw_bs) * fill,
        seq_lens_cpu=None if batch.seq_lens_cpu is None else pad(batch.seq_lens_cpu, bs, fill),
        max_seq_len_host=None,
        encoder_lens=None,
        out_cache_loc=pad(batch.out_cache_loc, bs * n, 0),
        out_cache_loc_virtual=getattr(batch, "out_cache_loc_virtual", None),
        kv_loc_plan=batch.kv_loc_plan,
        kv_loc_cols=getattr(batch, "kv_loc_cols", None),
        out_cache_loc_dsv4=None,
        mamba_track_indices=None,
        spec_info=spec,
    )


def trtllm_capture_batch(bs: int, *, n: int, fill: int, device: str, runner: Any) -> Any:
    """The batch ``EAGLEDraftExtendCudaGraphRunner`` captures a size with: seq_lens = fill, every
    request extending the captured width."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    seq = torch.full((bs,), fill, dtype=torch.int64, device=device)
    batch = ForwardBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        batch_size=bs,
        input_ids=torch.zeros(bs * n, dtype=torch.int64, device=device),
        req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=device),
        seq_lens=seq,
        seq_lens_cpu=seq.cpu(),
        seq_lens_sum=int(bs * fill),
        out_cache_loc=torch.zeros(bs * n, dtype=torch.int64, device=device),
        positions=torch.zeros(bs * n, dtype=torch.int64, device=device),
    )
    batch.extend_seq_lens = torch.full((bs,), n, dtype=torch.int32, device=device)
    batch.extend_seq_lens_cpu = [n] * bs
    runner.kv_index_translator.bind_own_plan(batch)
    full = torch.full((bs,), n, dtype=torch.int32, device=device)
    batch.spec_info = EagleDraftExtendInput(
        hidden_states=None,
        num_correct_drafts=full.clone(),
        num_accept_tokens=full.clone(),
        num_accept_tokens_cpu=None,
        input_ids=batch.input_ids,
        seq_lens=seq,
        seq_lens_cpu=batch.seq_lens_cpu,
        req_pool_indices=batch.req_pool_indices,
        positions=batch.positions,
        capture_hidden_mode=CaptureHiddenMode.LAST,
        num_tokens_per_req=n,
        num_tokens_for_logprob_per_req=1,
    )
    return batch
