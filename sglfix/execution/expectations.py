"""Toggle expectations: does reverting a fix produce what its YAML says, and nothing elsewhere?

Each expectation must hold on at least one matching scenario that ran; every cell of a toggle
set outside all of its expectations must PASS (the toggle must not matter there); the baseline
must PASS everywhere. With SGLANG_DEBUG_REVERT_PR set, the sets carry the env ids too, so the
expectations (written for sets without them) are not checked. A NOT_REACHED cell is judged by the
verdict of the baseline it provably equals.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sglfix.common.verdicts import stands_for
from sglfix.execution.known import match_known
from sglfix.harness.cell import CellResult
from sglfix.toggling.registry import Registry

__all__ = ["ExpectationCheck", "check_expectations", "effective", "known_hits"]


@dataclass
class ExpectationCheck:
    toggle: str
    revert: tuple[str, ...]
    scenario: str
    wanted: tuple[str, ...]
    device: str
    met: bool
    got: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "toggle": self.toggle,
            "revert": list(self.revert),
            "scenario": self.scenario,
            "wanted": list(self.wanted),
            "device": self.device,
            "met": self.met,
            "got": self.got,
        }


def effective(result: CellResult) -> str:
    """The verdict a cell stands for: its own, or for NOT_REACHED its baseline's."""
    return stands_for(result.verdict, result.findings)


def _meets(result: CellResult, wanted: Sequence[str], known: Sequence[Any]) -> bool:
    """Does a cell meet an expectation: its effective verdict is wanted, or it shows a known
    upstream divergence where PASS is wanted (the toggle left the bug where it was)."""
    verdict = effective(result)
    return verdict in wanted or (
        "PASS" in wanted
        and match_known(known, scenario=result.scenario, verdict=verdict, device=result.device) is not None
    )


def check_expectations(
    registry: Registry,
    results: list[CellResult],
    *,
    device: str,
    known: Sequence[Any] = (),
) -> tuple[list[ExpectationCheck], list[dict], list[str]]:
    """(checks, stray cells, expectations whose toggle set or scenarios did not run). A cell that
    a profile's known divergence names (``sglfix.execution.known``) is no stray: it is reported
    with that entry instead (``known_hits``)."""
    by_set: dict[tuple[str, ...], list[CellResult]] = {}
    for r in results:
        by_set.setdefault(tuple(r.toggles), []).append(r)
    checks: list[ExpectationCheck] = []
    not_run: list[str] = []
    covered: dict[tuple[str, ...], list[str]] = {}
    for toggle in registry:
        for e in toggle.expect:
            covered.setdefault(tuple(e.revert), []).append(e.scenario)
            if e.device not in ("any", device):
                continue
            cells = [r for r in by_set.get(tuple(e.revert), []) if fnmatch.fnmatchcase(r.scenario, e.scenario)]
            if not cells:
                not_run.append(f"revert {','.join(e.revert)} on {e.scenario}")
                continue
            got = {r.scenario: r.verdict for r in cells}
            checks.append(
                ExpectationCheck(
                    toggle=toggle.id,
                    revert=e.revert,
                    scenario=e.scenario,
                    wanted=e.verdicts,
                    device=e.device,
                    met=any(_meets(r, e.verdicts, known) for r in cells),
                    got=got,
                )
            )
    stray: list[dict] = []
    for toggles, cells in by_set.items():
        globs = covered.get(toggles, [])
        for r in cells:
            if match_known(known, scenario=r.scenario, verdict=effective(r), device=r.device) is not None:
                continue
            if not toggles:
                # SKIP is "cannot run on this device" with its reason (a GPU-only kernel on CPU): shown,
                # never a failure of the code under test; every other baseline verdict is.
                if r.verdict not in ("PASS", "SKIP"):
                    stray.append(
                        {"toggles": [], "scenario": r.scenario, "verdict": r.verdict, "why": "baseline must PASS"}
                    )
                continue
            if r.verdict not in ("PASS", "SKIP", "NOT_REACHED") and not any(
                fnmatch.fnmatchcase(r.scenario, g) for g in globs
            ):
                stray.append(
                    {
                        "toggles": list(toggles),
                        "scenario": r.scenario,
                        "verdict": r.verdict,
                        "why": "not covered by any expectation of this toggle set",
                    }
                )
    return checks, stray, not_run


def known_hits(known: Sequence[Any], results: list[CellResult]) -> list[dict]:
    """One line per known divergence: the baseline cells it names that showed it, or none (the
    upstream bug may be fixed: reported, never a failure)."""
    out = []
    for k in known:
        seen = sorted(
            r.scenario
            for r in results
            if not r.toggles
            and match_known([k], scenario=r.scenario, verdict=effective(r), device=r.device) is not None
        )
        out.append(
            {
                "scenario": k.scenario,
                "verdict": list(k.verdict),
                "reason": k.reason,
                "reproduce": k.reproduce,
                "device": k.device,
                "seen_on": seen,
            }
        )
    return out
