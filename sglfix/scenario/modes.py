"""The forward modes a scenario may use and what each implies, in one table.

Every mode-dependent rule of the loader and of the memory estimate reads this table: how many
new tokens a request brings, which batch keys the mode takes, whether it can be captured in a
CUDA graph, whether ``gpu_only`` applies, the largest ``spec.topk`` the reproduction supports,
and which builders can make its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglfix.scenario.limits import MAX_TOPK

__all__ = ["ModeRule", "MODE_RULES", "MODES", "BUILDERS", "rule_for"]

BUILDERS = ("kit", "glue")


@dataclass(frozen=True)
class ModeRule:
    name: str
    # Where a request's new tokens come from: "extend_lens" (given), "one", "draft"
    # (spec.num_draft_tokens) or "accept" (accept_lens + 1).
    new_tokens: str
    graph: bool
    gpu_only: bool
    max_topk: int
    builders: tuple[str, ...]
    # Spec-v1 DRAFT_EXTEND reads accept lengths on the host by design: never declared sync-free.
    host_reads: bool = False
    # TARGET_VERIFY builds a draft tree of num_draft_tokens nodes, depth <= num_steps.
    draft_tree: bool = False

    @property
    def takes_extend_lens(self) -> bool:
        return self.new_tokens == "extend_lens"

    @property
    def takes_accept_lens(self) -> bool:
        return self.new_tokens == "accept"

    def new_token_counts(self, *, batch_size: int, extend_lens: tuple[int, ...] | None,
                         accept_lens: tuple[int, ...] | None, num_draft_tokens: int) -> tuple[int, ...]:
        if self.new_tokens == "one":
            return (1,) * batch_size
        if self.new_tokens == "draft":
            return (num_draft_tokens,) * batch_size
        if self.new_tokens == "accept":
            return tuple(a + 1 for a in accept_lens or ())
        return tuple(extend_lens or ())

    def graph_tokens_per_request(self, *, num_steps: int, num_draft_tokens: int) -> int:
        """Query rows a captured graph lays out per request (the runner's num_tokens_per_bs)."""
        if self.new_tokens == "one":
            return 1
        if self.new_tokens == "accept":
            return num_steps + 1
        return num_draft_tokens


_RULES = (
    ModeRule("DECODE", new_tokens="one", graph=True, gpu_only=True, max_topk=MAX_TOPK, builders=("kit",)),
    ModeRule("EXTEND", new_tokens="extend_lens", graph=False, gpu_only=False, max_topk=MAX_TOPK, builders=("kit",)),
    ModeRule("TARGET_VERIFY", new_tokens="draft", graph=True, gpu_only=True, max_topk=1, builders=("kit",),
             draft_tree=True),
    ModeRule("DRAFT_EXTEND", new_tokens="accept", graph=True, gpu_only=True, max_topk=1, builders=("kit",),
             host_reads=True),
    ModeRule("DRAFT_EXTEND_V2", new_tokens="draft", graph=True, gpu_only=True, max_topk=1,
             builders=("kit", "glue")),
)
MODE_RULES: dict[str, ModeRule] = {r.name: r for r in _RULES}
MODES: tuple[str, ...] = tuple(MODE_RULES)


def rule_for(mode: str) -> ModeRule:
    return MODE_RULES[mode]
