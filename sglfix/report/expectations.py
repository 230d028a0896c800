"""What a judgement checks cells against, and what it found: a toggle file's expectation rows
(``Expect``) and a profile's known divergences (``Known``), each with its result over the cells
(``Check``, ``NotChecked`` with its reason, ``KnownHit``). Part of the one judgement
(``sglfix.report.outcome``, where the cells are checked); imports nothing of sglfix."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Check", "Expect", "Known", "KnownHit", "NotChecked"]


@dataclass(frozen=True)
class Expect:
    """One ``expect:`` row of a toggle file: reverting ``revert`` gives one of ``wanted`` on the
    scenarios ``scenario`` (a glob) names, on ``device`` (any, cpu, cuda)."""

    toggle: str
    revert: tuple[str, ...]
    scenario: str
    wanted: tuple[str, ...]
    device: str = "any"

    @property
    def text(self) -> str:
        return f"revert {','.join(self.revert)} on {self.scenario}"

    def covers(self, scenario: str) -> bool:
        return fnmatch.fnmatchcase(scenario, self.scenario)

    def to_json(self) -> dict:
        return {
            "toggle": self.toggle,
            "revert": list(self.revert),
            "scenario": self.scenario,
            "wanted": list(self.wanted),
            "device": self.device,
        }

    @classmethod
    def from_json(cls, data: dict) -> Expect:
        return cls(
            toggle=str(data.get("toggle") or ",".join(data["revert"])),
            revert=tuple(data["revert"]),
            scenario=data["scenario"],
            wanted=tuple(data["wanted"]),
            device=str(data.get("device") or "any"),
        )

    @classmethod
    def of_registry(cls, registry: Iterable[Any]) -> list[Expect]:
        return [
            cls(toggle=t.id, revert=tuple(e.revert), scenario=e.scenario, wanted=tuple(e.verdicts), device=e.device)
            for t in registry
            for e in t.expect
        ]


@dataclass(frozen=True)
class Known:
    """A profile's known divergence: a baseline finding on the real engine, confirmed upstream."""

    scenario: str
    verdict: tuple[str, ...]
    reason: str = ""
    reproduce: str = ""
    device: str = "any"
    cleared_by: str = ""  # the profile's candidate fix that clears it, if one is kept

    def matches(self, *, scenario: str, verdict: str, device: str | None) -> bool:
        return (
            verdict in self.verdict and self.device in ("any", device) and fnmatch.fnmatchcase(scenario, self.scenario)
        )

    def to_json(self) -> dict:
        return {
            "scenario": self.scenario,
            "verdict": list(self.verdict),
            "reason": self.reason,
            "reproduce": self.reproduce,
            "device": self.device,
            **({"cleared_by": self.cleared_by} if self.cleared_by else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> Known:
        verdict = data.get("verdict") or ()
        return cls(
            scenario=data["scenario"],
            verdict=tuple([verdict] if isinstance(verdict, str) else verdict),
            reason=str(data.get("reason") or ""),
            reproduce=str(data.get("reproduce") or ""),
            device=str(data.get("device") or "any"),
            cleared_by=str(data.get("cleared_by") or ""),
        )

    @classmethod
    def of(cls, entries: Iterable[Any]) -> list[Known]:
        """From ``sglfix.execution.known.KnownDivergence`` models or report dicts."""
        out = []
        for k in entries:
            if isinstance(k, dict):
                out.append(cls.from_json(k))
            else:
                out.append(
                    cls(
                        scenario=k.scenario,
                        verdict=tuple(str(v) for v in k.verdict),
                        reason=k.reason,
                        reproduce=k.reproduce,
                        device=k.device,
                        cleared_by=getattr(k, "cleared_by", ""),
                    )
                )
        return out


@dataclass
class Check:
    """An expectation judged over the cells that ran: met when at least one shows what it wants."""

    expect: Expect
    met: bool
    got: dict[str, str] = field(default_factory=dict)  # scenario -> the verdict it stands for

    def to_json(self) -> dict:
        return {**self.expect.to_json(), "met": self.met, "got": dict(self.got)}


@dataclass
class NotChecked:
    expect: Expect
    reason: str

    @property
    def text(self) -> str:
        return f"{self.expect.text} ({self.reason})"

    def to_json(self) -> dict:
        return {**self.expect.to_json(), "reason": self.reason}


@dataclass
class KnownHit:
    known: Known
    seen_on: list[str]
    status: str  # seen / not seen (fixed?) / <device> only

    def to_json(self) -> dict:
        return {**self.known.to_json(), "seen_on": list(self.seen_on), "status": self.status}
