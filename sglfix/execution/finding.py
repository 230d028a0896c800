"""What ``sglfix report finding`` writes up, gathered: the report's cell (refused in one line when
there is nothing to write up), its scenario as its file writes it, the profile's known divergence
and the candidate fix that clears it, how someone without sglfix installs the exact sglfix and code
base that ran it, what PASS requires as the judge's own code says it, and the cell run once more
here on the report's own code base (when its device is here) recording every function of the
code base it entered. Nothing it records names a folder of this machine."""

from __future__ import annotations

import fnmatch
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

from sglfix.common.errors import ConfigError
from sglfix.report.finding import Finding

__all__ = ["gather_finding", "pick_cell"]

# sglfix's own data, as its source tree names the folders (pyproject maps each into the package).
_DATA_PACKAGES = ("profiles", "scenarios", "toggles", "backends")


def pick_cell(report_path: str, report: dict, cell_id: str) -> dict:
    """The cell a finding writes up, or a one-line ConfigError: a cell the report lacks (with the
    nearest), one with a candidate fix applied, or one with no failure of the code base to write
    up (it passed, could not run, was not run, or sglfix itself failed there)."""
    from sglfix.common.schema import nearest
    from sglfix.common.verdicts import FAILING, NOT_REACHED, Verdict
    from sglfix.report.outcome import effective
    from sglfix.toggling.ids import is_candidate_id

    cells = {c["id"]: c for c in report["cells"]}
    cell = cells.get(cell_id)
    failing = [cid for cid, c in cells.items() if c.get("verdict") in FAILING and c.get("verdict") != "ERROR"]
    if cell is None:
        raise ConfigError(
            f"{report_path} has no cell {cell_id!r}{nearest(cell_id, cells)}; cells are named TOGGLES::SCENARIO "
            f"(e.g. {next(iter(failing or cells), 'baseline::NAME')})"
        )
    if any(is_candidate_id(str(t)) for t in cell.get("toggles") or ()):
        raise ConfigError(f"{cell_id} has a candidate fix applied; write the finding of the cell without it")
    verdict = cell.get("verdict")
    others = _failing_list(failing)
    if verdict == NOT_REACHED:
        base = f"baseline::{cell.get('scenario')}"
        raise ConfigError(
            f"{report_path}: {cell_id} did not run (NOT_REACHED: provably its baseline, "
            f"{effective(cell)}); write up {base} instead"
        )
    if verdict == Verdict.ERROR:
        raise ConfigError(
            f"{report_path}: {cell_id} is ERROR: sglfix itself failed in it, which is no finding about the "
            f"code base; run the cell again (sglfix run -s ...){others}"
        )
    if verdict not in FAILING:
        what = "passed" if verdict == Verdict.PASS else "could not run there (SKIP)"
        raise ConfigError(f"{report_path}: {cell_id} {what}: there is no failure to write up{others}")
    return cell


def _failing_list(failing: list[str]) -> str:
    if not failing:
        return "; the report has no failing cell"
    more = f" and {len(failing) - 3} more" if len(failing) > 3 else ""
    return f"; its failing cells: {', '.join(failing[:3])}{more}"


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
    from sglfix.execution.devices import has_cuda_device

    cell = pick_cell(report_path, report, cell_id)
    toggles = [str(t) for t in cell.get("toggles") or ()]
    _check_profile(report, profile, report_path)
    name = cell["scenario"]
    scenario = _scenario(profile, name, scenario_files)
    device = cell.get("device") or report.get("device") or "cpu"
    version = _report_version(report, profile)
    # Another release than the profile's own, or one the report's run took with --release: reproduced
    # with --release (sglfix fetches it), not installed.
    ran_release = isinstance(report.get("codebase"), dict) and bool(report["codebase"].get("release"))
    release = version if version is not None and (version != profile.version or ran_release) else None
    known = _known(profile, name, cell.get("verdict"), device, version)
    flags = f"--release {release} " if release else ""
    base = f"sglfix {flags}--profile {profile.name}"
    scenario_file = _shown_path(scenario.path, profile=profile)
    selection = f"-s {shlex.quote(name)} --device {device}" + (f" -r {','.join(toggles)}" if toggles else "")
    if scenario_files:
        selection += f" --scenario-file {shlex.quote(scenario_file)}"
    src, src_of = _sglfix_source(report)
    finding = Finding(
        cell=cell,
        report=report,
        report_path=_shown_path(report_path, profile=profile),
        profile=profile.name,
        scenario_name=name,
        scenario_yaml=_entry_text(scenario.path, scenario.line),
        scenario_file=scenario_file,
        scenario_given=bool(scenario_files),
        reproduce=f"{base} run {selection}",
        install=_install_lines(
            profile, release=release, src=src, src_of=src_of, kernels=_kernels(report) if device == "cuda" else []
        ),
        sglfix_source=src,
        sglfix_source_of=src_of,
        release=release,
        package=profile.package,
        expected=_expected(scenario, device),
        known=known.model_dump(mode="json") if known is not None else None,
        machine_folders=_machine_folders(report, profile),
    )
    if known is not None and known.cleared_by:
        from sglfix.execution.known import fix_path

        path = fix_path(profile, known.cleared_by)
        finding.fix_path = _shown_path(path, profile=profile)
        finding.fix_text = Path(path).read_text()
        finding.fix_written_for = profile.version if release else None
        finding.fix_command = f"{base} run {selection} --apply {finding.fix_path} --expect-fixes {shlex.quote(name)}"
    if not rerun:
        finding.rerun_note = "Not run again here (--no-rerun): the functions it entered are not listed."
    elif device == "cuda" and not has_cuda_device():
        finding.rerun_note = (
            "The cell ran on CUDA and this machine has no GPU: the functions it entered are not listed here; "
            "run `sglfix report finding` on a GPU machine to list them."
        )
    else:
        _use_report_codebase(profile, version, report_path=report_path, progress=progress)
        finding.rerun = _rerun(profile, scenario, toggles, device, progress)
        again = finding.rerun.get("verdict")
        if again != cell.get("verdict"):
            finding.rerun_note = f"Run again here the cell gave {again}, not {cell.get('verdict')}."
    return finding


def _scenario(profile: Any, name: str, scenario_files: tuple[str, ...]) -> Any:
    from sglfix.execution.runner import choose_scenarios

    try:
        (scenario,) = choose_scenarios(
            profile=profile, globs=[name], files=list(scenario_files), backend=None, memory_budget=None
        )
    except ConfigError:
        where = "the given --scenario-file" if scenario_files else f"the built-in scenarios of profile {profile.name}"
        raise ConfigError(
            f"scenario {name} is not among {where}; give the scenario file the report ran (--scenario-file F)"
        ) from None
    return scenario


def _check_profile(report: dict, profile: Any, path: str) -> None:
    cb = report.get("codebase")
    name = cb.get("name") if isinstance(cb, dict) else None
    if name and name != profile.name and name != getattr(profile, "asked", ""):
        raise ConfigError(f"{path} ran profile {name}; give --profile {name}")


def _report_version(report: dict, profile: Any) -> str | None:
    """The engine version the report's cells replayed through (None: the reproduction, or a
    report that does not record it)."""
    if profile.is_reproduction:
        return None
    cb = report.get("codebase")
    if not isinstance(cb, dict) or cb.get("distribution") != profile.distribution:
        return None
    version = cb.get("version")
    from sglfix.codebases.installed import UNKNOWN

    return version if isinstance(version, str) and version not in ("", UNKNOWN) else None


def _known(profile: Any, name: str, verdict: Any, device: str, version: str | None) -> Any:
    """The profile's known divergence this cell shows, as it holds at the report's version."""
    from sglfix.execution.known import known_of, load_known

    known_of(profile)  # its checks: each cleared_by names a file of the profile
    entries = load_known(profile.known_file)
    if version is not None:
        entries = [k for k in entries if k.holds_for(version)]
    return next(
        (
            k
            for k in entries
            if fnmatch.fnmatchcase(name, k.scenario) and verdict in k.verdict and k.device in ("any", device)
        ),
        None,
    )


def _sglfix_source(report: dict) -> tuple[dict, str]:
    """The sglfix the install line names: the report's, where it records one; else this one,
    which writes the finding (and re-runs the cell)."""
    recorded = report.get("sglfix_source")
    if isinstance(recorded, dict) and recorded.get("commit"):
        return recorded, "report"
    from sglfix.common.version import source

    return source(), "writer"


def _kernels(report: dict) -> list[str]:
    """The GPU kernel packages the report's run had (``pip install`` lines): without them the
    FlashInfer backends' cells are SKIP on a GPU."""
    version = report.get("flashinfer")
    return [f"pip install flashinfer-python=={version}"] if isinstance(version, str) and version else []


def _install_lines(profile: Any, *, release: str | None, src: dict, src_of: str, kernels: list[str]) -> list[str]:
    """How someone without sglfix gets what the cell ran: the profile's own install line (its
    torch pin, the engine release it is written for), the GPU kernels the run had, and sglfix
    from its source at the recorded commit; for another release, no engine install
    (``--release`` fetches it)."""
    hint = profile.install_hint or ""
    steps = [s.strip() for s in hint.split("&&") if s.strip()]
    extras = ""
    kept = []
    for step in steps:
        words = shlex.split(step)
        named = [w for w in words[2:] if not w.startswith("-")] if words[:2] == ["pip", "install"] else []
        ours = [w for w in named if w == "sglfix" or w.startswith(("sglfix[", "sglfix=", "sglfix>", "sglfix<"))]
        if ours:
            extras = ours[0][len("sglfix") :].split("]")[0] + "]" if ours[0].startswith("sglfix[") else ""
            continue
        if release and profile.distribution and any(w.startswith(f"{profile.distribution}==") for w in named):
            continue  # --release fetches the engine's files into sglfix's cache instead
        kept.append(step)
    kept += kernels
    lines = _sglfix_install(src, extras, whose="the run's" if src_of == "report" else "this finding's")
    kept.append(lines.pop())
    return [*lines, " && ".join(kept)]


def _sglfix_install(src: dict, extras: str, *, whose: str) -> list[str]:
    """Comment lines, then the command that installs sglfix from its source at the commit."""
    version, commit, url = src.get("version") or "?", src.get("commit"), src.get("url")
    notes = []
    if commit is None:
        notes.append(f"# sglfix {version} (its commit is not recorded): from a checkout of that version in ./sglfix:")
        return [*notes, f'pip install "./sglfix{extras}"']
    if src.get("modified"):
        notes.append(
            f"# {whose} sglfix had {src['modified']} file(s) changed from commit {commit[:12]}: "
            "that commit alone may not reproduce it"
        )
    if url:
        return [*notes, f'pip install "sglfix{extras} @ git+{url}@{commit}"']
    notes.append(
        f"# sglfix {version} at commit {commit}: no public address of its repository is recorded; "
        "in a clone of it in ./sglfix:"
    )
    return [*notes, f'git -C sglfix checkout {commit} && pip install "./sglfix{extras}"']


def _expected(scenario: Any, device: str) -> dict:
    """What PASS requires of this cell, from the judge's own code: the scenario's tolerance
    (its own, or its dtype's default), the reference's dtype on the cell's device, and the
    test of a row."""
    from sglfix.harness.reference import BAD_ROW_RULE, reference_dtype
    from sglfix.scenario.models import DEFAULT_TOLERANCE

    dtype = scenario.model.dtype
    default = DEFAULT_TOLERANCE.get(dtype)
    return {
        "probe": scenario.probe,
        "tolerance": scenario.tolerance,
        "tolerance_from": f"the default for {dtype}"
        if scenario.tolerance == default
        else "the scenario's `tolerance:`",
        "dtype": dtype,
        "reference_dtype": reference_dtype(device),
        "device": device,
        "rule": BAD_ROW_RULE,
    }


def _use_report_codebase(profile: Any, version: str | None, *, report_path: str, progress: Callable) -> None:
    """Make the re-run replay through the report's own engine release: where another version is
    importable here, the report's release from sglfix's cache (fetched once, as ``--release``
    does); a ``--release`` of another version is refused in one line."""
    if version is None:
        return
    from sglfix.codebases import installed
    from sglfix.codebases.releases import fetch_release, use_release
    from sglfix.common import cachedir

    here = installed(profile)
    if here is not None and here.version == version:
        return
    releases = cachedir.releases() + os.sep
    if here is not None and os.path.abspath(here.path).startswith(releases):
        raise ConfigError(
            f"{report_path} ran {profile.distribution} {version}; --release {here.version} names another: "
            f"give --release {version} or leave --release out"
        )
    progress(f"re-running on {profile.distribution} {version}, the report's (a release kept in sglfix's cache)")
    use_release(fetch_release(profile.distribution, version))


def _rerun(profile: Any, scenario: Any, toggles: list[str], device: str, progress: Callable[[Any], Any]) -> dict:
    from sglfix.codebases import get_codebase
    from sglfix.execution.planner import plan_run
    from sglfix.execution.runner import Runner, Target
    from sglfix.execution.settings import EVERY_FUNCTION, Settings
    from sglfix.toggling.registry import load_registry

    registry = load_registry(profile.toggles_dir)
    target = Target(profile=profile, registry=registry, codebase=get_codebase(profile.name))
    runner = Runner(
        Settings(device=cast(Literal["auto", "cpu", "cuda"], device), record=(EVERY_FUNCTION,)),
        target,
        what="report finding",
    )
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


def _machine_folders(report: dict, profile: Any) -> list[tuple[str, str]]:
    """The folders of the machine that ran the report and of this one that a message may quote,
    each with what the finding shows instead: the folder holding the code base's package and
    sglfix's own (paths below them read as the package's), sglfix's cache, the home folder."""
    from sglfix.codebases import installed
    from sglfix.common import cachedir
    from sglfix.common.codebase import package_dir

    pairs = []
    cb = report.get("codebase")
    if isinstance(cb, dict) and isinstance(cb.get("path"), str) and os.path.isabs(cb["path"]):
        pairs.append((os.path.dirname(cb["path"]), ""))
    here = installed(profile) if not profile.is_reproduction else None
    if here is not None:
        pairs.append((os.path.dirname(os.path.abspath(here.path)), ""))
    ours = package_dir("sglfix")
    if ours is not None:
        pairs.append((os.path.dirname(ours), ""))
    pairs += [(cachedir.root(), "~/.cache/sglfix"), (os.path.expanduser("~"), "~"), (os.getcwd(), "")]
    # A folder of one name ("/tmp") is too short to drop: in text it need not be that folder.
    return [
        (folder.rstrip(os.sep) + os.sep, shown + "/" if shown else "")
        for folder, shown in pairs
        if folder.rstrip(os.sep) and (shown or folder.count(os.sep) >= 2)
    ]


def _shown_path(path: str, *, profile: Any) -> str:
    """A path as someone else can follow it, never a folder of this machine: a file of sglfix's
    own data as its source tree names it (``profiles/...``), a file of the profile's folder below
    the profile's name, else relative to the current directory when below it, else its name."""
    import importlib.util

    full = os.path.abspath(path)
    for name in _DATA_PACKAGES:
        spec = importlib.util.find_spec(f"sglfix.{name}")
        for root in (spec.submodule_search_locations or ()) if spec is not None else ():
            if full.startswith(os.path.abspath(root) + os.sep):
                return f"{name}/{os.path.relpath(full, root)}"
    folder = getattr(profile, "folder", "")
    if folder and full.startswith(os.path.abspath(folder) + os.sep):
        return f"{profile.name}/{os.path.relpath(full, folder)}"
    rel = os.path.relpath(full)
    return rel if not rel.startswith("..") and not os.path.isabs(rel) else os.path.basename(full)
