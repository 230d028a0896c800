"""What a person reads first (issue 34): the console shows what did not pass and the counts, the
whole table one option away; the toggle-set lines fit a terminal; bisect's progress is a few lines;
the progress of a run tracks its expected work, not its cell count. The reports keep every cell."""

from __future__ import annotations

import json
from types import SimpleNamespace

from builders import ROOT
from clihelp import run_cli

TOPK8 = "fimla-draft-topk8*"
EXTEND = "trtllm-draft-extend@*"  # 21987 changes eight of them


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("│")]


def test_run_lists_what_did_not_pass_and_all_lists_every_cell(tmp_path, shared_store):
    out = tmp_path / "r.json"
    r = run_cli(
        "run",
        "-r",
        "27460",
        "-s",
        TOPK8,
        "--device",
        "cpu",
        *shared_store,
        "--json",
        str(out),
        subprocess=True,
    )
    assert r.code == 1, r.out + r.err
    rows = _table_rows(r.out)
    assert rows and all("INVARIANT" in row or "DIVERGE" in row or "CRASH" in row for row in rows), r.out
    assert not any(" PASS " in row for row in rows), r.out
    assert "passed, not listed; --all lists every cell" in r.out
    cells = json.loads(out.read_text())["cells"]
    assert len(cells) > len(rows) and any(c["verdict"] == "PASS" for c in cells)  # the report keeps all

    r = run_cli("run", "-r", "27460", "-s", TOPK8, "--device", "cpu", *shared_store, "--all", subprocess=True)
    assert len(_table_rows(r.out)) == len(cells) and "not listed" not in r.out, r.out


def test_a_run_where_every_cell_passes_prints_no_table(shared_store):
    r = run_cli("run", "-r", "26239", "-s", TOPK8, "--device", "cpu", *shared_store, subprocess=True)
    assert r.code == 0, r.out + r.err
    assert not _table_rows(r.out) and "every cell passed, not listed" in r.out, r.out
    assert r.out.splitlines()[0].startswith("sglfix run on cpu"), r.out


def test_the_matrix_grid_shows_only_rows_and_columns_with_a_finding(tmp_path, shared_store):
    out = tmp_path / "m.json"
    r = run_cli("matrix", "-s", TOPK8, "--device", "cpu", *shared_store, "--json", str(out), subprocess=True)
    assert r.code == 0, r.out + r.err
    report = json.loads(out.read_text())
    scenarios = sorted({c["scenario"] for c in report["cells"]})
    loud = sorted({c["scenario"] for c in report["cells"] if c["verdict"] not in ("PASS", "NOT_REACHED", "SKIP")})
    assert loud and len(loud) < len(scenarios)
    grid = _table_rows(r.out)
    shown = sorted(n for n in scenarios if any(row.split("│")[1].strip() == n for row in grid))
    assert shown == loud, (shown, loud, r.out)
    header = next(line for line in r.out.splitlines() if line.startswith("┃"))
    assert "baseline" in header and "27460" in header and "26239" not in header, header
    assert "(--all shows the whole grid)" in r.out

    r = run_cli("matrix", "-s", TOPK8, "--device", "cpu", *shared_store, "--all", subprocess=True)
    assert len(_table_rows(r.out)) == len(scenarios) and "--all shows" not in r.out, r.out


def test_a_toggle_sets_line_wraps_at_the_terminal_and_caps_its_names_by_default(shared_store):
    r = run_cli("matrix", "-s", EXTEND, "--device", "cpu", *shared_store, env={"COLUMNS": "80"}, subprocess=True)
    assert r.code == 0, r.out + r.err
    lines = r.out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("21987: differs on"))
    block = [lines[first]] + [line for line in lines[first + 1 :] if line.startswith("    ")][:20]
    assert len(block) > 1 and all(len(line) <= 80 for line in block), block
    assert "(--all lists them)" in " ".join(block), block
    r = run_cli(
        "matrix",
        "-s",
        EXTEND,
        "--device",
        "cpu",
        *shared_store,
        "--all",
        env={"COLUMNS": "80"},
        subprocess=True,
    )
    assert "(--all lists them)" not in r.out


def test_bisect_names_the_code_base_and_keeps_its_progress_short():
    r = run_cli("bisect", "-s", TOPK8, "--device", "cpu", subprocess=True)
    assert r.code == 1, r.out + r.err
    assert "code base: built-in reproduction" in r.out.splitlines()[0], r.out
    assert "reverted" not in r.err and len(r.err.splitlines()) <= 2, r.err
    r = run_cli("bisect", "-s", TOPK8, "--device", "cpu", "--all", subprocess=True)
    assert sum("reverted" in line for line in r.err.splitlines()) >= 3, r.err


def test_progress_counts_expected_work_and_not_reached_cells_cost_nothing(monkeypatch, capsys):
    from sglfix.cli import common
    from sglfix.execution.shards import scenario_cost
    from sglfix.scenario import load_scenarios

    scenarios = sorted(load_scenarios(), key=scenario_cost)
    small, big = scenarios[0], scenarios[-1]
    assert scenario_cost(big) > 4 * scenario_cost(small)
    # Nine cells of a small scenario that turn out not reached, then one big cell that runs.
    cells = [SimpleNamespace(scenario=small)] * 9 + [SimpleNamespace(scenario=big)] * 2
    work = common.Work(cells)
    for _ in range(9):
        assert work.settle(SimpleNamespace(scenario=small.name, verdict="NOT_REACHED")) == 0.0
        assert work.fraction == 0.0
    work.settle(SimpleNamespace(scenario=big.name, verdict="PASS"))
    assert work.fraction == 0.5 and work.count == 10

    t = [0.0]

    class Quick(common.LogProgress):
        def __init__(self, w):
            super().__init__(w, quiet_s=0.5, every_s=1000.0, clock=lambda: t[0])

    class Pool:
        def run(self, cells, *, on_result):
            for i, cell in enumerate(cells):
                t[0] = float(i)
                verdict = "NOT_REACHED" if cell.scenario is small else "PASS"
                on_result(SimpleNamespace(scenario=cell.scenario.name, verdict=verdict))
            return []

    monkeypatch.setattr(common, "LogProgress", Quick)
    with common.progress(SimpleNamespace(cells=cells, sets=[()])) as tick:
        Pool().run(cells, on_result=tick)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sglfix: ")]
    # The nine cells not reached are 82 % of the cells and none of the work.
    assert lines[0].startswith("sglfix: 2/11 cells, 0% of the work"), lines
    assert lines[-1] == "sglfix: 10/11 cells, 50% of the work, 9 s, 0 not passing so far", lines
    assert all(", 0% of the work" in line for line in lines[:-1]), lines


def test_the_readmes_console_example_is_what_the_commands_print():
    """Each ``$ sglfix ...`` of the README's console block, run at the width it was shown at: the
    same lines, timings aside."""
    import re
    import shlex

    readme = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"^```console\n(.*?)^```", readme, re.S | re.M)
    runs = re.split(r"^\$ ", block, flags=re.M)[1:]
    assert len(runs) >= 2

    def timeless(text: str) -> list[str]:
        return [re.sub(r"\d+\.\d s", "T s", line.rstrip()) for line in text.splitlines() if line.strip()]

    for shown in runs:
        command, _, expected = shown.partition("\n")
        argv = shlex.split(command)
        assert argv[0] == "sglfix", command
        r = run_cli(*argv[1:], env={"COLUMNS": "100"}, subprocess=True)
        assert timeless(r.out) == timeless(expected), (command, r.out)
