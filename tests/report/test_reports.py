"""Report files for CI: JUnit XML, the Markdown summary (and $GITHUB_STEP_SUMMARY), the heatmap;
their paths checked before any cell runs."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from builders import HARNESS_FAILS, ROOT
from clihelp import assert_one_line_error, run_cli

from sglfix.common.verdicts import LOOKS

PASSING = "triton-decode@cg=eager,gpu_only=off"
# Reverting 26651:clamp makes this one INVARIANT; under the whole-toggle matrix, 26651 DIVERGEs and
# 26738 CRASHes there, both as their toggles' expectations say.
GLUE = "triton-draft-extend-v2@cg=graph,builder=glue,gpu_only=off"


def _junit(path):
    from junitparser import JUnitXml

    xml = JUnitXml.fromfile(str(path))
    return {(case.classname, case.name): case for suite in xml for case in suite}


def _kinds(case) -> list[str]:
    return [type(r).__name__ for r in case.result]


def test_run_writes_junit_and_markdown_and_appends_to_the_step_summary(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    out = {k: tmp_path / f"r.{k}" for k in ("json", "xml", "md")}
    r = run_cli(
        "run",
        "-r",
        "26651:clamp",
        "-s",
        PASSING,
        "-s",
        GLUE,
        "--device",
        "cpu",
        "--json",
        str(out["json"]),
        "--junit",
        str(out["xml"]),
        "--markdown",
        str(out["md"]),
        env={"GITHUB_STEP_SUMMARY": str(summary)},
        subprocess=True,
    )
    assert r.code == 1, r.err
    report = json.loads(out["json"].read_text())
    verdicts = {c["scenario"]: c for c in report["cells"]}
    assert verdicts[PASSING]["verdict"] == "PASS" and verdicts[GLUE]["verdict"] == "INVARIANT"

    cases = _junit(out["xml"])
    assert set(cases) == {("26651:clamp", PASSING), ("26651:clamp", GLUE)}
    assert cases[("26651:clamp", PASSING)].is_passed
    bad = cases[("26651:clamp", GLUE)]
    assert _kinds(bad) == ["Failure"]
    key = next(f["message"] for f in verdicts[GLUE]["findings"] if f["verdict"] == "INVARIANT")
    assert bad.result[0].type == "INVARIANT" and bad.result[0].message == key
    assert key in bad.result[0].text and "INVARIANT: " in bad.result[0].text
    assert bad.time == pytest.approx(verdicts[GLUE]["timings_ms"]["total"] / 1000, rel=1e-3)

    md = out["md"].read_text()
    assert md.startswith("### sglfix run\n")
    assert "**2 cells** of built-in reproduction on cpu" in md and "1 PASS, 1 INVARIANT" in md
    assert f"| `{PASSING}` | {LOOKS['PASS'].letter} |" in md and f"| `{GLUE}` | INVARIANT |" in md
    assert "kv\\_indptr not monotone" in md  # the key figure, escaped
    assert summary.read_text() == "earlier step\n" + md


def test_matrix_junit_reflects_the_gate(tmp_path):
    # Without 26651's expectation on glue-built batches its DIVERGE there is unexpected (stray);
    # 26738's CRASH stays expected.
    toggles = tmp_path / "toggles"
    shutil.copytree(ROOT / "toggles", toggles)
    f = toggles / "26651.yaml"
    line = '  - {revert: "26651", scenario: "triton-draft-extend-v2*cg=graph*builder=glue*", verdict: [DIVERGE]}\n'
    assert line in f.read_text()
    f.write_text(f.read_text().replace(line, ""))
    xml, md, png = tmp_path / "m.xml", tmp_path / "m.md", tmp_path / "m.png"
    r = run_cli(
        "--toggles",
        str(toggles),
        "matrix",
        "-s",
        GLUE,
        "--device",
        "cpu",
        "--junit",
        str(xml),
        "--markdown",
        str(md),
        "--heatmap",
        str(png),
        env={"GITHUB_STEP_SUMMARY": ""},
        subprocess=True,
    )
    assert r.code == 1, r.err  # the stray verdict fails the gate
    cases = _junit(xml)
    assert len(cases) == 7 and {c for c, _ in cases} >= {"baseline", "26651", "26738"}
    stray = cases[("26651", GLUE)]
    assert _kinds(stray) == ["Failure"] and stray.result[0].type == "DIVERGE"
    assert "unexpected DIVERGE" in stray.result[0].text
    expected = cases[("26738", GLUE)]
    assert expected.is_passed and expected.system_out.startswith("expected CRASH: ")
    assert sum(not c.is_passed and not c.is_skipped for c in cases.values()) == 1
    skipped = [c for c in cases.values() if c.is_skipped]  # unreached: marked, not run, never a pass
    assert skipped and all(c.result[0].message.startswith("not reached: ") for c in skipped)
    text = md.read_text()
    assert "**Gate: FAILED**" in text and "Unexpected verdicts:" in text and "`26651` on" in text
    assert any(line.startswith("| scenario | `baseline` |") for line in text.splitlines())
    _assert_png(png, min_px=(300, 150))


def test_an_error_cell_is_a_junit_error(tmp_path):
    # A toggle that applies and hands sglfix's guard check a buffer list it cannot read: sglfix
    # cannot judge the cell.
    toggles = tmp_path / "toggles"
    toggles.mkdir()
    (toggles / "88888.yaml").write_text(HARNESS_FAILS)
    xml = tmp_path / "e.xml"
    r = run_cli(
        "--toggles",
        str(toggles),
        "run",
        "-r",
        "88888",
        "-s",
        "triton-decode@cg=eager,gpu_only=off",
        "--device",
        "cpu",
        "--junit",
        str(xml),
        subprocess=True,
    )
    assert r.code == 1, r.err
    (case,) = _junit(xml).values()
    assert _kinds(case) == ["Error"] and case.result[0].type == "ERROR" and "sglfix failed" in case.result[0].message


def _assert_png(path: Path, *, min_px: tuple[int, int], max_px: tuple[int, int] = (4000, 8000)) -> tuple[int, int]:
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) < 1_500_000
    h, w = matplotlib.image.imread(str(path)).shape[:2]
    assert min_px[0] <= w <= max_px[0] and min_px[1] <= h <= max_px[1], (w, h)
    return w, h


def _bad(*args, **kw):
    t0 = time.monotonic()
    r = run_cli(*args, **kw)
    assert time.monotonic() - t0 < 30  # refused before the workers run a cell
    return r


@pytest.mark.parametrize(
    "option,name,needle",
    [
        ("--junit", "r.txt", ".xml"),
        ("--junit", "-", "stdout"),
        ("--markdown", "r.json", ".md"),
        ("--heatmap", "r.jpg", ".png or .svg"),
        ("--heatmap", "no/such/dir/r.png", "does not exist"),
        ("--markdown", "no/such/dir/r.md", "does not exist"),
    ],
)
def test_bad_report_paths_are_one_line_errors_before_any_cell(tmp_path, option, name, needle):
    report = tmp_path / "r.json"
    path = name if name == "-" else str(tmp_path / name)
    r = _bad("matrix", "-s", PASSING, "--device", "cpu", "--json", str(report), option, path)
    assert_one_line_error(r, option, needle)
    assert not report.exists()


def test_run_has_no_heatmap_but_checks_its_other_paths(tmp_path):
    r = _bad("run", "-s", PASSING, "--device", "cpu", "--junit", str(tmp_path))
    assert_one_line_error(r, "--junit")
    assert _bad("run", "-s", PASSING, "--device", "cpu", "--heatmap", str(tmp_path / "h.png")).code == 2


def test_missing_matplotlib_is_a_one_line_error_with_the_install_hint(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    r = _bad(
        "matrix",
        "-s",
        PASSING,
        "--device",
        "cpu",
        "--heatmap",
        str(tmp_path / "h.png"),
        env={"PYTHONPATH": str(hide)},
        subprocess=True,
    )
    assert_one_line_error(r, "--heatmap", "pip install 'sglfix[plot]'")


VERDICT_CYCLE = ["PASS"] * 20 + ["DIVERGE", "CRASH", "INVARIANT", "NAN", "SYNC", "SKIP", "ERROR", "FAULT", "TIMEOUT"]


def _big_report(n_groups: int = 31, per_group: int = 5, n_sets: int = 25) -> dict:
    """155 scenarios (31 base names x 5 variants, as long as the real names) x 25 toggle sets."""
    sets = [[]] + [[f"2{i:04d}:part-{i}"] + ([f"2{i:04d}:other-part"] if i % 4 == 0 else []) for i in range(1, n_sets)]
    cells = []
    k = 0
    for g in range(n_groups):
        for v in range(per_group):
            name = f"backend{g % 4}-mode-number-{g}@mode=DRAFT_EXTEND_V2,ps={16 * (v + 1)},cg=graph-padded,v={v}"
            for toggles in sets:
                if (g, v, len(toggles)) == (3, 3, 2):
                    continue  # a cell that did not run
                verdict = VERDICT_CYCLE[k % len(VERDICT_CYCLE)] if toggles else "PASS"
                k += 7
                label = ",".join(toggles) or "baseline"
                cells.append(
                    {
                        "id": f"{label}::{name}",
                        "scenario": name,
                        "toggles": toggles,
                        "device": "cpu",
                        "verdict": verdict,
                        "findings": []
                        if verdict == "PASS"
                        else [{"verdict": verdict, "message": f"{verdict.lower()} | <b>*why*</b>"}],
                        "error": None,
                        "timings_ms": {"total": 12.5},
                        "revert_env": label,
                    }
                )
    return {
        "tool": "sglfix",
        "command": "sglfix matrix --parts",
        "device": "cpu",
        "device_name": "cpu",
        "wall_s": 99.0,
        "date": "2026-01-01T00:00:00+00:00",
        "cells": cells,
        "summary": {},
        "expectations": [],
        "stray": [],
        "not_run": [],
    }


def test_a_155_by_25_heatmap_stays_legible_and_small(tmp_path):
    from sglfix.report.heatmap import write_heatmap

    report = _big_report()
    assert len({c["scenario"] for c in report["cells"]}) == 155
    png, svg = tmp_path / "big.png", tmp_path / "big.svg"
    write_heatmap(report, str(png))
    w, h = _assert_png(png, min_px=(1000, 2500), max_px=(2600, 5000))
    assert h > w  # rows grow downwards; columns stay narrow
    write_heatmap(report, str(svg))
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()[:2000]


def test_markdown_groups_a_large_grid_by_base_name_and_escapes_text():
    from sglfix.report.markdown import render_markdown

    report = _big_report()
    md = render_markdown(report)
    grid = [line for line in md.splitlines() if line.startswith("| `backend")]
    assert len(grid) == 31  # one row per base name, not 155
    assert grid[0].startswith("| `backend0-mode-number-0@*` (5) |") and grid[0].count("|") == 27
    assert "Columns: t0 `baseline`, t1 `20001:part-1`" in md
    small = dict(report, cells=[c for c in report["cells"] if c["scenario"].startswith("backend1-mode-number-1@")])
    rows = [line for line in render_markdown(small, gate=False).splitlines() if line.startswith("| `backend")]
    assert len(rows) == 5
    assert "<b>" not in render_markdown(small, gate=False) and "\\<b\\>" in render_markdown(small, gate=False)


def test_a_group_cell_counts_not_reached_apart_from_its_worst_verdict():
    from sglfix.report.markdown import render_markdown

    report = _big_report(n_groups=31, per_group=5, n_sets=2)
    toggle = "20001:part-1"
    group = [
        c for c in report["cells"] if c["toggles"] == [toggle] and c["scenario"].startswith("backend0-mode-number-0@")
    ]
    for c, verdict in zip(group, ["DIVERGE", "DIVERGE", "DIVERGE", "NOT_REACHED", "NOT_REACHED"]):
        c["verdict"] = verdict
    unreached = [
        c for c in report["cells"] if c["toggles"] == [toggle] and c["scenario"].startswith("backend1-mode-number-1@")
    ]
    for c in unreached:
        c["verdict"] = "NOT_REACHED"
    mixed = [
        c for c in report["cells"] if c["toggles"] == [toggle] and c["scenario"].startswith("backend2-mode-number-2@")
    ]
    for c, verdict in zip(mixed, ["PASS", "PASS", "PASS", "PASS", "NOT_REACHED"]):
        c["verdict"] = verdict
    rows = {
        line.split("|")[1].strip(): line.split("|")[3].strip()
        for line in render_markdown(report).splitlines()
        if line.startswith("| `backend")
    }
    assert rows["`backend0-mode-number-0@*` (5)"] == "DIVERGE 3/5, 2 not reached"
    assert rows["`backend1-mode-number-1@*` (5)"] == "NOT_REACHED"
    assert rows["`backend2-mode-number-2@*` (5)"].endswith("4/5, 1 not reached")


def _gate_report() -> dict:
    def cell(toggles, scenario, verdict):
        return {
            "id": f"{','.join(toggles) or 'baseline'}::{scenario}",
            "scenario": scenario,
            "toggles": toggles,
            "verdict": verdict,
            "findings": [] if verdict == "PASS" else [{"verdict": verdict, "message": f"{verdict} here"}],
            "timings_ms": {"total": 1000.0},
        }

    cells = [
        cell([], "a@x", "PASS"),
        cell(["1"], "a@x", "DIVERGE"),
        cell(["1"], "b@y", "CRASH"),
        cell(["2"], "a@x", "PASS"),
        cell(["2"], "b@y", "SKIP"),
        cell(["3"], "a@x", "ERROR"),
        cell(["3"], "b@y", "FAULT"),
    ]
    return {
        "command": "sglfix matrix",
        "cells": cells,
        "expectations": [
            {
                "toggle": "1",
                "revert": ["1"],
                "scenario": "a*",
                "wanted": ["DIVERGE"],
                "met": True,
                "got": {"a@x": "DIVERGE"},
            },
            {
                "toggle": "2",
                "revert": ["2"],
                "scenario": "a*",
                "wanted": ["INVARIANT"],
                "met": False,
                "got": {"a@x": "PASS"},
            },
            {
                "toggle": "3",
                "revert": ["3"],
                "scenario": "b*",
                "wanted": ["FAULT"],
                "met": True,
                "got": {"b@y": "FAULT"},
            },
        ],
        "stray": [{"toggles": ["1"], "scenario": "b@y", "verdict": "CRASH", "why": "not covered"}],
        "not_run": [],
    }


def test_junit_gate_and_run_modes_from_a_report_dict(tmp_path):
    from sglfix.report.junit import write_junit

    report = _gate_report()
    gate, run = tmp_path / "gate.xml", tmp_path / "run.xml"
    write_junit(report, str(gate), gate=True)
    write_junit(report, str(run), gate=False)
    g, r = _junit(gate), _junit(run)
    assert g[("1", "a@x")].is_passed and g[("1", "a@x")].system_out.startswith("expected DIVERGE: DIVERGE here")
    assert _kinds(g[("1", "b@y")]) == ["Failure"]  # stray
    assert _kinds(g[("2", "a@x")]) == ["Failure"]  # PASS, but its expectation is unmet
    assert "expectation unmet" in g[("2", "a@x")].result[0].text
    assert _kinds(g[("2", "b@y")]) == ["Skipped"]
    assert _kinds(g[("3", "a@x")]) == ["Error"]  # ERROR fails the gate always
    assert g[("3", "b@y")].is_passed  # an expected FAULT passes the gate
    assert _kinds(r[("1", "a@x")]) == ["Failure"] and _kinds(r[("2", "a@x")]) == []
    assert _kinds(r[("3", "b@y")]) == ["Error"] and _kinds(r[("2", "b@y")]) == ["Skipped"]
    assert r[("1", "a@x")].time == 1.0
    from sglfix.report.markdown import render_markdown

    md = render_markdown(report)
    assert "**Gate: FAILED**: 2/3 expectations met, 1 unexpected verdict(s), 1 ERROR cell(s)" in md
    assert "Unmet expectations:" in md and "wanted INVARIANT, got PASS" in md


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("sglfix --release 0.5.13 matrix --parts", "sglfix matrix"),
        ("sglfix --wheels w --release 0.5.13 --codebase-version 0.5.9 run -r 1", "sglfix run"),
        ("sglfix --profile sglang-0.5.23 report merge a.json b.json", "sglfix report merge"),
        ("sglfix --debug matrix", "sglfix matrix"),
    ],
)
def test_the_markdown_names_the_command_past_every_global_option(line, shown):
    from sglfix.report.markdown import _command

    assert _command({"command": line}) == shown
