"""Layout helpers shared by the speculative worker and the attention backends.

The multi-step draft allocates ``out_cache_loc`` for all its steps at once, laid out
``[bs, topk, num_steps]``. Whoever needs one step's write slots (the worker's draft loop, and a
backend that bakes write targets into its metadata) takes them from this one helper, so that the
layout has a single definition (PR 26239).
"""

from __future__ import annotations

import torch


def per_step_draft_out_cache_loc(
    out_cache_loc: torch.Tensor, *, bs: int, topk: int, num_steps: int
) -> torch.Tensor:
    """``out_cache_loc`` laid out [bs, topk, num_steps] -> (num_steps, bs * topk): row ``i`` holds
    the slots the draft step ``i`` writes, branch-major within each request."""
    return out_cache_loc.view(bs, topk, num_steps).permute(2, 0, 1).reshape(num_steps, -1)
