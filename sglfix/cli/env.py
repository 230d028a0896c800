"""``sglfix env``: what SGLANG_DEBUG_REVERT_PR selects now."""

from __future__ import annotations

import os

import typer

from sglfix.cli.context import emit_json, options, out


def env_cmd(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show what SGLANG_DEBUG_REVERT_PR selects now."""
    from sglfix.toggling.env import ENV_VAR, selected_from_env

    value = os.environ.get(ENV_VAR)
    selections = selected_from_env(registry=options(ctx).registry())
    data = {
        "variable": ENV_VAR, "value": value,
        "selected": [{"id": s.id, "title": s.toggle.title, "summary": s.part.summary,
                      "targets": list(s.part.targets)} for s in selections],
    }
    if as_json:
        emit_json(data)
        return
    if not selections:
        out.print(f"{ENV_VAR}={value!r}: no fix is reverted" if value is not None else f"{ENV_VAR} is not set: no fix is reverted")
        return
    out.print(f"{ENV_VAR}={value!r} reverts:")
    for item in data["selected"]:
        out.print(f"  {item['id']}  {item['summary']}  ({', '.join(item['targets'])})")


def register(app: typer.Typer) -> None:
    app.command("env")(env_cmd)
