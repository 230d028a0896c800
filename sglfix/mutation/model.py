"""What a mutant is: one change of one function of the code base, as the operators made it and as
its diff says it. Every consumer (the runner, the report, ``--show``, ``--apply``) reads this."""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict

__all__ = ["MUTANT_PREFIX", "Mutant", "mutant_id"]

# A mutant runs as a candidate fix whose id is "+" and its file's stem: "+m-<hex>".
MUTANT_PREFIX = "m-"


def mutant_id(*, function: str, operator: str, line: int, original: str, mutated: str) -> str:
    """Stable across runs and machines while the function's text is: the same change of the same
    line is the same mutant. ``line`` is counted from the function's first line (the operators
    pass it so), so that a campaign after an edit elsewhere in the file keeps its ids."""
    text = "\0".join((function, operator, str(line), original.strip(), mutated.strip()))
    return MUTANT_PREFIX + hashlib.sha1(text.encode()).hexdigest()[:10]


class Mutant(BaseModel):
    """One generated change. ``path`` and ``line`` are where a reader finds it: the file as the
    code base's own repository names it (``backends/srt/...`` for the reproduction,
    ``python/sglang/srt/...`` for sglang) and the first changed line, 1-based."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    function: str  # the dotted path of the function changed (a toggle target's form)
    path: str
    line: int
    end_line: int  # the last line of the original replaced (== line for a one-line change)
    operator: str  # a name of sglfix.mutation.operators.OPERATORS
    original: str  # the replaced lines, as in the file
    mutated: str  # what replaces them
    description: str  # one line: what changed, in the operator's words ("+ 1 on seq_lens_sum")
    diff: str  # the unified diff, applied with --apply
