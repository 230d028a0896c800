"""One cell: a scenario run through its backend in this process, judged against the reference.

Whatever toggles are reverted in this process stay reverted; this module applies none.
Findings are collected, not raised: a cell gets the most severe verdict, its details keep all.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from sglfix.scenario import Scenario
from sglfix.common.verdicts import worst

__all__ = ["CellResult", "run_cell"]


@dataclass
class CellResult:
    scenario: str
    toggles: list[str]
    device: str
    verdict: str = "PASS"
    findings: list[dict] = field(default_factory=list)
    error: dict | None = None
    timings_ms: dict = field(default_factory=dict)
    revert_env: str | None = None  # SGLANG_DEBUG_REVERT_PR as the process that ran the cell saw it

    def add(self, verdict: str, message: str, **data: Any) -> None:
        self.findings.append({"verdict": verdict, "message": message, **data})

    def finish(self) -> "CellResult":
        self.verdict = worst([f["verdict"] for f in self.findings]) if self.findings else "PASS"
        return self

    @property
    def key_figure(self) -> str:
        return next((f["message"] for f in self.findings if f["verdict"] == self.verdict), "")

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "toggles": self.toggles, "device": self.device,
                "verdict": self.verdict, "findings": self.findings, "error": self.error,
                "timings_ms": self.timings_ms, "revert_env": self.revert_env}

    @classmethod
    def from_json(cls, data: dict) -> "CellResult":
        return cls(**data)


def _frame_under_test(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(frames):
        if "/backends/" in fr.filename.replace("\\", "/"):
            return f"{fr.filename.rsplit('/', 2)[-1]}:{fr.lineno} in {fr.name}"
    fr = frames[-1] if frames else None
    return f"{fr.filename.rsplit('/', 1)[-1]}:{fr.lineno} in {fr.name}" if fr else "?"


def run_cell(scenario: Scenario, *, device: str, toggles: list[str] | None = None) -> CellResult:
    import torch

    from sglfix.harness.guards import describe_guards
    from sglfix.backends.srt.model_executor.cuda_graph_runner import make_runner_for_case, run_eager
    from sglfix.backends.test.kits.attention_unittest.attention_methods.dense_attention import build_case

    from sglfix.harness.invariants import check_metadata
    from sglfix.harness.reference import compare_outputs, reference_attention
    from sglfix.harness.syncwatch import suspended, watch_syncs

    result = CellResult(scenario=scenario.name, toggles=list(toggles or []), device=device)
    t0 = time.perf_counter()
    is_cuda = torch.device(device).type == "cuda"

    def sync() -> None:
        if is_cuda:
            torch.cuda.synchronize()

    def crash(exc: BaseException, stage: str) -> CellResult:
        result.add("CRASH", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                            f"[{stage}, {_frame_under_test(exc)}]", type=type(exc).__name__, stage=stage,
                   frame=_frame_under_test(exc))
        return result.finish()

    try:
        case = build_case(
            mode=scenario.mode, prefix_lens=list(scenario.prefix_lens), extend_lens=list(scenario.extend_lens),
            accept_lens=list(scenario.accept_lens) if scenario.accept_lens is not None else None,
            page_size=scenario.page_size, num_heads=scenario.model.num_heads,
            num_kv_heads=scenario.model.num_kv_heads, head_dim=scenario.model.head_dim,
            dtype=scenario.model.dtype, topk=scenario.spec.topk, num_steps=scenario.spec.num_steps,
            num_draft_tokens=scenario.spec.num_draft_tokens, gpu_only=scenario.gpu_only, seed=scenario.seed,
            device=device, builder=scenario.builder,
        )
        sync()
    except Exception as exc:
        return crash(exc, "build")
    t1 = time.perf_counter()
    num_slots = case.model_runner.token_to_kv_pool.num_slots

    def on_metadata(backend: Any, forward_batch: Any, phase: str) -> None:
        rows = len(forward_batch.req_pool_indices) if forward_batch.req_pool_indices is not None else forward_batch.batch_size
        with suspended():
            found = check_metadata(backend.forward_metadata, rows=rows, num_slots=num_slots, phase=phase)
        for message in found:
            result.add("INVARIANT", message, phase=phase)

    try:
        backend = case.make_backend()
        fb = case.forward_batch
        if scenario.cuda_graph:
            graph = make_runner_for_case(case, backend=backend, capture_bs=list(scenario.capture_bs),
                                         on_metadata=on_metadata)
            sync()
            t_cap = time.perf_counter()
            result.timings_ms["capture"] = round((t_cap - t1) * 1e3, 2)
            with watch_syncs(device, enabled=scenario.sync_free) as syncs:
                out = graph.replay(fb, q=case.q, k=case.k, v=case.v)
            sync()
        else:
            with watch_syncs(device, enabled=scenario.sync_free) as syncs:
                out = run_eager(backend=backend, forward_batch=fb, q=case.q, k=case.k, v=case.v,
                                layer=case.layer, on_metadata=on_metadata)
            sync()
    except Exception as exc:
        return crash(exc, "forward")
    t2 = time.perf_counter()
    for message in syncs:
        result.add("SYNC", message)
    for message in describe_guards(backend.static_buffers):
        result.add("INVARIANT", f"write past a buffer's end: {message}")

    ref = reference_attention(q_pad=case.q_pad, k_pad=case.k_pad, v_pad=case.v_pad, mask=case.visible,
                              scale=case.sm_scale)
    cmp = compare_outputs(out=out, ref=ref, q_valid=case.q_valid, tolerance=scenario.tolerance)
    t3 = time.perf_counter()
    result.error = cmp.to_json()
    if cmp.nonfinite:
        result.add("NAN", f"{cmp.nonfinite} non-finite output values", **cmp.to_json())
    if cmp.bad_rows:
        result.add("DIVERGE", f"max abs err {cmp.max_abs:.3g} (rel {cmp.max_rel:.3g}), {cmp.bad_rows}/{cmp.rows} rows bad, "
                              f"first at request {cmp.first_bad_request} row {cmp.first_bad_row}", **cmp.to_json())
    result.timings_ms.update(build=round((t1 - t0) * 1e3, 2), run=round((t2 - t1) * 1e3, 2),
                             reference=round((t3 - t2) * 1e3, 2), total=round((t3 - t0) * 1e3, 2))
    return result.finish()
