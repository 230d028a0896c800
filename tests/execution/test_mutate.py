"""``sglfix mutate`` end to end on the reproduction, on CPU, over a few cheap Triton decode cells:
a planted mutant each of what a campaign must tell apart (killed, survived, suspected equivalent,
a worker killed), the gate, and the one-line refusals before any cell."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import pytest
from builders import ROOT

from sglfix.codebases import get_codebase
from sglfix.common.codebase import package_dir
from sglfix.mutation.diff import mutant_diff
from sglfix.mutation.model import Mutant, mutant_id

SELECT = ("triton-decode@cg=eager,gpu_only=off", "triton-decode@cg=graph,gpu_only=off")
MODULE = "sglfix.backends.srt.layers.attention.triton_backend"
REL = "srt/layers/attention/triton_backend.py"


def _plant(qualname: str, old: str, new: str, *, operator: str = "off-by-one") -> Mutant:
    """A mutant of the reproduction's Triton backend: the one line holding ``old`` (stripped)
    inside ``qualname`` made ``new`` (same indentation)."""
    path = Path(package_dir("sglfix.backends")) / REL
    text = path.read_text()
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip() == old]
    assert len(hits) == 1, (old, hits)
    i = hits[0]
    indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
    function = f"{MODULE}.{qualname}"
    mutated = indent + new
    return Mutant(
        id=mutant_id(function=function, operator=operator, line=i + 1, original=lines[i], mutated=mutated),
        function=function,
        path="backends/" + REL,
        line=i + 1,
        end_line=i + 1,
        operator=operator,
        original=lines[i],
        mutated=mutated,
        description=f"planted: {old} -> {new}",
        diff=mutant_diff(
            path="backends/" + REL, file_text=text, line=i + 1, end_line=i + 1, mutated=mutated, title="planted"
        ),
    )


KILLED = (
    "TritonAttnBackend._fill_kv_indices",
    "kv_indptr[1 : bs + 1] = torch.cumsum(kv_lens[:bs], dim=0)",
    "kv_indptr[1 : bs + 1] = torch.cumsum(kv_lens[:bs], dim=0) + 1",
)
# Fewer KV splits: split-K merges the same softmax, so the output stays within tolerance while
# the built num_kv_splits differs: no check can see it.
SURVIVOR = ("TritonAttnBackend.get_num_kv_splits", "max=self.max_kv_splits,", "max=1,")
# A lower clamp of 0 where every length is at least one: nothing built changes.
EQUIVALENT = ("TritonAttnBackend.get_num_kv_splits", "min=1,", "min=0,")
FAULTING = (
    "TritonAttnBackend.get_num_kv_splits",
    "num_kv_splits.copy_(splits.to(torch.int32))",
    "__import__('os').kill(__import__('os').getpid(), 9)",
)


@contextmanager
def _quiet(plan):
    yield lambda result: None


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    from sglfix.execution.mutate import Choice, run_campaign
    from sglfix.execution.runner import Target
    from sglfix.execution.settings import Settings
    from sglfix.toggling.registry import load_registry

    cb = get_codebase("reproduction")
    target = Target(profile=cb, registry=load_registry(cb.toggles_dir), codebase=cb)
    planted = tuple(_plant(*p) for p in (KILLED, SURVIVOR, EQUIVALENT, FAULTING))
    settings = Settings(scenario=SELECT, device="cpu", jobs=2, timeout=120, no_cache=True)
    return run_campaign(settings, target, choice=Choice(given=planted, all_cells=True), progress=_quiet)


@pytest.fixture(scope="module")
def campaign_report(campaign):
    from sglfix.execution.mutate import campaign_report
    from sglfix.report.mutation import Selection

    cb = get_codebase("reproduction")
    report = campaign_report(campaign, command=["sglfix", "mutate"], profile=cb, selection=Selection())
    return {m["description"]: m for m in report["mutants"]}, report


def test_reviewed_marks_make_a_survivor_equivalent_and_a_kill_or_a_moved_function_says_the_mark_is_wrong(campaign):
    """A mark of the profile's reviewed equivalents over a real campaign: the survivor it names is
    equivalent (reviewed) with the reason and out of the score; the killed one it names stays
    killed and the mark is contradicted (exit 1); a mark of a mutated function whose mutant was
    not made is stale; a mark of a function the campaign did not mutate says nothing."""
    import typer

    from sglfix.cli.mutate_cmd import Outputs, _write_and_print
    from sglfix.execution.mutate import campaign_report
    from sglfix.mutation.reviewed import Mark
    from sglfix.report.mutation import Selection, check_mutation_report
    from sglfix.report.mutation_render import render_markdown, review_lines

    cb = get_codebase("reproduction")
    plain = {
        m["description"]: m
        for m in campaign_report(campaign, command="m", profile=cb, selection=Selection())["mutants"]
    }
    survivor, killed = _of(plain, SURVIVOR), _of(plain, KILLED)
    why = "fewer splits merge the same softmax: a schedule, not a result"
    marks = {
        survivor["id"]: Mark(id=survivor["id"], function=survivor["function"], why=why),
        killed["id"]: Mark(id=killed["id"], function=killed["function"], why="claimed equivalent, wrongly"),
        "m-0123456789": Mark(id="m-0123456789", function=survivor["function"], why="a mutant its text no longer makes"),
        "m-abcdef0123": Mark(id="m-abcdef0123", function="elsewhere.not_mutated", why="outside this campaign entirely"),
    }
    report = campaign_report(
        campaign, command="m", profile=cb, selection=Selection(), marks=marks, marks_file="repro/mutants/eq.yaml"
    )
    check_mutation_report(report, where="test")
    by = {m["id"]: m for m in report["mutants"]}
    assert by[survivor["id"]]["status"] == "equivalent" and by[survivor["id"]]["evidence"]["reviewed"] == why
    assert by[killed["id"]]["status"] == "killed"
    reviews = report["reviews"]
    assert reviews["marked"] == 1 and reviews["file"] == "repro/mutants/eq.yaml"
    assert [m["id"] for m in reviews["contradicted"]] == [killed["id"]] and reviews["contradicted"][0]["killed_by"]
    assert [m["id"] for m in reviews["stale"]] == ["m-0123456789"]
    overall = report["scores"]["overall"]
    assert overall["survived"] == 0 and overall["killed"] == 2
    lines = review_lines(report)
    assert len(lines) == 2 and killed["id"] in lines[0] and "drop the mark" in lines[0] and "m-0123456789" in lines[1]
    assert "1 reviewed" in render_markdown(report)
    with pytest.raises(typer.Exit) as gate:
        _write_and_print(report, Outputs(json=None, junit=None, markdown=None), {"json_file": "-", "fail_under": None})
    assert gate.value.exit_code == 1
    # Without the contradicted mark the same campaign passes the gate.
    del marks[killed["id"]]
    fine = campaign_report(campaign, command="m", profile=cb, selection=Selection(), marks=marks, marks_file="f")
    _write_and_print(fine, Outputs(json=None, junit=None, markdown=None), {"json_file": "-", "fail_under": None})


def _of(mutants: dict, planted: tuple) -> dict:
    return mutants[f"planted: {planted[1]} -> {planted[2]}"]


def test_a_killed_mutant_names_its_cells(campaign_report):
    mutants, _ = campaign_report
    m = _of(mutants, KILLED)
    assert m["status"] == "killed"
    assert {k["scenario"] for k in m["killed_by"]} == set(SELECT)
    assert all(k["verdict"] not in ("PASS", "ERROR", "TIMEOUT") for k in m["killed_by"])


def test_a_planted_survivor_is_reported_survived(campaign_report):
    mutants, _ = campaign_report
    m = _of(mutants, SURVIVOR)
    assert m["status"] == "survived", m
    assert set(m["reached_by"]) == set(SELECT)
    assert m["hint"]


def test_a_change_nothing_built_shows_is_a_suspected_equivalent(campaign_report):
    mutants, _ = campaign_report
    assert _of(mutants, EQUIVALENT)["status"] == "equivalent"


def test_a_mutant_that_kills_the_worker_is_killed_with_fault(campaign_report):
    mutants, _ = campaign_report
    m = _of(mutants, FAULTING)
    assert m["status"] == "killed", m
    assert {k["verdict"] for k in m["killed_by"]} == {"FAULT"}


def test_the_score_counts_killed_over_killed_and_survived(campaign_report):
    from sglfix.report.mutation import fail_under

    _, report = campaign_report
    assert fail_under(report, 66.0)[0] and not fail_under(report, 67.0)[0]  # 2 killed of 3


def test_every_mutant_diff_is_what_apply_replays(tmp_path, campaign_report):
    """The diff a campaign ran is a candidate fix ``--apply`` loads as it is."""
    from sglfix.toggling.candidate import load_candidate

    mutants, _ = campaign_report
    for m in mutants.values():
        f = tmp_path / f"{m['id']}.patch"
        f.write_text(m["diff"])
        cand = load_candidate(f, codebase=get_codebase("reproduction"))
        assert [p.target for p in cand.part.patches] == [m["function"]]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--operators", "off-by-on"], "--operators off-by-on: no such operator"),
        (["--fail-under", "120"], "--fail-under 120"),
        (["--function", "no_such_function_anywhere", "-s", SELECT[0]], "--function no_such_function_anywhere"),
    ],
)
def test_bad_input_is_one_line_before_any_cell(args, said, tmp_path):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "sglfix", "mutate", "--device", "cpu", "--no-cache", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DEBUG")},
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("sglfix: ")]
    assert said in r.stderr and "Traceback" not in r.stderr and len(lines) <= 1, r.stderr


def test_fail_under_fails_and_passes_on_the_cli(tmp_path):
    """The gate on a real campaign of one function: exit 1 under the score, 0 at or over it; then
    --again over its report."""
    import subprocess
    import sys

    base = [sys.executable, "-m", "sglfix", "mutate", "--device", "cpu", "-s", SELECT[0]]
    base += ["--function", "get_num_kv_splits", "--operators", "slice-bound,off-by-one", "--cache", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DEBUG")}
    first = subprocess.run([*base, "--json", str(tmp_path / "m.json")], capture_output=True, text=True, env=env)
    assert first.returncode in (0, 1), first.stderr
    report = json.loads((tmp_path / "m.json").read_text())
    score = report["scores"]["overall"]["score"]
    assert score is not None, report["scores"]
    under = subprocess.run([*base, "--fail-under", str(min(100.0, score + 1))], capture_output=True, text=True, env=env)
    over = subprocess.run([*base, "--fail-under", str(max(0.0, score - 1))], capture_output=True, text=True, env=env)
    assert under.returncode == (1 if score < 100 else 0), under.stdout + under.stderr
    assert over.returncode == 0, over.stdout + over.stderr

    # --again: the survivors alone run again, by id; an id today's code does not yield is refused.
    survivors = sorted(m["id"] for m in report["mutants"] if m["status"] == "survived")
    assert survivors, "the campaign needs a survivor to run again"
    again = subprocess.run(
        [*base, "--again", str(tmp_path / "m.json"), "--json", str(tmp_path / "a.json")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert again.returncode in (0, 1), again.stderr
    assert sorted(m["id"] for m in json.loads((tmp_path / "a.json").read_text())["mutants"]) == survivors
    stale = dict(
        report, mutants=[dict(m, id="m-0000000000") if m["id"] == survivors[0] else m for m in report["mutants"]]
    )
    (tmp_path / "stale.json").write_text(json.dumps(stale))
    refused = subprocess.run([*base, "--again", str(tmp_path / "stale.json")], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "survivor m-0000000000" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and "cell" not in refused.stdout


def test_show_prints_the_patch_apply_reads(tmp_path):
    """``mutate --show ID`` prints the mutant's diff as --apply loads it (the campaign's own text)."""
    import subprocess
    import sys

    from sglfix.execution.mutate import mutants_on_surface
    from sglfix.toggling.candidate import load_candidate

    cb = get_codebase("reproduction")
    m = mutants_on_surface(codebase=cb, functions=("_fill_kv_indices",))[0]
    r = subprocess.run(
        [sys.executable, "-m", "sglfix", "mutate", "--show", m.id, "--function", "_fill_kv_indices"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert m.diff in r.stdout
    f = tmp_path / "shown.patch"
    f.write_text(r.stdout)
    assert [p.target for p in load_candidate(f, codebase=cb).part.patches] == [m.function]


def test_function_patterns_name_a_method_by_its_full_or_its_tail_dotted_name():
    """A method's full dotted name (as a campaign's report spells it) and a dotted tail of it find
    its mutants, as its own name does (the full name found none: the file filter cut the class)."""
    from sglfix.execution.mutate import mutants_on_surface

    cb = get_codebase("reproduction")
    full = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend._fill_kv_indices"
    by_name = {m.id for m in mutants_on_surface(codebase=cb, functions=("_fill_kv_indices",))}
    assert by_name
    for pattern in (full, "triton_backend.TritonAttnBackend._fill_kv_indices", "*.TritonAttnBackend._fill_kv_*"):
        assert {m.id for m in mutants_on_surface(codebase=cb, functions=(pattern,))} == by_name, pattern


def test_a_function_of_a_packages_init_is_named_by_the_package():
    """sglang defines a function in a package's own ``__init__.py`` (``qsa.__getattr__``): its
    mutants carry ``package.function``, so that ``--show`` over the whole surface finds them (it
    failed on ``qsa.__init__.__getattr__`` before)."""
    from real_sglang import require_sglang

    from sglfix.execution.mutate import mutants_on_surface

    require_sglang()
    found = mutants_on_surface(
        codebase=get_codebase("sglang-0.5.23"), functions=("sglang.srt.layers.attention.qsa.__getattr__",)
    )
    assert found and {m.function for m in found} == {"sglang.srt.layers.attention.qsa.__getattr__"}
    assert all(m.path.endswith("attention/qsa/__init__.py") for m in found), {m.path for m in found}


def test_shards_share_the_mutants_and_merge_into_the_whole_campaign(tmp_path):
    """``--shard i/N`` runs a share of the mutants (each shard every baseline); ``--merge`` of all
    the shards' reports is the unsharded campaign, mutant by mutant; a missing shard is refused."""
    import subprocess
    import sys

    base = [sys.executable, "-m", "sglfix", "mutate", "--device", "cpu", "-s", SELECT[0]]
    base += ["--function", "get_num_kv_splits", "--cache", str(tmp_path / "store")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DEBUG")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], capture_output=True, text=True, env=env, timeout=600)

    whole = run("--json", str(tmp_path / "whole.json"))
    assert whole.returncode in (0, 1), whole.stderr
    for i in (1, 2):
        r = run("--shard", f"{i}/2", "--json", str(tmp_path / f"s{i}.json"))
        assert r.returncode in (0, 1), r.stderr
    shares = [json.loads((tmp_path / f"s{i}.json").read_text()) for i in (1, 2)]
    assert all(s["shard"] == f"{i}/2" for i, s in zip((1, 2), shares))
    ids = [{m["id"] for m in s["mutants"]} for s in shares]
    assert not ids[0] & ids[1]
    merged = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglfix",
            "mutate",
            "--merge",
            str(tmp_path / "s1.json"),
            "--merge",
            str(tmp_path / "s2.json"),
            "--json",
            str(tmp_path / "merged.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert merged.returncode in (0, 1), merged.stderr
    m = json.loads((tmp_path / "merged.json").read_text())
    w = json.loads((tmp_path / "whole.json").read_text())
    assert {x["id"]: x["status"] for x in m["mutants"]} == {x["id"]: x["status"] for x in w["mutants"]}
    assert m["scores"] == w["scores"]
    alone = subprocess.run(
        [sys.executable, "-m", "sglfix", "mutate", "--merge", str(tmp_path / "s1.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert alone.returncode == 2 and "2/2 missing" in alone.stderr, alone.stderr

    # A shard run again as two of a split twice as fine (2/2 = 2/4 + 4/4) merges with the others.
    for i in (1, 2, 4):
        r = run("--shard", f"{i}/4", "--json", str(tmp_path / f"q{i}.json"))
        assert r.returncode in (0, 1), r.stderr

    def merge(*names: str) -> subprocess.CompletedProcess:
        args = [a for n in names for a in ("--merge", str(tmp_path / n))]
        out = ["--json", str(tmp_path / "nested.json")]
        return subprocess.run(
            [sys.executable, "-m", "sglfix", "mutate", *args, *out],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    nested = merge("s1.json", "q2.json", "q4.json")
    assert nested.returncode in (0, 1), nested.stderr
    n = json.loads((tmp_path / "nested.json").read_text())
    assert {x["id"]: x["status"] for x in n["mutants"]} == {x["id"]: x["status"] for x in w["mutants"]}
    assert n["scores"] == w["scores"] and n["merged_from"] == ["1/2", "2/4", "4/4"]
    overlap = merge("s1.json", "q1.json", "s2.json")
    assert overlap.returncode == 2 and "hold some mutants both" in overlap.stderr, overlap.stderr
    short = merge("s1.json", "q2.json")
    assert short.returncode == 2 and "4/4 missing" in short.stderr, short.stderr
    # A shard another sglfix wrote is another campaign's: its rules of judgement may differ.
    other = json.loads((tmp_path / "s2.json").read_text())
    other["sglfix_source"] = {**other["sglfix_source"], "commit": "0123456789abcdef" * 2 + "01234567"}
    (tmp_path / "s2-other.json").write_text(json.dumps(other))
    mixed = merge("s1.json", "s2-other.json")
    assert mixed.returncode == 2 and "0123456789" in mixed.stderr and "one sglfix commit" in mixed.stderr, mixed.stderr
    assert "Traceback" not in mixed.stderr


def test_the_readmes_mutant_id_is_one_of_todays_code():
    """The mutation guide's ``--show`` example names a mutant the operators make of the code as it is."""
    import re

    from sglfix.execution.mutate import mutants_on_surface

    text = (ROOT / "docs" / "how-to" / "mutate.md").read_text()
    shown = re.findall(r"sglfix mutate --show (m-[0-9a-f]+) --function (\S+)", text)
    assert shown
    for mid, function in shown:
        found = mutants_on_surface(codebase=get_codebase("reproduction"), functions=(function,))
        assert mid in {m.id for m in found}, f"docs/how-to/mutate.md's mutant {mid} is no mutant of {function} now"


def test_a_second_campaign_is_served_but_for_what_the_store_never_keeps(tmp_path):
    """The same campaign again runs only the cells the store never keeps (a dead worker, sglfix's
    failure, a timeout: a re-run may answer otherwise); a mutant cell that crashed before it built
    any metadata is kept like any other (None passed to a kernel: CRASH at the launch)."""
    import subprocess
    import sys

    base = [sys.executable, "-m", "sglfix", "mutate", "--device", "cpu", "-s", SELECT[0]]
    base += ["--function", "_fill_kv_indices", "--operators", "none-arg", "--cache", str(tmp_path / "store")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DEBUG")}
    reports = []
    for i in (1, 2):
        r = subprocess.run([*base, "--json", str(tmp_path / f"{i}.json")], capture_output=True, text=True, env=env)
        assert r.returncode in (0, 1), r.stderr
        reports.append(json.loads((tmp_path / f"{i}.json").read_text()))
    first, second = reports
    crashed = [m for m in first["mutants"] if any(k["verdict"] == "CRASH" for k in m["killed_by"])]
    assert crashed, "none-arg on the kernel launch crashes it"
    kept_out = sum(
        1
        for m in first["mutants"]
        for c in m["killed_by"] + m["not_judged"]
        if c["verdict"] in ("FAULT", "ERROR", "TIMEOUT")
    )
    assert second["phases"]["ran"] == kept_out
    assert second["phases"]["served"] == first["phases"]["mutant_cells"] - kept_out
    assert {m["id"]: m["status"] for m in second["mutants"]} == {m["id"]: m["status"] for m in first["mutants"]}


def test_a_mutant_taken_from_the_mapped_memo_is_the_mutant_loaded_again(tmp_path):
    """A served campaign takes mutants' mapped patches from the store folder's memo: each must be
    the candidate loading its diff gives (the store keys its cells on the patches)."""
    from sglfix.codebases import activate, get_codebase
    from sglfix.execution.mutate import _generate, load_mutants

    codebase = get_codebase("reproduction")
    activate(codebase)
    name = "sglfix.backends.srt.layers.attention.flashinfer_mla_backend.FlashInferMLAAttnBackend.init_forward_metadata"
    mutants = _generate([name], codebase=codebase, operators=None)
    loaded, errors = load_mutants(mutants, codebase=codebase, memo_dir=str(tmp_path))
    assert mutants and not errors and (tmp_path / "mutants-mapped.json").exists()
    memo, _ = load_mutants(mutants, codebase=codebase, memo_dir=str(tmp_path))
    assert [(c.id, repr(c.part), c.notes, c.title, c.sha256) for c in memo] == [
        (c.id, repr(c.part), c.notes, c.title, c.sha256) for c in loaded
    ]
    entries = json.loads((tmp_path / "mutants-mapped.json").read_text())["entries"]
    assert len(entries) == len(mutants)


def test_a_mutant_is_tried_on_its_own_backends_passing_cells_first():
    """The first cells of a mutant of one backend's file are that backend's scenarios (cheapest
    passing first, one per mode); other backends' cells come only after them, and a mutant of a
    shared file is sampled over every cell alike."""
    from types import SimpleNamespace

    from sglfix.execution.mutate import _sample

    def cell(name: str, backend: str, mode: str, ms: float) -> SimpleNamespace:
        return SimpleNamespace(name=name, backend=backend, mode=mode, capture_bs=None, page_size=1, ms=ms)

    cells = [
        cell("probe-a", "probe", "DECODE", 1.0),
        cell("probe-b", "probe", "EXTEND", 1.0),
        cell("hybrid", "hybrid_linear", "DECODE", 2.0),
        cell("tri-decode-slow", "triton", "DECODE", 9.0),
        cell("tri-decode", "triton", "DECODE", 5.0),
        cell("tri-extend-broken", "triton", "EXTEND", 3.0),
        cell("tri-extend", "triton", "EXTEND", 4.0),
    ]
    baseline_of = {
        c.name: SimpleNamespace(verdict="DIVERGE" if "broken" in c.name else "PASS", timings_ms={"total": c.ms})
        for c in cells
    }
    names = lambda picked: [c.name for c in picked]  # noqa: E731
    assert names(_sample(cells, baseline_of, 3, family="triton")) == ["tri-extend", "tri-decode", "tri-extend-broken"]
    assert names(_sample(cells, baseline_of, 5, family="triton"))[4] in ("probe-a", "hybrid")
    assert names(_sample(cells, baseline_of, 2, family="common")) == ["probe-a", "probe-b"]
    assert names(_sample(cells, baseline_of, 2)) == ["probe-a", "probe-b"]


def test_only_a_mutant_that_built_something_different_tries_every_cell():
    """``--survivors-every-cell`` sends a mutant on to every other reaching cell only where a
    sampled cell built other metadata or another output than its baseline (a survivor so far); a
    mutant whose cells built the same stays a suspected equivalent over its sample."""
    from sglfix.execution.mutate import _built_different
    from sglfix.harness.result import CellResult

    def cell(scenario, toggles, metadata, output="o"):
        return CellResult(scenario, toggles, "cpu", fingerprint={"metadata": metadata, "output": output})

    baselines = {"a": cell("a", [], "m"), "b": cell("b", [], "m")}
    results = [
        cell("a", ["+m-same"], "m"),
        cell("b", ["+m-same"], "m"),
        cell("a", ["+m-meta"], "m"),
        cell("b", ["+m-meta"], "other"),
        cell("a", ["+m-out"], "m", output="p"),
        cell("c", ["+m-nobase"], "x"),
        cell("a", ["+m-undigested"], None),  # nothing to tell it equivalent by: a survivor so far
    ]
    assert _built_different(results, baselines) == {"m-meta", "m-out", "m-undigested"}


# A candidate fix nothing sees alone (one split per request: split-K merges the same softmax)
# that makes the lower clamp load-bearing: EQUIVALENT's mutant (min=0) is then zero splits.
ONE_SPLIT = (
    "TritonAttnBackend.get_num_kv_splits",
    "(seq_lens.to(torch.int32) + _KV_SPLIT_TILE - 1) // _KV_SPLIT_TILE,",
    "(seq_lens.to(torch.int32) + _KV_SPLIT_TILE - 1) // _KV_SPLIT_TILE * 0,",
)
# A mutant of the very line the fix rewrites: no mutant of it exists atop the fix.
OF_THE_FIXED_LINE = (
    "TritonAttnBackend.get_num_kv_splits",
    "(seq_lens.to(torch.int32) + _KV_SPLIT_TILE - 1) // _KV_SPLIT_TILE,",
    "(seq_lens.to(torch.int32) + _KV_SPLIT_TILE) // _KV_SPLIT_TILE,",
)


def test_a_campaign_atop_a_fix_judges_its_mutants_on_the_fixed_code(tmp_path):
    from sglfix.execution.mutate import Choice, campaign_report, run_campaign
    from sglfix.execution.runner import Target
    from sglfix.execution.settings import Settings
    from sglfix.report.mutation import Selection, check_mutation_report
    from sglfix.toggling.candidate import load_candidates
    from sglfix.toggling.registry import load_registry

    cb = get_codebase("reproduction")
    fix_path = tmp_path / "one-split.patch"
    fix_path.write_text(_plant(*ONE_SPLIT).diff)
    fixes = load_candidates([str(fix_path)], codebase=cb)
    target = Target(
        profile=cb, registry=load_registry(cb.toggles_dir).with_candidates(fixes), codebase=cb, candidates=fixes
    )
    masked, rewritten = _plant(*EQUIVALENT), _plant(*OF_THE_FIXED_LINE)
    settings = Settings(scenario=SELECT[:1], device="cpu", jobs=2, timeout=120, no_cache=True)
    campaign = run_campaign(settings, target, choice=Choice(given=(masked, rewritten), all_cells=True), progress=_quiet)
    report = campaign_report(campaign, command=["sglfix", "mutate"], profile=cb, selection=Selection(), applied=fixes)
    check_mutation_report(report, where="the report")
    # Every cell ran atop the fix, the baseline too: the baseline passes, and the clamp the fix
    # leans on is what the mutant takes away (alone it is a suspected equivalent: the fixture).
    assert [list(b.toggles) for b in campaign.baselines] == [[fixes[0].id]]
    assert campaign.baselines[0].verdict == "PASS"
    by_id = {m["id"]: m for m in report["mutants"]}
    assert by_id[masked.id]["status"] == "killed", by_id[masked.id]
    assert rewritten.id not in by_id
    assert any(rewritten.id in n and "+one-split rewrites its line" in n for n in report["notes"]), report["notes"]
    assert report["applied"] == [{"id": "+one-split", "title": fixes[0].title, "sha256": fixes[0].sha256}]
