"""``sglfix run``: the scenarios with the given fixes reverted, in worker processes."""

from __future__ import annotations

import typer

from sglfix.cli.common import (
    BackendName,
    Device,
    DeviceList,
    Executor,
    Jobs,
    JsonFile,
    JunitFile,
    MarkdownFile,
    MemoryBudget,
    Outputs,
    RayAddress,
    ScenarioFiles,
    ScenarioGlobs,
    ShardCosts,
    ShardSpec,
    Timeout,
    cells_table,
    header,
    revert_ids,
    run_plan,
    write_report,
)
from sglfix.cli.complete import toggle_ids
from sglfix.cli.context import options, out


def run_cmd(
    ctx: typer.Context,
    revert: list[str] = typer.Option(
        [],
        "--revert",
        "-r",
        metavar="ID",
        autocompletion=toggle_ids,
        help="Revert this toggle or part (repeatable; comma lists too); added to what SGLANG_DEBUG_REVERT_PR selects.",
    ),
    scenario: ScenarioGlobs = [],
    scenario_file: ScenarioFiles = [],
    backend: BackendName = None,
    device: Device = "auto",
    jobs: Jobs = None,
    timeout: Timeout = 300.0,
    json_file: JsonFile = None,
    junit: JunitFile = None,
    markdown: MarkdownFile = None,
    memory_budget: MemoryBudget = None,
    devices: DeviceList = None,
    executor: Executor = "local",
    ray_address: RayAddress = None,
    shard: ShardSpec = None,
    shard_costs: ShardCosts = None,
) -> None:
    """Run scenarios with the given fixes reverted (through SGLANG_DEBUG_REVERT_PR in the workers)."""
    from sglfix.execution.planner import plan_run

    opts = options(ctx)
    outputs = Outputs(json=json_file, junit=junit, markdown=markdown)
    ids = revert_ids(revert)

    def build_plan(chosen, *, registry, env_ids):
        return plan_run(chosen, revert=ids, env_ids=env_ids, registry=registry)

    ran = run_plan(
        opts,
        build_plan=build_plan,
        scenario=scenario,
        scenario_file=scenario_file,
        backend=backend,
        device=device,
        jobs=jobs,
        timeout=timeout,
        outputs=outputs,
        memory_budget=memory_budget,
        shard=shard,
        shard_costs=shard_costs,
        devices=devices,
        executor=executor,
        ray_address=ray_address,
    )
    results = ran.results
    write_report(opts, ran, outputs, gate=False)
    if json_file != "-":
        title = header(
            what="run" if ran.shard is None else f"run shard {ran.shard}",
            info=ran.info,
            env=ran.env,
            wall=ran.wall,
            cells=len(results),
        )
        out.print(cells_table(results, title=title))
    if any(r.verdict == "ERROR" for r in results):
        raise typer.Exit(1)
    if results and all(r.verdict == "SKIP" for r in results):
        raise typer.Exit(125)
    if any(r.verdict != "PASS" for r in results):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
