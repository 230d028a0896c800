"""The bisect and release bisect reports as models (``sglfix.report.bisect``,
``sglfix.report.release_bisect``): closed, written with the keys their files have always had, in
that order, and read back to the same file; the comparison of a search without and with a
candidate fix."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from sglfix.execution.bisection import Found, report_of
from sglfix.execution.release_bisect import ReleaseRun, ReleaseSearch
from sglfix.report.bisect import Answer, BisectReport, Culprit, Group, Masking, compare_with_fix
from sglfix.report.release_bisect import (
    ChangedFunction,
    ChangedReached,
    DifferingCell,
    ReleaseBisectReport,
    ReleaseFound,
)

# The keys of ``sglfix bisect --json``, in the order the file has them; shard and apply only
# where the run had them.
BISECT_KEYS = [
    "schema", "tool", "command", "date", "wall_s", "device", "device_name", "codebase", "candidates", "runs",
    "masking_runs", "sets_run", "reachability", "cells", "culprits", "masking", "left_out", "groups",
    "worker_replacements", "shard", "plan", "apply",
]  # fmt: skip
PLAN = {"command": "bisect", "profile": "reproduction", "toggles": "sha256:0", "cells": "4 cells, sha256:1"}
CODEBASE = {"name": "reproduction", "distribution": "sglfix (reproduction)", "version": "0.1.0", "path": "backends"}


def _found() -> Found:
    culprit = Culprit(
        ids=["26651:fixture"],
        verdict="DIVERGE",
        scenarios=["g@a"],
        key_figure="max abs err 1.28",
        key_scenario="g@a",
        found_by="search",
    )
    group = Group(group="g", scenarios=2, culprits=[culprit], unreachable=["26738"], searched=2, runs=2, swept=0)
    masking = Masking(group="g", culprit="26651:fixture", masked_by="26651:clamp", scenarios=["g@a"], all=True)
    cells = SimpleNamespace(sets={(), ("26651:fixture",), ("26651:clamp",), ("26651:fixture", "26651:clamp")})
    cells.results = {(s, n): None for s in cells.sets for n in ("g@a", "g@b")}
    return Found(
        groups=[group],
        masking=[masking],
        masking_sets={("26651:fixture", "26651:clamp")},
        skipped=["h@a"],
        known_base=[],
        info={"device": "cpu", "device_name": "cpu", "codebase": CODEBASE},
        replacements=[],
        cells=cells,
        record=("f",),
    )


def test_a_bisect_report_has_its_keys_in_order_and_reads_back_the_same():
    plain = report_of(_found(), command="sglfix bisect", wall_s=1.5, candidates=3, plan=PLAN).to_json()
    assert list(plain) == [k for k in BISECT_KEYS if k not in ("shard", "apply")]
    assert (plain["runs"], plain["masking_runs"], plain["sets_run"], plain["cells"]) == (2, 1, 3, 8)
    assert plain["culprits"] == [{**plain["groups"][0]["culprits"][0], "group": "g"}]
    assert list(plain["culprits"][0])[-1] == "group"
    assert plain["left_out"] == {"skip": ["h@a"], "known": []} and plain["reachability"] is True
    assert plain["codebase"] == CODEBASE and plain["plan"] == PLAN  # the keys they were given, no more
    fixed = Answer(culprits=[("g", "26651:fixture", "DIVERGE")])
    applied = compare_with_fix(["+fix"], unfixed=fixed, fixed=fixed, candidates=[])
    full = report_of(
        _found(), command="sglfix bisect", wall_s=1.5, candidates=3, plan=PLAN, shard="1/2", apply=applied
    ).to_json()
    assert list(full) == BISECT_KEYS and full["shard"] == "1/2"
    text = json.dumps(full)
    assert json.dumps(BisectReport.model_validate(json.loads(text)).to_json()) == text


def test_a_bisect_report_is_closed():
    data = report_of(_found(), command="sglfix bisect", wall_s=1.5, candidates=3, plan=PLAN).to_json()
    with pytest.raises(ValidationError, match="extra"):
        BisectReport.model_validate({**data, "culprit": []})
    data["groups"][0]["culprits"][0]["verdict"] = "FAILED"
    with pytest.raises(ValidationError, match="verdict"):
        BisectReport.model_validate(data)


def test_the_search_with_and_without_a_fix_is_compared():
    a, b = ("g", "1", "DIVERGE"), ("g", "2", "INVARIANT")
    same = compare_with_fix(["+f"], unfixed=Answer(culprits=[a]), fixed=Answer(culprits=[a]), candidates=[])
    assert same.same and same.without_fix[0].ids == ["1"] and not same.only_with_fix
    more = compare_with_fix(["+f"], unfixed=Answer(culprits=[a]), fixed=Answer(culprits=[a, b]), candidates=[])
    assert more.same and [r.ids for r in more.only_with_fix] == [["2"]] and "1 more" in more.outcome
    hides = compare_with_fix(["+f"], unfixed=Answer(culprits=[a, b]), fixed=Answer(culprits=[b]), candidates=[])
    assert not hides.same and [r.ids for r in hides.only_without_fix] == [["1"]] and "hides" in hides.outcome
    failing = compare_with_fix(["+f"], unfixed=Answer(failing_baseline="boom"), fixed=Answer(), candidates=[])
    assert failing.same and failing.without_fix == "boom" and "baseline fails (boom)" in failing.outcome


def _release_search(first_bad: str | None) -> tuple[ReleaseSearch, ReleaseFound]:
    releases = ["0.5.21", "0.5.22", "0.5.23"]

    def run(version: str) -> ReleaseRun:
        if version == "0.5.22" and first_bad != "0.5.22":
            return ReleaseRun(version, untestable="no profile covers it", exit=2)
        bad = first_bad is not None and releases.index(version) >= releases.index(first_bad)
        return ReleaseRun(version, verdicts={"baseline::s": "DIVERGE" if bad else "PASS"}, path="sglang")

    search = ReleaseSearch(releases, run=run)
    return search, search.search()


def test_a_release_bisect_report_has_the_searchs_keys_in_its_order():
    _, found = _release_search("0.5.23")
    changed = ChangedReached(
        modules=1,
        changed_functions=1,
        functions=[ChangedFunction(function="m.f", file="m.py", line=3, diff="-a\n+b\n")],
    )
    report = ReleaseBisectReport.of(
        found, command="sglfix bisect --releases", date="d", wall_s=1.0, distribution="sglang", changed_reached=changed
    )
    data = report.to_json()
    header = ["schema", "tool", "command", "date", "wall_s", "distribution"]
    assert list(data) == [*header, *ReleaseFound.model_fields, "changed_reached"]
    assert data["differing_cells"] == [{"cell": "baseline::s", "reference": "PASS", "0.5.23": "DIVERGE"}]
    # A run that could not be tested says why, one that ran counts its verdicts: never both.
    assert [sorted(r) for r in data["runs"]] == [
        ["exit", "path", "release", "summary", "wall_s"],
        ["exit", "path", "release", "untestable", "wall_s"],
        ["exit", "path", "release", "summary", "wall_s"],
    ]
    text = json.dumps(data)
    assert json.dumps(ReleaseBisectReport.model_validate(json.loads(text)).to_json()) == text
    _, none = _release_search(None)
    quiet = ReleaseBisectReport.of(none, command="c", date="d", wall_s=1.0, distribution="sglang").to_json()
    assert "differing_cells" not in quiet and "changed_reached" not in quiet and quiet["first_bad"] is None


def test_a_differing_cell_is_written_under_its_release_and_read_back():
    cell = DifferingCell(cell="c", reference=None, release="0.5.23", verdict="NAN")
    assert cell.model_dump() == {"cell": "c", "reference": None, "0.5.23": "NAN"}
    assert DifferingCell.model_validate(cell.model_dump()) == cell
    with pytest.raises(ValidationError):
        DifferingCell.model_validate({"cell": "c", "reference": "PASS", "0.5.23": "NAN", "0.5.24": "PASS"})


def test_a_release_bisect_report_given_for_a_run_report_is_named_for_what_it_is(tmp_path):
    from sglfix.common.errors import ConfigError
    from sglfix.report.load import load_report

    _, found = _release_search("0.5.23")
    path = tmp_path / "releases.json"
    report = ReleaseBisectReport.of(found, command="c", date="d", wall_s=1.0, distribution="sglang")
    path.write_text(json.dumps(report.to_json()))
    with pytest.raises(ConfigError, match=r"is a release bisect report \(sglfix bisect --releases --json\), not a run"):
        load_report(str(path))
