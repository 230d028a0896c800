"""Slot ground truth of the draft cases: where each request's prefix and each branch's draft tokens
live in the KV pool (``DraftSlots``, page size 1) and which pages a paged batch's requests own
(``PagedSlots``); scattered from the scenario's seed, so that a wrong index reads another token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftSlots", "PagedSlots"]


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

    @classmethod
    def paged(
        cls, prefix_lens: tuple[int, ...], *, num_steps: int, page_size: int, num_slots: int, seed: int
    ) -> DraftSlots:
        """A chain (topk 1) on a paged pool: each request's prefix and its draft tokens run on its
        own pages, as a paged allocator lays a request's tokens out; the pages scattered."""
        paged = PagedSlots.allocate(
            tuple(p + num_steps for p in prefix_lens), page_size=page_size, num_slots=num_slots, seed=seed
        )
        prefix = [[paged.slot(b, pos) for pos in range(p)] for b, p in enumerate(prefix_lens)]
        draft = [[[paged.slot(b, p + s) for s in range(num_steps)]] for b, p in enumerate(prefix_lens)]
        return cls(tuple(prefix_lens), 1, num_steps, prefix, draft)

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
