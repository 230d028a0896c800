"""Which reverted toggles make the scenarios fail: culprits by delta debugging, and masking.

Pure search over candidate ids with a ``fails(ids) -> bool`` oracle (in the CLI: run the chosen
scenarios with ``ids`` reverted; any non-PASS cell fails). Every distinct set is asked once
(``Oracle`` caches), so ``runs`` counts the distinct toggle sets executed.

- ``one_culprit_search``: one minimal failing subset. It first assumes the failure has one cause
  and halves the candidates, asking only about the left half at each level (the right half must
  fail when the left passes, if the cause is single): ``ceil(log2 n)`` questions plus one that
  confirms the singleton. When that confirmation fails (the cause needs several candidates
  together) it falls back to ddmin (Zeller & Hildebrandt) on the whole set, which finds a
  1-minimal failing subset however the cause is shaped.
- ``find_culprits``: repeat while the remaining candidates still fail.
- ``find_masking``: a culprit that fails alone but passes when reverted together with another
  candidate (as 26651's kit fixture hides its Triton part).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

__all__ = ["Oracle", "ddmin", "one_culprit_search", "find_culprits", "find_masking", "BisectResult"]


@dataclass
class Oracle:
    """``fails`` with a cache: a set of ids is run at most once."""

    fails_fn: Callable[[tuple[str, ...]], bool]
    order: Sequence[str] = ()
    asked: dict[frozenset, bool] = field(default_factory=dict)

    def __call__(self, ids: Iterable[str]) -> bool:
        key = frozenset(ids)
        if key not in self.asked:
            rank = {c: i for i, c in enumerate(self.order)}
            self.asked[key] = bool(self.fails_fn(tuple(sorted(key, key=lambda c: (rank.get(c, len(rank)), c)))))
        return self.asked[key]

    @property
    def runs(self) -> int:
        return len(self.asked)


def _split(items: Sequence[str], n: int) -> list[list[str]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return [c for c in out if c]


def ddmin(candidates: Sequence[str], fails: Callable[[Iterable[str]], bool]) -> list[str]:
    """A 1-minimal failing subset of ``candidates`` (which must fail as a whole)."""
    current, n = list(candidates), 2
    while len(current) >= 2:
        chunks = _split(current, n)
        reduced = False
        for chunk in chunks:
            if fails(chunk):
                current, n, reduced = chunk, 2, True
                break
        if not reduced:
            for chunk in chunks:
                complement = [c for c in current if c not in chunk]
                if len(chunks) > 2 and fails(complement):
                    current, n, reduced = complement, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    return current


def one_culprit_search(candidates: Sequence[str], fails: Callable[[Iterable[str]], bool]) -> list[str]:
    """A minimal failing subset, in ``ceil(log2 n) + 1`` questions when one candidate is the cause."""
    current = list(candidates)
    while len(current) > 1:
        half = len(current) // 2
        left, right = current[:half], current[half:]
        current = left if fails(left) else right
    if fails(current):
        return current
    return ddmin(list(candidates), fails)


def find_culprits(candidates: Sequence[str], fails: Callable[[Iterable[str]], bool], *,
                  max_culprits: int = 16) -> list[list[str]]:
    """Minimal failing subsets, removed one after the other while the rest still fails."""
    remaining, culprits = list(candidates), []
    while remaining and len(culprits) < max_culprits and fails(remaining):
        found = one_culprit_search(remaining, fails)
        culprits.append(found)
        remaining = [c for c in remaining if c not in found]
    return culprits


def find_masking(culprits: Sequence[Sequence[str]], partners: Callable[[str], Sequence[str]],
                 fails: Callable[[Iterable[str]], bool]) -> list[dict]:
    """Culprits (of one id) that pass when reverted together with a partner candidate."""
    out = []
    for culprit in culprits:
        if len(culprit) != 1:
            continue
        (c,) = culprit
        for other in partners(c):
            if other != c and not fails([c, other]):
                out.append({"culprit": c, "masked_by": other})
    return out


@dataclass
class BisectResult:
    candidates: int
    runs: int
    culprits: list[list[str]]
    masking: list[dict]

    @property
    def log2_bound(self) -> int:
        return math.ceil(math.log2(self.candidates)) if self.candidates > 1 else 0
