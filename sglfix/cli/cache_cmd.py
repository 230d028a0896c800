"""``sglfix cache show | prune | clear``: what the result store holds, and removing what no run
needs (the work is ``sglfix.execution.store.folder``; this module parses and prints)."""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from sglfix.cli.context import add_group, emit_json, out
from sglfix.cli.layout import named_rows
from sglfix.common.environ import envs
from sglfix.common.errors import ConfigError

_FOLDER_HELP = f"The result store's folder (default: {envs.SGLFIX_STORE.name}, else ~/.cache/sglfix/results), as for run and matrix."


def _folder(cache: str | None) -> str:
    from sglfix.execution.runner import chosen_store_folder

    return chosen_store_folder(cache)


def show_cmd(
    cache: str | None = typer.Option(None, "--cache", metavar="DIR", help=_FOLDER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """What the result store holds: its folder, schema, records and size, by kind, oldest and newest."""
    from sglfix.execution.store.folder import summarize_store

    summary = summarize_store(_folder(cache))
    if as_json:
        emit_json(summary.model_dump())
        return
    schema = f"schema {summary.schema_version}" if summary.schema_version is not None else "no schema"
    title = f"result store at {summary.path} ({schema}): {summary.records} record(s), {_size(summary.bytes)}"
    if summary.note is not None:
        out.print(Text(f"{title}; {summary.note}"))
        return
    _table(summary.parts, title=title, records="records")


def prune_cmd(
    older_than: str | None = typer.Option(
        None,
        "--older-than",
        metavar="AGE",
        help="Remove what no run used or wrote for this long: a number and a unit, s, m, h, d or w (e.g. 30d).",
    ),
    cache: str | None = typer.Option(None, "--cache", metavar="DIR", help=_FOLDER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Remove the results no run used or wrote for --older-than AGE (and a mutant memo as old)."""
    from sglfix.execution.store.folder import parse_age, prune_store

    if older_than is None:
        raise ConfigError("cache prune removes what is old: give --older-than AGE (e.g. --older-than 30d)")
    age = parse_age(older_than)
    _said(prune_store(_folder(cache), older_than_s=age), what=f"pruned (older than {older_than})", as_json=as_json)


def clear_cmd(
    cache: str | None = typer.Option(None, "--cache", metavar="DIR", help=_FOLDER_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Remove every result and the mutant memo (the folder, its CACHEDIR.TAG and README stay)."""
    from sglfix.execution.store.folder import clear_store

    _said(clear_store(_folder(cache)), what="cleared", as_json=as_json)


def _said(removed: Any, *, what: str, as_json: bool) -> None:
    if as_json:
        emit_json(removed.model_dump())
        return
    title = f"result store at {removed.path} {what}: {removed.records} record(s) removed, {_size(removed.bytes)} freed"
    if removed.note is not None:
        out.print(Text(f"result store at {removed.path}: {removed.note}"))
        return
    if removed.left:
        title += f"; {removed.left} file(s) that are not the store's left as they were"
    _table(removed.parts, title=title, records="removed")


def _table(parts: list, *, title: str, records: str) -> None:
    rows = [
        [Text(p.kind), Text(str(p.records)), Text(_size(p.bytes)), Text(p.oldest or ""), Text(p.newest or "")]
        for p in parts
    ]
    headers = ["kind", records, "size", "oldest (used or written)", "newest"]
    for part in named_rows(headers, rows, title=title, width=out.width):
        out.print(part)


def _size(n: int) -> str:
    from sglfix.scenario.memory import format_size

    return format_size(n)


def register(app: typer.Typer) -> None:
    add_group(
        app,
        name="cache",
        help="The result store: what it holds (show), removing old results (prune --older-than), or all (clear).",
        commands=[("show", show_cmd), ("prune", prune_cmd), ("clear", clear_cmd)],
    )
