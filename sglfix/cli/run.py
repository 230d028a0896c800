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
    ShowAll,
    Timeout,
    cells_table,
    header,
    judge_ran,
    print_known,
    revert_ids,
    run_plan,
    summary_line,
    write_outputs,
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
    show_all: ShowAll = False,
) -> None:
    """Run scenarios with the given fixes reverted (through SGLANG_DEBUG_REVERT_PR in the workers)."""
    from sglfix.execution.known import load_known
    from sglfix.execution.planner import plan_run

    opts = options(ctx)
    outputs = Outputs(json=json_file, junit=junit, markdown=markdown)
    known = load_known(opts.active_profile().known_file)  # a bad list is one line before any cell
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
    # The same judgement as the matrix's, in findings mode: a known divergence of the profile
    # (an upstream bug the baseline shows too) is marked, listed, and fails nothing.
    report, judgement = judge_ran(opts, ran, mode="findings", known=known)
    write_outputs(report, outputs, judgement=judgement)
    if json_file != "-":
        title = header(
            what="run" if ran.shard is None else f"run shard {ran.shard}",
            info=ran.info,
            env=ran.env,
            wall=ran.wall,
            cells=len(results),
            report=report,
        )
        for part in cells_table(results, title=title, width=out.width, judgement=judgement, show_all=show_all):
            out.print(part)
        print_known(judgement, device=ran.info.get("device"), only_shown=True)
    code = judgement.exit_code
    what = "run" if ran.shard is None else f"run shard {ran.shard}"
    (err if json_file == "-" else out).print(
        summary_line(what, results, wall=ran.wall, outcome=judgement.outcome(), outputs=outputs)
    )
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("run")(run_cmd)
