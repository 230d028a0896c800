"""One cell: a scenario run through its backend in this process, judged against the reference.

Whatever toggles are reverted in this process stay reverted; this module applies none.
Findings are collected, not raised: a cell gets the most severe verdict, its details keep all.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sglfix.common.codebase import is_code_under_test
from sglfix.harness.misfit import innermost_owner, misfit
from sglfix.harness.result import CellResult
from sglfix.harness.unavailable import NoOutput, Unavailable
from sglfix.scenario import Scenario

__all__ = ["not_reached_result", "run_cell"]


def not_reached_result(
    scenario: str, toggles: list[str], *, device: str, same_as: str, targets: list[str]
) -> CellResult:
    """A cell whose reverted functions its scenario's baseline never entered: not run."""
    shown = ", ".join(".".join(t.split(".")[-2:]) for t in sorted(targets)[:3])
    more = f" and {len(targets) - 3} more" if len(targets) > 3 else ""
    result = CellResult(scenario=scenario, toggles=list(toggles), device=device)
    result.add(
        "NOT_REACHED",
        f"not reached: the baseline never runs {shown}{more}; same as baseline ({same_as})",
        same_as=same_as,
        targets=sorted(targets),
    )
    return result.finish()


def _backends_dir() -> str:
    """The directory of the code under test, for frames shown relative to it."""
    from sglfix.codebases import active
    from sglfix.common.codebase import package_dirs

    dirs = package_dirs(active().package)
    return dirs[0] if dirs else os.sep


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(exc.__traceback__))


def raised_by_code_under_test(exc: BaseException) -> bool:
    """Whose frame raised? The innermost frame that is ours decides: in the backends, the code
    under test raised (CRASH); in sglfix proper (harness, reference, invariant hooks the backends
    call back into), sglfix failed (ERROR). Library frames (torch, triton) are skipped."""
    return innermost_owner(exc) == "code"


def _frame_under_test(exc: BaseException) -> str:
    frames = _frames(exc)
    from sglfix.patching.patcher import real_filename

    for fr in reversed(frames):
        if is_code_under_test(fr.filename):
            # A reverted function runs under its revert's file name (its source in linecache);
            # the report names the real file and line, which the revert keeps.
            return f"{os.path.relpath(real_filename(fr.filename), _backends_dir())}:{fr.lineno} in {fr.name}"
    fr = frames[-1] if frames else None
    return f"{os.path.basename(fr.filename)}:{fr.lineno} in {fr.name}" if fr else "?"


# What the device's allocators say when the GPU's memory is gone, where torch's own error is not
# what reaches the cell: a kernel library's workspace (cuBLAS), a plain CUDA call's status.
_OUT_OF_MEMORY_TEXTS = ("CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "cudaErrorMemoryAllocation")


def is_out_of_gpu_memory(exc: BaseException) -> bool:
    """The GPU ran out of memory: torch's error (torch.OutOfMemoryError, found without importing
    torch), or another error whose first line says so."""
    if any(c.__name__ == "OutOfMemoryError" and c.__module__.startswith("torch") for c in type(exc).__mro__):
        return True
    return any(text in _first_line(exc) for text in _OUT_OF_MEMORY_TEXTS)


# What CUDA says of a fault of the device itself (as against a call refused on the host).
_DEVICE_FAULT_TEXTS = (
    "illegal memory access",
    "illegal address",
    "device-side assert",
    "misaligned address",
    "operation not supported on global/shared address space",
    "unspecified launch failure",
    "illegal instruction",
)


def is_device_fault(exc: BaseException) -> bool:
    """A kernel faulted on the GPU (CUDA's error, raised wherever the next wait happened to be);
    never an out-of-memory error, which says nothing of the code under test."""
    line = _first_line(exc)
    return "CUDA error" in line and any(text in line for text in _DEVICE_FAULT_TEXTS) and not is_out_of_gpu_memory(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def run_cell(scenario: Scenario, *, device: str, toggles: list[str] | None = None) -> CellResult:
    """Run one cell; never raises for a failure of the code under test or of the harness."""
    result = CellResult(scenario=scenario.name, toggles=list(toggles or []), device=device)
    try:
        return _run(scenario, device=device, result=result, stage_box=["setup"])
    except _Staged as staged:  # _run wraps every exception with the stage it was raised in
        exc, stage = staged.exc, staged.stage
    if isinstance(exc, Unavailable):
        result.add("SKIP", str(exc), stage=stage)
        return result.finish()
    where = _frame_under_test(exc)
    verdict, message, kind, flags = _blame(exc, scenario=scenario, stage=stage, where=where)
    result.add(verdict, message, type=kind, stage=stage, frame=where, **flags)
    return result.finish()


def _blame(exc: BaseException, *, scenario: Scenario, stage: str, where: str) -> tuple[str, str, str, dict]:
    """(verdict, message, exception type, flags) of a cell that raised ``exc``: whose failure it
    is, the code under test's (CRASH) or sglfix's or the machine's (ERROR)."""
    from sglfix.harness.codefault import code_fault_of

    name, line = type(exc).__name__, _first_line(exc)
    if is_out_of_gpu_memory(exc):
        # The GPU is shared by the workers (and whatever else runs there): running out of its
        # memory says nothing about the code under test, so it is never a finding. Whether other
        # workers shared it is the pool's to say (sglfix.execution.pool), not this process's.
        return "ERROR", f"out of GPU memory in {stage}: {line[:160]} [{where}]", name, {"out_of_memory": True}
    if (unfit := misfit(exc)) is not None:
        # sglfix's probe or adapter (or the kit helper it uses) was written for other interfaces
        # than this tree's: its failure, never a crash of the code under test.
        kind = "probe" if getattr(scenario, "probe", None) is not None else "adapter"
        message = f"this {kind} does not support this code base: {unfit} [{stage}, {where}]"
        return "ERROR", message, name, {"misfit": True}
    if (fault := code_fault_of(exc)) is not None:
        return "CRASH", f"{fault} [{stage}, {where}]", type(fault).__name__, {}
    if is_device_fault(exc):
        # A fault of the device (an illegal address, a device-side assert) is asynchronous: it
        # surfaces at the next wait, often one of sglfix's, though a kernel this cell launched
        # raised it. A worker owns its GPU context alone when this is judged (a context lost
        # under MPS is run again alone: sglfix.execution.pool), so the fault is this cell's.
        message = f"device fault: {name}: {line[:160]} [{stage}, surfaced at {where}]"
        return "CRASH", message, name, {"device_fault": True}
    if raised_by_code_under_test(exc):
        return "CRASH", f"{name}: {line} [{stage}, {where}]", name, {}
    return "ERROR", f"sglfix failed in {stage}: {name}: {line} [{where}]", name, {}


# What a cell catches: every exception, and also SystemExit and KeyboardInterrupt, which the code
# under test may raise like any other (a worker runs in its own session: no terminal's Ctrl-C
# reaches it, so a KeyboardInterrupt there was raised by code). Either is CRASH or ERROR with
# its type and frame, never a dead worker.
_CELL_EXCEPTIONS = (Exception, SystemExit, KeyboardInterrupt)


class _Staged(Exception):
    def __init__(self, exc: BaseException, stage: str) -> None:
        super().__init__(str(exc))
        self.exc, self.stage = exc, stage


def _run(scenario: Scenario, *, device: str, result: CellResult, stage_box: list) -> CellResult:
    def stage(name: str):
        stage_box[0] = name

    from sglfix.harness.poison import poisoned

    with _engine_flags(scenario):
        if getattr(scenario, "probe", None) is not None:  # a probe instead of a backend (sglfix.harness.probes)
            try:
                from sglfix.harness.probes import run_probe

                with poisoned():
                    return run_probe(scenario, device=device, result=result, stage=stage).finish()
            except _CELL_EXCEPTIONS as exc:
                raise _Staged(exc, stage_box[0]) from exc
        try:
            with poisoned():
                ran = _execute(scenario, device=device, result=result, stage=stage)
        except _CELL_EXCEPTIONS as exc:
            raise _Staged(exc, stage_box[0]) from exc
        try:
            stage("judge")
            _judge(ran, scenario=scenario, result=result)
        except _CELL_EXCEPTIONS as exc:
            raise _Staged(exc, "judge") from exc
    return result.finish()


@contextlib.contextmanager
def _engine_flags(scenario: Scenario) -> Iterator[None]:
    """The scenario's engine flags (``env:``) for the whole cell, build to judge; none: nothing."""
    env = getattr(scenario, "env", None)
    if not env:
        yield
        return
    from sglfix.harness.kits import kit

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(kit("attention").engine_flags(env))
        except _CELL_EXCEPTIONS as exc:
            raise _Staged(exc, "build") from exc
        yield


@dataclass
class _Ran:
    """What the run left for the judge: the adapter and its objects, the output, the syncs seen,
    how many metadata views were checked, and the clock at the start, after the build and after
    the run."""

    adapter: Any
    prepared: Any
    backend: Any
    out: Any
    syncs: list[str]
    views_checked: list[int]  # one count, kept by the metadata hook
    t0: float
    t1: float
    t2: float


def _execute(scenario: Scenario, *, device: str, result: CellResult, stage: Callable[[str], None]) -> _Ran:
    """Build, capture and run the scenario through its adapter, the invariants checked after every
    metadata init."""
    import torch

    from sglfix.harness.adapters import get_adapter
    from sglfix.harness.syncwatch import watch_syncs

    adapter = get_adapter(scenario.backend)
    is_cuda = torch.device(device).type == "cuda"
    adapter.check_available(device)

    # The device is waited on once, after the run: every wait of a worker also waits for the
    # other workers sharing the GPU (sglfix.harness.hostcopy), so the build and capture timings
    # are the host's time to issue their work, and the run's includes what was left.
    t0 = time.perf_counter()
    stage("build")
    prepared = adapter.build(scenario, device=device)
    t1 = time.perf_counter()
    views_checked = [0]
    # Under deterministic inference the split is the mode's promise: schedule fields stay schedule
    # to the fingerprint only where the adapter judges that promise itself.
    on_metadata = _metadata_hook(
        adapter,
        prepared,
        result,
        views_checked,
        deterministic=scenario.deterministic and not adapter.judges_batch_invariance(scenario),
    )
    stage("forward")
    backend = adapter.make_backend(prepared)
    stage("capture")
    runner = adapter.capture(prepared, backend, scenario=scenario, on_metadata=on_metadata)
    t_cap = time.perf_counter()
    if runner is not None:
        result.timings_ms["capture"] = round((t_cap - t1) * 1e3, 2)
    stage("forward")
    watched = sync_watched(scenario, is_cuda=is_cuda)
    if scenario.sync_free == "cuda" and not watched:
        # Said, so that a PASS here is not read as the promise kept: only CUDA can judge it.
        result.add("PASS", "sync-free not judged here: declared for CUDA only", syncs_checked=False)
    with watch_syncs(device, enabled=watched) as syncs:
        out = adapter.run(prepared, backend, runner, scenario=scenario, on_metadata=on_metadata)
    if is_cuda:
        torch.cuda.synchronize()
    from sglfix.harness import fingerprint

    fp = fingerprint.active()
    if fp is not None:
        # Known only now: which fields the launches of this run never read.
        fp.mark_unread(adapter.unread_fields(prepared, backend))
    t2 = time.perf_counter()
    return _Ran(adapter, prepared, backend, out, syncs, views_checked, t0, t1, t2)


def _metadata_hook(
    adapter: Any, prepared: Any, result: CellResult, views_checked: list[int], *, deterministic: bool = False
) -> Callable[[Any, Any, str], None]:
    """The hook an adapter calls after every metadata init: the invariant table over each of its
    metadata views (outside the sync watch), each finding an INVARIANT; counts the views checked.
    Under deterministic inference the work's split is what the mode promises to fix (the same
    split whatever the batch), so no field is declared schedule to the fingerprint there
    (``deterministic``: such a cell, whose adapter does not judge that promise itself)."""
    import dataclasses

    from sglfix.harness import fingerprint
    from sglfix.harness.invariants import check_metadata_views
    from sglfix.harness.syncwatch import suspended

    def on_metadata(backend: Any, forward_batch: Any, phase: str) -> None:
        with suspended():
            views = []
            for label, metadata, rows in adapter.metadata_views(backend, forward_batch):
                views_checked[0] += metadata is not None
                views.append((f"{phase} {label}" if label else phase, metadata, rows))
            found = check_metadata_views(views, fields=adapter.metadata_fields, num_slots=prepared.num_slots)
            fp = fingerprint.active()
            if fp is not None:
                reads = adapter.metadata_fields
                if deterministic and reads.schedule:
                    reads = dataclasses.replace(reads, schedule=())
                fp.add_views(views, reads=reads)
        for message in found:
            result.add("INVARIANT", message, phase=phase)

    return on_metadata


def sync_watched(scenario: Scenario, *, is_cuda: bool) -> bool:
    """Whether the cell watches for device->host syncs: a scenario declared sync-free, where
    ``sync_free: cuda`` is judged on CUDA alone."""
    return scenario.sync_free is True or (scenario.sync_free == "cuda" and is_cuda)


def _judge(ran: _Ran, *, scenario: Scenario, result: CellResult) -> None:
    """Syncs, guard zones and the adapter's own metadata checks; then the output against the
    reference, or, without an output, why it was not compared."""
    from sglfix.harness.guards import describe_guards, guard_zones
    from sglfix.harness.hostcopy import to_host

    adapter = ran.adapter
    for message in ran.syncs:
        result.add("SYNC", message)
    registry = list(adapter.static_buffers(ran.backend))
    # The guard zones and, with an output, the reference, the rows to compare and the output:
    # read in one wait for the device (sglfix.harness.hostcopy).
    compared = [] if isinstance(ran.out, NoOutput) else [*adapter.reference(ran.prepared), ran.out]
    read = to_host([*guard_zones(registry), *compared])
    raws, compared = read[: len(registry)], read[len(registry) :]
    for message in describe_guards(registry, raws):
        result.add("INVARIANT", f"write past a buffer's end: {message}")
    checks = list(adapter.check_metadata(ran.prepared, ran.backend))
    for verdict, message in checks:
        result.add(verdict, message)
    if not compared:
        _judge_without_output(ran, checked=bool(checks or ran.views_checked[0] or result.findings), result=result)
    else:
        _compare_with_reference(ran, *compared, scenario=scenario, result=result)


def _rows_never_written(out: Any, *, rows: int) -> int:
    """How many output rows still hold the poison an allocation was filled with
    (sglfix.harness.poison): rows no kernel wrote."""
    from sglfix.harness.poison import unwritten

    flat = out.reshape(-1)
    per_row = flat.numel() // rows if rows else 0
    if not per_row:
        return 0
    return int(unwritten(flat[: rows * per_row].reshape(rows, per_row)).any(dim=1).sum())


def _judge_without_output(ran: _Ran, *, checked: bool, result: CellResult) -> None:
    if not checked:
        result.add("SKIP", f"nothing checked: {ran.out.reason}")
    else:
        result.add("PASS", f"output not checked: {ran.out.reason}", output_checked=False)
    t3 = time.perf_counter()
    result.timings_ms.update(
        build=round((ran.t1 - ran.t0) * 1e3, 2),
        run=round((ran.t2 - ran.t1) * 1e3, 2),
        total=round((t3 - ran.t0) * 1e3, 2),
    )


def _compare_with_reference(
    ran: _Ran, ref: Any, q_valid: Any, out: Any, *, scenario: Scenario, result: CellResult
) -> None:
    """The output against the reference, both already on the host (``_judge`` read them)."""
    from sglfix.harness import fingerprint
    from sglfix.harness.reference import compare_outputs

    fp = fingerprint.active()
    if fp is not None:
        fp.add_output(out)
    rows = int(q_valid.sum())
    wanted = rows * ref[0, 0].numel() if ref.dim() >= 2 and ref.shape[0] and ref.shape[1] else 0
    if out.numel() != wanted:
        # The backend returned another number of rows than the batch has query tokens: no row
        # can be compared with its reference, and every one is wrong.
        result.add(
            "DIVERGE",
            f"the output holds {out.numel()} values where the batch's {rows} query rows need {wanted} "
            f"(output shape {tuple(out.shape)})",
            output_shape=list(out.shape),
            expected_values=wanted,
        )
        t3 = time.perf_counter()
        result.timings_ms.update(
            build=round((ran.t1 - ran.t0) * 1e3, 2),
            run=round((ran.t2 - ran.t1) * 1e3, 2),
            total=round((t3 - ran.t0) * 1e3, 2),
        )
        return
    cmp = compare_outputs(out=out, ref=ref, q_valid=q_valid, tolerance=scenario.tolerance)
    t3 = time.perf_counter()
    result.error = cmp.to_json()
    got_dtype, wanted_dtype = str(out.dtype).removeprefix("torch."), str(scenario.model.dtype)
    if got_dtype != wanted_dtype:
        # The layer after attention (o_proj) runs in the model's dtype: an output of another one
        # fails there or is read as another type, however close its values are.
        result.add(
            "INVARIANT",
            f"the attention output is {got_dtype} where the model runs in {wanted_dtype}",
            output_dtype=got_dtype,
            model_dtype=wanted_dtype,
        )
    if cmp.nonfinite:
        never = _rows_never_written(out, rows=cmp.rows)
        said = f"; {never} of {cmp.rows} rows hold the poison: output memory nothing wrote" if never else ""
        result.add("NAN", f"{cmp.nonfinite} non-finite output values{said}", **cmp.to_json(), rows_never_written=never)
    if cmp.bad_rows:
        result.add(
            "DIVERGE",
            f"max abs err {cmp.max_abs:.3g} (rel {cmp.max_rel:.3g}), {cmp.bad_rows}/{cmp.rows} rows bad, "
            f"first at request {cmp.first_bad_request} row {cmp.first_bad_row}",
            **cmp.to_json(),
        )
    result.timings_ms.update(
        build=round((ran.t1 - ran.t0) * 1e3, 2),
        run=round((ran.t2 - ran.t1) * 1e3, 2),
        reference=round((t3 - ran.t2) * 1e3, 2),
        total=round((t3 - ran.t0) * 1e3, 2),
    )
