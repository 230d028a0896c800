"""Probe ``draft-positions`` (PR 25015): the positions each step of the multi-step EAGLE draft runs at.

The draft starts from ``topk`` first draft tokens per request, which sit at position ``seq_len``
(the position after the request's last committed token). Step ``i`` runs the model on the tokens
of depth ``i + 1``, so every branch's query of step ``i`` is at position ``seq_len + i`` (its KV
goes to the step's out_cache_loc slice, and RoPE reads the position); the step's top-k then picks
the tokens of the next depth, and only then does the position advance.

Inputs from the scenario: ``prefix_lens`` (the requests' seq_lens), ``spec`` (topk, num_steps),
``model`` (heads, head_dim, dtype of the tiny draft model), ``page_size`` (1: the kit lays branch
slots out linearly), ``max_context_len``, ``seed`` (draft inputs).

Real code run: sglang's own dense EAGLE draft fixture (kit: MockModelRunner, real pools, the real
Triton multi-step draft backend from ``DraftBackendFactory``) and ``EagleDraftWorker.draft_forward``
(under test) through the kit's worker stand-in, eagerly (on CPU the Triton kernels run interpreted).
The model forward the worker calls is wrapped to record ``forward_batch.positions`` per step.
Judged (DIVERGE): ``num_steps - 1`` forwards, step ``i`` at ``seq_len + i`` for every branch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglfix.harness.fingerprint import observe

__all__ = ["PROBE"]


class DraftPositions:
    name = "draft-positions"

    def run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        stage("build")
        from sglfix.harness.kits import kit

        probes = kit("probes")
        build_eagle_draft, kit_scope, run_eagle_draft = (
            probes.build_eagle_draft,
            probes.kit_scope,
            probes.run_eagle_draft,
        )

        spec = scenario.spec
        seq_lens = [int(p) for p in scenario.prefix_lens]
        with kit_scope(device=device, seed=scenario.seed):
            setup = build_eagle_draft(scenario, device=device)
            runner = setup.worker.model_runner
            model_forward = runner.forward
            seen: list[list[int]] = []

            def recording_forward(forward_batch: Any) -> Any:
                seen.append([int(x) for x in forward_batch.positions.cpu().tolist()])
                observe(f"draft step {len(seen)}", forward_batch)
                return model_forward(forward_batch)

            runner.forward = recording_forward
            stage("forward")
            drafted = run_eagle_draft(setup)  # EagleDraftWorker.draft_forward, the function under test
            observe("draft output", drafted)

        stage("judge")
        steps = spec.num_steps - 1
        want = [[s + i for s in seq_lens for _ in range(spec.topk)] for i in range(steps)]
        figures = dict(positions=seen, expected=want, topk=spec.topk, num_steps=spec.num_steps)
        if len(seen) != steps:
            result.add(
                "DIVERGE", f"the draft ran {len(seen)} model forwards, expected num_steps - 1 = {steps}", **figures
            )
        bad = [
            (i, j)
            for i, (got, exp) in enumerate(zip(seen, want))
            for j in range(len(exp))
            if j >= len(got) or got[j] != exp[j]
        ]
        if bad:
            i, j = bad[0]
            got = seen[i][j] if j < len(seen[i]) else None
            rows = sum(len(w) for w in want[: len(seen)])
            shift = "" if got is None else f" ({got - want[i][j]:+d})"
            result.add(
                "DIVERGE",
                f"{len(bad)}/{rows} draft queries at wrong positions: step {i} request "
                f"{j // spec.topk} branch {j % spec.topk} runs at {got}{shift}, expected seq_len + "
                f"{i} = {want[i][j]}",
                first_bad_request=j // spec.topk,
                first_bad_row=i,
                bad_rows=len(bad),
                rows=rows,
                **figures,
            )
        if not result.findings:
            result.add(
                "PASS",
                f"{steps} draft steps x {len(seq_lens) * spec.topk} branches at seq_len + step "
                f"(step 0 at {want[0][: spec.topk * 2] if want else []})",
                **figures,
            )


PROBE = DraftPositions()
