"""``sglfix matrix``: baseline and each toggle (with --parts, each part) over the scenarios."""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from sglfix.cli.common import (
    VERDICT_STYLE,
    BackendName,
    Device,
    DeviceList,
    Executor,
    HeatmapFile,
    Jobs,
    JsonFile,
    JunitFile,
    MarkdownFile,
    MemoryBudget,
    NoReachability,
    Outputs,
    RayAddress,
    RayKeep,
    ScenarioFiles,
    ScenarioGlobs,
    ShardCosts,
    ShardSpec,
    Timeout,
    header,
    run_plan,
    summary_line,
    verdict_text,
    write_report,
)
from sglfix.cli.context import err, options, out

# One character per verdict for the compact grid (a narrow terminal, a CI log): failures are
# capitals, the three that are no finding are punctuation.
MARK_CHAR = {
    "PASS": ".",
    "NOT_REACHED": "-",
    "SKIP": "s",
    "SYNC": "Y",
    "DIVERGE": "D",
    "NAN": "N",
    "INVARIANT": "I",
    "CRASH": "C",
    "TIMEOUT": "T",
    "FAULT": "F",
    "ERROR": "E",
}


def _grid(plan, results, *, title: str, width: int) -> list:
    """The toggle x scenario grid. With full names and verdicts when it fits ``width``; else
    compact: a legend numbering the toggle sets, then one line per scenario, one mark per set
    and the name last and whole (never cut, piped or not, at any width)."""
    from sglfix.execution.planner import set_label

    verdicts = {(tuple(r.toggles), r.scenario): r.verdict for r in results}
    set_labels = [set_label(t) for t in plan.sets]
    names = [s.name for s in plan.scenarios]
    need = max(map(len, names)) + sum(max(len(lbl), 9) + 3 for lbl in set_labels) + 4
    if need <= width:
        table = Table("scenario", *set_labels, title=Text(title))
        for s in plan.scenarios:
            table.add_row(Text(s.name), *[verdict_text(verdicts.get((t, s.name), "?")) for t in plan.sets])
        return [table]
    parts: list = [Text(title, style="italic"), Text("toggle sets (one mark each, in this order):")]
    parts += [Text(f"  {i:>3}  {lbl}") for i, lbl in enumerate(set_labels)]
    key = Text("marks: ")
    for verdict, ch in MARK_CHAR.items():
        key.append(ch, style=VERDICT_STYLE.get(verdict, ""))
        key.append(f" {verdict}  ")
    key.append("? not run")
    parts.append(key)

    def grouped(chars: list[Text]) -> Text:
        line = Text()
        for i, ch in enumerate(chars):
            if i and i % 5 == 0:
                line.append(" ")
            line.append_text(ch)
        return line

    n = len(plan.sets)
    if n > 10:  # a ruler over the marks: tens, then ones
        parts.append(grouped([Text(str(i // 10) if i % 10 == 0 else " ") for i in range(n)]))
    parts.append(grouped([Text(str(i % 10)) for i in range(n)]))
    for s in plan.scenarios:
        marks = []
        for t in plan.sets:
            verdict = verdicts.get((t, s.name), "?")
            marks.append(Text(MARK_CHAR.get(verdict, "?"), style=VERDICT_STYLE.get(verdict, "")))
        line = grouped(marks)
        line.append("  ")
        line.append(s.name)
        parts.append(line)
    return parts


def matrix_cmd(
    ctx: typer.Context,
    parts: bool = typer.Option(
        False,
        "--parts",
        help="Also revert each part of each toggle alone, and the part combinations expectations name (checks those expectations).",
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
    heatmap: HeatmapFile = None,
    memory_budget: MemoryBudget = None,
    devices: DeviceList = None,
    executor: Executor = "local",
    ray_address: RayAddress = None,
    ray_keep: RayKeep = None,
    shard: ShardSpec = None,
    shard_costs: ShardCosts = None,
    no_reachability: NoReachability = False,
) -> None:
    """Baseline plus each registered toggle (and part) over the scenarios: the toggle x scenario grid."""
    from sglfix.execution.expectations import check_expectations, known_hits
    from sglfix.execution.known import load_known
    from sglfix.execution.planner import plan_matrix, set_label
    from sglfix.toggling.env import ENV_VAR

    opts = options(ctx)
    outputs = Outputs(json=json_file, junit=junit, markdown=markdown, heatmap=heatmap)
    known = load_known(opts.active_profile().known_file)  # a bad list is one line before any cell

    def build_plan(chosen, *, registry, env_ids):
        return plan_matrix(chosen, registry=registry, parts=parts, env_ids=env_ids)

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
        reachability=not no_reachability,
    )
    plan, results, env, info, wall = ran.plan, ran.results, ran.env, ran.info, ran.wall
    if env:
        # Every set carries the env ids: the expectations (written without them) do not apply.
        checks, stray, not_run = [], [], [f"all expectations: {ENV_VAR} is set"]
    else:
        checks, stray, not_run = check_expectations(
            ran.registry, results, device=info.get("device", device), known=known
        )
    known_seen = known_hits(known, results)
    write_report(opts, ran, outputs, gate=True, checks=checks, stray=stray, not_run=not_run, known=known_seen)
    if json_file != "-":
        for part in _grid(
            plan,
            results,
            width=out.width,
            title=header(
                what="matrix" if ran.shard is None else f"matrix shard {ran.shard}",
                info=info,
                env=env,
                wall=wall,
                cells=len(results),
            ),
        ):
            out.print(part)
        by_set: dict[tuple, list] = {}
        for r in results:
            by_set.setdefault(tuple(r.toggles), []).append(r)
        for t in plan.sets[1:]:
            bad = [f"{r.scenario} ({r.verdict})" for r in by_set.get(t, []) if r.verdict not in ("PASS", "NOT_REACHED")]
            out.print(Text(f"{set_label(t)}: ", style="bold"), end="")
            cells = by_set.get(t, [])
            unreached = sum(r.verdict == "NOT_REACHED" for r in cells)
            if cells and unreached == len(cells):
                out.print("not reached: these scenarios never run the functions it reverts")
            else:
                out.print(
                    (f"differs on {len(bad)}: " + ", ".join(bad) if bad else "no effect on these scenarios")
                    + (f" ({unreached} not reached)" if unreached else "")
                )
        for c in checks:
            out.print(Text("met   " if c.met else "UNMET ", style="green" if c.met else "red"), end="")
            out.print(
                f"expect revert {','.join(c.revert)} on {c.scenario} -> {'|'.join(c.wanted)}"
                + ("" if c.met else f"; got {sorted(set(c.got.values()))}")
            )
        for k in known_seen:
            out.print(Text("known ", style="yellow"), end="")
            out.print(
                f"{k['scenario']} -> {'|'.join(k['verdict'])}: "
                + (
                    f"seen on {len(k['seen_on'])} baseline cell(s)"
                    if k["seen_on"]
                    else f"{k['device']} only, not expected on {info.get('device', device)}"
                    if k.get("device", "any") not in ("any", info.get("device", device))
                    else "not seen (fixed?)"
                )
                + f"; {k['reason']} (reproduce: {k['reproduce']})"
            )
        for s in stray:
            out.print(Text("unexpected ", style="red"), end="")
            out.print(f"{','.join(s['toggles']) or 'baseline'} on {s['scenario']}: {s['verdict']} ({s['why']})")
        if not_run:
            hint = "" if env else " (part-level expectations run with --parts; or their scenarios were not selected)"
            out.print(f"{len(not_run)} expectation(s) not checked{hint}")
    # A shard sees only some of an expectation's scenarios: whether it is met is decided on the
    # merged report (`sglfix report merge --gate`); stray verdicts and errors are per cell.
    unmet = [c for c in checks if not c.met]
    if unmet and ran.shard is not None and json_file != "-":
        out.print(
            f"shard {ran.shard}: {len(unmet)} expectation(s) not met by this shard's scenarios alone; "
            "`sglfix report merge --gate` judges them over all shards"
        )
    errors = sum(r.verdict == "ERROR" for r in results)
    failed = bool(stray or (unmet and ran.shard is None) or errors)
    problems = [
        f"{n} {what}"
        for n, what in (
            (len(unmet) if ran.shard is None else 0, "expectation(s) unmet"),
            (len(stray), "unexpected verdict(s)"),
            (errors, "ERROR cell(s)"),
        )
        if n
    ]
    met = sum(c.met for c in checks)
    if failed:
        outcome = "gate failed: " + ", ".join(problems)
    else:
        outcome = f"gate passed ({met} of {len(checks)} expectations met"
        outcome += f", {len(not_run)} not checked)" if not_run else ")"
        if unmet and ran.shard is not None:
            outcome += f"; {len(unmet)} expectation(s) left to `sglfix report merge --gate`"
    what = "matrix" if ran.shard is None else f"matrix shard {ran.shard}"
    (err if json_file == "-" else out).print(
        summary_line(what, results, wall=ran.wall, outcome=outcome, outputs=outputs)
    )
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("matrix")(matrix_cmd)
