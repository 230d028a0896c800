"""Bad input that used to go wrong: a FIFO or a device named as a file, an output path nothing
can be created in, empty paths, odd knobs and terminal settings. Each is one line on stderr and
exit 2, before any worker starts; and the command line answers ``--version``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli

FAST = "triton-decode@cg=eager,gpu_only=off"
CPU_REPORT = ROOT / "bench" / "results" / "matrix-cpu.json"


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    yield path
    # Whatever happened, nobody stays blocked on the FIFO: open it for writing without waiting.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


def test_a_fifo_or_a_device_named_as_a_file_is_refused_not_read(tmp_path, fifo):
    line = assert_one_line_error(
        run_cli("run", "--scenario-file", str(fifo), "--device", "cpu", timeout=60), "is a FIFO, not a regular file"
    )
    assert str(fifo) in line
    assert_one_line_error(
        run_cli("run", "--scenario-file", "/dev/zero", "--device", "cpu", timeout=60), "is a device, not a regular file"
    )
    assert_one_line_error(run_cli("report", "compare", str(CPU_REPORT), str(fifo), timeout=60), "is a FIFO")
    assert_one_line_error(
        run_cli("matrix", "--shard", "1/2", "--shard-costs", str(fifo), "-s", FAST, "--device", "cpu", timeout=60),
        "is a FIFO",
    )
    toggles = tmp_path / "toggles"
    toggles.mkdir()
    os.mkfifo(toggles / "11111.yaml")
    assert_one_line_error(run_cli("--toggles", str(toggles), "list", timeout=60), "is a FIFO")
    # The start-up hook reads the same directory in every Python process: it stops, it never hangs.
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SGLANG_DEBUG_REVERT_PR="11111", SGLFIX_TOGGLES_DIR=str(toggles))
    r = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "is a FIFO" in r.stderr and "ran" not in r.stdout, (r.returncode, r.stderr)


def test_an_output_path_no_file_can_be_created_in_is_refused_before_any_cell(tmp_path):
    line = assert_one_line_error(
        run_cli("run", "-s", FAST, "--device", "cpu", "--json", "/proc/x.json", timeout=60),
        "/proc/x.json",
        "cannot create a file",
    )
    assert "choose another path" in line
    assert_one_line_error(run_cli("run", "-s", FAST, "--device", "cpu", "--json", "", timeout=60), "the path is empty")
    assert not list(Path("/proc").glob(".x.json.*"))


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--toggles", "", "list"], "--toggles '': the directory is empty"),
        (["doctor", "--source", ""], "--source '': the path is empty"),
        (["--allow-target", "", "list"], "--allow-target '' is not a module prefix"),
        (["--allow-target", "not a module!", "list"], "--allow-target 'not a module!' is not a module prefix"),
    ],
)
def test_empty_paths_and_malformed_prefixes_are_refused(args, needle):
    assert_one_line_error(run_cli(*args, timeout=60), needle)


def test_a_bad_kernel_memo_size_is_refused_in_the_parent():
    r = run_cli("run", "-s", FAST, "--device", "cpu", env={"SGLFIX_KERNEL_MEMO_MB": "abc"}, timeout=60)
    assert_one_line_error(r, "SGLFIX_KERNEL_MEMO_MB='abc'", "MiB")
    assert (
        run_cli(
            "run", "-s", FAST, "--device", "cpu", env={"SGLFIX_KERNEL_MEMO_MB": "0"}, timeout=300, subprocess=True
        ).code
        == 0
    )


def test_a_bad_columns_value_is_ignored_not_a_traceback():
    r = run_cli("list", env={"COLUMNS": "abc"}, timeout=60)
    assert r.code == 0 and "Traceback" not in r.err, r.err


def test_version():
    from sglfix import __version__

    r = run_cli("--version", timeout=60)
    assert r.code == 0 and r.out.strip() == f"sglfix {__version__}", (r.out, r.err)


def test_a_users_script_named_sglfix_gets_the_revert(tmp_path):
    """The hook stands down only for sglfix's own command line and workers, which read the
    variable themselves; any other program, whatever its name, runs with the revert applied."""
    import subprocess
    import sys

    probe = (
        "import sglfix.backends.srt.managers.overlap_utils as m\n"
        "try:\n    m.decide_needs_cpu_seq_lens([None]); print('fixed')\nexcept AttributeError:\n    print('pre-fix')\n"
    )
    script = tmp_path / "sglfix"
    script.write_text(probe)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLFIX_TOGGLES_DIR", "SGLFIX_PROFILE")}
    env["SGLANG_DEBUG_REVERT_PR"] = "26738:overlap-guard"
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "pre-fix", (r.stdout, r.stderr)
    # sglfix's own command line still reads the variable itself (and applies it in each cell).
    own = run_cli("env", "--json", env={"SGLANG_DEBUG_REVERT_PR": "26738:overlap-guard"}, timeout=60, subprocess=True)
    assert own.code == 0, own.err


@pytest.mark.parametrize("ids", [["26651", "26651:clamp"], ["26651:clamp", "26651:clamp"]])
def test_bisect_refuses_candidates_that_name_a_part_twice(ids):
    args = [a for rid in ids for a in ("-r", rid)]
    assert_one_line_error(
        run_cli("bisect", *args, "-s", FAST, "--device", "cpu", timeout=60), "already names 26651:clamp"
    )


def test_bisect_on_a_device_it_cannot_use_is_one_line_before_any_progress():
    r = run_cli("bisect", "--device", "cuda", "-s", FAST, "-r", "26738", env={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert_one_line_error(r, "--device cuda")
    assert "bisect [" not in r.out + r.err


@pytest.mark.parametrize(
    "text, needle",
    [
        ("def decide_needs_cpu_seq_lens(:\n", "not valid Python"),
        ("x = " + "(" * 20000 + ")" * 20000 + "\n", "too many nested parentheses"),
    ],
)
def test_doctor_source_with_a_broken_target_file_reports_that_toggle_and_checks_the_rest(tmp_path, text, needle):
    import json
    import shutil

    source = tmp_path / "src"
    shutil.copytree(ROOT / "backends", source / "sglfix" / "backends")
    (source / "sglfix" / "__init__.py").write_text("")
    (source / "sglfix" / "backends" / "srt" / "managers" / "overlap_utils.py").write_text(text)
    r = run_cli("doctor", "--source", str(source), "--json", timeout=120)
    assert r.code == 1 and "Traceback" not in r.err and "internal error" not in r.err, r.err
    rows = {t["id"]: t for t in json.loads(r.out)["toggles"]}
    broken = [t for t in rows.values() if not t["ok"]]
    assert broken and all("overlap_utils.py" in t["error"] and needle in t["error"] for t in broken), broken
    assert any(t["ok"] and t["targets"] for t in rows.values())  # the other toggles were still checked


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: r["cells"][0].update(findings="oops"),
        lambda r: r["cells"][0].update(findings=[{"verdict": "MAYBE", "message": "x"}]),
        lambda r: r["cells"][0].update(device=7),
        lambda r: r["cells"][0].update(timings_ms={"total": "slow"}),
        lambda r: r.update(wall_s="long"),
        lambda r: r.update(device=["cpu"]),
        lambda r: r.update(expectations=[{"revert": "26651", "scenario": "x", "wanted": ["PASS"], "got": {}}]),
        lambda r: r.update(stray=["x"]),
    ],
)
def test_a_damaged_report_is_refused_before_anything_is_written(tmp_path, damage):
    import json

    report = json.loads(CPU_REPORT.read_text())
    report["cells"] = report["cells"][:20]
    damage(report)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(report))
    out = tmp_path / "merged.json"
    assert_one_line_error(run_cli("report", "merge", str(bad), "-o", str(out), "--gate", timeout=60), str(bad))
    assert not out.exists()
    assert_one_line_error(run_cli("report", "compare", str(CPU_REPORT), str(bad), timeout=60), str(bad))


def _nested_merges(levels: int) -> str:
    lines = ["a0: &a0 {x: 1, y: 2}"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} {{<<: [*a{i - 1}, *a{i - 1}], k{i}: {i}}}")
    return "\n".join(lines) + "\n"


def _nested_aliases(levels: int) -> str:
    lines = ["l0: &l0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text, needle",
    [(_nested_merges(12), "merge keys (<<) are not supported"), (_nested_aliases(9), "more than 32 YAML aliases")],
)
def test_yaml_that_expands_without_bound_is_refused_at_once(tmp_path, text, needle):
    import time

    assert len(text) < 2000
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text)
    toggles = tmp_path / "toggles"
    toggles.mkdir()
    (toggles / "11111.yaml").write_text(text)
    t0 = time.monotonic()
    assert_one_line_error(run_cli("run", "--scenario-file", str(scenario), "--device", "cpu", timeout=60), needle)
    assert_one_line_error(run_cli("--toggles", str(toggles), "list", timeout=60), needle)
    assert time.monotonic() - t0 < 30  # each well under a second of parsing; the rest is interpreter start


def _ray_processes() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"raylet" in cmd or b"gcs_server" in cmd:
                found.add(int(entry))
    return found


@pytest.mark.parametrize(
    "args, needle",
    [
        (["-r", "99999"], "99999"),
        (["-s", "no-such-scenario*"], "no scenario matches"),
        (["--ray-address", "127.0.0.1:1"], "nothing answers there"),
        (["--ray-address", "not an address"], "give auto or host:port"),
    ],
)
def test_ray_runs_are_checked_before_ray_starts(args, needle):
    before = _ray_processes()
    base = ["run", "--executor", "ray", "--device", "cpu"] + ([] if "-s" in args else ["-s", FAST])
    assert_one_line_error(run_cli(*base, *args, timeout=120), needle)
    assert _ray_processes() <= before  # no Ray instance was started for a command that was refused


@pytest.mark.parametrize(
    "edit, needle",
    [
        ({"match": "this line is not in the source\n", "replacement": "pass\n"}, "match text not found"),
        (
            {"match": "        md = self.forward_metadata\n", "replacement": "        md = = self.forward_metadata\n"},
            "does not parse",
        ),
    ],
)
def test_a_revert_that_cannot_apply_is_refused_before_any_worker(tmp_path, edit, needle):
    import yaml

    toggles = tmp_path / "toggles"
    toggles.mkdir()
    target = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.forward_decode"
    (toggles / "90001.yaml").write_text(
        yaml.safe_dump({"pr": 90001, "title": "broken", "patches": [{"target": target, "edits": [edit]}]})
    )
    for command in (["run", "-r", "90001", "-s", FAST, "--device", "cpu"], ["matrix", "-s", FAST, "--device", "cpu"]):
        r = run_cli("--toggles", str(toggles), *command, timeout=60)
        line = assert_one_line_error(r, "revert 90001:main", needle)
        assert "worker" not in line
    assert_one_line_error(
        run_cli("--toggles", str(toggles), "show", "90001", "--diff", timeout=60), needle, "sglfix doctor"
    )
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "90002.yaml").write_text(
        yaml.safe_dump(
            {
                "pr": 90002,
                "title": "outside",
                "patches": [
                    {
                        "target": "colorsys.rgb_to_yiq",
                        "edits": [{"match": "y = 0.30*r + 0.59*g + 0.11*b\n", "append": "pass\n"}],
                    }
                ],
            }
        )
    )
    assert_one_line_error(
        run_cli("--toggles", str(outside), "run", "-r", "90002", "-s", FAST, "--device", "cpu", timeout=60),
        "revert 90002:main",
        "allowed",
    )


def test_the_pytest_option_is_named_in_its_own_errors(tmp_path):
    import subprocess
    import sys

    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_DEBUG_REVERT_PR"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--sglfix-revert", "99999", "-q", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: --sglfix-revert: PR 99999 is not registered"), lines
    assert "SGLANG_DEBUG_REVERT_PR" not in proc.stderr


def test_report_compare_names_a_bisect_report_for_what_it_is(tmp_path):
    bisect = ROOT / "bench" / "results" / "bisect-cpu.json"
    assert_one_line_error(
        run_cli("report", "compare", str(CPU_REPORT), str(bisect), timeout=60),
        "is a bisect report (sglfix bisect --json), not a run or matrix report",
    )


def test_report_compare_of_reports_with_no_cell_in_common_is_refused(tmp_path):
    import json

    data = json.loads(CPU_REPORT.read_text())
    scenarios = sorted({c["scenario"] for c in data["cells"]})
    for name, keep in (("a", scenarios[:3]), ("b", scenarios[3:6])):
        part = dict(data, cells=[c for c in data["cells"] if c["scenario"] in keep])
        (tmp_path / f"{name}.json").write_text(json.dumps(part))
    out = tmp_path / "cmp.json"
    r = run_cli("report", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json", str(out), timeout=60)
    assert_one_line_error(r, "have no cell in common")
    assert not out.exists()


def test_a_sliding_window_where_no_window_layer_runs_is_one_line_before_any_cell(tmp_path):
    """model.sliding_window on the reproduction (it has no window layer), and on sglang's
    FlashInfer backend in DRAFT_EXTEND_V2 (its window layer runs in DECODE, EXTEND and TARGET_VERIFY)."""
    for name, backend, mode, extra, profile, needles in (
        (
            "extend",
            "triton",
            "EXTEND",
            "      extend_lens: [5, 9]\n",
            (),
            ("backend triton on reproduction has no sliding-window layer",),
        ),
        (
            "verify",
            "flashinfer",
            "DRAFT_EXTEND_V2",
            "",
            ("--profile", "sglang-0.5.23"),
            ("sets model.sliding_window", "with backend flashinfer in mode DRAFT_EXTEND_V2"),
        ),
    ):
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"scenarios:\n  - name: window-{name}\n    backend: {backend}\n    mode: {mode}\n"
            f"    batch:\n      prefix_lens: [13, 37]\n{extra}    page_size: 1\n"
            "    model: {num_heads: 4, num_kv_heads: 2, head_dim: 64, dtype: float16, sliding_window: 8}\n"
        )
        r = run_cli(*profile, "run", "--scenario-file", str(path), "--device", "cpu", timeout=60)
        assert_one_line_error(r, "model.sliding_window" if name == "extend" else str(path), *needles)


def test_deterministic_where_no_backend_reads_it_is_one_line_before_any_cell(tmp_path):
    """deterministic: true on the reproduction (nothing there reads the flag), on sglang's
    FlashInfer backend (only its Triton backend has the path here) and on a probe (it reads no
    such key)."""
    body = "    batch:\n      prefix_lens: [13, 37]\n    deterministic: true\n"
    for name, head, profile, needles in (
        ("repro", "    backend: triton\n    mode: DECODE\n", (), ("backend triton on reproduction",)),
        (
            "fi",
            "    backend: flashinfer\n    mode: DECODE\n",
            ("--profile", "sglang-0.5.23"),
            ("backend flashinfer on sglang-0.5.23", "deterministic-inference"),
        ),
        (
            "probe",
            "    probe: needs-cpu-seq-lens\n    mode: DECODE\n",
            ("--profile", "sglang-0.5.23"),
            ("does not read deterministic",),
        ),
    ):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"scenarios:\n  - name: det-{name}\n{head}{body}")
        r = run_cli(*profile, "run", "--scenario-file", str(path), "--device", "cpu", timeout=60)
        assert_one_line_error(r, "deterministic", *needles)


def test_a_mamba_track_the_scheduler_never_sends_is_one_line_before_any_cell(tmp_path):
    """batch.mamba_track with a decode entry other than 0/1 or a decode host plan, on a backend that
    tracks no Mamba state, of a length the scheduler never asks for (shorter than a chunk, or
    aligned short of the extend's end), and its host flag alone: each one line naming the key and
    the fix."""
    hybrid = "    backend: hybrid_linear\n    mode: EXTEND\n"
    for name, head, batch, needles in (
        (
            "decode",
            "    backend: hybrid_linear\n    mode: DECODE\n",
            "mamba_track: [70]",
            ("in DECODE each request's entry",),
        ),
        (
            "decode-host",
            "    backend: hybrid_linear\n    mode: DECODE\n",
            "mamba_track: [1]\n      mamba_track_host: true",
            ("track has no host plan",),
        ),
        (
            "triton",
            "    backend: triton\n    mode: EXTEND\n",
            "mamba_track: [70]",
            ("backend triton", "tracks no Mamba"),
        ),
        ("short", hybrid, "mamba_track: [40]", ("64-token chunk",)),
        ("aligned", hybrid, "mamba_track: [64]", ("write 65 or 70",)),
        ("past", hybrid, "mamba_track: [71]", ("past its extend",)),
        ("host", hybrid, "mamba_track_host: false", ("without batch.mamba_track",)),
    ):
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            f"scenarios:\n  - name: track-{name}\n{head}    batch:\n      prefix_lens: [5]\n"
            f"      extend_lens: [70]\n      {batch}\n"
        )
        if name.startswith("decode"):
            path.write_text(path.read_text().replace("      extend_lens: [70]\n", ""))
        r = run_cli("--profile", "sglang-0.5.23", "run", "--scenario-file", str(path), "--device", "cpu", timeout=60)
        assert_one_line_error(r, "mamba_track", *needles)


def test_a_linear_attention_where_nothing_builds_one_is_one_line_before_any_cell(tmp_path):
    """model.linear_attention on a backend without linear-attention layers (sglang's Triton), on
    the reproduction, and a mixer that does not exist (with the nearest one): each one line."""
    body = "    batch:\n      prefix_lens: [13, 37]\n    model: {linear_attention: %s}\n"
    for name, head, mixer, profile, needles in (
        (
            "triton",
            "    backend: triton\n    mode: DECODE\n",
            "mamba2",
            ("--profile", "sglang-0.5.23"),
            ("model.linear_attention: backend triton on sglang-0.5.23 has no linear-attention layers",),
        ),
        ("repro", "    backend: triton\n    mode: DECODE\n", "gdn", (), ("backend triton on reproduction",)),
        (
            "typo",
            "    backend: hybrid_linear\n    mode: DECODE\n",
            "mamba3",
            ("--profile", "sglang-0.5.23"),
            ("'mamba3' is not one of gdn, kda, mamba2", "did you mean 'mamba2'?"),
        ),
    ):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"scenarios:\n  - name: linear-{name}\n{head}{body % mixer}")
        r = run_cli(*profile, "run", "--scenario-file", str(path), "--device", "cpu", timeout=60)
        assert_one_line_error(r, *needles)


def test_an_encoder_decoder_batch_where_nothing_runs_one_is_one_line_before_any_cell(tmp_path):
    """batch.encoder_lens on a backend without cross-attention wrappers (sglang's Triton), in a
    speculative mode, on the reproduction, and model.cross_attention without encoder lengths:
    each one line naming the key and what to do."""
    body = "    batch:\n      prefix_lens: [13, 37]\n      encoder_lens: [6, 17]\n"
    sglang = ("--profile", "sglang-0.5.23")
    for name, head, profile, needles in (
        (
            "triton",
            "    backend: triton\n    mode: DECODE\n",
            sglang,
            ("sets batch.encoder_lens with backend triton in mode DECODE", "runs on flashinfer in DECODE, EXTEND"),
        ),
        (
            "verify",
            "    backend: flashinfer\n    mode: TARGET_VERIFY\n",
            sglang,
            ("sets batch.encoder_lens with backend flashinfer in mode TARGET_VERIFY",),
        ),
        (
            "repro",
            "    backend: flashinfer\n    mode: DECODE\n",
            (),
            (
                "batch.encoder_lens: backend flashinfer on reproduction has no encoder-decoder (cross-attention) "
                "path here; it runs on sglang-0.5.23 (pick that profile)",
            ),
        ),
    ):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"scenarios:\n  - name: ed-{name}\n{head}{body}")
        r = run_cli(*profile, "run", "--scenario-file", str(path), "--device", "cpu", timeout=60)
        assert_one_line_error(r, *needles)
    path = tmp_path / "alone.yaml"
    path.write_text(
        "scenarios:\n  - name: ed-alone\n    backend: flashinfer\n    mode: DECODE\n"
        "    batch: {prefix_lens: [13]}\n    model: {cross_attention: true}\n"
    )
    r = run_cli(*sglang, "run", "--scenario-file", str(path), "--device", "cpu", timeout=60)
    assert_one_line_error(r, "alone.yaml:6:", "without batch.encoder_lens; give the encoder tokens cached per request")


def test_a_multi_item_batch_where_nothing_runs_one_is_one_line_before_any_cell(tmp_path):
    """batch.items on a backend without the multi-item path (sglang's Triton), in a mode without
    it, under CUDA graphs (which --enable-mis disables), and on the reproduction: each one line
    naming the key and what to do."""
    body = "    batch:\n      prefix_lens: [0, 5]\n      extend_lens: [9, 6]\n      items: [[2, 1], [3]]\n"
    sglang = ("--profile", "sglang-0.5.23")
    for name, head, tail, profile, needles in (
        (
            "triton",
            "    backend: triton\n    mode: EXTEND\n",
            "",
            sglang,
            (
                "sets batch.items with backend triton in mode EXTEND",
                "runs on flashinfer in EXTEND; hybrid_linear in EXTEND only",
            ),
        ),
        (
            "graph",
            "    backend: flashinfer\n    mode: EXTEND\n",
            "    cuda_graph: {capture_bs: [2]}\n",
            sglang,
            ("sets batch.items and cuda_graph; sglang disables CUDA graphs under --enable-mis: drop one",),
        ),
        (
            "repro",
            "    backend: flashinfer\n    mode: EXTEND\n",
            "",
            (),
            ("backend flashinfer on reproduction runs DECODE, DRAFT_DECODE, not EXTEND; it runs on sglang-0.5.23",),
        ),
    ):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"scenarios:\n  - name: mis-{name}\n{head}{body}{tail}")
        r = run_cli(*profile, "run", "--scenario-file", str(path), "--device", "cpu", timeout=60)
        assert_one_line_error(r, *needles)
