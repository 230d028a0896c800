"""What ``sglfix report finding`` writes up, gathered: the report's cell, its scenario as its file
writes it, the profile's known divergence and the candidate fix that clears it, and the cell run
once more here (when its device is here) recording every function of the code base it entered."""

from __future__ import annotations

import fnmatch
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sglfix.common.errors import ConfigError
from sglfix.report.finding import Finding

__all__ = ["gather_finding"]


def gather_finding(
    report_path: str,
    report: dict,
    cell_id: str,
    *,
    profile: Any,
    scenario_files: tuple[str, ...] = (),
    rerun: bool = True,
    progress: Callable[[Any], Any],
) -> Finding:
    from sglfix.common.schema import nearest
    from sglfix.execution.devices import has_cuda_device
    from sglfix.execution.known import fix_path, known_of
    from sglfix.execution.runner import choose_scenarios
    from sglfix.toggling.ids import is_candidate_id

    cells = {c["id"]: c for c in report["cells"]}
    cell = cells.get(cell_id)
    if cell is None:
        raise ConfigError(
            f"{report_path} has no cell {cell_id!r}{nearest(cell_id, cells)}; cells are named TOGGLES::SCENARIO "
            f"(e.g. {next(iter(cells), 'baseline::NAME')})"
        )
    toggles = [str(t) for t in cell.get("toggles") or ()]
    if any(is_candidate_id(t) for t in toggles):
        raise ConfigError(f"{cell_id} has a candidate fix applied; write the finding of the cell without it")
    _check_profile(report, profile, report_path)
    name = cell["scenario"]
    try:
        (scenario,) = choose_scenarios(
            profile=profile, globs=[name], files=list(scenario_files), backend=None, memory_budget=None
        )
    except ConfigError:
        where = "the given --scenario-file" if scenario_files else f"the built-in scenarios of profile {profile.name}"
        raise ConfigError(
            f"scenario {name} is not among {where}; give the scenario file the report ran (--scenario-file F)"
        ) from None
    device = cell.get("device") or report.get("device") or "cpu"
    known = next(
        (
            k
            for k in known_of(profile)
            if fnmatch.fnmatchcase(name, k.scenario)
            and cell.get("verdict") in k.verdict
            and k.device in ("any", device)
        ),
        None,
    )
    base = f"sglfix --profile {profile.name}"
    selection = f"-s {shlex.quote(name)} --device {device}" + (f" -r {','.join(toggles)}" if toggles else "")
    finding = Finding(
        cell=cell,
        report=report,
        report_path=report_path,
        profile=profile.name,
        scenario_name=name,
        scenario_yaml=_entry_text(scenario.path, scenario.line),
        scenario_file=_shown_path(scenario.path),
        reproduce=f"{base} run {selection}",
        install=profile.install_hint or "pip install sglfix",
        known=known.model_dump(mode="json") if known is not None else None,
    )
    if known is not None and known.cleared_by:
        path = fix_path(profile, known.cleared_by)
        finding.fix_path = _shown_path(path)
        finding.fix_text = Path(path).read_text()
        finding.fix_command = f"{base} run {selection} --apply {finding.fix_path} --expect-fixes {shlex.quote(name)}"
    if not rerun:
        finding.rerun_note = "Not run again here (--no-rerun): the functions it entered are not listed."
    elif device == "cuda" and not has_cuda_device():
        finding.rerun_note = (
            "The cell ran on CUDA and this machine has no GPU: the functions it entered are not listed here; "
            "run `sglfix report finding` on a GPU machine to list them."
        )
    else:
        finding.rerun = _rerun(profile, scenario, toggles, device, progress)
        again = finding.rerun.get("verdict")
        if again != cell.get("verdict"):
            finding.rerun_note = f"Run again here the cell gave {again}, not {cell.get('verdict')}."
    return finding


def _check_profile(report: dict, profile: Any, path: str) -> None:
    cb = report.get("codebase")
    name = cb.get("name") if isinstance(cb, dict) else None
    if name and name != profile.name and name != getattr(profile, "asked", ""):
        raise ConfigError(f"{path} ran profile {name}; give --profile {name}")


def _rerun(profile: Any, scenario: Any, toggles: list[str], device: str, progress: Callable[[Any], Any]) -> dict:
    from sglfix.codebases import get_codebase
    from sglfix.execution.planner import plan_run
    from sglfix.execution.runner import Runner, Target
    from sglfix.execution.session import EVERY_FUNCTION
    from sglfix.execution.settings import Settings
    from sglfix.toggling.registry import load_registry

    registry = load_registry(profile.toggles_dir)
    target = Target(profile=profile, registry=registry, codebase=get_codebase(profile.name))
    runner = Runner(Settings(device=device, record=(EVERY_FUNCTION,)), target, what="report finding")
    plan = runner.plan(
        lambda chosen, *, registry, env_ids: plan_run(chosen, revert=toggles, env_ids=env_ids, registry=registry),
        chosen=[scenario],
    )
    ran = runner.run(plan, progress=progress)
    return ran.results[0].to_json()


def _entry_text(path: str, line: int) -> str:
    """The scenario's entry in its file, as written there (comments kept), dedented."""
    import textwrap

    lines = Path(path).read_text().splitlines()
    start = max(0, line - 1)
    first = lines[start]
    indent = len(first) - len(first.lstrip())
    out = [first]
    for text in lines[start + 1 :]:
        stripped = text.strip()
        level = len(text) - len(text.lstrip())
        if stripped and level <= indent:  # the next entry, or a comment that leads it
            break
        out.append(text)
    while out and not out[-1].strip():
        out.pop()
    body = textwrap.dedent("\n".join(out))
    return body[2:].replace("\n  ", "\n") if body.startswith("- ") else body


def _shown_path(path: str) -> str:
    """A path relative to the current directory when it is below it, else as it is."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path
