"""Probe ``needs-cpu-seq-lens`` (PR 26738, part overlap-guard): whether spec v2 must publish the
CPU mirror of seq_lens.

At overlap start-up the scheduler asks ``overlap_utils.decide_needs_cpu_seq_lens`` over the
attention backends a spec-v2 step touches (target, draft, draft-extend). The gpu_only path skips
the per-step device->host copy only when every backend present opts out; a slot a spec config
leaves unset is no backend at all, and a backend that does not declare ``needs_cpu_seq_lens``
(out-of-tree, or older than the flag) must keep the CPU mirror.

Inputs from the scenario: ``spec`` (topk, num_steps: the draft backend's shape), ``gpu_only``:
true leaves the draft-extend slot unset (the configuration that takes the gpu_only path), false
puts a backend that declares no flag there; ``prefix_lens`` size the runner's pools.

Real code run: sglang's own dense EAGLE draft fixture (kit: MockModelRunner publishing EAGLE
server args, the real ``TritonAttnBackend`` target, the real ``TritonMultiStepDraftBackend`` from
``DraftBackendFactory``), then ``decide_needs_cpu_seq_lens`` (under test) on the three slots.
sglfix's expectation: two-batch overlap and ngram always need the mirror; otherwise the OR, over
the slots holding a backend, of the flag the backend's class (or the object) declares, True where
none is declared. Judged (DIVERGE): the decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglfix.harness.fingerprint import observe

__all__ = ["PROBE", "UndeclaredAttnBackend"]

_UNSET = object()


class UndeclaredAttnBackend:
    """An attention backend that predates the ``needs_cpu_seq_lens`` flag (an out-of-tree plugin):
    it declares nothing, so it must be taken to read the CPU mirror."""


def _declared(backend: Any) -> Any:
    """The flag ``backend`` declares (on itself or a class of its MRO), or _UNSET."""
    if "needs_cpu_seq_lens" in getattr(backend, "__dict__", {}):
        return backend.__dict__["needs_cpu_seq_lens"]
    for klass in type(backend).__mro__:
        if "needs_cpu_seq_lens" in vars(klass):
            return vars(klass)["needs_cpu_seq_lens"]
    return _UNSET


class NeedsCpuSeqLens:
    name = "needs-cpu-seq-lens"

    def run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        stage("build")
        from sglfix.harness.kits import kit

        build_eagle_draft, kit_scope = kit("probes").build_eagle_draft, kit("probes").kit_scope

        with kit_scope(device=device, seed=scenario.seed):
            try:
                from sglang.srt import runtime_context
            except ImportError:  # 0.5.13
                runtime_context = None

            setup = build_eagle_draft(scenario, device=device)
            third = None if scenario.gpu_only else UndeclaredAttnBackend()
            slots = (setup.target_backend, setup.draft_backend, third)
            if runtime_context is not None and hasattr(runtime_context, "get_exec"):
                two_batch_overlap = bool(runtime_context.get_exec().overlap.enable_two_batch_overlap)
                algorithm = str(runtime_context.get_spec().speculative_algorithm or "")
            else:  # up to 0.5.16 it reads the server args themselves
                server_args = kit("probes").server_args()
                two_batch_overlap = bool(server_args.enable_two_batch_overlap)
                algorithm = str(server_args.speculative_algorithm or "")
            stage("forward")
            decided = kit("probes").decide_needs_cpu_seq_lens(slots)  # the function under test
            # What the decision reads of the backends is the flag each declares; the rest of
            # what their constructors built is judged by the cells that run them.
            observe("needs cpu seq_lens", decided, [None if b is None else _declared(b) for b in slots])

        stage("judge")
        names = ["unset" if b is None else type(b).__name__ for b in slots]
        flags = ["-" if b is None else ("undeclared" if _declared(b) is _UNSET else bool(_declared(b))) for b in slots]
        if two_batch_overlap or algorithm.upper() == "NGRAM":
            want = True
        else:
            want = any(True if _declared(b) is _UNSET else bool(_declared(b)) for b in slots if b is not None)
        shown = ", ".join(f"{n} ({f})" for n, f in zip(names, flags))
        figures = dict(decided=decided, expected=want, slots=names, flags=[str(f) for f in flags])
        if not isinstance(decided, bool) or decided != want:
            result.add(
                "DIVERGE",
                f"decide_needs_cpu_seq_lens says {decided!r}, expected {want} for the slots {shown}",
                **figures,
            )
        else:
            path = "CPU mirror kept" if want else "gpu_only path (no seq_lens D2H)"
            result.add("PASS", f"{path}: decide_needs_cpu_seq_lens says {decided} for the slots {shown}", **figures)


PROBE = NeedsCpuSeqLens()
