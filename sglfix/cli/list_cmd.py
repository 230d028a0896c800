"""``sglfix list``: the registered toggles."""

from __future__ import annotations

import typer
from rich.table import Table

from sglfix.cli.context import emit_json, options, out


def list_cmd(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the registered toggles: id, parts, title, bug class, targets."""
    registry = options(ctx).registry()
    rows = [
        {"id": t.id, "parts": list(t.parts), "title": t.title, "bug": t.bug, "targets": list(t.targets), "file": t.path}
        for t in registry
    ]
    if as_json:
        emit_json({"toggles": rows, "directory": registry.directory})
        return
    if not rows:
        out.print(f"no toggles registered in {registry.directory}")
        return
    table = Table("id", "parts", "title", "bug", "targets", title=f"toggles ({registry.directory})")
    for r in rows:
        table.add_row(r["id"], ", ".join(r["parts"]), r["title"], r["bug"], "\n".join(r["targets"]))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command("list")(list_cmd)
