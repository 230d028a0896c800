"""The command line as a new user meets it: help, errors before any cell runs, output that
never reads user text as markup, atomic reports, the env toggle, readable grids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from builders import HARNESS_FAILS, ROOT
from clihelp import assert_one_line_error, run_cli
from procs import alive, workers_of

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


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"name: x\x00\n", "binary"),
        (b"name: caf\xe9\n", "not UTF-8"),
    ],
)
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


# --------------------------------------------------------------------------- through the workers


def test_env_toggle_applies_in_run_cells():
    scen = "triton-target-verify@cg=eager,gpu_only=on"
    plain = run_cli("run", "-s", scen, "--device", "cpu", "--json", "-", subprocess=True)
    assert plain.code == 0, plain.err
    r = run_cli(
        "run", "-s", scen, "--device", "cpu", "--json", "-", env={"SGLANG_DEBUG_REVERT_PR": "26738"}, subprocess=True
    )
    assert r.code == 1, r.err
    data = json.loads(r.out)
    assert [c["verdict"] for c in data["cells"]] == ["CRASH"]
    assert data["cells"][0]["toggles"] == ["26738"] and data["env_revert"] == "26738"
    assert data["cells"][0]["id"] == f"26738::{scen}"


def test_toggles_dir_reaches_the_workers(tmp_path):
    builtin = ROOT / "toggles" / "26651.yaml"
    d = tmp_path / "toggles"
    d.mkdir()
    # A toggle that exists only here, and a drifted copy of a built-in one: both must be what runs.
    text = builtin.read_text().replace("pr: 26651", "pr: 77777")
    (d / "77777.yaml").write_text(text)
    drifted = builtin.read_text().replace(
        "  kv_lens = seq_lens - extend_seq_lens", "  kv_lenz = seq_lens - extend_seq_lens", 1
    )
    assert drifted != builtin.read_text()
    (d / "26651.yaml").write_text(drifted)
    scen = "triton-draft-extend-v2@cg=graph-padded,builder=glue,gpu_only=off"
    r = run_cli(
        "--toggles", str(d), "run", "-r", "77777:clamp", "-s", scen, "--device", "cpu", "--json", "-", subprocess=True
    )
    assert r.code in (0, 1), r.err
    assert json.loads(r.out)["cells"][0]["verdict"] == "INVARIANT", r.out[-2000:]
    # The drifted copy is what is used (the built-in one applies): refused before any worker.
    r = run_cli(
        "--toggles", str(d), "run", "-r", "26651", "-s", scen, "--device", "cpu", "--json", "-", subprocess=True
    )
    assert_one_line_error(r, "revert 26651:", "match text not found")


def test_allow_target_reaches_the_workers_of_run(tmp_path):
    import yaml

    d = tmp_path / "toggles"
    d.mkdir()
    patch = {
        "target": "colorsys.rgb_to_yiq",
        "edits": [{"match": "y = 0.30*r + 0.59*g + 0.11*b\n", "append": "pass\n"}],
    }
    (d / "90011.yaml").write_text(yaml.safe_dump({"pr": 90011, "title": "outside the fence", "patches": [patch]}))
    scen = "triton-decode@cg=eager,gpu_only=off"
    r = run_cli(
        "--toggles", str(d), "run", "-r", "90011", "-s", scen, "--device", "cpu", "--json", "-", subprocess=True
    )
    assert_one_line_error(r, "revert 90011:main", "allowed module prefixes")  # before any worker
    r = run_cli(
        "--toggles",
        str(d),
        "--allow-target",
        "colorsys",
        "run",
        "-r",
        "90011",
        "-s",
        scen,
        "--device",
        "cpu",
        "--json",
        "-",
        subprocess=True,
    )
    assert r.code == 0, r.err
    assert json.loads(r.out)["cells"][0]["verdict"] == "PASS"


def test_matrix_with_an_error_cell_exits_1(tmp_path):
    d = tmp_path / "toggles"
    d.mkdir()
    # One toggle whose expectation names the ERROR it gets: met, no stray, and still a failed run.
    # It applies, and hands sglfix's guard check a buffer list it cannot read: sglfix fails.
    (d / "88888.yaml").write_text(HARNESS_FAILS + "expect:\n  - {scenario: '*', verdict: ERROR}\n")
    r = run_cli(
        "--toggles",
        str(d),
        "matrix",
        "-s",
        "triton-decode@cg=eager,gpu_only=off",
        "--device",
        "cpu",
        "--json",
        str(tmp_path / "m.json"),
        subprocess=True,
    )
    data = json.loads((tmp_path / "m.json").read_text())
    assert [c["verdict"] for c in data["cells"]] == ["PASS", "ERROR"], data["cells"]
    assert not data["stray"] and all(c["met"] for c in data["expectations"])
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]


def test_scenario_names_are_not_markup(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: x[/red]\nmode: decode\nbatch: {prefix_lens: [5, 9]}\n")
    r = run_cli("run", "--scenario-file", str(f), "--device", "cpu", "--all", subprocess=True)
    assert r.code == 0, r.err
    assert "x[/red]" in r.out


def test_matrix_grid_is_readable_when_piped_and_narrow(tmp_path):
    r = run_cli(
        "matrix",
        "-s",
        "triton-decode@cg=eager*",
        "-s",
        "triton-extend",
        "--device",
        "cpu",
        "--all",
        env={"COLUMNS": "60"},
        subprocess=True,
    )
    assert r.code == 0, r.out + r.err
    for name in ("triton-decode@cg=eager,gpu_only=off", "triton-decode@cg=eager,gpu_only=on", "triton-extend"):
        assert name in r.out, r.out
    assert "baseline" in r.out and "26651" in r.out


def test_json_report_is_written_atomically_and_complete(tmp_path):
    target = tmp_path / "r.json"
    r = run_cli("run", "-s", FAST, "--device", "cpu", "--json", str(target), subprocess=True)
    assert r.code == 0, r.err
    data = json.loads(target.read_text())
    assert data["cells"][0]["verdict"] == "PASS" and data["torch"] and data["device"] == "cpu"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_the_parent_imports_neither_torch_nor_triton_while_running_cells():
    code = (
        "import sys\nfrom sglfix.cli import main\ntry:\n"
        f"    main(['run', '-s', {FAST!r}, '--device', 'cpu'])\nexcept SystemExit as e:\n    code = e.code\n"
        "print('RESULT', code, sorted(m for m in ('torch', 'triton', 'sglfix.backends') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "RESULT 0 []" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_signals_mid_run_stop_every_worker(sig, code):
    import signal

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p
        for p in (os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures"), env.get("PYTHONPATH", ""))
        if p
    )
    # A suite started as a background job inherits SIGINT ignored; the command under test must see
    # the default disposition, as it would from a terminal.
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglfix", "matrix", "--device", "cpu", "-j", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.5)
            workers = workers_of(proc.pid)
        assert workers, "no worker started"
        time.sleep(2.0)
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == code, err
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert len(lines) == 1 and "workers stopped" in lines[0], err
    time.sleep(0.5)
    assert not [p for p in workers if alive(p)]


def test_running_out_of_gpu_memory_is_an_error_of_sglfix_never_a_crash_of_the_code(tmp_path):
    # Workers share the GPU: an allocation that fails there says nothing about the code under
    # test. The same message raised as another error type stays a CRASH: the judge still judges.
    target = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.init_forward_metadata"
    verdicts = {}
    for pr, error in ((88801, "__import__('torch').OutOfMemoryError"), (88802, "RuntimeError")):
        d = tmp_path / str(pr)
        d.mkdir()
        raise_line = f"raise {error}('CUDA out of memory. Tried to allocate 384.00 MiB')\n"
        (d / f"{pr}.yaml").write_text(
            yaml.safe_dump(
                {
                    "pr": pr,
                    "title": "raises",
                    "patches": [
                        {
                            "target": target,
                            "edits": [{"match": "bs = forward_batch.batch_size\n", "append": raise_line}],
                        }
                    ],
                }
            )
        )
        out = tmp_path / f"{pr}.json"
        r = run_cli(
            "--toggles",
            str(d),
            "run",
            "-r",
            str(pr),
            "-s",
            "triton-decode@cg=eager,gpu_only=off",
            "--device",
            "cpu",
            "--json",
            str(out),
            subprocess=True,
        )
        assert r.code == 1, r.err
        (cell,) = json.loads(out.read_text())["cells"]
        verdicts[pr] = (cell["verdict"], cell["findings"][0]["message"])
    assert verdicts[88801][0] == "ERROR" and "out of GPU memory" in verdicts[88801][1], verdicts
    assert verdicts[88802][0] == "CRASH", verdicts
