"""``sglfix run``: the scenarios with the given fixes reverted, in worker processes."""

from __future__ import annotations

from typing import Any

import typer

from sglfix.cli.common import (
    Outputs,
    cells_table,
    check_expect_fixes,
    check_expect_fixes_match,
    header,
    judge_ran,
    print_known,
    revert_ids,
    run_plan,
    summary_line,
    write_outputs,
)
from sglfix.cli.context import err, options, out
from sglfix.cli.options import SCALE, SELECT, takes
from sglfix.common.errors import ConfigError

RUN_OPTIONS = (
    "revert",
    "apply",
    "expect_fixes",
    *SELECT,
    *SCALE,
    "show_all",
    "reach_file",
    "cache",
    "no_cache",
    "verify_store",
)


@takes(*RUN_OPTIONS)
def run_cmd(ctx: typer.Context, **given: Any) -> None:
    # The help (register) names the engine's variable from its declaration.
    from sglfix.execution.known import known_of
    from sglfix.execution.planner import plan_run
    from sglfix.execution.settings import Settings
    from sglfix.report.meaning import Meaning

    opts = options(ctx)
    json_file = given["json_file"]
    outputs = Outputs(json=json_file, junit=given["junit"], markdown=given["markdown"])
    known = known_of(opts.active_profile())  # a bad list is one line before any cell
    ids = revert_ids(given["revert"])
    expect_fixes = check_expect_fixes(given["expect_fixes"], given["apply"])

    def build_plan(chosen, *, registry, env_ids):
        check_expect_fixes_match(expect_fixes, chosen)
        return plan_run(chosen, revert=ids, env_ids=env_ids, registry=registry)

    record = _reach_targets(given["reach_file"])
    ran = run_plan(
        opts,
        Settings.of(given, record=record),
        outputs=outputs,
        build_plan=build_plan,
        what="run",
        apply=given["apply"],
        given=given,
    )
    results = ran.results
    # The same judgement as the matrix's, in findings mode: a known divergence of the profile
    # (an upstream bug the baseline shows too) is marked, listed, and fails nothing.
    report, judgement = judge_ran(opts, ran, mode="findings", known=known, expect_fixes=expect_fixes)
    write_outputs(report, outputs, judgement=judgement)
    what = "run" if ran.shard is None else f"run shard {ran.shard}"
    if json_file != "-":
        title = header(what=what, info=ran.info, env=ran.env, wall=ran.wall, cells=len(results), report=report)
        table = cells_table(results, title=title, width=out.width, judgement=judgement, show_all=given["show_all"])
        for part in table:
            out.print(part)
        print_known(judgement, device=ran.info.get("device"), only_shown=True)
    (err if json_file == "-" else out).print(
        summary_line(what, results, wall=ran.wall, outcome=judgement.outcome(), outputs=outputs)
    )
    if opts.git_bisect and (judgement.count(Meaning.ERROR) or judgement.drifted):
        # sglfix could not drive this commit's code (or a revert asked for is not there): neither
        # good nor bad, which git bisect run reads from 125.
        err.print("sglfix: --git-bisect: this commit cannot be tested (exit 125)", highlight=False, markup=False)
        raise typer.Exit(125)
    if judgement.exit_code:
        raise typer.Exit(judgement.exit_code)


def register(app: typer.Typer) -> None:
    from sglfix.common.environ import envs

    app.command(
        "run",
        help=f"Run scenarios with the given fixes reverted (through {envs.REVERT_PR.name} in the workers); "
        "with --apply, each cell also with a candidate fix applied, beside the same cell without it.",
    )(run_cmd)


def _reach_targets(path: str | None) -> tuple[str, ...]:
    """The dotted paths ``--reach-file`` lists (blank lines and ``#`` comments left out)."""
    if path is None:
        return ()
    import re

    from sglfix.common.yamlio import read_text_file

    names = []
    for number, line in enumerate(read_text_file(path, what="--reach-file").splitlines(), start=1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", name):
            raise ConfigError(f"--reach-file {path}:{number}: {name!r} is not a dotted path like pkg.mod.Class.method")
        names.append(name)
    return tuple(dict.fromkeys(names))
