"""``sglfix run``: the scenarios with the given fixes reverted, in worker processes."""

from __future__ import annotations

from typing import List

import typer

from sglfix.cli.common import (
    BackendName, Device, Jobs, JsonFile, MemoryBudget, ScenarioFiles, ScenarioGlobs, Timeout, cells_table,
    check_device, check_jobs, check_timeout, env_ids, execute, header, load_selected, make_pool, revert_ids,
)
from sglfix.cli.context import options, out


def run_cmd(
    ctx: typer.Context,
    revert: List[str] = typer.Option([], "--revert", "-r", metavar="ID", help="Revert this toggle or part (repeatable; comma lists too); added to what SGLANG_DEBUG_REVERT_PR selects."),
    scenario: ScenarioGlobs = [],
    scenario_file: ScenarioFiles = [],
    backend: BackendName = None,
    device: Device = "auto",
    jobs: Jobs = None,
    timeout: Timeout = 300.0,
    json_file: JsonFile = None,
    memory_budget: MemoryBudget = None,
) -> None:
    """Run scenarios with the given fixes reverted (through SGLANG_DEBUG_REVERT_PR in the workers)."""
    from sglfix.execution.planner import plan_run
    from sglfix.report.jsonreport import build_report
    from sglfix.report.output import check_output_path, write_json
    from sglfix.toggling.env import ENV_VAR

    opts = options(ctx)
    check_output_path(json_file, option="--json")
    device = check_device(device)
    timeout = check_timeout(timeout)
    registry = opts.registry()
    env = env_ids(registry)
    ids = revert_ids(revert)
    from sglfix.execution.pool import signals_raise

    with signals_raise(), make_pool(opts, device=device, jobs=check_jobs(jobs, device), timeout=timeout) as pool:
        chosen = load_selected(scenario, scenario_file, backend, memory_budget)
        plan = plan_run(chosen, revert=ids, env_ids=env, registry=registry)
        info = pool.info
        results, wall = execute(pool, plan)
    import os

    data = build_report(command=opts.argv, info=info, results=results, cell_ids=[c.id for c in plan.cells],
                        wall_s=wall, env_revert=os.environ.get(ENV_VAR))
    if json_file is not None:
        write_json(json_file, data)
    if json_file != "-":
        out.print(cells_table(results, title=header(what="run", info=info, env=env, wall=wall, cells=len(results))))
    if any(r.verdict == "ERROR" for r in results):
        raise typer.Exit(1)
    if results and all(r.verdict == "SKIP" for r in results):
        raise typer.Exit(125)
    if any(r.verdict != "PASS" for r in results):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
