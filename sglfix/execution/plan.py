"""Plan and run cells (scenario x toggle set) on worker processes; check toggle expectations."""

from __future__ import annotations

import datetime
import fnmatch
import platform
import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable

from sglfix.harness.cell import CellResult
from sglfix.toggling.registry import Registry, parse_toggle_ids
from sglfix.scenario import Scenario

__all__ = ["Cell", "plan_matrix", "run_cells", "check_expectations", "resolve_device", "report"]


@dataclass(frozen=True)
class Cell:
    scenario: Scenario
    toggles: tuple[str, ...]


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        from sglfix.common.errors import ConfigError

        raise ConfigError(f"--device {device!r} is not one of auto, cpu, cuda")
    if device == "auto" or device == "cuda":
        import torch

        available = torch.cuda.is_available()
        if device == "cuda" and not available:
            from sglfix.common.errors import ConfigError

            raise ConfigError("--device cuda: no CUDA device here; use --device cpu")
        return "cuda" if available else "cpu"
    return device


def canonical(ids: Iterable[str], registry: Registry) -> tuple[str, ...]:
    """Toggle ids as given, validated (whole PRs stay whole, so reports read as typed)."""
    ids = [i for i in ids if i]
    parse_toggle_ids(ids, registry=registry, what="--revert")
    return tuple(ids)


def plan_matrix(registry: Registry, *, parts: bool,
                extra_sets: Iterable[tuple[str, ...]] = ()) -> list[tuple[str, ...]]:
    """Baseline, each toggle, each part (with parts), and every set an expectation names."""
    sets: list[tuple[str, ...]] = [()]
    for toggle in registry:
        sets.append((toggle.id,))
        if parts and len(toggle.parts) > 1:
            sets.extend((f"{toggle.pr}:{p}",) for p in toggle.parts)
        for e in toggle.expect:
            if len(e.revert) > 1 or (not parts and e.revert != (toggle.id,)):
                sets.append(tuple(e.revert))
    for s in extra_sets:
        sets.append(tuple(s))
    return list(dict.fromkeys(sets))


def run_cells(cells: list[Cell], *, device: str, jobs: int, timeout: float,
              on_result: Callable[[CellResult], None] | None = None) -> list[CellResult]:
    from sglfix.execution.worker import Worker

    work: "queue.Queue[tuple[int, Cell]]" = queue.Queue()
    for i, c in enumerate(cells):
        work.put((i, c))
    results: list[CellResult | None] = [None] * len(cells)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def loop() -> None:
        worker = Worker(device=device)
        try:
            while not errors:
                try:
                    i, c = work.get_nowait()
                except queue.Empty:
                    return
                r = worker.run(scenario_json=c.scenario.to_json(), scenario_name=c.scenario.name,
                               toggles=list(c.toggles), timeout=timeout)
                with lock:
                    results[i] = r
                    if on_result is not None:
                        on_result(r)
        except BaseException as exc:  # a worker that cannot start stops the run
            errors.append(exc)
        finally:
            worker.close()

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(max(1, min(jobs, len(cells))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


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
        return {"toggle": self.toggle, "revert": list(self.revert), "scenario": self.scenario,
                "wanted": list(self.wanted), "device": self.device, "met": self.met, "got": self.got}


def check_expectations(registry: Registry, results: list[CellResult], *, device: str) -> tuple[list[ExpectationCheck], list[dict]]:
    """Each expectation must hold on at least one matching scenario that ran; and every cell of a
    toggle set outside all of its expectations must PASS (the toggle must not matter there)."""
    by_set: dict[tuple[str, ...], list[CellResult]] = {}
    for r in results:
        by_set.setdefault(tuple(r.toggles), []).append(r)
    checks: list[ExpectationCheck] = []
    covered: dict[tuple[str, ...], list[str]] = {}
    for toggle in registry:
        for e in toggle.expect:
            covered.setdefault(tuple(e.revert), []).append(e.scenario)
            if e.device not in ("any", device):
                continue
            cells = [r for r in by_set.get(tuple(e.revert), []) if fnmatch.fnmatchcase(r.scenario, e.scenario)]
            if not cells:
                continue
            got = {r.scenario: r.verdict for r in cells}
            checks.append(ExpectationCheck(toggle=toggle.id, revert=e.revert, scenario=e.scenario,
                                           wanted=e.verdicts, device=e.device,
                                           met=any(v in e.verdicts for v in got.values()), got=got))
    stray: list[dict] = []
    for toggles, cells in by_set.items():
        globs = covered.get(toggles, [])
        for r in cells:
            if not toggles:
                if r.verdict != "PASS":
                    stray.append({"toggles": [], "scenario": r.scenario, "verdict": r.verdict, "why": "baseline must PASS"})
                continue
            if r.verdict not in ("PASS", "SKIP") and not any(fnmatch.fnmatchcase(r.scenario, g) for g in globs):
                stray.append({"toggles": list(toggles), "scenario": r.scenario, "verdict": r.verdict,
                              "why": "not covered by any expectation of this toggle set"})
    return checks, stray


def report(*, command: list[str], device: str, results: list[CellResult], wall_s: float,
           checks: list | None = None, stray: list | None = None) -> dict:
    import torch
    import triton

    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"

    return {
        "tool": "sglfix", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(command), "device": device, "device_name": device_name,
        "host": platform.node(), "python": sys.version.split()[0], "torch": torch.__version__,
        "triton": triton.__version__, "wall_s": round(wall_s, 2), "cells": [r.to_json() for r in results],
        "summary": summarize(results),
        "expectations": [c.to_json() for c in checks or []], "stray": stray or [],
    }


def summarize(results: list[CellResult]) -> dict:
    out: dict[str, int] = {}
    for r in results:
        out[r.verdict] = out.get(r.verdict, 0) + 1
    return out
