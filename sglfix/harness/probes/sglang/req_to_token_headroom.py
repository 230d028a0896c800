"""Probe ``req-to-token-headroom`` (PR 26972): a spec-v2 decode step's KV allocation must end
inside the request's req_to_token row.

Inputs from the scenario: ``prefix_lens`` are the requests' committed KV lengths at a decode
step, ``max_context_len`` the model's context length (default: the longest prefix + 3, the
longest committed length sglang decodes), ``page_size`` and ``spec`` (EAGLE topk, steps, draft
tokens) the published server args.

Real code run: ``allocation_sizing.get_req_to_token_extra_context_len`` (under test) sizes a real
``ReqToTokenPool`` row as ``_build_default_req_pool`` does (context + headroom);
``page_aligned_decode_alloc_lens`` with ``get_alloc_reserve_per_decode`` gives each request's
allocation ``[cur, nxt)``, as ``eagle_prepare_for_decode`` computes it; the real
``assign_req_to_token_pool_func`` (the Triton kernel; interpreted on CPU) records fresh slots there.

sglfix's own expectation, from first principles: per decode step a request writes ``topk`` draft
tokens per step for ``num_steps`` steps and the verify's ``num_draft_tokens``, in the same
reserved region (the larger of the two); with pages > 1 and topk > 1 every branch starts on a
fresh page holding a copy of the prefix's last partial page (up to page_size - 1 tokens), so a
branch spans ceil((page_size - 1 + num_steps) / page_size) pages; overlap scheduling reads the
committed length one step late, so two steps are reserved; the end is rounded up to a page.
Judged (INVARIANT): that end, and the allocation's, lie inside the row; the allocation starts
where the request's allocated KV ends (an earlier start hands a held position a fresh slot, a
later one leaves a position no slot backs) and ends no later than that footprint (every position
past it is KV memory held that no draft writes, taken from other requests); after the real write
every row still holds its own prefix slots and the new slots, and no row past the batch changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglfix.harness.fingerprint import observe
from sglfix.harness.misfit import Standin
from sglfix.harness.probes.sglang.common import ceil_to, published
from sglfix.harness.unavailable import Unavailable

__all__ = ["PROBE", "own_decode_reserve"]

_SENTINEL = -1


def own_decode_reserve(*, page_size: int, topk: int, num_steps: int, num_draft_tokens: int) -> int:
    """Positions one decode step may need past the committed length (see the module's docstring)."""
    if page_size > 1 and topk > 1:
        worst_branch_pages = max(ceil_to(tail + num_steps, page_size) // page_size for tail in range(page_size))
        per_step = max(topk * worst_branch_pages * page_size, num_draft_tokens)
    else:
        per_step = max(topk * num_steps, num_draft_tokens)
    return 2 * per_step


def _decode_alloc_lens(
    sizing: Any, committed: list[int], *, reserve: int, page_size: int
) -> tuple[list[int], list[int]]:
    """Each request's decode allocation ``[cur, nxt)`` as ``eagle_prepare_for_decode`` computes
    it: through ``page_aligned_decode_alloc_lens`` from 0.5.19 on; before, the same rounding is
    written inline in that function (committed + reserve, up to a whole page, never below cur)."""
    aligned = getattr(sizing, "page_aligned_decode_alloc_lens", None)
    if aligned is not None:
        alloc_page = int(sizing.get_alloc_page_size())
        reqs = [Standin(kv=Standin(kv_allocated_len=c, kv_committed_len=c)) for c in committed]
        cur, nxt, _needed = aligned(reqs, reserve=reserve, page_size=alloc_page)
        return [int(x) for x in cur], [int(x) for x in nxt]
    return list(committed), [max(c, ceil_to(c + reserve, page_size)) for c in committed]


def _published_dcp() -> int | None:
    """The decode context-parallel width sglang's sizing reads, as published (None: this release
    has none: 0.5.13-0.5.15 keep no attention DCP width in a runtime context)."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return None
    width = getattr(get_parallel(), "attn_dcp_size", None)
    return None if width is None else int(width)


class ReqToTokenHeadroom:
    name = "req-to-token-headroom"

    def run(self, scenario: Any, *, device: str, result: Any, stage: Callable[[str], None]) -> None:
        stage("build")
        import torch

        try:
            from sglang.srt.mem_cache import allocation_sizing as sizing
        except ImportError:  # before 0.5.16 the sizing functions live in mem_cache.common
            from sglang.srt.mem_cache import common as sizing
        try:
            from sglang.srt.mem_cache.allocation import assign_req_to_token_pool_func
        except ImportError:  # before 0.5.16
            from sglang.srt.speculative.triton_ops.cache_locs import assign_req_to_token_pool_func
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

        spec = scenario.spec
        dcp = int(getattr(scenario, "dcp_size", 1))
        # Under decode context parallelism sglang's KV allocator pages page_size x dcp_size
        # (kv_cache_configurator._build_token_to_kv_pool_allocator): a decode allocation is rounded
        # up to that page, and so is sglfix's own expectation of it.
        page = scenario.page_size * dcp
        committed = [int(p) for p in scenario.prefix_lens]
        bs = len(committed)
        context_len = scenario.max_context_len or max(committed) + 3
        args = dict(
            page_size=scenario.page_size,
            speculative_algorithm="EAGLE",
            speculative_eagle_topk=spec.topk,
            speculative_num_steps=spec.num_steps,
            speculative_num_draft_tokens=spec.num_draft_tokens,
            **({"dcp_size": dcp, "tp_size": dcp} if dcp > 1 else {}),
        )
        from sglfix.harness.kits import kit

        with_server_args = kit("probes").with_server_args  # the release's calling convention
        with published(**args):
            if dcp > 1 and _published_dcp() != dcp:
                raise Unavailable(
                    f"this release's runtime context publishes no decode context-parallel width "
                    f"(get_parallel().attn_dcp_size) for its sizing to read; dcp_size {dcp} cannot be driven here"
                )
            stage("forward")
            headroom = int(with_server_args(sizing.get_req_to_token_extra_context_len))  # under test
            width = context_len + headroom
            reserve = int(with_server_args(sizing.get_alloc_reserve_per_decode))
            cur, nxt = _decode_alloc_lens(sizing, committed, reserve=reserve, page_size=page)
            if len(cur) != bs or len(nxt) != bs:
                # The engine hands these on per request (alloc_for_spec_decode zips them strictly
                # with the batch's requests; the paged allocator takes its batch size from them).
                result.add(
                    "INVARIANT",
                    f"page_aligned_decode_alloc_lens: {len(cur)} current and {len(nxt)} next lengths for "
                    f"{bs} requests (one each)",
                    current=cur,
                    next=nxt,
                )
                return
            shrunk = [b for b, (c, n) in enumerate(zip(cur, nxt)) if n < c]
            if shrunk:
                # Nothing to assign: the sizing asks a request to give back slots it holds.
                b = shrunk[0]
                result.add(
                    "INVARIANT",
                    f"page_aligned_decode_alloc_lens: request {b} is to grow from {cur[b]} to {nxt[b]} "
                    f"tokens (fewer than it holds)",
                    current=cur,
                    next=nxt,
                )
                return

            # Request b in row 1 + b (row 0 is the pool's padding row); rows after the batch are
            # guards, enough of them that a spill of the last request stays inside the tensor.
            spill = max(0, max(nxt) - width)
            guards = -(-spill // width) + 1
            pool = ReqToTokenPool(size=bs + guards, max_context_len=width, device=device, enable_memory_saver=False)
            table = pool.req_to_token
            table.fill_(_SENTINEL)
            next_slot = 1
            prefix_slots = []
            for b, c in enumerate(committed):
                slots = torch.arange(next_slot, next_slot + c, dtype=torch.int32)
                next_slot += c
                table[1 + b, :c] = slots.to(device)
                prefix_slots.append(slots)
            new_total = sum(n - s for s, n in zip(cur, nxt))
            out_cache_loc = torch.arange(next_slot, next_slot + new_total, dtype=torch.int64, device=device)
            assign_req_to_token_pool_func(
                torch.arange(1, bs + 1, dtype=torch.int64, device=device),
                table,
                torch.tensor(cur, dtype=torch.int32, device=device),
                torch.tensor(nxt, dtype=torch.int32, device=device),
                out_cache_loc,
                bs,
            )
            after = table.cpu()
            observe("req_to_token sizing", headroom, reserve, cur, nxt, after)

        stage("judge")
        own = own_decode_reserve(
            page_size=page, topk=spec.topk, num_steps=spec.num_steps, num_draft_tokens=spec.num_draft_tokens
        )
        own_end = [ceil_to(c + own, page) for c in committed]  # where sglfix expects each allocation to end
        need = [max(n, e) for e, n in zip(own_end, nxt)]
        worst = max(range(bs), key=lambda b: need[b])
        figures = dict(
            context_len=context_len,
            headroom=headroom,
            row_width=width,
            reserve=reserve,
            own_reserve=own,
            alloc_end=nxt,
            own_end=own_end,
            committed=committed,
        )
        over = [b for b in range(bs) if need[b] > width]
        if over:
            b = max(over, key=lambda i: need[i])
            by = "the allocation" if nxt[b] >= need[b] else "sglfix's draft footprint"
            result.add(
                "INVARIANT",
                f"{len(over)}/{bs} requests need KV positions past their req_to_token row: request "
                f"{b} (committed {committed[b]}) needs up to {need[b]} ({by}), the row holds {width} "
                f"(context {context_len} + headroom {headroom}; page {page}, topk {spec.topk})",
                first_bad_request=b,
                **figures,
            )
        if any(n < e for e, n in zip(own_end, nxt)):
            b = next(i for i in range(bs) if nxt[i] < own_end[i])
            result.add(
                "INVARIANT",
                f"request {b}'s decode allocation ends at {nxt[b]}, short of the draft footprint "
                f"sglfix expects ({own_end[b]}: reserve {own}, allocated {reserve})",
                first_bad_request=b,
                **figures,
            )
        moved = [b for b in range(bs) if cur[b] != committed[b]]
        if moved:
            b = moved[0]
            what = (
                "hands a position it holds a fresh slot" if cur[b] < committed[b] else "leaves positions no slot backs"
            )
            result.add(
                "INVARIANT",
                f"page_aligned_decode_alloc_lens: request {b}'s allocation starts at {cur[b]}, but it holds "
                f"{committed[b]} allocated tokens: the decode write {what}",
                first_bad_request=b,
                **figures,
            )
        held = [b for b in range(bs) if nxt[b] > own_end[b]]
        if held:
            b = max(held, key=lambda i: nxt[i] - own_end[i])
            end = own_end[b]
            result.add(
                "INVARIANT",
                f"request {b}'s decode allocation ends at {nxt[b]}, past the draft footprint sglfix expects "
                f"({end}: reserve {own}, allocated {reserve}): {nxt[b] - end} KV positions held that no draft "
                f"writes ({len(held)}/{bs} requests)",
                first_bad_request=b,
                **figures,
            )
        expected = torch.full_like(after, _SENTINEL)
        offset = next_slot
        for b, c in enumerate(committed):
            expected[1 + b, :c] = prefix_slots[b]
            n_new = nxt[b] - cur[b]
            flat = expected.view(-1)
            start = (1 + b) * width + cur[b]
            # Where the new slots belong: inside the row; what lies past its end is the spill.
            keep = min(n_new, width - cur[b])
            flat[start : start + keep] = torch.arange(offset, offset + keep, dtype=expected.dtype)
            offset += n_new
        bad_rows = [r for r in range(after.shape[0]) if not torch.equal(after[r], expected[r])]
        if bad_rows:
            r = bad_rows[0]
            changed = int((after[r] != expected[r]).sum())
            whose = (
                f"request {r - 1}'s row"
                if 1 <= r <= bs
                else "the pool's padding row"
                if r == 0
                else f"guard row {r - bs} past the batch"
            )
            result.add(
                "INVARIANT",
                f"the decode write spilled past a req_to_token row: {changed} entries of {whose} "
                f"overwritten ({len(bad_rows)} rows changed)",
                rows_changed=bad_rows,
                **figures,
            )
        if not result.findings:
            result.add(
                "PASS",
                f"every decode allocation fits its req_to_token row: request {worst} (committed "
                f"{committed[worst]}) ends at {need[worst]} of {width} (context {context_len} + headroom "
                f"{headroom}; page {page}, topk {spec.topk})",
                **figures,
            )


PROBE = ReqToTokenHeadroom()
