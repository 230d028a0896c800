"""``sglfix show ID``: a toggle's metadata, parts, expectations and (with --diff) the revert."""

from __future__ import annotations

import difflib
import textwrap

import typer

from sglfix.cli.complete import toggle_ids
from sglfix.cli.context import emit_json, options, out


def show_cmd(
    ctx: typer.Context,
    toggle_id: str = typer.Argument(
        ..., metavar="ID", autocompletion=toggle_ids, help="A toggle id: 27460 or 27460:part."
    ),
    diff: bool = typer.Option(
        False, "--diff", help="Show the unified diff of each target function (nothing stays patched)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a toggle's metadata, parts, expectations and (with --diff) the revert as a diff."""
    from sglfix.patching.patcher import prepare_specs
    from sglfix.toggling.registry import parse_toggle_ids

    opts = options(ctx)
    registry = opts.registry()
    selections = parse_toggle_ids([toggle_id], registry=registry, what="show")
    toggle = selections[0].toggle
    info = {
        "id": toggle_id,
        "pr": toggle.pr,
        "title": toggle.title,
        "url": toggle.url,
        "bug": toggle.bug,
        "description": toggle.description,
        "file": toggle.path,
        "parts": {
            s.part.name: {
                "summary": s.part.summary,
                "targets": list(s.part.targets),
                "behaviour_neutral": s.part.behaviour_neutral,
                "static_only": s.part.static_only,
            }
            for s in selections
        },
        "expect": [
            {"scenario": e.scenario, "verdict": list(e.verdicts), "revert": list(e.revert), "device": e.device}
            for e in toggle.expect
        ],
        "caught_by": list(toggle.caught_by),
    }
    if diff:
        opts.enter_codebase()
        specs = [p for s in selections for p in s.part.patches]
        from sglfix.common.errors import ConfigError, SglfixError

        try:
            prepared = prepare_specs(specs, allowed_prefixes=opts.allowed_prefixes())
        except SglfixError as exc:
            # The toggle does not apply to this code: nothing to show (bad input, one line; where
            # its match comes closest is what sglfix doctor prints).
            lines = str(exc).splitlines()
            raise ConfigError(
                f"show {', '.join(s.id for s in selections)} --diff: {lines[0] if lines else exc}; "
                f"sglfix doctor shows where the match comes closest"
            ) from None
        per_target: dict[str, list] = {}
        for p in prepared:
            per_target.setdefault(p.spec.target, []).append(p)
        diffs = {}
        for target, items in per_target.items():
            name = target.rsplit(".", 1)[-1]
            diffs[target] = (
                "".join(
                    difflib.unified_diff(
                        textwrap.dedent(items[0].source_before).splitlines(keepends=True),
                        items[-1].source_after.splitlines(keepends=True),
                        fromfile=f"{target} (fixed)",
                        tofile=f"{target} (reverted)",
                    )
                )
                or f"(no textual change in {name})\n"
            )
        info["diff"] = diffs
    if as_json:
        emit_json(info)
        return
    out.print(f"{toggle.pr} {toggle.title}", style="bold")
    for key in ("url", "bug", "description"):
        if info[key]:
            out.print(f"  {key}: {info[key]}")
    out.print(f"  file: {toggle.path}")
    for name, part in info["parts"].items():
        out.print(f"  part {name}: {part['summary']}")
        if part["static_only"]:
            out.print(f"      static only: {part['static_only'].strip()}")
        for t in part["targets"]:
            out.print(f"      {t}")
    for e in info["expect"]:
        out.print(
            f"  expect: revert {','.join(e['revert'])} on {e['scenario']} -> {'|'.join(e['verdict'])}"
            + (f" ({e['device']})" if e["device"] != "any" else "")
        )
    if toggle.caught_by:
        out.print(f"  caught by: {', '.join(toggle.caught_by)}")
    for text in info.get("diff", {}).values():
        out.print()
        out.print(text, end="")


def register(app: typer.Typer) -> None:
    app.command("show")(show_cmd)
