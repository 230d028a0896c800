"""Probe ``eagle-prefill-tail`` (PR 26329): the tail token of the EAGLE draft's input rotation.

After a target prefill, the draft extends the same tokens shifted left by one, each position's
input being the *next* token; the last position of a request gets a tail token. For a request
whose prompt ends in this chunk that is the target's next (sampled) token; for a chunked
prefill whose prompt continues past this chunk it is the next prompt token, else the draft
chain diverges from what the target will see.

Inputs from the scenario: ``prefix_lens`` / ``extend_lens`` are each request's cached prefix and
this chunk; the batch's last request is the chunked one (sglang schedules the chunked request
last), its prompt continuing past the chunk by max(1, its extend length) tokens; ``seed`` draws
the prompts. Prompt tokens and sampled tokens come from disjoint ranges, so a wrong tail cannot
equal the right one by luck.

Real code run: real ``Req`` objects and a real ``ScheduleBatch`` whose
``chunked_req_next_prompt_token`` is snapshotted by ``_compute_chunked_req_next_prompt_token``
(as ``ScheduleBatch.init_new`` does), then ``eagle_utils._eagle_prefill_tail_tokens`` (under test).
sglfix's expectation: the prompt token at ``prefix + extend`` for the chunked request, the
sampled token for the others. Judged (DIVERGE): every tail token; and the sampled tokens are not
overwritten in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglfix.harness.fingerprint import observe

__all__ = ["PROBE", "VOCAB_SIZE"]

VOCAB_SIZE = 4096  # prompt tokens in [0, VOCAB_SIZE / 2), sampled tokens in [VOCAB_SIZE / 2, VOCAB_SIZE)


def _next_prompt_token(compute: Callable[..., Any], req: Any) -> Any:
    """``_compute_chunked_req_next_prompt_token`` as the release has it: 0.5.13 takes the request
    alone, later releases the vocab size too (to skip multimodal placeholders)."""
    import inspect

    if len(inspect.signature(compute).parameters) > 1:
        return compute(req, VOCAB_SIZE)
    return compute(req)


class EaglePrefillTail:
    name = "eagle-prefill-tail"

    def run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        stage("build")
        from array import array

        import torch
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch, _compute_chunked_req_next_prompt_token
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.eagle_utils import _eagle_prefill_tail_tokens

        prefix, extend = list(scenario.prefix_lens), list(scenario.extend_lens)
        bs = len(prefix)
        chunked = bs - 1
        gen = torch.Generator().manual_seed(scenario.seed)
        half = VOCAB_SIZE // 2
        prompts, reqs = [], []
        for i, (p, e) in enumerate(zip(prefix, extend)):
            length = p + e + (max(1, e) if i == chunked else 0)
            prompt = torch.randint(0, half, (length,), generator=gen).tolist()
            req = Req(f"sglfix-probe-{i}", "", array("q", prompt), SamplingParams(), vocab_size=VOCAB_SIZE)
            # This round extends fill ids [prefix, prefix + extend): 0.5.22 on keeps the end,
            # 0.5.15-0.5.21 a range set through set_extend_range, 0.5.13-0.5.14 its length.
            if hasattr(req, "set_extend_range"):
                req.set_extend_range(p, p + e)
            elif hasattr(req, "fill_len"):
                req.fill_len = p + e
            else:
                req.extend_end = p + e
            prompts.append(prompt)
            reqs.append(req)
        input_ids = torch.tensor(
            [t for prompt, p, e in zip(prompts, prefix, extend) for t in prompt[p : p + e]],
            dtype=torch.int64,
            device=device,
        )
        batch = ScheduleBatch(
            reqs=reqs,
            input_ids=input_ids,
            chunked_req=reqs[chunked],
            chunked_req_next_prompt_token=_next_prompt_token(_compute_chunked_req_next_prompt_token, reqs[chunked]),
        )
        sampled = torch.randint(half, VOCAB_SIZE, (bs,), generator=gen).to(device=device, dtype=torch.int32)
        sampled_before = sampled.clone()

        stage("forward")
        tails = _eagle_prefill_tail_tokens(batch, sampled)  # the function under test
        observe("prefill tail", tails, sampled)

        stage("judge")
        got = [int(t) for t in tails.cpu().tolist()]
        want = [prompts[i][prefix[i] + extend[i]] if i == chunked else int(sampled_before[i]) for i in range(bs)]
        wrong = [i for i in range(bs) if got[i] != want[i]]
        figures = dict(tails=got, expected=want, chunked_request=chunked)
        if len(got) != bs:
            result.add("DIVERGE", f"{len(got)} tail tokens for {bs} requests", **figures)
        elif wrong:
            i = wrong[0]
            what = "the target's sampled token" if got[i] == int(sampled_before[i]) else "neither candidate"
            kind = "chunked prefill, prompt continues" if i == chunked else "prompt ends in this chunk"
            expect = "the next prompt token" if i == chunked else "the sampled token"
            result.add(
                "DIVERGE",
                f"{len(wrong)}/{bs} tail tokens wrong: request {i} ({kind}) gets {got[i]} ({what}), "
                f"expected {expect} {want[i]}",
                first_bad_request=i,
                bad_rows=len(wrong),
                rows=bs,
                **figures,
            )
        if not torch.equal(sampled.cpu(), sampled_before.cpu()):
            result.add(
                "DIVERGE", "the target's sampled tokens were overwritten in place by the tail computation", **figures
            )
        if not result.findings:
            result.add(
                "PASS",
                f"{bs}/{bs} tail tokens right: request {chunked} (chunked prefill) gets the next prompt "
                f"token {want[chunked]}, the others their sampled token",
                **figures,
            )


PROBE = EaglePrefillTail()
