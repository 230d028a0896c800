"""A cell's result: its verdict and the findings behind it, as a worker sends it back.

A leaf of the harness: the cell and the probes both fill one in, and the executors read it in
processes that never run a cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sglfix.common.verdicts import worst

__all__ = ["CellResult"]


@dataclass
class CellResult:
    scenario: str
    toggles: list[str]
    device: str
    verdict: str = "PASS"
    findings: list[dict] = field(default_factory=list)
    error: dict | None = None
    timings_ms: dict = field(default_factory=dict)
    revert_env: str | None = None  # REVERT_PR as the process that ran the cell saw it
    # Interpreted kernel launches of this cell and how many the launch memo answered (CPU only).
    kernels: dict | None = None
    # Which requested toggle targets the run entered (reachability); None when not recorded.
    reached: list[str] | None = None
    # Recording every function of the code base (a finding's record): where each entered one is
    # defined in the installed tree (dotted name -> "file:line").
    reached_at: dict[str, str] | None = None
    # What the result store keys this result on, as the worker saw it (``sglfix.execution.store``):
    # the code base's files the cell ran code of and the ones its process had imported. Taken
    # off by the parent before any report is written.
    deps: dict | None = None
    # When the run that made this result ran, for a result the store served (None: run now).
    stored: str | None = None
    # Digests of the metadata the cell built and of its output (``sglfix.harness.fingerprint``),
    # when the run asked for them (``sglfix mutate``).
    fingerprint: dict | None = None

    def add(self, verdict: str, message: str, **data: Any) -> None:
        self.findings.append({"verdict": verdict, "message": message, **data})

    def finish(self) -> CellResult:
        self.verdict = worst([f["verdict"] for f in self.findings]) if self.findings else "PASS"
        return self

    @property
    def key_figure(self) -> str:
        return next((f["message"] for f in self.findings if f["verdict"] == self.verdict), "")

    def to_json(self) -> dict:
        return {
            "scenario": self.scenario,
            "toggles": self.toggles,
            "device": self.device,
            "verdict": self.verdict,
            "findings": self.findings,
            "error": self.error,
            "timings_ms": self.timings_ms,
            "revert_env": self.revert_env,
            "kernels": self.kernels,
            "reached": self.reached,
            **({"reached_at": self.reached_at} if self.reached_at is not None else {}),
            **({"deps": self.deps} if self.deps is not None else {}),
            **({"stored": self.stored} if self.stored is not None else {}),
            **({"fingerprint": self.fingerprint} if self.fingerprint is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> CellResult:
        return cls(**data)
