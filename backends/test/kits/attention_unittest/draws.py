"""Standard normal draws on the host, remembered by generator state, for the case builders.

A builder seeds a CPU generator for its case and draws the case's inputs from it, so the same
scenario under every other toggle set draws the very same values again: about half of a build's
time (0.45 s of the 0.99 s that the 155 built-in scenarios' builds take on the CPU). A draw is a
function of the generator's state, the shape and the dtype, so one made before is handed back (a
copy: the caller may write into it) and the generator left where the draw would have left it.
The memo is an object's fields, which the state check between toggle sets does not look into (it is
no state of the code under test), and it is bounded (least recently used draws go first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import torch

__all__ = ["MEMO_BYTES", "randn"]

MEMO_BYTES = 256 << 20  # per process: every built-in scenario's draws are about this much


class _Draws:
    def __init__(self) -> None:
        self.memo: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.held = 0  # bytes of the remembered draws

    def remember(self, key: tuple, values: torch.Tensor, after: torch.Tensor) -> None:
        size = values.numel() * values.element_size()
        if size > MEMO_BYTES // 4:
            return
        self.memo[key] = (values.clone(), after)
        self.held += size
        while self.held > MEMO_BYTES:
            _, (old, _) = self.memo.popitem(last=False)
            self.held -= old.numel() * old.element_size()


_DRAWS = _Draws()


def randn(shape: Sequence[int], *, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """``torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)``, bit for bit,
    with ``generator`` moved on as that call moves it."""
    before = generator.get_state()
    key = (hashlib.blake2b(before.numpy().tobytes(), digest_size=16).digest(), tuple(int(n) for n in shape), dtype)
    hit = _DRAWS.memo.get(key)
    if hit is not None:
        _DRAWS.memo.move_to_end(key)
        values, after = hit
        generator.set_state(after)
        return values.clone()
    values = torch.randn(tuple(shape), generator=generator, dtype=torch.float32).to(dtype)
    _DRAWS.remember(key, values, generator.get_state())
    return values
