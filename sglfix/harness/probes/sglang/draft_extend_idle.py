"""Probe ``draft-extend-idle`` (PR 28221): an idle rank's spec-v2 draft extend on the dense
attention backends.

Under data-parallel attention a rank with no requests still runs every forward of the step, as an
IDLE batch. Its draft extend goes through the production glue like any other: the worker installs
an ``EagleDraftExtendInput`` (empty accept counts) as the batch's ``spec_info``, the glue
(``prepare_for_draft_extend``) keeps the mode IDLE and plans nothing, and the model runner's eager
decode path runs the attention backend's ``init_forward_metadata`` on it. IDLE is a decode-or-idle
mode: the backends take the decode branch, which reads ``spec_info.kv_indptr`` to tell a
multi-step draft's pre-built indices from plain decode. ``EagleDraftExtendInput`` had no
``kv_indptr`` until PR 28221 (the Triton backend raised AttributeError), and FlashInfer's decode
updater took any ``spec_info`` for a pre-built one.

Inputs from the scenario: ``prefix_lens`` only size the backend's pools (the idle batch has no
requests), ``spec.num_draft_tokens`` the glue's window, ``gpu_only`` whether the scheduler keeps
CPU mirrors.

Real code run, for each dense backend (Triton, then FlashInfer: its own wrappers on a GPU, the
torch stand-ins of ``sglfix.harness.torchfi`` on CPU): the backend built as the adapters build it
(``ATTENTION_BACKENDS``), the production glue over a real idle ``ScheduleBatch`` and the eager
runner's metadata step. sglfix's expectation: the metadata is built and describes a batch of no
requests (an indptr of one zero, no indices). An exception in the code under test propagates
(CRASH, its stage naming the backend); metadata for requests that do not exist is INVARIANT.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from sglfix.harness.adapters.sglang.glue import make_schedule_batch
from sglfix.harness.fingerprint import observe, observe_view
from sglfix.harness.probes.sglang.common import runners_unpublished
from sglfix.harness.unavailable import Unavailable

__all__ = ["PROBE"]

# (backend, the adapter class that builds it). FlashInfer's GQA backend and Triton's read the
# spec input on their decode-or-idle path; the MLA and TRT-LLM backends are the MLA adapters'.
_BACKENDS = ("triton", "flashinfer")


def _adapter(name: str) -> Any:
    if name == "flashinfer":
        from sglfix.harness.adapters.sglang.flashinfer_dense import SglangFlashInferAdapter

        return SglangFlashInferAdapter()
    from sglfix.harness.adapters.sglang.triton import SglangTritonAdapter

    return SglangTritonAdapter()


def _indptr_lists(backend: Any) -> list[tuple[str, Any]]:
    """The indptr arrays the live metadata hands the kernels: Triton's own, each FlashInfer
    decode wrapper's planned one."""
    metadata = backend.forward_metadata
    found = []
    if getattr(metadata, "kv_indptr", None) is not None:
        found.append(("kv_indptr", metadata.kv_indptr))
    for i, wrapper in enumerate(getattr(metadata, "decode_wrappers", None) or []):
        indptr = getattr(wrapper, "_paged_kv_indptr_buf", None)
        if indptr is not None:
            found.append((f"decode wrapper {i} kv_indptr", indptr))
    return found


class DraftExtendIdle:
    name = "draft-extend-idle"

    def check_available(self, device: str) -> None:
        from sglang.srt.speculative import eagle_info

        if hasattr(eagle_info.EagleDraftInput, "prepare_for_extend_to_fill_draft_kvcache"):
            # 0.5.13: the spec-v2 worker's draft extend keeps its EagleDraftInput; no
            # EagleDraftExtendInput reaches an attention backend.
            raise Unavailable("this release's spec-v2 draft extend installs no EagleDraftExtendInput")

    def run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        with runners_unpublished():
            self._run(scenario, device=device, result=result, stage=stage)

    def _run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        from sglfix.harness.kits import kit

        ndt = scenario.spec.num_draft_tokens
        # The busiest peer rank's draft extend: the idle rank pads to its token count.
        num_tokens = len(scenario.prefix_lens) * ndt
        ran, skipped = [], []
        for name in _BACKENDS:
            stage(f"{name}: build")
            adapter = _adapter(name)
            sized = scenario.model_copy(update={"backend": name, "probe": None, "builder": "glue"})
            try:
                prepared = adapter.build(sized, device=device)
            except Unavailable as why:  # FlashInfer on a GPU without the package
                skipped.append(f"{name} not run ({why})")
                continue
            backend = adapter.make_backend(prepared)
            if scenario.gpu_only and kit("attention").decide_needs_cpu_seq_lens([backend, None]):
                # The scheduler keeps CPU seq_lens for this backend: no gpu_only batch reaches it.
                skipped.append(f"{name} not run (the scheduler keeps CPU seq_lens for it)")
                continue
            placed = getattr(adapter, "_placed", contextlib.nullcontext)
            with placed():
                figures = _idle_step(
                    runner=prepared.case.runner,
                    backend=backend,
                    gpu_only=scenario.gpu_only,
                    ndt=ndt,
                    num_tokens=num_tokens,
                    device=device,
                    stage=lambda what, n=name: stage(f"{n}: {what}"),
                    reads=adapter.metadata_fields,
                )
            stage(f"{name}: judge")
            bad = _judge(backend, **figures)
            if bad:
                result.add("INVARIANT", f"{name}: idle draft extend padded to {figures['bs']}: " + "; ".join(bad))
            else:
                ran.append(name)
        rows = num_tokens // ndt
        said = [f"{', '.join(ran)}: metadata for {rows} fill-length rows"] if ran else []
        result.add(
            "PASS",
            f"idle draft extend padded to {num_tokens} tokens ({rows} rows of request row 0): "
            + "; ".join(said + skipped),
            backends=ran,
        )


def _idle_step(
    *,
    runner: Any,
    backend: Any,
    gpu_only: bool,
    ndt: int,
    num_tokens: int,
    device: str,
    stage: Callable[[str], None],
    reads: Any = None,
) -> dict:
    """The idle rank's draft extend as production runs it: the worker's glue over an idle batch,
    the data-parallel sync's padding to the peers' token count (``prepare_mlp_sync_batch``: one
    row per ``num_tokens_per_req`` tokens, ``_pad_inputs_to_size``), then the eager runner's idle
    step, which builds metadata for a padded batch."""
    import torch

    from sglfix.harness.kits import kit

    # An idle rank's batch: no requests, mode IDLE (as prepare_for_idle leaves it).
    empty = torch.empty((0,), dtype=torch.int64)
    idle = make_schedule_batch(
        runner=runner,
        req_pool_indices=empty,
        seq_lens=empty,
        gpu_only=gpu_only,
        out_cache_loc=empty.to(device),
        device=device,
        idle=True,
    )
    stage("draft-extend glue")
    # The target's hidden states of no tokens, as the worker hands them to an EAGLE draft.
    hidden = torch.empty((0, runner.model_config.hidden_size), dtype=runner.dtype, device=device)
    forward_batch = kit("attention").prepare_for_draft_extend(
        num_accept_tokens=idle.seq_lens.to(dtype=torch.int32),
        batch=idle,
        predict=idle.seq_lens,
        num_draft_tokens=ndt,
        runner=runner,
        graph_runner=None,
        hidden_states=hidden,
    )
    stage("data-parallel padding")
    mode = getattr(forward_batch.forward_mode, "name", str(forward_batch.forward_mode))
    per_req = forward_batch.spec_info.num_tokens_per_req
    bs = forward_batch.batch_size = num_tokens // per_req
    forward_batch._pad_inputs_to_size(runner, num_tokens, bs)
    stage("idle metadata init")
    if forward_batch.batch_size > 0:
        backend.init_forward_metadata(forward_batch)
    fill = int(forward_batch.seq_lens[0]) if bs else 0
    # The spec input's per-request counts after the padding (EagleDraftExtendInput.pad_batch):
    # the backends read them a row per request (FlashInfer's window draft extend subtracts
    # num_accept_tokens[:bs] from seq_lens; others read them whole).
    spec_rows = {
        name: int(value.shape[0])
        for name in ("num_correct_drafts", "num_accept_tokens")
        if isinstance(value := getattr(forward_batch.spec_info, name, None), torch.Tensor)
    }
    # The metadata as the backend's own cells digest it (as far as its kernels read it, its
    # schedule fields declared), and the padded batch.
    observe_view("idle draft extend", getattr(backend, "forward_metadata", None), rows=bs, reads=reads)
    observe("idle draft extend", forward_batch)
    return {"mode": mode, "bs": bs, "fill": fill, "spec_rows": spec_rows}


def _judge(backend: Any, *, mode: str, bs: int, fill: int, spec_rows: dict[str, int]) -> list[str]:
    """What is wrong with the metadata of a padded idle batch: ``bs`` rows, each ``fill`` positions
    of request row 0, and the spec input's per-request counts a row each."""
    bad = []
    if mode != "IDLE":
        bad.append(f"the glue turned the idle batch into {mode}")
    bad += [
        f"spec_info.{name} holds {rows} rows for the padded batch of {bs}"
        for name, rows in spec_rows.items()
        if rows != bs
    ]
    expected = [i * fill for i in range(bs + 1)]
    for what, indptr in _indptr_lists(backend):
        values = [int(x) for x in indptr.reshape(-1)[: bs + 2].tolist()]
        if values[: bs + 1] != expected:
            bad.append(f"{what} is {values[: bs + 1]}, the padded rows give {expected}")
    return bad


PROBE = DraftExtendIdle()
