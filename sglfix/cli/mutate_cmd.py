"""``sglfix mutate``: where the scenarios are blind. Mutants of the attention-metadata code the
selected cells run, each run over those cells and judged against them (the campaign is
``sglfix.execution.mutate``'s; the verdicts and the report ``sglfix.report.mutation``'s)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sglfix.cli.common import Outputs
from sglfix.cli.context import err, options, out
from sglfix.cli.options import OPTIONS, SCALE, SELECT, takes
from sglfix.common.errors import ConfigError

# Options of mutate alone, declared where every option is (``OPTIONS``) so that ``takes`` finds them.
OPTIONS.update(
    {
        "function": (
            Annotated[
                list[str],
                typer.Option(
                    "--function",
                    metavar="PATTERN",
                    help="Mutate only these functions (a glob over dotted names, or a function's own name; "
                    "repeatable) instead of the profile's metadata surface.",
                ),
            ],
            [],
        ),
        "operators": (
            Annotated[
                list[str],
                typer.Option(
                    "--operators",
                    metavar="NAME",
                    help="Only these operators (repeatable or comma-separated; default all: sglfix mutate --list-operators).",
                ),
            ],
            [],
        ),
        "show": (
            Annotated[
                str | None,
                typer.Option("--show", metavar="ID", help="Print mutant ID of the campaign (its diff) and exit."),
            ],
            None,
        ),
        "merge": (
            Annotated[
                list[str],
                typer.Option(
                    "--merge",
                    metavar="REPORT",
                    help="Merge the --shard i/N campaigns' JSON reports (repeatable) into one report; runs nothing.",
                ),
            ],
            [],
        ),
        "again": (
            Annotated[
                str | None,
                typer.Option(
                    "--again",
                    metavar="REPORT",
                    help="Run again only the survivors of this earlier campaign's JSON report (after a new "
                    "judge or scenario), by mutant id on the code base as it is; --function narrows them.",
                ),
            ],
            None,
        ),
        # A campaign atop candidate fixes judges its mutants on the fixed code: no cell is set beside
        # one without the fix, so run's help does not apply.
        "mutate_apply": (
            Annotated[
                list[str],
                typer.Option(
                    "--apply",
                    metavar="FIX.patch",
                    help="Run every cell, baselines included, atop this candidate fix (a unified diff in the "
                    "code base's repository paths; repeatable: the files apply together), so that a path a "
                    "live bug's known divergence masks can show a mutant. Mutants of lines it rewrites are "
                    "not run.",
                ),
            ],
            [],
        ),
        "list_operators": (
            Annotated[bool, typer.Option("--list-operators", help="List the operators and exit.")],
            False,
        ),
        "all_cells": (
            Annotated[
                bool,
                typer.Option(
                    "--all-cells",
                    help="Run every mutant over every cell that reaches it (default: a few cells first, "
                    "the rest only for the mutants those do not show).",
                ),
            ],
            False,
        ),
        "survivors_every_cell": (
            Annotated[
                bool,
                typer.Option(
                    "--survivors-every-cell",
                    help="A mutant the sampled cells did not show but that built something different there "
                    "tries every other cell that reaches it before it is called a survivor.",
                ),
            ],
            False,
        ),
        "first_cells": (
            Annotated[
                int,
                typer.Option("--first-cells", metavar="N", help="Cells each mutant tries first (default 3)."),
            ],
            3,
        ),
        # A mutant can loop for ever (a negated loop condition): mutate waits less than a run.
        "mutate_timeout": (
            Annotated[
                float,
                typer.Option("--timeout", help="Seconds per cell before TIMEOUT (finite, > 0; mutate's default 60)."),
            ],
            60.0,
        ),
        # A campaign's shard is a share of its mutants, not of its cells (every shard runs every
        # baseline), so matrix's help and its --shard-costs do not apply.
        "mutate_shard": (
            Annotated[
                str | None,
                typer.Option(
                    "--shard",
                    metavar="I/N",
                    help="Run only the i-th of N shares of the mutants (dealt by mutant id, the same on every "
                    "machine; every shard runs every baseline); --merge joins the shards' JSON reports.",
                ),
            ],
            None,
        ),
        "more_cells": (
            Annotated[
                int,
                typer.Option(
                    "--more-cells",
                    metavar="N",
                    help="Further cells a mutant its first cells did not show is tried on (default 9; "
                    "--all-cells for every cell that reaches it).",
                ),
            ],
            9,
        ),
        "fail_under": (
            Annotated[
                float | None,
                typer.Option(
                    "--fail-under",
                    metavar="SCORE",
                    help="Exit 1 when the mutation score (killed / (killed + survived), in %) is under SCORE.",
                ),
            ],
            None,
        ),
    }
)

MUTATE_OPTIONS = (
    "mutate_apply",
    "function",
    "operators",
    "show",
    "merge",
    "again",
    "list_operators",
    "all_cells",
    "survivors_every_cell",
    "first_cells",
    "more_cells",
    "fail_under",
    *(name if name != "timeout" else "mutate_timeout" for name in SELECT),
    *(name if name != "shard" else "mutate_shard" for name in SCALE if name != "shard_costs"),
    "cache",
    "no_cache",
)


def _reviewed_marks(tgt: Any) -> tuple[dict, str | None]:
    """The profile's reviewed equivalents that hold atop the applied fixes, read before any cell
    (a bad file is one line, exit 2), and the file as the report names it (relative to the
    profile's folder); ({}, None) where the profile names none."""
    from sglfix.mutation.reviewed import load_marks, marks_file, marks_for

    path = marks_file(tgt.codebase)
    if path is None:
        return {}, None
    shown = f"{tgt.codebase.name}/{tgt.codebase.equivalent_mutants}"
    marks = load_marks(path, shown=shown)
    return marks_for(marks, applied=[c.id.removeprefix("+") for c in tgt.candidates]), shown


def _operators(given: list[str]) -> tuple[str, ...] | None:
    from sglfix.common.schema import nearest
    from sglfix.mutation.operators import OPERATORS

    names = [n.strip() for g in given for n in g.split(",")]
    for n in names:
        if n not in OPERATORS:
            raise ConfigError(
                f"--operators {n or repr(n)}: no such operator{nearest(n, list(OPERATORS))}; "
                f"give one of {', '.join(OPERATORS)}"
            )
    return tuple(dict.fromkeys(names)) or None


@takes(*MUTATE_OPTIONS)
def mutate_cmd(ctx: typer.Context, **given: Any) -> None:
    """Mutate the attention-metadata code the selected scenarios run (the profile's surface, or
    --function) and run each mutant over the cells that reach it: which lines could break without
    any scenario noticing. Survivors first, then what no scenario reaches, equivalents, scores.
    With --apply every cell runs atop the candidate fixes: mutants judged on the fixed code."""
    from sglfix.execution.mutate import Choice, check_function_patterns, run_campaign
    from sglfix.execution.settings import Settings

    opts = options(ctx)
    if given["list_operators"]:
        from sglfix.mutation.operators import OPERATORS

        for name, doc in OPERATORS.items():
            out.print(f"{name:18} {doc}", highlight=False, markup=False)
        return
    operators = _operators(given["operators"])
    functions = check_function_patterns(given["function"])
    _check_numbers(given)
    outputs = Outputs(json=given["json_file"], junit=given["junit"], markdown=given["markdown"])
    if given["show"] is not None:
        _show(opts, given["show"], functions=functions, operators=operators)
        return
    outputs.check()
    if given["merge"]:
        from sglfix.report.mutation import load_mutation_report, merge_mutation_reports

        report = merge_mutation_reports([load_mutation_report(p) for p in given["merge"]], names=given["merge"])
        _write_and_print(report, outputs, given)
        return
    again = _survivors_of(opts, given["again"], functions=functions, operators=operators) if given["again"] else None
    from sglfix.cli.common import progress, target

    tgt = target(opts, apply=given["mutate_apply"])
    _check_no_env(tgt.registry)
    marks, marks_shown = _reviewed_marks(tgt)
    settings = Settings.of(given, env_baseline=False, timeout=given["mutate_timeout"], shard=given["mutate_shard"])

    def say(line: str) -> None:
        err.print(f"sglfix: {line}", highlight=False, markup=False)

    choice = Choice(
        functions=functions,
        operators=operators,
        first_cells=given["first_cells"],
        more_cells=given["more_cells"],
        all_cells=given["all_cells"],
        survivors_every_cell=given["survivors_every_cell"],
        given=again,
    )
    campaign = run_campaign(settings, tgt, choice=choice, progress=progress, say=say)
    from sglfix.execution.mutate import campaign_report, catalogue_rows
    from sglfix.report.mutation import Selection

    report = campaign_report(
        campaign,
        command=opts.argv,
        profile=tgt.profile,
        selection=Selection(
            scenario=list(given["scenario"]), function=list(functions), operators=list(operators or ())
        ),
        catalogue=catalogue_rows(tgt, operators=operators),
        applied=tgt.candidates,
        marks=marks,
        marks_file=marks_shown,
    )
    _write_and_print(report, outputs, given)


def _survivors_of(opts: Any, path: str, *, functions: Any, operators: Any) -> tuple[Any, ...]:
    """The survivors of the mutation report at ``path`` as mutants of the installed code base
    (``--function`` and ``--operators`` narrow them), each found again by its id: an id the code
    base no longer yields (its line changed) is refused, naming it, before any cell runs."""
    from sglfix.execution.mutate import matches_function, mutants_on_surface
    from sglfix.report.mutation import Status, check_mutation_report, load_mutation_report

    report = check_mutation_report(load_mutation_report(path), where=path)
    rows = [m for m in report.mutants if m.status == Status.SURVIVED]
    if functions:
        rows = [m for m in rows if any(matches_function(m.function, f) for f in functions)]
    if operators:
        rows = [m for m in rows if m.operator in operators]
    if not rows:
        narrowed = " that --function / --operators select" if functions or operators else ""
        raise ConfigError(f"--again {path}: the report has no survivor{narrowed}; nothing to run again")
    codebase = opts.codebase()
    found = {m.id: m for m in mutants_on_surface(codebase=codebase, functions=sorted({m.function for m in rows}))}
    missing = [m for m in rows if m.id not in found]
    if missing:
        first = missing[0]
        raise ConfigError(
            f"--again {path}: survivor {first.id} ({first.function.rsplit('.', 1)[-1]}, line {first.line}) "
            f"is no mutant of {codebase.package} as installed{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: "
            "its code changed since that campaign; run the campaign whole"
        )
    return tuple(found[m.id] for m in rows)


def _write_and_print(report: dict, outputs: Outputs, given: dict) -> None:
    """The report to every file asked for, the console's tables, then the gate: exit 1 under
    --fail-under, when a mutant is an error of sglfix's, or when a kill contradicts a mark of the
    profile's reviewed equivalents."""
    from sglfix.report.mutation import fail_under
    from sglfix.report.mutation_render import render_console, render_markdown, write_junit

    if outputs.json:
        from sglfix.report.output import write_json

        write_json(outputs.json, report)
    if outputs.junit:
        write_junit(report, outputs.junit)
    if outputs.markdown:
        from sglfix.report.output import write_atomic

        write_atomic(outputs.markdown, render_markdown(report))
    if given["json_file"] != "-":
        for part in render_console(report):
            out.print(part)
    if given["fail_under"] is not None:
        ok, line = fail_under(report, given["fail_under"])
        (err if given["json_file"] == "-" else out).print(f"sglfix mutate: {line}", highlight=False, markup=False)
        if not ok:
            raise typer.Exit(1)
    if any(m["status"] == "error" for m in report["mutants"]):
        raise typer.Exit(1)
    if (report.get("reviews") or {}).get("contradicted"):
        # A mark a kill contradicts is a wrong claim in the profile: while it stays, the mutant
        # would read as equivalent the day no scenario kills it.
        raise typer.Exit(1)


def _check_numbers(given: dict) -> None:
    from sglfix.report.mutation import check_fail_under

    if given["first_cells"] < 1:
        raise ConfigError(f"--first-cells {given['first_cells']}: give how many cells a mutant tries first (>= 1)")
    if given["more_cells"] < 0:
        raise ConfigError(f"--more-cells {given['more_cells']}: give how many more cells a mutant tries (>= 0)")
    if given["fail_under"] is not None:
        check_fail_under(given["fail_under"])


def _check_no_env(registry: Any) -> None:
    """Mutants change the code as installed: a revert inherited from the environment would make
    every cell's baseline another code, in every worker."""
    from sglfix.execution.runner import env_ids
    from sglfix.toggling import ENV_VAR

    env = env_ids(registry)
    if env:
        raise ConfigError(
            f"{ENV_VAR}={','.join(env)} is set: mutate changes the code as installed, and the workers would "
            f"revert those fixes under every mutant; unset it (env -u {ENV_VAR} sglfix mutate ...)"
        )


def _show(opts: Any, mid: str, *, functions: tuple[str, ...], operators: Any) -> None:
    """Mutant ``mid``'s diff: the mutants of the functions named, or of the whole surface of
    the installed code base, generated again from the source (ids are stable while it is)."""
    from sglfix.execution.mutate import mutants_on_surface
    from sglfix.mutation.diff import show_mutant

    codebase = opts.codebase()
    mid = mid.lstrip("+")
    found = mutants_on_surface(codebase=codebase, functions=functions, operators=operators)
    hit = next((m for m in found if m.id == mid), None)
    if hit is None:
        from sglfix.common.schema import nearest

        raise ConfigError(
            f"--show {mid}: no mutant of {codebase.package} has that id{nearest(mid, [m.id for m in found])}; "
            "give an id from a campaign's report (its code may have changed since)"
        )
    # Written as it is, byte for byte: the output is a patch --apply reads back.
    text = show_mutant(hit)
    typer.echo(text if text.endswith("\n") else text + "\n", nl=False)


def register(app: typer.Typer) -> None:
    app.command("mutate")(mutate_cmd)
