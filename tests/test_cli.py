"""The command line as a new user meets it: help, errors before any cell runs, output that
never reads user text as markup, atomic reports, the env toggle, readable grids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from clihelp import assert_one_line_error, run_cli

FAST = "triton-decode@cg=eager,gpu_only=off"


def test_bare_sglfix_prints_help_and_exits_0():
    r = run_cli()
    assert r.code == 0, r.err
    assert "Usage" in r.out and "matrix" in r.out and "error" not in r.err


def test_debug_is_accepted_after_the_command():
    quiet = run_cli("show", "99999")
    assert_one_line_error(quiet, "not registered")
    loud = run_cli("show", "99999", "--debug")
    assert loud.code == 2 and "Traceback" in loud.err and "not registered" in loud.err
    assert "No such option" not in loud.err


def test_yaml_text_is_not_read_as_markup():
    r = run_cli("show", "26738")
    assert r.code == 0, r.err
    assert "[num_draft_tokens] * bs" in r.out


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_timeout_must_be_finite_and_positive(value):
    t0 = time.monotonic()
    assert_one_line_error(run_cli("run", "-s", FAST, "--device", "cpu", "--timeout", value), "--timeout")
    assert time.monotonic() - t0 < 30  # refused before any worker starts a cell


def test_empty_revert_id_is_refused():
    assert_one_line_error(run_cli("run", "-r", "", "-s", FAST, "--device", "cpu"), "empty toggle id")
    assert_one_line_error(run_cli("run", "-r", "26651,", "-s", FAST, "--device", "cpu"), "empty toggle id")


def test_unwritable_json_path_fails_before_any_cell(tmp_path):
    missing = tmp_path / "no" / "such" / "dir" / "r.json"
    t0 = time.monotonic()
    assert_one_line_error(run_cli("matrix", "--device", "cpu", "--json", str(missing)), "--json", "does not exist")
    assert time.monotonic() - t0 < 30
    assert_one_line_error(run_cli("run", "-s", FAST, "--device", "cpu", "--json", str(tmp_path)), "is a directory")


def test_bad_env_value_is_refused_before_any_cell():
    r = run_cli("run", "-s", FAST, "--device", "cpu", env={"SGLANG_DEBUG_REVERT_PR": "27460x"})
    assert_one_line_error(r, "SGLANG_DEBUG_REVERT_PR", "registered")
    r = run_cli("run", "-s", FAST, "--device", "cpu", env={"SGLANG_DEBUG_REVERT_PR": "12345"})
    assert_one_line_error(r, "not registered")


@pytest.mark.parametrize("content,needle", [
    (b"name: x\x00\n", "binary"),
    (b"name: caf\xe9\n", "not UTF-8"),
])
def test_binary_and_latin1_scenario_files_name_the_file(tmp_path, content, needle):
    f = tmp_path / "bad.yaml"
    f.write_bytes(content)
    assert_one_line_error(run_cli("scenarios", "--scenario-file", str(f)), str(f), needle)


def test_toggles_option_says_what_is_wrong_with_the_path(tmp_path):
    f = tmp_path / "file.yaml"
    f.write_text("x: 1\n")
    msg = assert_one_line_error(run_cli("--toggles", str(f), "list"), str(f))
    assert "not a directory" in msg or "is a file" in msg, msg
    assert_one_line_error(run_cli("--toggles", str(tmp_path / "missing"), "list"), "does not exist")


def test_parts_changes_the_matrix_plan():
    from sglfix.execution.planner import plan_matrix
    from sglfix.scenario import load_scenarios
    from sglfix.toggling.registry import load_registry

    reg = load_registry()
    scenarios = load_scenarios()[:1]
    whole = plan_matrix(scenarios, registry=reg, parts=False).sets
    parts = plan_matrix(scenarios, registry=reg, parts=True).sets
    assert all(":" not in i for s in whole for i in s), whole
    assert set(whole) < set(parts)
    assert ("26651:clamp",) in parts and ("26651:fixture", "26651:triton-kv-lens") in parts


def test_plan_cell_ids_are_stable_and_unique():
    from sglfix.execution.planner import plan_matrix
    from sglfix.scenario import load_scenarios
    from sglfix.toggling.registry import load_registry

    reg = load_registry()
    a = [c.id for c in plan_matrix(load_scenarios(), registry=reg, parts=True).cells]
    b = [c.id for c in plan_matrix(load_scenarios(), registry=reg, parts=True).cells]
    assert a == b and len(set(a)) == len(a)
    assert f"baseline::{FAST}" in a and f"26651:clamp::{FAST}" in a
