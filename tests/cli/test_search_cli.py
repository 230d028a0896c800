"""``sglfix search`` end to end on the reproduction: a revert found from the generic space and
shrunk to a scenario file the matrix runs (failing with the revert, passing without), the same for
the same seed; a mutant killed and a patch's effect found (replayed by ``run --apply``); a search
resumed from its report; a budget that finds nothing says so; bad input is one line before any cell."""

from __future__ import annotations

import json

import pytest
import yaml
from clihelp import assert_one_line_error, run_cli

from sglfix.report.search import SearchReport
from sglfix.search.shrink import reductions
from sglfix.search.space import to_scenario

FIND = ["search", "-r", "27460", "--family", "flashinfer_mla", "--mode", "DRAFT_DECODE", "--device", "cpu"]
FIND += ["--examples", "40"]


def test_a_revert_is_found_and_shrunk_to_a_scenario_file_that_shows_it(tmp_path):
    out, report, store = tmp_path / "found.yaml", tmp_path / "search.json", str(tmp_path / "store")
    result = run_cli(*FIND, "--cache", store, "-o", str(out), "--json", str(report), subprocess=True, timeout=600)
    assert result.code == 1, (result.out, result.err)
    data = SearchReport.model_validate(json.loads(report.read_text()))
    assert data.target == "revert" and data.revert == ["27460"] and data.found is not None
    assert data.shrink is not None and data.shrink.minimal
    assert data.shrunk is not None and data.shrunk.verdict == data.found.verdict
    assert data.shrunk.check == data.found.check
    assert 0 < data.tried <= 40 and data.examples_per_s > 0
    assert "smallest: " + data.shrunk.name in result.out
    # The file is a scenario the matrix runs: it fails with the revert and passes without.
    node = yaml.safe_load(out.read_text())
    assert node["name"] == data.shrunk.name
    reverted = run_cli("run", "--scenario-file", str(out), "-r", "27460", "--device", "cpu", "--no-cache")
    assert reverted.code == 1 and data.shrunk.verdict in reverted.out
    plain = run_cli("run", "--scenario-file", str(out), "--device", "cpu", "--no-cache")
    assert plain.code == 0, plain.out
    # No single reduction is smaller and still a scenario: the minimal claim is checked by the run above.
    from sglfix.codebases import get_codebase

    cb = get_codebase("reproduction")
    shrunk = {k: v for k, v in node.items() if k not in ("name", "description")}
    assert to_scenario(shrunk, codebase=cb).name == data.shrunk.name
    assert reductions(shrunk)
    # The same seed, the same search (its cells served by the result store the first one filled).
    again = tmp_path / "again.json"
    run_cli(*FIND, "--cache", store, "--json", str(again), subprocess=True, timeout=600)
    assert json.loads(again.read_text())["shrunk"]["name"] == data.shrunk.name


def test_a_budget_that_finds_nothing_says_so_and_exits_0(tmp_path):
    report = tmp_path / "search.json"
    result = run_cli(
        "search", "--family", "triton", "--mode", "DECODE", "--device", "cpu", "--examples", "8", "--no-cache",
        "--json", str(report), subprocess=True, timeout=300,
    )  # fmt: skip
    assert result.code == 0, (result.out, result.err)
    data = json.loads(report.read_text())
    assert data["found"] is None and data["tried"] == 8 and data["errors"] == []
    assert "nothing found: --examples 8" in result.out


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--family", "flashinfr"], ["--family flashinfr", "did you mean 'flashinfer'"]),
        (["--mode", "verify"], ["--mode verify: no such mode"]),
        (["--target", "revert"], ["--target revert", "--revert IDS"]),
        (["--target", "mutant"], ["--target mutant", "--mutant ID"]),
        (["--target", "kill"], ["--target kill: give one of baseline, revert, apply, mutant"]),
        (["-r", "27460", "--mutant", "m-0"], ["--revert and --mutant", "one change at a time"]),
        (["--function", "_fill_kv_indices"], ["--function narrows", "--mutant ID"]),
        (["--mutant", "m-00000000zz", "--function", "_fill_kv_indices"], ["--mutant m-00000000zz", "no mutant"]),
        (["--apply", "/nonexistent.patch"], ["/nonexistent.patch"]),
        (["--resume", "/nonexistent.json"], ["/nonexistent.json", "no such file"]),
        (["--where", "spec.topkk=1"], ["--where spec.topkk=1", "did you mean 'spec.topk'"]),
        (["--seeds", "builtins"], ["--seeds builtins", "did you mean 'builtin'"]),
        (["-r", "99999"], ["99999"]),
        (["-o", "/nonexistent-folder/x.yaml"], ["-o /nonexistent-folder/x.yaml", "does not exist"]),
    ],
)
def test_bad_input_is_one_line_before_any_cell(args, needles):
    assert_one_line_error(run_cli("search", "--device", "cpu", *args), *needles)


def test_a_live_bug_is_found_on_real_sglang_and_named_for_the_known_divergence_its_fix_clears(tmp_path):
    # From the generic space alone: the req_to_token headroom bug at page size 1 with tree drafting.
    report = tmp_path / "search.json"
    result = run_cli(
        "--profile", "sglang-0.5.23", "search", "--family", "probes", "--mode", "DECODE", "--device", "cpu",
        "--examples", "120", "--no-cache", "--json", str(report), subprocess=True, timeout=300,
    )  # fmt: skip
    assert result.code == 1, (result.out, result.err)
    data = json.loads(report.read_text())
    shrunk = data["shrunk"]
    assert shrunk["verdict"] == "INVARIANT" and shrunk["node"]["probe"] == "req-to-token-headroom"
    assert shrunk["node"]["page_size"] == 1 and shrunk["node"]["spec"]["topk"] > 1
    assert data["known"] == "probe-req-to-token-tree-ps1 (fixes/req-to-token-headroom-ps1.patch clears it)"
    assert "known divergence probe-req-to-token-tree-ps1" in result.out


MUTANT_FUNCTION = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend._fill_kv_indices"


def _mutant(description: str, function: str = MUTANT_FUNCTION):
    from sglfix.codebases import get_codebase
    from sglfix.execution.mutate import mutants_on_surface

    found = mutants_on_surface(codebase=get_codebase("reproduction"), functions=(function,))
    return next(m for m in found if m.description == description)


def test_a_change_search_spends_its_budget_on_the_kinds_that_enter_the_change(tmp_path):
    """Once every kind has been tried, the rest of the budget goes to the kinds whose base cells
    entered the mutant's function (the decode split heuristic: DECODE alone)."""
    from sglfix.codebases import get_codebase
    from sglfix.search.space import kinds, space_for

    m = _mutant("- 1 on (seq_lens.to(torch.int32) + _KV_SPLIT_TILE - 1)...", "*TritonAttnBackend.get_num_kv_splits")
    report = tmp_path / "focus.json"
    result = run_cli(
        "search", "--mutant", m.id, "--function", "get_num_kv_splits", "--device", "cpu", "--examples", "24",
        "--seeds", "none", "--no-cache", "--json", str(report), subprocess=True, timeout=300,
    )  # fmt: skip
    assert result.code in (0, 1), (result.out, result.err)
    data = json.loads(report.read_text())
    assert data["focus"] == ["triton/DECODE"], data["focus"]
    # Round robin over the family's kinds first; once narrowed (after a batch), every other
    # example is decode's, the rest from every kind still.
    every = len(kinds(space_for(get_codebase("reproduction"), family="triton")))
    assert every > 1
    assert {n.split("-")[2] for n in data["record"][:every]} != {"decode"}
    tail = data["record"][-8:]
    assert data["tried"] == 24 and sum(name.startswith("search-triton-decode-") for name in tail) >= 4, tail


def test_a_mutant_is_killed_and_the_kill_replays_through_run_apply(tmp_path):
    """--mutant: a scenario whose verdict the mutant moves (mutate's kill), shrunk, written; ``run
    --apply`` of the mutant's own diff (``mutate --show``) on that scenario breaks the cell."""
    m = _mutant("+ 1 on kv_lens[:bs]")
    out, report = tmp_path / "kill.yaml", tmp_path / "kill.json"
    args = ["search", "--mutant", m.id, "--function", "_fill_kv_indices", "--device", "cpu", "--examples", "24"]
    result = run_cli(*args, "--no-cache", "-o", str(out), "--json", str(report), subprocess=True, timeout=300)
    assert result.code == 1, (result.out, result.err)
    data = SearchReport.model_validate(json.loads(report.read_text()))
    assert data.target == "mutant" and data.mutant == m.id and data.applied == ["+" + m.id]
    assert data.family == "triton"  # the mutant's own family, where --family is not given
    assert data.shrunk is not None and data.shrunk.meaning in ("BROKEN", "CHANGED", "FIXED")
    assert data.record and data.record[-1] == data.found.name and len(data.record) == data.tried
    patch = tmp_path / "m.patch"
    shown = run_cli("mutate", "--show", m.id, "--function", "_fill_kv_indices", subprocess=True)
    patch.write_text(shown.out)
    replay = run_cli("run", "--scenario-file", str(out), "--apply", str(patch), "--device", "cpu", "--no-cache")
    assert replay.code == 1, replay.out
    # The same change as a patch file, from the same seeds (the default of --mutant): --apply finds
    # the same first example.
    applied = tmp_path / "apply.json"
    again = run_cli(
        "search", "--apply", str(patch), "--family", "triton", "--device", "cpu", "--examples", "24", "--no-cache",
        "--seeds", "builtin", "--json", str(applied), subprocess=True, timeout=300,
    )  # fmt: skip
    assert again.code == 1, (again.out, again.err)
    a = json.loads(applied.read_text())
    assert a["target"] == "apply" and a["found"]["name"] == data.found.name


def test_a_mutant_that_no_example_reaches_is_not_run_and_survives(tmp_path):
    """An example whose base cell never enters the mutant's function cannot show it: only the base
    cells run (reachability), and the search ends without a find."""
    m = _mutant("+ 1 on kv_lens[:bs]")
    report = tmp_path / "none.json"
    result = run_cli(
        "search", "--mutant", m.id, "--function", "_fill_kv_indices", "--family", "flashinfer", "--device", "cpu",
        "--examples", "8", "--no-cache", "--json", str(report), subprocess=True, timeout=300,
    )  # fmt: skip
    assert result.code == 0, (result.out, result.err)
    data = json.loads(report.read_text())
    assert data["found"] is None and data["tried"] == 8 and data["errors"] == []


def test_a_search_resumes_where_its_report_left_off(tmp_path):
    """--resume REPORT: the examples the earlier search tried are not run again; the record goes on."""
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    base = ["search", "--family", "triton", "--mode", "DECODE", "--device", "cpu", "--no-cache"]
    one = run_cli(*base, "--examples", "8", "--json", str(first), subprocess=True, timeout=300)
    assert one.code == 0, one.err
    two = run_cli(
        *base, "--examples", "16", "--resume", str(first), "--json", str(second), subprocess=True, timeout=300
    )
    assert two.code == 0, two.err
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert b["tried"] == 16 and b["record"][:8] == a["record"] and len(set(b["record"])) == 16
    assert "search: 16/16 examples" in two.err and "search: 8/16" not in two.err  # the first 8 not run again
    other = run_cli(*base, "--examples", "16", "--seed", "3", "--resume", str(first))
    assert_one_line_error(other, f"--resume {first}: it searched with seed 0, not 3")


def test_ctrl_c_mid_search_stops_every_worker_and_writes_nothing(tmp_path):
    """SIGINT while a search's examples run: exit 130, the workers stopped, no traceback, and
    neither the report nor the scenario file half-written."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from procs import alive, workers_of

    out, report = tmp_path / "found.yaml", tmp_path / "search.json"
    # A search that finds nothing soon (the reproduction's triton baseline passes) keeps running.
    args = ["search", "--family", "triton", "--device", "cpu", "--jobs", "2", "--examples", "400", "--no-cache"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglfix", *args, "-o", str(out), "--json", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        # A suite started in the background inherits SIGINT ignored; a terminal's command would not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 90
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.5)
            workers = workers_of(proc.pid)
        assert workers, "no worker started"
        time.sleep(3.0)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and text.strip().splitlines()[-1].endswith("workers stopped"), text[-2000:]
    time.sleep(0.5)
    assert not [p for p in workers if alive(p)]
    assert not out.exists() and not report.exists()
    assert not list(tmp_path.iterdir())
