"""The ``sglfix`` command line: one command per verb, ``--json`` for machines.

Exit codes: 0 ok, 1 a check failed, 2 usage or configuration error (one line, no traceback
unless ``--debug``), 125 "cannot test this" for ``git bisect run``.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import traceback
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import SglfixError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Revert historical attention-metadata fixes and see which one causes which divergence.",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class _Options:
    toggles: Optional[str] = None
    allow: tuple[str, ...] = ()
    debug: bool = False


OPTS = _Options()


def _allowed() -> tuple[str, ...] | None:
    if not OPTS.allow:
        return None
    from .targets import DEFAULT_ALLOWED_PREFIXES

    return DEFAULT_ALLOWED_PREFIXES + OPTS.allow


def _registry(directory: Optional[str] = None):
    from .registry import load_registry

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
    from .patcher import prepare_specs
    from .registry import parse_toggle_ids

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
            import textwrap

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
    for target, text in info.get("diff", {}).items():
        out.print()
        out.print(text, markup=False, end="")


@app.command("doctor")
def doctor_cmd(
    source: Optional[str] = typer.Option(None, "--source", metavar="DIR", help="Check against source files under DIR without importing them."),
    toggles: Optional[str] = typer.Option(None, "--toggles", metavar="DIR", help="Toggle files directory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Check that every toggle and part applies and restores cleanly against the code now."""
    from .doctor import live_check, static_check

    registry = _registry(toggles)
    if source is not None:
        results = static_check(registry, source_dir=source)
        mode = "static"
    else:
        results = live_check(registry, allowed_prefixes=_allowed())
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
            out.print(f"{mark} {r.id}  ({', '.join(r.targets)})")
            if not r.ok:
                out.print(r.error, markup=False)
        out.print(f"{len(results) - len(failed)}/{len(results)} apply and restore cleanly ({mode})")
    if failed:
        raise typer.Exit(1)


@app.command("env")
def env_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show what SGLANG_DEBUG_REVERT_PR selects now."""
    from .envtoggle import ENV_VAR, selected_from_env

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
