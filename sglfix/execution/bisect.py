"""Which reverted toggles make the scenarios fail: culprits by complement halving, and masking.

Pure search over candidate ids with a ``fails(ids) -> bool`` oracle (in the CLI: run the chosen
scenarios with ``ids`` reverted; any non-PASS cell fails). Every distinct set is asked once,
whatever the order of its ids (``Oracle`` caches), so ``runs`` counts the distinct sets executed.

- ``locate_one``: one culprit by halving: ask the left half of the region; failing, go on in it
  (the right half waits, unproven); passing, it is clean and the search goes right. At the end
  the last candidate is asked alone unless it already was, and the waiting halves together once:
  one single culprit among n costs at most ``ceil(log2 n) + 2`` questions, sees the culprit fail
  alone and proves every other candidate clean (no question about the whole set first). A cause
  that needs several candidates together falls back to ddmin (Zeller & Hildebrandt), which finds
  a 1-minimal failing subset however the cause is shaped.
- ``find_culprits``: repeat on the candidates not proven clean while any is left.
- ``find_masking``: a culprit that fails alone but passes when reverted together with another
  candidate (as 26651's kit fixture hides its Triton part).

Masking breaks the premise of every group question (a set that passes is clean): the CLI sweeps
the candidates a search could have missed (``sglfix.cli.bisect_cmd``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["BisectResult", "Oracle", "ddmin", "find_culprits", "find_masking", "locate_one", "one_culprit_search"]


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


def locate_one(candidates: Sequence[str], fails: Callable[[Iterable[str]], bool]) -> tuple[list[str] | None, list[str]]:
    """(a minimal failing subset, or None when none fails; the other candidates not proven clean).

    Halving: ask the left half of the region; failing, the search goes on in it and the right half
    waits, unproven; passing, the left half is clean and the search goes on to the right. At the
    end the last candidate is asked alone unless it was already, and the waiting halves together
    once: one single culprit among n costs at most ``ceil(log2 n) + 2`` questions, sees the
    culprit fail alone and proves every other candidate clean."""
    every = list(candidates)
    if not every:
        return None, []
    waiting: list[str] = []
    region, last_failing = list(every), None
    while len(region) > 1:
        left, right = region[: len(region) // 2], region[len(region) // 2 :]
        if fails(left):
            waiting = right + waiting
            region = last_failing = left
        else:  # the left half is clean
            region = right
    (c,) = region
    if last_failing == [c] or fails([c]):
        unproven = waiting if waiting and fails(waiting) else []
        return [c], unproven
    # c passes alone: no single cause here; a failing set to take apart, if there is one.
    if last_failing is not None:
        return ddmin(last_failing, fails), [x for x in every if x not in last_failing]
    if fails(every):
        return ddmin(every, fails), []
    return None, []


def one_culprit_search(candidates: Sequence[str], fails: Callable[[Iterable[str]], bool]) -> list[str]:
    """A minimal failing subset of ``candidates`` (which must fail as a whole)."""
    found, _ = locate_one(candidates, fails)
    return found if found is not None else ddmin(list(candidates), fails)


def find_culprits(
    candidates: Sequence[str], fails: Callable[[Iterable[str]], bool], *, max_culprits: int = 16
) -> list[list[str]]:
    """Minimal failing subsets, each removed in turn while the rest is not proven clean."""
    remaining = list(candidates)
    culprits: list[list[str]] = []
    while remaining and len(culprits) < max_culprits:
        found, unproven = locate_one(remaining, fails)
        if found is None:
            break
        culprits.append(found)
        remaining = [c for c in unproven if c not in found]
    return culprits


def find_masking(
    culprits: Sequence[Sequence[str]], partners: Callable[[str], Sequence[str]], fails: Callable[[Iterable[str]], bool]
) -> list[dict]:
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
