"""The plan: which cells (scenario x toggle set) to run, built once, with stable ids.

``run``, ``matrix`` (and bisect, shards, the pytest plugin) consume the same object. A cell id
is ``<toggle set>::<scenario>`` (``baseline::triton-decode@cg=eager``), stable across runs and
machines, so reports can be merged and compared cell by cell.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError
from sglfix.scenario import Scenario
from sglfix.toggling.registry import Registry, parse_toggle_ids

__all__ = ["Plan", "PlannedCell", "merge_sets", "patched", "plan_matrix", "plan_run", "set_label"]

BASELINE = "baseline"


def set_label(toggles: Sequence[str]) -> str:
    return ",".join(toggles) or BASELINE


@dataclass(frozen=True)
class PlannedCell:
    scenario: Scenario
    toggles: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{set_label(self.toggles)}::{self.scenario.name}"


@dataclass
class Plan:
    scenarios: list[Scenario]
    # Toggle sets in run order; the first is the baseline of this plan (the env selection, or ()).
    sets: list[tuple[str, ...]]
    # What REVERT_PR selected in the caller's environment: part of every set.
    env_ids: tuple[str, ...] = ()
    cells: list[PlannedCell] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.cells:
            # Set-major: a worker switches toggle sets (restore + apply) as rarely as possible.
            self.cells = [PlannedCell(s, t) for t in self.sets for s in self.scenarios]
        ids = [c.id for c in self.cells]
        if len(set(ids)) != len(ids):
            raise ConfigError("the plan holds the same cell twice; scenario names must be unique")

    def __len__(self) -> int:
        return len(self.cells)


def merge_sets(base: Sequence[str], extra: Sequence[str], *, registry: Registry, what: str) -> tuple[str, ...]:
    """``base`` + ``extra`` as one validated set; selecting a part twice is an error."""
    ids = tuple(dict.fromkeys([*base, *extra]))
    parse_toggle_ids(list(ids), registry=registry, what=what)
    return ids


def plan_run(
    scenarios: Sequence[Scenario], *, revert: Sequence[str], env_ids: Sequence[str], registry: Registry
) -> Plan:
    what = f"--revert with {envs.REVERT_PR.name}" if env_ids else "--revert"
    ids = merge_sets(env_ids, revert, registry=registry, what=what)
    return Plan(scenarios=list(scenarios), sets=[ids], env_ids=tuple(env_ids))


def plan_matrix(
    scenarios: Sequence[Scenario],
    *,
    registry: Registry,
    parts: bool,
    env_ids: Sequence[str] = (),
    extra_sets: Iterable[Sequence[str]] = (),
) -> Plan:
    """Baseline, each whole toggle, and with ``parts`` each part alone and every set a part-level
    expectation names (combinations of parts, e.g. to show masking)."""
    sets: list[tuple[str, ...]] = [()]
    for toggle in registry:
        sets.append((toggle.id,))
        if parts:
            if len(toggle.parts) > 1:
                sets.extend((f"{toggle.pr}:{p}",) for p in toggle.parts)
            for e in toggle.expect:
                sets.append(tuple(e.revert))
        else:
            for e in toggle.expect:
                if all(":" not in r for r in e.revert):
                    sets.append(tuple(e.revert))
    sets.extend(tuple(s) for s in extra_sets)
    env = tuple(env_ids)
    merged = []
    for s in dict.fromkeys(sets):
        try:
            merged.append(merge_sets(env, s, registry=registry, what=f"{envs.REVERT_PR.name} with the matrix"))
        except ConfigError:
            continue  # the env already reverts (part of) this set: its cells equal the baseline's
    return Plan(scenarios=list(scenarios), sets=list(dict.fromkeys(merged)), env_ids=env)


def patched(plan: Plan, fixes: Sequence[str]) -> Plan:
    """``plan`` with each toggle set run twice: as it is, and with the candidate ``fixes``
    applied first (``+fix,26651``); each patched set right after its own, so that a report sets
    every cell beside the same cell without the fix."""
    if not fixes:
        return plan
    sets: list[tuple[str, ...]] = []
    for s in plan.sets:
        sets += [tuple(s), (*fixes, *s)]
    return Plan(scenarios=plan.scenarios, sets=list(dict.fromkeys(sets)), env_ids=plan.env_ids)
