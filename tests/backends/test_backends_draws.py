"""Host draws remembered by generator state (the kit's draws module): the values and the
generator afterwards are those of the plain draw, a remembered draw is a copy, and the memo stays
within its bound."""

from __future__ import annotations

import torch

from sglfix.backends.test.kits.attention_unittest import draws as hostrandom


def _plain(seed: int, shapes, dtype):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=g, dtype=torch.float32).to(dtype) for s in shapes]
    return out, torch.randint(1 << 30, (4,), generator=g)  # what the builder draws next


def _memo(seed: int, shapes, dtype):
    g = torch.Generator().manual_seed(seed)
    out = [hostrandom.randn(s, generator=g, dtype=dtype) for s in shapes]
    return out, torch.randint(1 << 30, (4,), generator=g)


def test_a_remembered_draw_is_the_plain_draw_bit_for_bit_and_moves_the_generator_as_it_does():
    shapes = [(3, 5, 7), (11,), (2, 64, 128)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        want, want_next = _plain(1234, shapes, dtype)
        for _ in range(3):  # the first draws, then the remembered ones
            got, got_next = _memo(1234, shapes, dtype)
            assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want))
            assert torch.equal(got_next, want_next)
    other, _ = _memo(99, shapes, torch.float32)
    assert not torch.equal(other[0], _plain(1234, shapes, torch.float32)[0][0])


def test_a_remembered_draw_is_a_copy_the_caller_may_write_into():
    first, _ = _memo(7, [(4, 4)], torch.float32)
    first[0].fill_(0)
    again, _ = _memo(7, [(4, 4)], torch.float32)
    assert torch.equal(again[0], _plain(7, [(4, 4)], torch.float32)[0][0])


def test_the_memo_stays_within_its_bound(monkeypatch):
    monkeypatch.setattr(hostrandom, "MEMO_BYTES", 64 << 10)
    monkeypatch.setattr(hostrandom, "_DRAWS", hostrandom._Draws())
    for seed in range(40):
        _memo(seed, [(1024,)], torch.float32)  # 4 KiB each
    held = hostrandom._DRAWS
    assert held.held <= 64 << 10
    assert held.held == sum(v.numel() * v.element_size() for v, _ in held.memo.values())
    assert len(held.memo) == 16
