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
    RayKeep,
    ScenarioFiles,
    ScenarioGlobs,
    ShardCosts,
    ShardSpec,
    Timeout,
    cells_table,
    header,
    revert_ids,
    run_plan,
    summary_line,
    write_report,
)
from sglfix.cli.complete import toggle_ids
from sglfix.cli.context import err, options, out


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
    ray_keep: RayKeep = None,
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
        ray_keep=ray_keep,
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
        for part in cells_table(results, title=title, width=out.width):
            out.print(part)
    errors = sum(r.verdict == "ERROR" for r in results)
    not_passed = sum(r.verdict != "PASS" for r in results)
    if errors:
        code, outcome = 1, f"exit 1: sglfix itself failed in {errors} cell(s) (ERROR)"
    elif results and all(r.verdict == "SKIP" for r in results):
        code, outcome = 125, "exit 125: every cell was skipped (cannot test this here)"
    elif not_passed:
        code, outcome = 1, f"exit 1: {not_passed} cell(s) did not pass"
    else:
        code, outcome = 0, "every cell passed"
    what = "run" if ran.shard is None else f"run shard {ran.shard}"
    (err if json_file == "-" else out).print(
        summary_line(what, results, wall=ran.wall, outcome=outcome, outputs=outputs)
    )
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
