"""One runner for run, matrix and bisect (issue 35): the options are declared once and every
command that runs cells checks them through the same code, so bisect has --devices, --executor,
--shard and the up-front revert check that run and matrix have, with the same words."""

from __future__ import annotations

import json

import pytest
from clihelp import assert_one_line_error, run_cli

DECODE = "triton-decode@cg=eager,gpu_only=off"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--devices", "cuda:9"], "--devices cuda:9"),
        (["--devices", "0,1", "--jobs", "1"], "--jobs 1 is fewer workers than the 2 GPUs of --devices"),
        (["--executor", "ray", "--ray-address", "127.0.0.1:1"], "nothing answers there"),
        (["--ray-address", "auto"], "give --executor ray with it"),
        (["--ray-keep", "60"], "--ray-keep leaves actors"),
        (["--shard", "3/2"], "--shard 3/2"),
        (["--shard-costs", "x.json"], "give --shard I/N with it"),
        (["--jobs", "100000"], "--jobs 100000"),
        (["--memory-budget", "1K"], "over the memory budget of 1.0 KiB"),
    ],
)
def test_every_command_that_runs_cells_refuses_the_same_options_in_the_same_words(args, needle):
    env = {"CUDA_VISIBLE_DEVICES": ""} if args[0] == "--devices" else None
    lines = set()
    for command in ("run", "matrix", "bisect"):
        r = run_cli(command, *args, "-s", DECODE, "--device", "auto", env=env)
        lines.add(assert_one_line_error(r, needle))
    assert len(lines) == 1, lines


def test_bisect_refuses_a_revert_that_does_not_apply_before_any_worker(tmp_path):
    import yaml

    folder = tmp_path / "toggles"
    folder.mkdir()
    target = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend.forward_decode"
    patch = {"target": target, "edits": [{"match": "not in the source\n", "replacement": "pass\n"}]}
    (folder / "90001.yaml").write_text(yaml.safe_dump({"pr": 90001, "title": "t", "patches": [patch]}))
    for command in ("run", "bisect"):
        extra = ["-r", "90001"]
        r = run_cli("--toggles", str(folder), command, *extra, "-s", DECODE, "--device", "cpu")
        assert_one_line_error(r, "match text not found")


def test_bisect_shards_search_whole_groups_and_together_cover_every_group(tmp_path):
    reports = []
    for i in (1, 2):
        out = tmp_path / f"b{i}.json"
        r = run_cli(
            "bisect", "-s", "fimla-draft-*", "--shard", f"{i}/2", "--device", "cpu", "--json", str(out), subprocess=True
        )
        assert r.code in (0, 1), r.err[-2000:]
        reports.append(json.loads(out.read_text()))
    assert [rep["shard"] for rep in reports] == ["1/2", "2/2"]
    groups = [{g["group"] for g in rep["groups"]} | {c["group"] for c in rep["culprits"]} for rep in reports]
    assert groups[0] and groups[1] and not groups[0] & groups[1], groups
    whole = tmp_path / "b.json"
    r = run_cli("bisect", "-s", "fimla-draft-*", "--device", "cpu", "--json", str(whole), subprocess=True)
    found = json.loads(whole.read_text())
    culprits = sorted((c["group"], tuple(c["ids"])) for c in found["culprits"])
    assert culprits == sorted((c["group"], tuple(c["ids"])) for rep in reports for c in rep["culprits"])


def test_options_are_declared_once_and_commands_take_them_by_name():
    from sglfix.cli.options import OPTIONS, takes

    with pytest.raises(KeyError):
        takes("no_such_option")
    import inspect

    from sglfix.cli.bisect_cmd import bisect_cmd
    from sglfix.cli.matrix import matrix_cmd
    from sglfix.cli.run import run_cmd

    shared = {"device", "jobs", "timeout", "devices", "executor", "ray_address", "ray_keep", "shard", "shard_costs"}
    for cmd in (run_cmd, matrix_cmd, bisect_cmd):
        params = inspect.signature(cmd).parameters
        assert shared <= set(params), (cmd.__name__, shared - set(params))
        for name in shared:
            assert params[name].annotation is OPTIONS[name][0]
