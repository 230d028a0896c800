"""Probes: scenarios that judge one engine function living outside any attention backend.

A probe scenario names ``probe: NAME`` instead of ``backend:`` (``sglfix.scenario.modes.PROBE_RULES``
says what each judges and which keys it reads). Its probe builds inputs from the scenario's fields
(batch lengths, spec shape, page size, seed ...), runs the REAL function of the active code base
on them, and judges a stated property against sglfix's own expectation, computed from first
principles: never by calling the function under test, never by reading its result as the truth.

Which probes a code base has is declared on the code base (``CodeBase.probes``: probe name ->
module defining ``PROBE``); ``sglfix.codebases.check_scenarios_runnable`` refuses a probe scenario
on a code base without that probe before any cell runs.

A probe reports through the cell's result (``result.add``), like an adapter's findings:
- a property that does not hold: ``DIVERGE`` (a wrong value) or ``INVARIANT`` (a structural
  property: an index past an allocation, a write into a neighbour's row);
- an exception raised in the code under test propagates: the cell classifies it (CRASH when the
  raising frame is in the code base's package, ERROR when it is sglfix's own); a probe that does
  not fit the tree (it imports or reads what this version lacks, or the engine reads a field of
  the ``Standin`` it built that the stand-in lacks: ``sglfix.harness.misfit``) is an ERROR "this
  probe does not support this code base", never a CRASH blamed on the engine;
- nothing wrong: one ``PASS`` finding carrying the figure that was measured, so a PASS says what
  was checked.
``stage(name)`` names the phase ("build", "forward", "judge") an exception is charged to.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from sglfix.common.errors import ConfigError

if TYPE_CHECKING:  # the cell imports this module; nothing heavy at import
    from sglfix.codebases import CodeBase
    from sglfix.harness.result import CellResult
    from sglfix.scenario import Scenario

__all__ = ["Probe", "get_probe", "run_probe"]


class Probe(Protocol):
    """What a probe module's ``PROBE`` provides."""

    name: str

    def run(self, scenario: Scenario, *, device: str, result: CellResult, stage: Callable[[str], None]) -> None:
        """Build the inputs, run the code under test, judge; findings go to ``result``."""


def get_probe(name: str, codebase: CodeBase | None = None) -> Probe:
    """The probe ``name`` of ``codebase`` (default: the code base this process replays through)."""
    from sglfix.codebases import active

    cb = codebase or active()
    module = cb.probes.get(name)
    if module is None:
        raise ConfigError(f"no probe {name!r} on {cb.name}; known: {', '.join(sorted(cb.probes)) or 'none'}")
    probe = importlib.import_module(module).PROBE
    if probe.name != name:
        raise ConfigError(f"module {module} defines probe {probe.name!r}, not {name!r}")
    return probe


def run_probe(scenario: Scenario, *, device: str, result: CellResult, stage: Callable[[str], None]) -> Any:
    """Run the scenario's probe into ``result`` (exceptions propagate to the cell's classifier)."""
    stage("setup")
    probe = get_probe(scenario.probe)
    check = getattr(probe, "check_available", None)
    if check is not None:
        check(device)
    t0 = time.perf_counter()
    probe.run(scenario, device=device, result=result, stage=stage)
    result.timings_ms["total"] = round((time.perf_counter() - t0) * 1e3, 2)
    return result
