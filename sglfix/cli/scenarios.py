"""``sglfix scenarios``: the scenarios after grid expansion."""

from __future__ import annotations

import typer
from rich.text import Text

from sglfix.cli.common import load_selected
from sglfix.cli.context import emit_json, options, out
from sglfix.cli.layout import named_rows
from sglfix.cli.options import ScenarioFiles, ScenarioGlobs


def scenarios_cmd(
    ctx: typer.Context,
    scenario: ScenarioGlobs = [],
    scenario_file: ScenarioFiles = [],
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List scenarios (the profile's built-in ones, or from --scenario-file) after grid expansion."""
    chosen = load_selected(options(ctx), scenario, scenario_file, None)
    if as_json:
        emit_json({"scenarios": [s.to_json() for s in chosen]})
        return
    rows = []
    for s in chosen:
        rows.append(
            [
                Text(s.name),
                s.backend or f"probe:{s.probe}",
                s.mode,
                f"cg{list(s.capture_bs)}" if s.cuda_graph else "eager",
                str(s.batch_size),
                str(s.page_size),
                s.model.dtype,
                str(s.gpu_only),
                s.builder,
            ]
        )
    headers = ["name", "backend", "mode", "graph", "bs", "page", "dtype", "gpu_only", "builder"]
    for part in named_rows(headers, rows, title=f"{len(chosen)} scenarios", width=out.width):
        out.print(part)


def register(app: typer.Typer) -> None:
    app.command("scenarios")(scenarios_cmd)
