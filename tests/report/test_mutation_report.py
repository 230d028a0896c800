"""A mutation campaign's report (sglfix.report.mutation, mutation_render): each mutant's status from
the one judgement of its cells, the scores and their denominator, the --fail-under gate, the
schema, and the Markdown and JUnit renderings. Reports are built by hand: no cell runs."""

from __future__ import annotations

import json

import pytest

from sglfix.common.errors import ConfigError
from sglfix.mutation.model import Mutant, mutant_id
from sglfix.report.mutation import (
    NO_DIGEST,
    OUTPUT,
    VIEWS,
    MutantResult,
    ScenarioRun,
    Status,
    build_mutation_report,
    built_differently,
    check_fail_under,
    check_mutation_report,
    classify_report,
    fail_under,
    family_of,
    hint,
    load_mutation_report,
    mode_of,
)
from sglfix.report.mutation_render import render_console, render_markdown, write_junit
from sglfix.report.output import write_json

TRITON = "backends/srt/layers/attention/triton_backend.py"
FLASHINFER = "backends/srt/layers/attention/flashinfer_backend.py"
EAGLE = "backends/srt/speculative/eagle_utils.py"


def _mutant(name: str, *, path: str = TRITON, function: str | None = None, line: int = 10) -> Mutant:
    function = function or f"srt.layers.attention.triton_backend.TritonAttnBackend.{name}"
    original, mutated = f"{name}_len = seq_lens_sum", f"{name}_len = seq_lens_sum + 1"
    return Mutant(
        id=mutant_id(function=function, operator="plus-one", line=line, original=original, mutated=mutated),
        function=function,
        path=path,
        line=line,
        end_line=line,
        operator="plus-one",
        original=original,
        mutated=mutated,
        description="+ 1 on seq_lens_sum",
        diff=f"--- a/{path}\n+++ b/{path}\n",
    )


def _cell(scenario: str, verdict: str, mutant: Mutant | None = None, *, fingerprint: dict | None = None) -> dict:
    toggles = ["+" + mutant.id] if mutant else []
    cell = {
        "id": f"{','.join(toggles) or 'baseline'}::{scenario}",
        "scenario": scenario,
        "toggles": toggles,
        "verdict": verdict,
        "findings": [] if verdict == "PASS" else [{"verdict": verdict, "message": f"{verdict.lower()} seen"}],
    }
    if fingerprint is not None:
        cell["fingerprint"] = fingerprint
    return cell


# Baselines: s1 and s3 pass (fingerprinted), s2 fails by itself (DIVERGE), s4 SKIPs here.
FP1 = {"metadata": "a1" * 32, "output": "b1" * 32}
FP3 = {"metadata": "a3" * 32, "output": "b3" * 32}
BASE = [_cell("s1", "PASS", fingerprint=FP1), _cell("s2", "DIVERGE"), _cell("s3", "PASS", fingerprint=FP3)]

M = {
    name: _mutant(name, line=10 + i)
    for i, name in enumerate(
        [
            "broken",
            "fault",
            "fixed",
            "changed",
            "timeout",
            "error",
            "survived",
            "same_failure",
            "equivalent",
            "one_unprinted",
            "output_moved",
            "timeout_pass",
            "kill_and_timeout",
        ]
    )
}
M["unreached"] = _mutant("init_forward_metadata_target_verify", path=FLASHINFER, function="srt.fi.X.target_verify")

MUTANT_CELLS = [
    _cell("s1", "DIVERGE", M["broken"]),  # PASS -> DIVERGE: BROKEN
    _cell("s1", "FAULT", M["fault"]),  # the worker died of the change
    _cell("s2", "PASS", M["fixed"]),  # DIVERGE -> PASS: FIXED
    _cell("s2", "NAN", M["changed"]),  # DIVERGE -> NAN: CHANGED
    _cell("s1", "TIMEOUT", M["timeout"]),
    _cell("s3", "PASS", M["timeout"], fingerprint=FP3),
    _cell("s1", "ERROR", M["error"]),
    _cell("s3", "TIMEOUT", M["error"]),
    _cell("s1", "PASS", M["survived"], fingerprint={"metadata": "ff" * 32, "output": FP1["output"]}),
    _cell("s2", "DIVERGE", M["same_failure"]),  # its baseline's own failure: nothing moved
    _cell("s1", "PASS", M["equivalent"], fingerprint=dict(FP1)),
    _cell("s3", "PASS", M["equivalent"], fingerprint=dict(FP3)),
    _cell("s1", "PASS", M["one_unprinted"], fingerprint=dict(FP1)),
    _cell("s3", "PASS", M["one_unprinted"]),  # no fingerprint: equivalence cannot be shown
    _cell("s1", "PASS", M["output_moved"], fingerprint={"metadata": FP1["metadata"], "output": "ee" * 32}),
    _cell("s1", "TIMEOUT", M["timeout_pass"]),  # TIMEOUT is never a kill, even where the baseline passed
    _cell("s1", "CRASH", M["kill_and_timeout"]),  # one kill is a kill, whatever its other cells did
    _cell("s3", "TIMEOUT", M["kill_and_timeout"]),
]

WANT = {
    "broken": Status.KILLED,
    "fault": Status.KILLED,
    "fixed": Status.KILLED,
    "changed": Status.KILLED,
    "timeout": Status.TIMEOUT,
    "error": Status.ERROR,
    "survived": Status.SURVIVED,
    "same_failure": Status.SURVIVED,
    "equivalent": Status.EQUIVALENT,
    "one_unprinted": Status.SURVIVED,
    "output_moved": Status.SURVIVED,
    "timeout_pass": Status.TIMEOUT,
    "kill_and_timeout": Status.KILLED,
    "unreached": Status.NOT_REACHED,
}
SCENARIOS = [
    ScenarioRun("s1", "triton", "DECODE", False),
    ScenarioRun("s2", "triton", "EXTEND", True),
    ScenarioRun("s3", "triton", "DECODE", True),
]


def _campaign() -> dict:
    return {"tool": "sglfix", "cells": BASE + MUTANT_CELLS}


def _report() -> dict:
    classified = classify_report(report=_campaign(), mutants=list(M.values()))
    return build_mutation_report(
        facts={
            "command": ["sglfix", "mutate", "-s", "s*"],
            "wall_s": 12.345,
            "device": "cpu",
            "profile": "repro",
            "selection": {"scenario": ["s*"], "function": [], "operators": ["plus-one"]},
            "phases": {"baseline_s": 1.5, "baseline_cells": 3, "mutant_cells": 16, "ran": 16, "served": 0},
            "catalogue": [
                {"toggle": "26651:clamp", "function": "pkg.f", "match": "exact", "mutant": "m-1", "change": "a -> b"},
                {"toggle": "21987:no-cpu-fast-path", "function": "pkg.g", "match": "none", "change": "(nothing) -> c"},
            ],
        },
        mutants=list(M.values()),
        classified=classified,
        scenarios=SCENARIOS,
    )


@pytest.fixture(scope="module")
def report() -> dict:
    return _report()


def _by_name(report: dict) -> dict[str, dict]:
    ids = {m.id: name for name, m in M.items()}
    return {ids[m["id"]]: m for m in report["mutants"]}


def test_each_mutant_gets_the_status_its_cells_show(report):
    got = {name: Status(m["status"]) for name, m in _by_name(report).items()}
    assert got == WANT


def test_a_kill_names_its_cell_and_both_verdicts(report):
    rows = _by_name(report)
    (kill,) = rows["broken"]["killed_by"]
    assert kill["cell"] == f"+{M['broken'].id}::s1"
    assert (kill["scenario"], kill["verdict"], kill["baseline"]) == ("s1", "DIVERGE", "PASS")
    assert kill["key_figure"] == "diverge seen"
    assert rows["fault"]["killed_by"][0]["verdict"] == "FAULT"
    assert (rows["fixed"]["killed_by"][0]["baseline"], rows["fixed"]["killed_by"][0]["verdict"]) == ("DIVERGE", "PASS")
    # Timeouts and errors are never kills: they are listed as not judged.
    assert rows["timeout_pass"]["killed_by"] == [] and rows["timeout_pass"]["not_judged"][0]["verdict"] == "TIMEOUT"
    assert {k["verdict"] for k in rows["error"]["not_judged"]} == {"ERROR", "TIMEOUT"}


def test_equivalent_only_with_matching_fingerprints_on_every_cell(report):
    rows = _by_name(report)
    assert rows["equivalent"]["evidence"] == {"cells": 2, "outputs_identical": True, "schedule": [], "reviewed": None}
    assert rows["equivalent"]["reached_by"] == ["s1", "s3"]
    for name in ("one_unprinted", "survived", "output_moved"):
        assert rows[name]["evidence"] is None, name
    assert "output changed in 1 cell(s)" in rows["output_moved"]["hint"]


def test_a_survivor_names_what_it_built_differently_field_by_field():
    m = _mutant("built_other_indices")
    base_fp = {"metadata": "a1" * 8, "output": "b1" * 8, "fields": {"kv_indptr": "11", "kv_indices": "22"}}
    other = {"metadata": "c1" * 8, "output": "d1" * 8, "fields": {"kv_indptr": "11", "kv_indices": "33"}}
    unprinted = _cell("s3", "PASS", m)
    base = {"s1": _cell("s1", "PASS", fingerprint=base_fp), "s3": _cell("s3", "PASS", fingerprint=FP3)}
    cells = [_cell("s1", "PASS", m, fingerprint=other), unprinted]
    report = {"tool": "sglfix", "cells": [*base.values(), *cells]}
    (got,) = classify_report(report=report, mutants=[m]).values()
    assert got.status is Status.SURVIVED
    # The field that differs, the output, and the cell that has nothing to compare; never kv_indptr.
    assert got.built_different == {"kv_indices": 1, OUTPUT: 1, NO_DIGEST: 1}
    said = hint(
        mutant=m, status=got.status, reached=SCENARIOS[:1], selected=SCENARIOS, built_different=got.built_different
    )
    assert "kv_indices in 1 cell(s) differently" in said and "kv_indptr" not in said
    # Digests that differ with no field to say where: the views themselves.
    assert built_differently(
        {"fingerprint": {**other, "fields": base_fp["fields"], "output": "b1" * 8}}, base["s1"]
    ) == [VIEWS]
    assert built_differently(base["s1"], base["s1"]) == []


def test_a_change_of_the_schedule_alone_is_an_equivalent_of_its_own_kind():
    def fp(meta: str, out: str, splits: str, indptr: str = "11") -> dict:
        fields = {"kv_indptr": indptr, "num_kv_splits": splits}
        return {"metadata": meta, "output": out, "fields": fields, "schedule": ["num_kv_splits"]}

    base = {
        "s1": _cell("s1", "PASS", fingerprint=fp("a1", "b1", "22")),
        "s3": _cell("s3", "PASS", fingerprint=fp("a3", "b3", "33")),
    }

    def status(*cells: dict) -> object:
        m = cells[0]["_m"]
        report = {
            "tool": "sglfix",
            "cells": [*base.values(), *({k: v for k, v in c.items() if k != "_m"} for c in cells)],
        }
        return classify_report(report=report, mutants=[m])[m.id]

    m = _mutant("fewer_splits")
    split = {**_cell("s1", "PASS", m, fingerprint=fp("c1", "d1", "99")), "_m": m}
    same = {**_cell("s3", "PASS", m, fingerprint=fp("a3", "b3", "33")), "_m": m}
    got = status(split, same)
    assert got.status is Status.EQUIVALENT
    assert got.evidence == {"cells": 2, "outputs_identical": False, "schedule": ["num_kv_splits"]}
    # Another field changed too: a survivor, naming both.
    m2 = _mutant("splits_and_indptr")
    both = {**_cell("s1", "PASS", m2, fingerprint=fp("c1", "d1", "99", indptr="12")), "_m": m2}
    got = status(both)
    assert got.status is Status.SURVIVED and set(got.built_different) == {"kv_indptr", "num_kv_splits", OUTPUT}
    # The output alone moved, the schedule did not: nothing explains it, a survivor.
    m3 = _mutant("output_alone")
    out_only = {**_cell("s1", "PASS", m3, fingerprint=fp("c1", "d1", "22")), "_m": m3}
    assert status(out_only).status is Status.SURVIVED


def test_a_baseline_that_did_not_run_to_a_verdict_judges_nothing():
    m = _mutant("over_a_failed_baseline")
    campaign = {"tool": "sglfix", "cells": [_cell("s5", "ERROR"), _cell("s5", "DIVERGE", m)]}
    c = classify_report(report=campaign, mutants=[m])[m.id]
    assert (c.status, c.killed_by, c.not_judged[0]["baseline"]) == (Status.ERROR, [], "ERROR")


def test_skipped_cells_alone_do_not_reach():
    m = _mutant("skipped_only")
    campaign = {"tool": "sglfix", "cells": [_cell("s4", "SKIP"), _cell("s4", "SKIP", m)]}
    c = classify_report(report=campaign, mutants=[m])[m.id]
    assert (c.status, c.skipped, c.reached_by) == (Status.NOT_REACHED, ["s4"], [])
    said = hint(mutant=m, status=c.status, reached=[], selected=SCENARIOS, skipped=c.skipped)
    assert "SKIP here" in said


def test_scores_count_each_status_and_score_only_killed_over_killed_and_survived(report):
    statuses = [s.value.replace("-", "_") for s in WANT.values()]
    overall = report["scores"]["overall"]
    for key in ("killed", "survived", "equivalent", "not_reached", "timeout", "error"):
        assert overall[key] == statuses.count(key), key
    assert overall["score"] == pytest.approx(overall["killed"] / (overall["killed"] + overall["survived"]))
    assert set(report["scores"]["families"]) == {"triton", "flashinfer"}
    fi = report["scores"]["families"]["flashinfer"]
    assert fi["not_reached"] == 1 and fi["score"] is None  # nothing judged: no score, not 0
    fn = report["scores"]["functions"][M["broken"].function]
    assert (fn["killed"], fn["score"]) == (1, 1.0)


def test_survivors_come_first_in_the_report(report):
    order = [m["status"] for m in report["mutants"]]
    assert order[0] == "survived" and order[-1] == "killed"
    assert order.index("not-reached") < order.index("equivalent") < order.index("killed")


def test_fail_under_passes_and_fails_on_the_exact_score(report):
    o = report["scores"]["overall"]
    exact = 100 * o["killed"] / (o["killed"] + o["survived"])
    ok, line = fail_under(report, exact)
    assert ok and "meets --fail-under" in line
    assert f"({o['killed']} killed / {o['killed'] + o['survived']})" in line
    assert "1 not reached, 1 equivalent, 2 timeout, 1 error" in line
    ok, line = fail_under(report, exact + 0.01)
    assert not ok and "is under --fail-under" in line
    # The shown figure never contradicts the verdict (rounding up to the limit would).
    shown = float(line.split("mutation score ")[1].split("%")[0])
    assert shown < exact + 0.01


def test_fail_under_with_nothing_judged_fails():
    m = _mutant("alone")
    report = build_mutation_report(
        facts={"command": "sglfix mutate", "wall_s": 0.1}, mutants=[m], classified={}, scenarios=SCENARIOS
    )
    assert report["mutants"][0]["status"] == "not-reached"
    ok, line = fail_under(report, 0)
    assert not ok and "no mutation score" in line and "1 not reached" in line


@pytest.mark.parametrize("value", ["120", "-1", "abc", "nan", "inf", True])
def test_check_fail_under_refuses_what_is_not_a_percentage(value):
    with pytest.raises(ConfigError) as info:
        check_fail_under(value)
    text = str(info.value)
    assert "\n" not in text and "--fail-under" in text and "give e.g. --fail-under 80" in text


def test_check_fail_under_reads_a_percentage():
    assert check_fail_under("80") == 80.0 and check_fail_under(72.5) == 72.5 and check_fail_under("90%") == 90.0
    assert check_fail_under(None) is None


def test_families_and_modes_come_from_the_path_and_the_name():
    assert family_of(TRITON) == "triton" and family_of(FLASHINFER) == "flashinfer"
    assert family_of("python/sglang/srt/layers/attention/flashinfer_mla_backend.py") == "flashinfer_mla"
    assert (
        family_of("x/trtllm_mla_backend.py") == "trtllm_mla" and family_of("x/deepseek_v4_backend.py") == "deepseek_v4"
    )
    assert family_of("x/flashattention_backend.py") == "fa3"
    assert (
        family_of(EAGLE) == "common" and family_of("python/sglang/srt/model_executor/forward_batch_info.py") == "common"
    )
    assert mode_of("a.B.init_forward_metadata_target_verify") == (("TARGET_VERIFY",), False)
    assert mode_of("a.B.init_forward_metadata_replay_cuda_graph") == ((), True)
    assert mode_of("a.FlashInferIndicesUpdaterDecode.update") == (("DECODE",), False)
    assert mode_of("a.B._draft_extend_replay")[0] == ("DRAFT_EXTEND", "DRAFT_EXTEND_V2")


def test_hint_names_the_missing_scenario():
    m = _mutant("v", path=FLASHINFER, function="srt.fi.FlashInferAttnBackend.init_forward_metadata_target_verify")
    only_triton = SCENARIOS
    assert hint(mutant=m, status="not-reached", reached=[], selected=only_triton) == (
        "no selected scenario runs the flashinfer backend"
    )
    decode = [*SCENARIOS, ScenarioRun("f1", "flashinfer", "DECODE", False)]
    assert hint(mutant=m, status="not-reached", reached=[], selected=decode) == (
        "no selected scenario runs TARGET_VERIFY on flashinfer"
    )
    verify = [*decode, ScenarioRun("f2", "flashinfer", "TARGET_VERIFY", False)]
    assert "yet none entered FlashInferAttnBackend.init_forward_metadata_target_verify" in hint(
        mutant=m, status="not-reached", reached=[], selected=verify
    )
    said = hint(mutant=m, status="survived", reached=SCENARIOS[:2], selected=SCENARIOS)
    assert said.startswith("reached by 2 cell(s) (DECODE, EXTEND; eager and graph), none changed")
    assert hint(mutant=m, status="killed", reached=SCENARIOS, selected=SCENARIOS) == ""


def test_markdown_lists_survivors_before_killed(report):
    text = render_markdown(report)
    survivors = text.index(f"**{report['scores']['overall']['survived']} survivor(s)**")
    assert survivors < text.index("not reached (no selected cell") < text.index("killed</summary>")
    for name in ("survived", "same_failure"):
        assert f"{TRITON}:{M[name].line}" in text
    assert "<details>" in text and "mutation score" in text


def test_console_renders_every_section(report):
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    for part in render_console(report):
        console.print(part)
    text = console.export_text()
    assert text.index("survivor(s)") < text.index("not reached") < text.index("suspected equivalent")
    assert "mutation score" in text.splitlines()[-1]


def test_junit_parses_back_with_one_testcase_per_mutant(report, tmp_path):
    from junitparser import Error, Failure, JUnitXml, Skipped

    path = tmp_path / "mutants.xml"
    write_junit(report, str(path))
    cases = [case for suite in JUnitXml.fromfile(str(path)) for case in suite]
    assert len(cases) == len(M)
    kinds: dict[str, int] = {}
    for case in cases:
        kind = type(case.result[0]).__name__ if case.result else "pass"
        kinds[kind] = kinds.get(kind, 0) + 1
    o = report["scores"]["overall"]
    assert kinds == {
        "pass": o["killed"],
        Failure.__name__: o["survived"],
        Skipped.__name__: o["not_reached"] + o["equivalent"],
        Error.__name__: o["timeout"] + o["error"],
    }
    by_name = {case.name.split()[0]: case for case in cases}
    survived = by_name[M["survived"].id]
    assert survived.classname == M["survived"].function
    assert survived.result[0].message == _by_name(report)["survived"]["hint"]
    assert "suspected equivalent" in by_name[M["equivalent"].id].result[0].message
    assert f"+{M['broken'].id}::s1" in by_name[M["broken"].id].system_out


def test_the_report_round_trips_and_its_schema_is_closed(report, tmp_path):
    path = tmp_path / "mutation.json"
    write_json(str(path), report)
    assert load_mutation_report(str(path)) == json.loads(path.read_text())
    with pytest.raises(ConfigError, match=r"an unknown key 'scorez' at the top \(did you mean 'scores'\?\)"):
        check_mutation_report({**report, "scorez": {}}, where="m.json")
    mutants = [dict(report["mutants"][0], colour="red"), *report["mutants"][1:]]
    with pytest.raises(ConfigError, match=r'"mutants\[0\]" has an unknown key \'colour\''):
        check_mutation_report({**report, "mutants": mutants}, where="m.json")
    # Scores that do not count the mutants listed (a hand edit, a cut file) are refused.
    with pytest.raises(ConfigError, match="do not count the mutants"):
        check_mutation_report({**report, "mutants": report["mutants"][1:]}, where="m.json")
    killed = next(i for i, m in enumerate(report["mutants"]) if m["status"] == "killed")
    bad = [dict(m) for m in report["mutants"]]
    bad[killed]["killed_by"] = []
    with pytest.raises(ConfigError, match="names the cells that killed it"):
        check_mutation_report({**report, "mutants": bad}, where="m.json")


def test_a_run_report_is_not_a_mutation_report(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"tool": "sglfix", "schema": 2, "cells": []}))
    with pytest.raises(ConfigError, match="is not a mutation report"):
        load_mutation_report(str(path))


def test_a_mutation_report_is_named_where_a_run_report_is_wanted(report, tmp_path):
    from sglfix.report.load import load_report

    path = tmp_path / "mutation.json"
    write_json(str(path), report)
    with pytest.raises(ConfigError, match=r"is a mutation report \(sglfix mutate --json\), not a run or matrix report"):
        load_report(str(path))


def test_a_mutant_result_carries_every_field_of_a_mutant():
    # sglfix.report stands on sglfix.common alone: it repeats the model's fields instead of importing it.
    assert set(Mutant.model_fields) <= set(MutantResult.model_fields)


def test_the_reports_catalogue_rows_are_the_catalogues_own():
    """The report keeps each catalogue row as ``sglfix.mutation.catalogue`` makes it."""
    from sglfix.mutation.catalogue import CatalogueRow
    from sglfix.report.mutation import CatalogueEntry

    assert set(CatalogueEntry.model_fields) == set(CatalogueRow.model_fields)
