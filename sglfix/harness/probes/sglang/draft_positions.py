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

from sglfix.harness.adapters.sglang.truth import first_difference
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
            forwards: list[dict] = []
            start = _draft_start(setup.batch)

            def recording_forward(forward_batch: Any) -> Any:
                seen.append([int(x) for x in forward_batch.positions.cpu().tolist()])
                observe(f"draft step {len(seen)}", forward_batch)
                out = model_forward(forward_batch)
                forwards.append(
                    {
                        "input_ids": [int(x) for x in forward_batch.input_ids.cpu().tolist()],
                        "out_cache_loc": [int(x) for x in forward_batch.out_cache_loc.cpu().tolist()],
                        "logits": out.logits_output.next_token_logits.detach().float().cpu(),
                    }
                )
                return out

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
        wrong = _check_steps(forwards, start=start, spec=spec) or _check_tree(drafted, forwards, start=start, spec=spec)
        if wrong is not None:
            result.add("DIVERGE", wrong, **figures)
        if not result.findings:
            result.add(
                "PASS",
                f"{steps} draft steps x {len(seq_lens) * spec.topk} branches at seq_len + step "
                f"(step 0 at {want[0][: spec.topk * 2] if want else []}); each step's tokens and write slots, and "
                "the draft tree (tokens, scores' order, parents) as the model's step distributions give it",
                **figures,
            )


# Scores within this of each other may rank either way: the reference's softmax is not the
# engine's to the last bit.
_SCORE_TIE = 1e-5


def _draft_start(batch: Any) -> dict:
    """What the draft starts from (copied before it runs): each request's first ``topk`` tokens
    and their probabilities, and the draft's write slots."""
    info = batch.spec_info
    return {
        "p": info.topk_p.detach().float().cpu(),
        "tokens": info.topk_index.detach().cpu().long(),
        "slots": [int(x) for x in batch.out_cache_loc.cpu().tolist()],
        "bs": int(batch.batch_size),
    }


def _check_steps(steps: list[dict], *, start: dict, spec: Any) -> str | None:
    """Each model forward's write slots: branch ``k`` of request ``b`` at step ``i`` writes the
    slot the draft's allocation lays out for it (each request's slots as ``topk`` branches of
    ``num_steps``); and step 0 runs on the first draft tokens, branch by branch."""
    bs, topk, n = start["bs"], spec.topk, spec.num_steps
    slots = start["slots"]
    if len(slots) != bs * topk * n:
        return f"the draft holds {len(slots)} write slots, {bs} requests x {topk} branches x {n} steps need {bs * topk * n}"
    for i, step in enumerate(steps):
        want = [slots[(b * topk + k) * n + i] for b in range(bs) for k in range(topk)]
        j = first_difference(step["out_cache_loc"], want)
        if j is not None:
            return (
                f"draft step {i} writes its KV at {step['out_cache_loc']}, request {j // topk} branch {j % topk} "
                f"owns slot {want[j] if j < len(want) else None} there"
            )
    if steps:
        first = [int(t) for t in start["tokens"].reshape(-1).tolist()]
        if steps[0]["input_ids"] != first:
            return f"draft step 0 runs on tokens {steps[0]['input_ids']}, the first draft tokens are {first}"
    return None


def _candidates(steps: list[dict], frontiers: list[list[int]], *, start: dict, spec: Any, b: int) -> dict:
    """Request ``b``'s draft candidates from the model alone, grown from the frontiers the draft
    ran: the root's ``topk`` children are the first draft tokens; each node of the frontier run at
    step ``i - 1`` (logits row ``b * topk + j`` for its ``j``-th node) adds its ``topk`` most likely
    next tokens (softmax), scored by the product of probabilities along their path. Candidates
    are numbered as they arise: the root's children, then step by step, node by node, child by
    child."""
    import torch

    topk = spec.topk
    scores = [float(x) for x in start["p"][b].tolist()]
    tokens = [int(x) for x in start["tokens"][b].tolist()]
    for i in range(1, spec.num_steps):
        logits = steps[i - 1]["logits"][b * topk : (b + 1) * topk]
        p, t = torch.topk(torch.softmax(logits, dim=-1), topk, dim=-1)
        for j, node in enumerate(frontiers[i - 1]):
            for c in range(topk):
                scores.append(scores[node] * float(p[j, c]))
                tokens.append(int(t[j, c]))
    return {"scores": scores, "tokens": tokens}


def _ranks_within(picked: list[int], scores: list[float], *, among: list[int]) -> bool:
    """Whether ``picked`` are a best ``len(picked)`` of ``among`` by score, ties within _SCORE_TIE."""
    rest = [x for x in among if x not in set(picked)]
    if not picked or not rest:
        return True
    return min(scores[x] for x in picked) >= max(scores[x] for x in rest) - _SCORE_TIE


def _check_tree(drafted: Any, steps: list[dict], *, start: dict, spec: Any) -> str | None:
    """The draft's output against its tree (a chain at topk 1): ``parent_list`` names -1, the
    root's children, then the frontier each later step ran, each a best ``topk`` of that step's
    candidates, whose tokens that step ran on; the draft tokens are the ``num_draft_tokens - 1``
    best-scored candidates in candidate order (``top_scores_index``), each the token the model gave
    its path."""
    if drafted is None or len(drafted) < 3 or any(x is None for x in drafted[:3]):
        return f"the draft returned {drafted!r}, not (parent_list, top_scores_index, draft_tokens, ...)"
    parent_list, top_scores_index, draft_tokens = drafted[0], drafted[1], drafted[2]
    topk, n, ndt = spec.topk, spec.num_steps, spec.num_draft_tokens
    if len(steps) != n - 1:
        return None  # the positions judge names a wrong number of forwards
    for name, value in (
        ("parent_list", parent_list),
        ("top_scores_index", top_scores_index),
        ("draft_tokens", draft_tokens),
    ):
        rows = int(value.shape[0]) if getattr(value, "dim", lambda: 0)() else 0
        if rows != start["bs"]:
            return f"{name} has {rows} rows for {start['bs']} requests"
    for b in range(start["bs"]):
        plist = [int(x) for x in parent_list[b].reshape(-1).tolist()] if n > 1 else []
        want_len = 1 + topk + (n - 2) * topk if n > 1 else 0
        if len(plist) != want_len or (n > 1 and plist[: topk + 1] != list(range(-1, topk))):
            return f"request {b}: parent_list {plist}, a draft of {n} steps at topk {topk} gives -1, 0..{topk - 1} then {n - 2} frontier(s) of {topk}"
        frontiers = [list(range(topk))] + [
            plist[topk + 1 + (i - 1) * topk : topk + 1 + i * topk] for i in range(1, n - 1)
        ]
        ref = _candidates(steps, frontiers, start=start, spec=spec, b=b)
        for i in range(1, n - 1):
            block = list(range(topk + (i - 1) * topk * topk, topk + i * topk * topk))
            got = frontiers[i]
            if (
                len(set(got)) != topk
                or not set(got) <= set(block)
                or not _ranks_within(got, ref["scores"], among=block)
            ):
                return f"request {b}: step {i}'s frontier {got} is not a best {topk} of its candidates {block[0]}..{block[-1]}"
            ran = steps[i]["input_ids"][b * topk : (b + 1) * topk]
            want = [ref["tokens"][x] for x in got]
            if ran != want:
                return f"draft step {i} runs request {b} on tokens {ran}, its frontier's tokens are {want}"
        picked = [int(x) for x in top_scores_index[b].reshape(-1).tolist()]
        every = list(range(len(ref["scores"])))
        if len(picked) != ndt - 1 or picked != sorted(set(picked)) or not all(0 <= x < len(every) for x in picked):
            return (
                f"request {b}: top_scores_index {picked} is not {ndt - 1} distinct candidates of {len(every)} in order"
            )
        if not _ranks_within(picked, ref["scores"], among=every):
            return f"request {b}: top_scores_index {picked} are not the {ndt - 1} best-scored draft candidates"
        have = [int(x) for x in draft_tokens[b].reshape(-1).tolist()]
        want = [ref["tokens"][x] for x in picked]
        if have != want:
            return f"request {b}: draft tokens {have}, the model gives {want} for candidates {picked}"
    return None


PROBE = DraftPositions()
