"""Probe ``draft-extend-view`` (upstream PR 36913, open): the batch view the spec-v2 draft-extend
CUDA-graph runner hands its attention backend before a replay.

A graph replay pads a batch of ``raw_bs`` requests to the captured size ``bs``. The draft-decode
runner hands its backend the forward batch itself, its per-request tensors cut to ``bs`` rows, with
``num_padding = bs - raw_bs``. The draft-extend runner builds its view by hand: ``batch_size`` is
``bs``, but ``req_pool_indices``, ``seq_lens`` and ``seq_lens_cpu`` are its whole static buffers
(``max(capture_bs)`` rows) and ``num_padding`` is absent. A backend that sizes from a tensor's
length or counts padding itself (hybrid linear attention counts the zero request rows when
``num_padding`` is missing) reads rows outside the replayed bucket; the in-tree dense backends slice
``[:bs]`` and do not.

Inputs from the scenario: ``prefix_lens`` (the raw batch), ``cuda_graph.capture_bs`` (the buckets;
the largest sizes the buffers), ``spec.num_draft_tokens`` (tokens per request), ``gpu_only`` (no
CPU mirror: its absence must survive the replay).

Real code run: the installed ``EAGLEDraftExtendCudaGraphRunner``'s replay method (``execute``;
``replay`` in 0.5.13) on a runner built without its constructor (static buffers as the constructor
makes them; the graph launch not run), a recorder standing in for the draft-extend backend.
sglfix's expectation: every per-request tensor of the view has ``batch_size`` rows, the padded rows
hold the fill value (request row 0), the CPU mirror is absent when the batch has none, and
``num_padding`` says ``bs - raw_bs``. Judged (INVARIANT otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from sglfix.harness.fingerprint import observe
from sglfix.harness.misfit import Standin

__all__ = ["PROBE", "ViewRecorder"]

_ROWS = ("req_pool_indices", "seq_lens", "seq_lens_cpu")


class ViewRecorder:
    """Stands in for the draft-extend attention backend: keeps the view it is handed."""

    def __init__(self) -> None:
        self.view: Any = None

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1  # every in-tree dense backend's value

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        self.view = SimpleNamespace(**vars(forward_batch))

    def init_forward_metadata_replay_cuda_graph(self, *args: Any, **kwargs: Any) -> None:  # before 0.5.14
        raise AssertionError("the draft-extend runner replayed through the pre-0.5.14 per-field call")

    def shared_read_ends(self, _mode: Any) -> None:
        return None


def _batch(scenario: Any, *, width: int, device: str) -> Any:
    import dataclasses

    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    prefix = [int(p) for p in scenario.prefix_lens]
    raw_bs = len(prefix)
    seq_lens = torch.tensor([p + width for p in prefix], dtype=torch.int64, device=device)
    tokens = raw_bs * width
    spec = Standin(
        hidden_states=None,
        num_correct_drafts=torch.full((raw_bs,), width - 1, dtype=torch.int32, device=device),
        num_accept_tokens=torch.full((raw_bs,), width, dtype=torch.int32, device=device),
        extend_seq_lens_cpu=[width] * raw_bs,
        extend_seq_lens_tensor=None,
        positions=None,
    )
    fields = {
        "forward_mode": ForwardMode.DRAFT_EXTEND_V2,
        "batch_size": raw_bs,
        "input_ids": torch.zeros((tokens,), dtype=torch.int64, device=device),
        "req_pool_indices": torch.arange(1, raw_bs + 1, dtype=torch.int64, device=device),
        "seq_lens": seq_lens,
        "seq_lens_cpu": None if scenario.gpu_only else seq_lens.cpu(),
        "seq_lens_sum": int(seq_lens.sum()),
        "out_cache_loc": torch.arange(1, tokens + 1, dtype=torch.int64, device=device),
        "positions": torch.arange(tokens, dtype=torch.int64, device=device),
        "extend_seq_lens": torch.full((raw_bs,), width, dtype=torch.int32, device=device),
        "extend_seq_lens_cpu": [width] * raw_bs,
        "spec_info": spec,
    }
    names = {f.name for f in dataclasses.fields(ForwardBatch)}
    return ForwardBatch(**{k: v for k, v in fields.items() if k in names})


class DraftExtendView:
    name = "draft-extend-view"

    def run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        stage("build")
        from sglfix.harness.kits import kit

        width = scenario.spec.num_draft_tokens
        recorder = ViewRecorder()
        fill = recorder.get_cuda_graph_seq_len_fill_value()
        with kit("probes").published(
            speculative_algorithm="EAGLE",
            speculative_eagle_topk=scenario.spec.topk,
            speculative_num_steps=scenario.spec.num_steps,
            speculative_num_draft_tokens=width,
        ):
            batch = _batch(scenario, width=width, device=device)
            stage("forward")
            runner = kit("probes").replay_draft_extend(
                recorder, batch, capture_bs=list(scenario.capture_bs), width=width, fill=fill, device=device
            )
            observe("draft-extend replay", recorder.view, getattr(runner, "buffers", None), batch)

        stage("judge")
        view, raw_bs = recorder.view, len(scenario.prefix_lens)
        bs, capacity = scenario.graph_bs, max(scenario.capture_bs)
        figures = dict(raw_bs=raw_bs, bs=bs, capacity=capacity, fill=fill)
        if view is None:
            result.add("INVARIANT", "the draft-extend runner never handed its backend a batch view", **figures)
            return
        bad = []
        for name in _ROWS:
            t = getattr(view, name, None)
            if t is None:
                continue
            rows = int(t.shape[0])
            figures[f"{name}_rows"] = rows
            if rows != view.batch_size:
                bad.append(f"{name} has {rows} rows for a batch of {view.batch_size}")
            elif bs > raw_bs and (
                [int(x) for x in t[raw_bs:bs].tolist()] != [0 if name == "req_pool_indices" else fill] * (bs - raw_bs)
            ):
                bad.append(f"{name}'s padded rows hold {t[raw_bs:bs].tolist()}")
        if scenario.gpu_only and getattr(view, "seq_lens_cpu", None) is not None:
            bad.append("seq_lens_cpu is set though the batch has no CPU mirror")
        padding = getattr(view, "num_padding", None)
        figures["num_padding"] = padding
        if padding != bs - raw_bs:
            bad.append(f"num_padding is {padding!r}, the replay pads {bs - raw_bs} row(s)")
        where = f"a batch of {raw_bs} replayed at {bs} (buffers of {capacity})"
        if bad:
            result.add("INVARIANT", f"draft-extend replay view, {where}: " + "; ".join(bad), **figures)
        else:
            result.add(
                "PASS", f"draft-extend replay view, {where}: {bs} rows each, num_padding {bs - raw_bs}", **figures
            )


PROBE = DraftExtendView()
