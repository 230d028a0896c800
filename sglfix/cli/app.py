"""The ``sglfix`` command line: one command per verb, ``--json`` for machines.

Exit codes: 0 ok, 1 a check failed, 2 usage or configuration error (one line, no traceback
unless ``--debug``), 125 "cannot test this" for ``git bisect run``.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import textwrap
import traceback
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from sglfix.common.errors import SglfixError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Revert historical attention-metadata fixes and see which one causes which divergence.",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)
# Wide when piped, so names are not cut in logs and CI output.
_WIDTH = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "0") or 0) or 200
out = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class _Options:
    toggles: Optional[str] = None
    allow: tuple[str, ...] = ()
    debug: bool = False


OPTS = _Options()


def _allowed() -> tuple[str, ...] | None:
    if not OPTS.allow:
        return None
    from sglfix.patching.targets import DEFAULT_ALLOWED_PREFIXES

    return DEFAULT_ALLOWED_PREFIXES + OPTS.allow


def _registry(directory: Optional[str] = None):
    from sglfix.toggling.registry import load_registry

    return load_registry(directory or OPTS.toggles)


def _emit_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


@app.callback()
def _main(
    toggles: Optional[str] = typer.Option(None, "--toggles", metavar="DIR", help="Toggle files directory (default: the installed toggles; env SGLFIX_TOGGLES_DIR)."),
    allow_target: List[str] = typer.Option([], "--allow-target", metavar="PREFIX", help="Also allow patch targets under this module prefix (repeatable)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    OPTS.toggles = toggles
    OPTS.allow = tuple(allow_target)
    OPTS.debug = debug or OPTS.debug


@app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the registered toggles: id, parts, title, bug class, targets."""
    registry = _registry()
    rows = [
        {"id": t.id, "parts": list(t.parts), "title": t.title, "bug": t.bug, "targets": list(t.targets), "file": t.path}
        for t in registry
    ]
    if as_json:
        _emit_json({"toggles": rows, "directory": registry.directory})
        return
    if not rows:
        out.print(f"no toggles registered in {registry.directory}")
        return
    table = Table("id", "parts", "title", "bug", "targets", title=f"toggles ({registry.directory})")
    for r in rows:
        table.add_row(r["id"], ", ".join(r["parts"]), r["title"], r["bug"], "\n".join(r["targets"]))
    out.print(table)


@app.command("show")
def show_cmd(
    toggle_id: str = typer.Argument(..., metavar="ID", help="A toggle id: 27460 or 27460:part."),
    diff: bool = typer.Option(False, "--diff", help="Show the unified diff of each target function (nothing stays patched)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a toggle's metadata, parts, expectations and (with --diff) the revert as a diff."""
    from sglfix.patching.patcher import prepare_specs
    from sglfix.toggling.registry import parse_toggle_ids

    registry = _registry()
    selections = parse_toggle_ids([toggle_id], registry=registry, what="show")
    toggle = selections[0].toggle
    info = {
        "id": toggle_id, "pr": toggle.pr, "title": toggle.title, "url": toggle.url, "bug": toggle.bug,
        "description": toggle.description, "file": toggle.path,
        "parts": {s.part.name: {"summary": s.part.summary, "targets": list(s.part.targets)} for s in selections},
        "expect": [
            {"scenario": e.scenario, "verdict": list(e.verdicts), "revert": list(e.revert), "device": e.device}
            for e in toggle.expect
        ],
        "caught_by": list(toggle.caught_by),
    }
    if diff:
        specs = [p for s in selections for p in s.part.patches]
        prepared = prepare_specs(specs, allowed_prefixes=_allowed())
        per_target: dict[str, list] = {}
        for p in prepared:
            per_target.setdefault(p.spec.target, []).append(p)
        diffs = {}
        for target, items in per_target.items():
            name = target.rsplit(".", 1)[-1]
            diffs[target] = "".join(difflib.unified_diff(
                textwrap.dedent(items[0].source_before).splitlines(keepends=True),
                items[-1].source_after.splitlines(keepends=True),
                fromfile=f"{target} (fixed)", tofile=f"{target} (reverted)",
            )) or f"(no textual change in {name})\n"
        info["diff"] = diffs
    if as_json:
        _emit_json(info)
        return
    out.print(f"[bold]{toggle.pr}[/] {toggle.title}")
    for key in ("url", "bug", "description"):
        if info[key]:
            out.print(f"  {key}: {info[key]}")
    out.print(f"  file: {toggle.path}")
    for name, part in info["parts"].items():
        out.print(f"  part [bold]{name}[/]: {part['summary']}")
        for t in part["targets"]:
            out.print(f"      {t}")
    for e in info["expect"]:
        out.print(f"  expect: revert {','.join(e['revert'])} on {e['scenario']} -> {'|'.join(e['verdict'])}"
                  + (f" ({e['device']})" if e["device"] != "any" else ""))
    if toggle.caught_by:
        out.print(f"  caught by: {', '.join(toggle.caught_by)}")
    for text in info.get("diff", {}).values():
        out.print()
        out.print(text, markup=False, end="")


def _is_builtin_registry(registry) -> bool:
    from importlib.resources import files
    from pathlib import Path

    return Path(registry.directory).resolve() == Path(str(files("sglfix.toggles"))).resolve()


@app.command("doctor")
def doctor_cmd(
    source: Optional[str] = typer.Option(None, "--source", metavar="DIR", help="Check against source files under DIR without importing them."),
    toggles: Optional[str] = typer.Option(None, "--toggles", metavar="DIR", help="Toggle files directory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Check that every toggle and part applies and restores cleanly against the code now."""
    from sglfix.toggling.doctor import expectation_check, live_check, static_check

    registry = _registry(toggles)
    if source is not None:
        results = static_check(registry, source_dir=source)
        mode = "static"
    else:
        results = live_check(registry, allowed_prefixes=_allowed())
        if _is_builtin_registry(registry):
            # Built-in toggles are checked against the built-in scenarios they name.
            from sglfix.scenario import load_scenarios

            results += expectation_check(registry, [sc.name for sc in load_scenarios()])
        mode = "live"
    failed = [r for r in results if not r.ok]
    if as_json:
        _emit_json({"mode": mode, "source": source, "directory": registry.directory,
                    "ok": not failed, "toggles": [r.to_json() for r in results]})
    else:
        if not results:
            out.print(f"no toggles registered in {registry.directory}: nothing to check")
        for r in results:
            mark = "[green]ok[/]     " if r.ok else "[red]DRIFTED[/]"
            out.print(f"{mark} {r.id}" + (f"  ({', '.join(r.targets)})" if r.targets else ""))
            if not r.ok:
                out.print(r.error, markup=False)
        out.print(f"{len(results) - len(failed)}/{len(results)} checks pass ({mode}: each toggle and part "
                  "applies and restores cleanly" + ("; every expectation names a scenario)" if mode == "live" else ")"))
    if failed:
        raise typer.Exit(1)


@app.command("env")
def env_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show what SGLANG_DEBUG_REVERT_PR selects now."""
    from sglfix.toggling.env import ENV_VAR, selected_from_env

    value = os.environ.get(ENV_VAR)
    selections = selected_from_env(registry=_registry())
    data = {
        "variable": ENV_VAR, "value": value,
        "selected": [{"id": s.id, "title": s.toggle.title, "summary": s.part.summary,
                      "targets": list(s.part.targets)} for s in selections],
    }
    if as_json:
        _emit_json(data)
        return
    if not selections:
        out.print(f"{ENV_VAR}={value!r}: no fix is reverted" if value is not None else f"{ENV_VAR} is not set: no fix is reverted")
        return
    out.print(f"{ENV_VAR}={value!r} reverts:")
    for item in data["selected"]:
        out.print(f"  {item['id']}  {item['summary']}  ({', '.join(item['targets'])})")


# Options shared by the commands that run or list scenarios.
ScenarioGlobs = Annotated[List[str], typer.Option("--scenario", "-s", metavar="GLOB", help="Only scenarios whose name matches (repeatable).")]
ScenarioFiles = Annotated[List[str], typer.Option("--scenario-file", metavar="PATH", help="Scenario YAML file (repeatable); replaces the built-in set.")]
BackendName = Annotated[Optional[str], typer.Option("--backend", metavar="NAME", help="Only scenarios of this backend.")]
Device = Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")]
Jobs = Annotated[Optional[int], typer.Option("--jobs", "-j", help="Worker processes (default: 1 on CUDA, 2 on CPU).")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds per cell before TIMEOUT.")]
JsonFile = Annotated[Optional[str], typer.Option("--json", metavar="FILE", help="Write the report as JSON (- for stdout).")]


_VERDICT_STYLE = {"PASS": "green", "SKIP": "dim", "SYNC": "yellow", "DIVERGE": "red", "NAN": "red",
                  "INVARIANT": "magenta", "CRASH": "bold red", "TIMEOUT": "bold red", "FAULT": "bold red"}


def _load_selected(scenario_globs: List[str], scenario_files: List[str], backend: Optional[str]):
    """Built-in scenarios, or only the given files when --scenario-file is used."""
    from sglfix.scenario import load_scenarios, select_scenarios

    scenarios = load_scenarios(scenario_files, builtin=not scenario_files)
    return select_scenarios(scenarios, globs=scenario_globs, backend=backend)


def _execute(cells, *, device: str, jobs: int, timeout: float):
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sglfix.execution.plan import run_cells

    start = time.perf_counter()
    with Progress(TextColumn("[bold]cells"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err, transient=True,
                  disable=not err.is_terminal) as progress:
        task = progress.add_task("", total=len(cells))

        def tick(result):
            progress.update(task, advance=1, description=f"{result.scenario} {result.verdict}")

        results = run_cells(cells, device=device, jobs=jobs, timeout=timeout, on_result=tick)
    return results, time.perf_counter() - start


def _default_jobs(device: str, jobs: Optional[int]) -> int:
    if jobs is not None:
        if jobs < 1:
            raise SglfixError("--jobs must be at least 1")
        return jobs
    return 1 if device == "cuda" else max(1, min(2, os.cpu_count() or 1))


def _write_json(path: Optional[str], data: dict) -> None:
    if path is None:
        return
    if path == "-":
        _emit_json(data)
        return
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")


@app.command("scenarios")
def scenarios_cmd(
    scenario: ScenarioGlobs = [],
    scenario_file: ScenarioFiles = [],
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List scenarios (built-in, or from --scenario-file) after grid expansion."""
    chosen = _load_selected(scenario, scenario_file, None)
    if as_json:
        _emit_json({"scenarios": [s.to_json() for s in chosen]})
        return
    table = Table("name", "mode", "graph", "bs", "page", "dtype", "gpu_only", "builder")
    for s in chosen:
        table.add_row(s.name, s.mode, f"cg{list(s.capture_bs)}" if s.cuda_graph else "eager",
                      str(s.batch_size), str(s.page_size), s.model.dtype, str(s.gpu_only), s.builder)
    out.print(table)


@app.command("run")
def run_cmd(
    revert: List[str] = typer.Option([], "--revert", "-r", metavar="ID", help="Revert this toggle or part (repeatable; comma lists too)."),
    scenario: ScenarioGlobs = [],
    scenario_file: ScenarioFiles = [],
    backend: BackendName = None,
    device: Device = "auto",
    jobs: Jobs = None,
    timeout: Timeout = 300.0,
    json_file: JsonFile = None,
) -> None:
    """Run scenarios with the given fixes reverted (through SGLANG_DEBUG_REVERT_PR in the workers)."""
    from sglfix.execution.plan import Cell, canonical, report, resolve_device

    registry = _registry()
    ids = canonical([i.strip() for r in revert for i in r.split(",")], registry)
    chosen = _load_selected(scenario, scenario_file, backend)
    dev = resolve_device(device)
    cells = [Cell(s, ids) for s in chosen]
    results, wall = _execute(cells, device=dev, jobs=_default_jobs(dev, jobs), timeout=timeout)
    data = report(command=["sglfix", *sys.argv[1:]], device=dev, results=results, wall_s=wall)
    _write_json(json_file, data)
    if json_file != "-":
        table = Table("scenario", "toggles", "verdict", "key figure", title=f"sglfix run on {dev} ({wall:.1f} s)")
        for r in results:
            style = _VERDICT_STYLE.get(r.verdict, "")
            table.add_row(r.scenario, ",".join(r.toggles) or "-", f"[{style}]{r.verdict}[/]", r.key_figure)
        out.print(table)
    if results and all(r.verdict == "SKIP" for r in results):
        raise typer.Exit(125)
    if any(r.verdict != "PASS" for r in results):
        raise typer.Exit(1)


@app.command("matrix")
def matrix_cmd(
    parts: bool = typer.Option(False, "--parts", help="Also revert each part of each toggle alone."),
    scenario: ScenarioGlobs = [],
    scenario_file: ScenarioFiles = [],
    backend: BackendName = None,
    device: Device = "auto",
    jobs: Jobs = None,
    timeout: Timeout = 300.0,
    json_file: JsonFile = None,
) -> None:
    """Baseline plus each registered toggle (and part) over the scenarios: the toggle x scenario grid."""
    from sglfix.execution.plan import Cell, check_expectations, plan_matrix, report, resolve_device

    registry = _registry()
    chosen = _load_selected(scenario, scenario_file, backend)
    dev = resolve_device(device)
    sets = plan_matrix(registry, parts=parts)
    cells = [Cell(s, t) for t in sets for s in chosen]
    results, wall = _execute(cells, device=dev, jobs=_default_jobs(dev, jobs), timeout=timeout)
    checks, stray = check_expectations(registry, results, device=dev)
    data = report(command=["sglfix", *sys.argv[1:]], device=dev, results=results, wall_s=wall, checks=checks, stray=stray)
    _write_json(json_file, data)
    if json_file != "-":
        grid: dict[tuple, dict[str, str]] = {}
        for r in results:
            grid.setdefault(tuple(r.toggles), {})[r.scenario] = r.verdict
        table = Table("scenario", *[",".join(t) or "baseline" for t in sets],
                      title=f"sglfix matrix on {dev}: {len(results)} cells in {wall:.1f} s")
        for s in chosen:
            row = []
            for t in sets:
                v = grid.get(tuple(t), {}).get(s.name, "?")
                row.append(f"[{_VERDICT_STYLE.get(v, '')}]{v}[/]")
            table.add_row(s.name, *row)
        out.print(table)
        for t in sets[1:]:
            bad = [f"{n} ({v})" for n, v in grid.get(tuple(t), {}).items() if v != "PASS"]
            out.print(f"[bold]{','.join(t)}[/]: " + (f"diverges on {len(bad)}: " + ", ".join(bad) if bad else "no effect on these scenarios"))
        for c in checks:
            mark = "[green]met[/]  " if c.met else "[red]UNMET[/]"
            out.print(f"{mark} expect revert {','.join(c.revert)} on {c.scenario} -> {'|'.join(c.wanted)}"
                      + ("" if c.met else f"; got {sorted(set(c.got.values()))}"))
        for s in stray:
            out.print(f"[red]unexpected[/] {','.join(s['toggles']) or 'baseline'} on {s['scenario']}: {s['verdict']} ({s['why']})")
    if stray or any(not c.met for c in checks):
        raise typer.Exit(1)


def _click_exception_type() -> type:
    # Newer typer vendors click as typer._click and no longer installs click itself.
    try:
        from typer._click.exceptions import ClickException
    except ImportError:  # pragma: no cover - older typer on top of click
        from click.exceptions import ClickException
    return ClickException


def main(argv: Optional[list[str]] = None) -> None:
    usage_error = _click_exception_type()
    args = list(sys.argv[1:] if argv is None else argv)
    OPTS.debug = "--debug" in args or os.environ.get("SGLFIX_DEBUG") == "1"
    try:
        code = app(args=args, prog_name="sglfix", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        err.print("sglfix: aborted")
        code = 1
    except usage_error as exc:
        if OPTS.debug:
            traceback.print_exc()
        err.print(f"sglfix: error: {exc.format_message()} (see --help)", markup=False)
        code = 2
    except SglfixError as exc:
        if OPTS.debug:
            traceback.print_exc()
        err.print(f"sglfix: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", markup=False)
        rest = str(exc).splitlines()[1:]
        if rest and exc.exit_code == 1:
            err.print("\n".join(rest), markup=False)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # a bug of ours: one line, traceback on --debug
        if OPTS.debug:
            traceback.print_exc()
        err.print(f"sglfix: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", markup=False)
        code = 2
    sys.exit(code or 0)
