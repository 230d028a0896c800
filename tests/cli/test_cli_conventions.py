"""What users of a Typer/rich tool and CI logs expect of the command line: choices shown in the
help and checked, shell completion of toggle ids and scenario names, names never cut at any
width, a summary line at the end of a run, and progress lines when no terminal is attached."""

from __future__ import annotations

import pytest
from clihelp import assert_one_line_error, run_cli


@pytest.mark.parametrize(("option", "choices"), [("--device", "<auto|cpu|cuda>"), ("--executor", "<local|ray>")])
def test_options_with_fixed_values_show_their_choices_and_refuse_others(option, choices):
    r = run_cli("run", "--help", timeout=60)
    assert r.code == 0, r.err
    line = next(line for line in r.out.splitlines() if line.strip().startswith(option + " "))
    assert choices in line, line
    assert "<str>" not in line
    assert_one_line_error(run_cli("run", option, "gpu", "-s", "x", timeout=60), option, "gpu")


def _complete(*words: str, env: dict | None = None) -> list[str]:
    line = " ".join(("sglfix", *words))
    r = run_cli(
        env={"_SGLFIX_COMPLETE": "complete_bash", "COMP_WORDS": line, "COMP_CWORD": str(len(words)), **(env or {})},
        timeout=60,
    )
    assert r.code == 0, r.err
    return r.out.split()


def test_shell_completion_offers_commands_choices_ids_and_scenario_names():
    from sglfix.scenario import load_scenarios
    from sglfix.toggling.profiles import get_profile
    from sglfix.toggling.registry import load_registry

    assert _complete("ma") == ["matrix"]
    assert _complete("run", "--device", "c") == ["cpu", "cuda"]
    ids = load_registry().ids(parts=True)
    assert _complete("run", "-r", "") == ids
    part = next(i for i in ids if ":" in i)
    first, rest = part.split(":")[0], [i for i in ids if i != part]
    # A comma list completes its last item.
    assert _complete("run", "-r", f"{rest[0]},{first}") == [f"{rest[0]},{i}" for i in ids if i.startswith(first)]
    names = [s.name for s in load_scenarios()]
    stem = names[0].split("@")[0]
    assert _complete("matrix", "-s", stem) == [n for n in names if n.startswith(stem)]
    # The profile given earlier on the line decides what is offered.
    sglang_ids = load_registry(get_profile("sglang-0.5.23").toggles_dir).ids()
    assert _complete("--profile", "sglang-0.5.23", "show", "") == sglang_ids
    assert _complete("--profile", "sg") == ["sglang-0.5.23"]


def test_the_completion_script_can_be_shown_for_a_shell():
    """As a user types it, in bash: the shell is found among the command's parents, so the test
    does not depend on how pytest itself was started (a job whose shell has exited has none)."""
    import shlex
    import subprocess
    import sys

    line = f"{shlex.quote(sys.executable)} -m sglfix --show-completion bash"
    r = subprocess.run(["bash", "-c", f"{line}; exit $?"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "_SGLFIX_COMPLETE" in r.stdout and "complete" in r.stdout


LONG = "triton-decode-ps16-bf16@*"  # the longest built-in names (52 characters)
MIXED = ["-s", LONG, "-s", "fimla-draft-overflow@*"]


@pytest.mark.parametrize("columns", ["60", "80", "250"])
def test_run_never_cuts_a_scenario_name_and_ends_with_a_summary_line(tmp_path, columns, shared_store):
    from sglfix.scenario import load_scenarios, select_scenarios

    names = [s.name for s in select_scenarios(load_scenarios(), globs=[LONG, "fimla-draft-overflow@*"])]
    report = tmp_path / "r.json"
    argv = ("run", *MIXED, "-r", "27460", "--device", "cpu", "--json", str(report), "--all", *shared_store)  # every row
    r = run_cli(*argv, env={"COLUMNS": columns}, subprocess=True)
    assert r.code == 1, r.out + r.err  # 27460 reverted: the overflow scenarios fail
    lines = r.out.splitlines()
    for name in names:
        assert any(name in line for line in lines), (name, r.out)
    assert not any("…" in line for line in lines), r.out
    last = lines[-1]
    assert last.startswith(f"sglfix run: {len(names)} cells in "), last
    assert "INVARIANT" in last and "PASS" in last and "exit 1:" in last and f"report: {report}" in last, last


@pytest.mark.parametrize("columns", ["60", "80"])
def test_a_matrix_too_wide_for_the_terminal_is_compact_with_every_name_whole(columns, shared_store):
    from sglfix.common.verdicts import LOOKS

    r = run_cli("matrix", *MIXED, "--device", "cpu", "--all", *shared_store, env={"COLUMNS": columns}, subprocess=True)
    assert r.code == 0, r.out + r.err
    lines = r.out.splitlines()
    rows = [line for line in lines if line and line[0] in {look.letter for look in LOOKS.values()} and "  " in line]
    names = [line.split("  ", 1)[1] for line in rows]
    assert len(names) == 9 and all(n.startswith(("triton-decode-ps16-bf16@", "fimla-draft-overflow@")) for n in names)
    # A mark per toggle set: the baseline and each registered toggle, in the legend's order.
    sets = [line.split()[1] for line in lines if line.startswith("    ") and line.split()[0].isdigit()]
    assert sets[0] == "baseline"
    assert all(len(row.split("  ", 1)[0].replace(" ", "")) == len(sets) for row in rows)
    overflow_graph = next(row for row in rows if row.endswith("fimla-draft-overflow@cg=graph"))
    assert overflow_graph.split("  ", 1)[0].replace(" ", "")[sets.index("27460")] in "ID", overflow_graph
    assert lines[-1].startswith("sglfix matrix: ") and "gate passed" in lines[-1], lines[-1]


def test_the_matrix_summary_line_says_whether_the_gate_passed_and_why_not(tmp_path, shared_store):
    import shutil

    from sglfix.toggling.profiles import get_profile

    r = run_cli("matrix", "-s", "fimla-draft-overflow@cg=graph", "--device", "cpu", *shared_store, subprocess=True)
    assert r.code == 0, r.out + r.err
    assert "gate passed (1 of 1 expectations met, " in r.out.splitlines()[-1], r.out
    # The same toggle told to expect a PASS where it diverges: the gate fails and the line says so.
    toggles = tmp_path / "toggles"
    shutil.copytree(get_profile("reproduction").toggles_dir, toggles)
    text = (toggles / "27460.yaml").read_text()
    (toggles / "27460.yaml").write_text(
        text.replace(
            'scenario: "fimla-draft-overflow@*cg=graph*", verdict: [INVARIANT, DIVERGE]',
            'scenario: "fimla-draft-overflow@*cg=graph*", verdict: [PASS]',
        )
    )
    r = run_cli(
        "--toggles",
        str(toggles),
        "matrix",
        "-s",
        "fimla-draft-overflow@cg=graph",
        "--device",
        "cpu",
        *shared_store,
        subprocess=True,
    )
    assert r.code == 1, r.out + r.err
    assert r.out.splitlines()[-1].endswith("gate failed: 1 expectation(s) unmet"), r.out


def test_progress_lines_go_to_a_log_when_no_terminal_is_attached(monkeypatch, capsys):
    from types import SimpleNamespace

    from sglfix.cli import common

    t = [0.0]

    class Quick(common.LogProgress):
        def __init__(self, work):
            super().__init__(work, quiet_s=1.0, every_s=10.0, clock=lambda: t[0])

    class Pool:
        def run(self, cells, *, on_result):
            for i, _ in enumerate(cells):
                t[0] = float(i)  # a cell a second
                on_result(SimpleNamespace(scenario=f"s{i}", verdict="DIVERGE" if i == 3 else "PASS"))
            return []

    monkeypatch.setattr(common, "LogProgress", Quick)
    plan = SimpleNamespace(cells=list(range(40)), sets=[()])
    with common.progress(plan) as tick:
        Pool().run(plan.cells, on_result=tick)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sglfix: ")]
    # Quiet for the first second; then each tenth of the 40 cells; none for the last cell (the
    # summary line says that).
    assert lines[0].startswith("sglfix: 2/40 cells, 5% of the work, 1 s, 0 not passing"), lines
    assert any(line.startswith("sglfix: 4/40 cells, 10% of the work, 3 s, 1 not passing") for line in lines), lines
    assert len(lines) == 10 and not any(line.startswith("sglfix: 40/40") for line in lines), lines


@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
def test_named_rows_keep_every_name_whole_at_any_width(width):
    import io

    from rich.console import Console

    from sglfix.cli.layout import named_rows

    names = ["triton-decode-ps16-bf16@cg=graph-padded,gpu_only=off", "fimla-draft-overflow@cg=graph"]
    figure = "AssertionError: EAGLE draft kv_indices row too small: needs 564 entries, row width 384"
    rows = [[names[0], "26651", "PASS", ""], [names[1], "27460", "CRASH", figure]]
    console = Console(file=io.StringIO(), width=width, soft_wrap=True, color_system=None)
    for part in named_rows(["scenario", "toggles", "verdict", "key figure"], rows, title="t", width=width):
        console.print(part)
    text = console.file.getvalue()
    for name in names:
        assert any(name in line for line in text.splitlines()), (width, text)
    assert "…" not in text
    # Every value is shown (wrapped in its column or on a record line), none dropped.
    assert all(word in text for word in figure.split()), text
    # An empty column takes no room.
    from rich.table import Table

    (only,) = named_rows(["scenario", "key figure"], [[names[0], ""]], title="t", width=200)
    assert isinstance(only, Table) and [c.header for c in only.columns] == ["scenario"]
