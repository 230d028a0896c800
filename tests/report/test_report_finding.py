"""``sglfix report finding``: one cell written up as an upstream issue needs it, from a report,
with the functions of the code base the cell ran (run again here), on the reproduction and on real
sglang (where the profile's candidate fix that clears the finding is part of it)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli
from real_sglang import clean_env, require_sglang

NAME = "triton-draft-extend-v2@cg=graph,builder=kit,gpu_only=off"
FINDINGS = sorted((ROOT / "profiles").glob("*/findings/*"))
# Folders of a machine: a committed file that names one cannot be followed anywhere else.
MACHINE_FOLDER = re.compile(r"(?<![\w.~-])/(?:work|root|home|tmp|Users|var/folders|private|mnt|opt)/")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_a_reproduction_finding_names_the_scenario_the_command_and_the_code_it_ran(tmp_path):
    report = tmp_path / "r.json"
    r = run_cli(
        "run", "-s", NAME, "--device", "cpu", "-r", "26651:clamp", "--json", str(report), timeout=600, subprocess=True
    )
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]
    md = tmp_path / "f.md"
    f = run_cli("report", "finding", str(report), f"26651:clamp::{NAME}", "-o", str(md), timeout=600, subprocess=True)
    assert f.code == 0, f.out[-2000:] + f.err[-2000:]
    text = md.read_text()
    assert text.startswith(f"# {NAME}: INVARIANT\n")
    assert f"sglfix --profile reproduction run -s {NAME} --device cpu -r 26651:clamp" in text
    assert "```yaml\nname: triton-draft-extend-v2\n" in text
    assert "grid point `cg=graph,builder=kit,gpu_only=off`" in text
    # The reverted function ran, and the table says where it is defined.
    row = next(
        line for line in text.splitlines() if "TritonAttnBackend.init_forward_metadata_replay_cuda_graph`" in line
    )
    assert "srt/layers/attention/triton_backend.py:" in row
    assert "## A candidate fix" not in text  # the reproduction keeps none for this


def test_without_a_rerun_it_says_the_functions_are_not_listed(tmp_path):
    report = _report(tmp_path / "r.json", [{"scenario": NAME, "toggles": ["26651:clamp"], **_failed("INVARIANT")}])
    f = run_cli("report", "finding", str(report), f"26651:clamp::{NAME}", "--no-rerun", timeout=120)
    assert f.code == 0, f.err
    assert "Not run again here (--no-rerun)" in f.out and "| function | defined at |" not in f.out


def _report(path: Path, cells: list[dict], **top) -> Path:
    """A report as a run writes it, by hand: only what a finding reads."""
    data = {"tool": "sglfix", "schema": 2, "device": "cpu", **top, "cells": []}
    for c in cells:
        cell = {"toggles": [], "device": data["device"], "findings": [], **c}
        cell["id"] = f"{','.join(cell['toggles']) or 'baseline'}::{cell['scenario']}"
        data["cells"].append(cell)
    path.write_text(json.dumps(data))
    return path


def _failed(verdict: str, message: str = "what went wrong") -> dict:
    return {"verdict": verdict, "findings": [{"verdict": verdict, "message": message}]}


def test_a_cell_with_nothing_to_write_up_is_one_line_before_any_rerun(tmp_path):
    report = _report(
        tmp_path / "r.json",
        [
            {"scenario": NAME, "toggles": ["26651:clamp"], **_failed("INVARIANT")},
            {"scenario": NAME, "verdict": "PASS"},
            {"scenario": "triton-extend", "verdict": "SKIP", "findings": [{"verdict": "SKIP", "message": "no GPU"}]},
            {
                "scenario": "triton-extend",
                "toggles": ["26651:clamp"],
                "verdict": "NOT_REACHED",
                "findings": [{"verdict": "NOT_REACHED", "message": "not entered", "same_as": "SKIP"}],
            },
            {"scenario": "triton-decode@cg=eager,gpu_only=off", **_failed("ERROR", "the harness failed")},
        ],
    )
    failing = f"26651:clamp::{NAME}"
    for cell, needles in (
        (f"basline::{NAME}", ("has no cell", "did you mean", f"baseline::{NAME}")),
        (f"baseline::{NAME}", ("passed", "no failure to write up", failing)),
        ("baseline::triton-extend", ("SKIP", "no failure to write up", failing)),
        ("26651:clamp::triton-extend", ("NOT_REACHED", "write up baseline::triton-extend")),
        ("baseline::triton-decode@cg=eager,gpu_only=off", ("ERROR", "sglfix itself failed", failing)),
    ):
        # No --no-rerun: the refusal comes before any cell would run again (a worker would take seconds).
        assert_one_line_error(run_cli("report", "finding", str(report), cell, timeout=60), *needles)


def _finding(tmp_path: Path, report: Path, cell: str, *args: str, env: dict | None = None) -> str:
    out = tmp_path / "f.md"
    f = run_cli(
        "report",
        "finding",
        str(report),
        cell,
        "-o",
        str(out),
        *args,
        env=env,
        cwd=str(tmp_path),
        timeout=600,
        subprocess=True,
    )
    assert f.code == 0, f.out[-2000:] + f.err[-2000:]
    return out.read_text()


def _machine_folders(text: str) -> list[str]:
    here = [str(ROOT), str(Path.home()), os.getcwd(), "/tmp/"]
    return sorted({m.group(0) for m in MACHINE_FOLDER.finditer(text)} | {h for h in here if len(h) > 1 and h in text})


def test_a_finding_names_the_exact_sglfix_and_no_folder_of_the_machines(tmp_path):
    """The report's code base path, its command and its file live in folders of the machine that
    wrote them; the finding names none of them, installs the sglfix the report records from its
    source at that commit, and the engine release the profile is written for."""
    cell = "baseline::fimla-draft-topk1@cg=graph-padded"
    report = _report(
        tmp_path / "fimla.report.json",
        [{"scenario": "fimla-draft-topk1@cg=graph-padded", "device": "cuda", **_failed("DIVERGE")}],
        device="cuda",
        command=f"sglfix --profile sglang-0.5.23 run -s 'fimla-*' --json {tmp_path}/fimla.report.json",
        sglfix="0.1.0",
        flashinfer="0.7.2.post1",
        sglfix_source={"version": "0.1.0", "commit": COMMIT, "modified": 0, "url": "https://example.org/sglfix.git"},
        codebase={"name": "sglang-0.5.23", "distribution": "sglang", "version": "0.5.23", "path": "/tmp/sgsite/sglang"},
    )
    text = _finding(tmp_path, report, cell, "--no-rerun")
    assert not _machine_folders(text), _machine_folders(text)
    assert f"- sglfix: 0.1.0, commit `{COMMIT}`" in text
    git = f"git+https://example.org/sglfix.git@{COMMIT}"
    # The engine release the profile is written for, the GPU kernels the run had, sglfix at that commit.
    install = f'pip install --no-deps sglang==0.5.23 && pip install flashinfer-python==0.7.2.post1 && pip install "sglfix[sglang] @ {git}"'
    assert install in text
    assert "sglfix --profile sglang-0.5.23 run -s fimla-draft-topk1@cg=graph-padded --device cuda\n" in text
    assert "Recorded in `fimla.report.json`" in text
    assert "## Scenario (`profiles/sglang-0.5.23/scenarios/mla_dsv4.yaml`)" in text
    assert "`profiles/sglang-0.5.23/fixes/fimla-draft-plan.patch` (in sglfix's source tree" in text
    # The same release taken with --release: reproduced so, sglfix fetching it instead of pip installing it.
    data = json.loads(report.read_text())
    data["codebase"]["release"] = "0.5.23"
    report.write_text(json.dumps(data))
    text = _finding(tmp_path, report, cell, "--no-rerun")
    assert "sglfix --release 0.5.23 --profile sglang-0.5.23 run -s fimla-draft-topk1@cg=graph-padded" in text
    assert "sglang==" not in text


def test_expected_is_the_judges_own_tolerance_and_reference_dtype(tmp_path):
    """ "Expected" quotes the tolerance the judge applies to this scenario (its dtype's default, or
    its own) and the dtype the reference computes in on the cell's device."""
    from sglfix.scenario.models import DEFAULT_TOLERANCE

    scenarios = tmp_path / "mine.yaml"
    entry = "    backend: triton\n    mode: DECODE\n    batch: {prefix_lens: [9, 17]}\n    model: {dtype: bfloat16}\n"
    scenarios.write_text(
        f"scenarios:\n  - name: bf16-default\n{entry}  - name: bf16-own\n{entry}    tolerance: 0.003\n"
    )
    report = _report(
        tmp_path / "r.json",
        [{"scenario": "bf16-default", **_failed("DIVERGE")}, {"scenario": "bf16-own", **_failed("DIVERGE")}],
    )
    default = _finding(tmp_path, report, "baseline::bf16-default", "--no-rerun", "--scenario-file", str(scenarios))
    assert f"within tolerance {DEFAULT_TOLERANCE['bfloat16']:g} (the default for bfloat16;" in default
    # The judge's reference on CPU (sglfix.harness.reference) computes in float64.
    assert "the reference computes in float64 (its dtype on cpu)" in default
    assert "by more than tolerance x (1 + |reference|)" in default
    assert "--scenario-file mine.yaml" in default and str(tmp_path) not in default
    own = _finding(tmp_path, report, "baseline::bf16-own", "--no-rerun", "--scenario-file", str(scenarios))
    assert "within tolerance 0.003 (the scenario's `tolerance:`;" in own


def test_every_report_records_the_exact_sglfix_commit():
    """A report names the code that wrote it: sglfix's version and the commit of its checkout
    (here the repository's HEAD), and the report schema reads it back."""
    from sglfix.report.jsonreport import build_report
    from sglfix.report.schema import check_report

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = build_report(command=["sglfix"], info={}, results=[], cell_ids=[], wall_s=0.0, env_revert=None)
    src = report["sglfix_source"]
    assert src["commit"] == head and len(head) == 40
    assert isinstance(src["modified"], int) and src["version"]
    check_report(report, where="r.json", fix="rerun")


def test_a_regular_install_reads_the_commit_its_wheel_was_built_from(tmp_path):
    """Installed from a regular wheel, sglfix is no checkout: the commit comes from the file the
    build wrote beside the package (setup.py), and pip's record of a git install gives the address."""
    import importlib.util

    import sglfix.common.version as ours

    package = tmp_path / "site" / "sglfix"
    (package / "common").mkdir(parents=True)
    (package / "common" / "version.py").write_text(Path(ours.__file__).read_text())
    (package / "_source.json").write_text(json.dumps({"commit": COMMIT, "modified": 0, "url": None}))
    spec = importlib.util.spec_from_file_location("installed_version", package / "common" / "version.py")
    version = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(version)
    src = version.source()
    assert src["commit"] == COMMIT and src["modified"] == 0
    assert version.public_url("https://user:token@example.org/sglfix.git") == "https://example.org/sglfix.git"
    assert version.public_url("git@example.org:team/sglfix.git") == "https://example.org/team/sglfix.git"
    assert version.public_url(str(tmp_path)) is None and version.public_url(f"file://{tmp_path}") is None


@pytest.mark.parametrize("path", FINDINGS, ids=[p.name for p in FINDINGS])
def test_committed_findings_name_no_folder_of_a_machine(path):
    found = sorted({m.group(0) for m in MACHINE_FOLDER.finditer(path.read_text())})
    assert not found, f"{path.relative_to(ROOT)} names {found}: give paths relative to the code base or sglfix"


def test_the_sglang_finding_carries_the_profiles_fix(tmp_path):
    require_sglang()
    report = tmp_path / "r.json"
    env = clean_env()
    run_cli(
        "--profile", "sglang-0.5.23", "run", "-s", "probe-req-to-token-tree-ps1", "--device", "cpu", "--json",
        str(report), env=env, timeout=600, subprocess=True,
    )  # fmt: skip
    f = run_cli(
        "report", "finding", str(report), "baseline::probe-req-to-token-tree-ps1", env=env, timeout=600, subprocess=True
    )
    assert f.code == 0, f.err[-2000:]
    text = f.out
    assert "- code base: sglang 0.5.23" in text
    assert "widens a request's req_to_token row only for page_size > 1" in text  # the known entry's reason
    assert "`sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len` | " in text
    assert "sglang/srt/mem_cache/allocation_sizing.py:" in text
    assert "--apply profiles/sglang-0.5.23/fixes/req-to-token-headroom-ps1.patch" in text or "--apply " in text
    assert "+        if page_size > 1 or spec_algo.is_uno() or spec_algo.is_eagle():" in text


def _release_like_the_installed(cache: Path, installed: Path, version: str, shift: int) -> Path:
    """A release of sglang ``version`` in sglfix's cache as ``--release`` leaves it, made from the
    installed tree without a download: its files linked, its version its own, and
    ``mem_cache/allocation_sizing.py`` moved ``shift`` lines down (a listing from this tree says so)."""
    folder = cache / "releases" / f"sglang-{version}"
    changed = Path("srt") / "mem_cache" / "allocation_sizing.py"
    mirror = folder / "sglang"
    for depth in range(len(changed.parts)):
        here = Path(*changed.parts[:depth])
        (mirror / here).mkdir(parents=True, exist_ok=True)
        for entry in (installed / here).iterdir():
            if entry.name != changed.parts[depth] and entry.name not in ("_version.py", "__pycache__"):
                (mirror / here / entry.name).symlink_to(entry)
    text = (installed / changed).read_text()
    (mirror / changed).write_text("# moved down\n" * shift + text)
    (mirror / "_version.py").write_text(f"__version__ = version = {version!r}\n")
    info = folder / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    record = {"distribution": "sglang", "version": version, "path": str(folder), "wheel": "-", "overlay": []}
    (folder / "sglfix-release.json").write_text(json.dumps(record))
    return folder


def test_a_release_report_is_written_up_on_that_release(tmp_path):
    """A report of ``--release 0.5.17``: the finding installs no other sglang, reproduces with
    ``--release 0.5.17``, runs the cell again on that release (from sglfix's cache) and lists the
    lines of that release's files."""
    installed = Path(require_sglang())
    shift = 7
    _release_like_the_installed(tmp_path / "cache", installed, "0.5.17", shift)
    source = (installed / "srt" / "mem_cache" / "allocation_sizing.py").read_text()
    line = next(
        n.lineno
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef) and n.name == "get_req_to_token_extra_context_len"
    )
    report = _report(
        tmp_path / "r.json",
        [{"scenario": "probe-req-to-token-tree-ps1", **_failed("INVARIANT")}],
        codebase={"name": "sglang-0.5.23", "distribution": "sglang", "version": "0.5.17", "followed": "sglang"},
    )
    env = clean_env(SGLFIX_CACHE=str(tmp_path / "cache"))
    text = _finding(tmp_path, report, "baseline::probe-req-to-token-tree-ps1", env=env)
    head = text.split("## Observed")[0]
    assert "- code base: sglang 0.5.17" in head and "sglang 0.5.23" not in head and "==0.5.23" not in head
    assert "sglfix --release 0.5.17 --profile sglang-0.5.23 run -s probe-req-to-token-tree-ps1 --device cpu" in text
    assert "pip install torch==2.13.0 && " in text and "sglang==" not in text
    assert f"`sglang/srt/mem_cache/allocation_sizing.py:{line + shift}` |" in text, text
    assert "Run again here the cell gave" not in text
    assert not _machine_folders(text), _machine_folders(text)
