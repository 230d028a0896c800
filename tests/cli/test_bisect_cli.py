"""``sglfix bisect`` on real cells: the parts that fail alone, and 26651's masking pair."""

from __future__ import annotations

import json

from clihelp import assert_one_line_error, run_cli

SCENARIOS = "triton-draft-extend-v2@cg=graph,builder=*,gpu_only=off"


def test_bisect_names_culprits_and_the_masking_pair(tmp_path):
    out, xml, md, summary = tmp_path / "b.json", tmp_path / "b.xml", tmp_path / "b.md", tmp_path / "summary.md"
    r = run_cli(
        "bisect",
        "-s",
        SCENARIOS,
        "-r",
        "26651:fixture,26651:triton-kv-lens,26651:clamp,26738:glue-constant",
        "--device",
        "cpu",
        "--json",
        str(out),
        "--junit",
        str(xml),
        "--markdown",
        str(md),
        timeout=900,
        env={"GITHUB_STEP_SUMMARY": str(summary)},
        subprocess=True,
    )
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]  # culprits found: a failure for CI and git bisect
    data = json.loads(out.read_text())
    assert data["candidates"] == 4
    found = {tuple(c["ids"]): c for c in data["culprits"]}
    assert set(found) == {("26651:fixture",), ("26651:triton-kv-lens",), ("26651:clamp",)}, found
    assert found[("26651:fixture",)]["scenarios"] == ["triton-draft-extend-v2@cg=graph,builder=kit,gpu_only=off"]
    assert found[("26651:clamp",)]["verdict"] == "INVARIANT"
    pairs = {(m["culprit"], m["masked_by"], m["all"]) for m in data["masking"]}
    assert ("26651:fixture", "26651:triton-kv-lens", True) in pairs
    assert ("26651:triton-kv-lens", "26651:fixture", False) in pairs  # the glue-built batch still shows it
    assert data["runs"] <= 12, data["runs"]
    assert "masking in triton-draft-extend-v2" in r.out
    # CI files: one JUnit testcase per cell the search ran, non-PASS cells failing; the Markdown
    # summary names the culprits and the masking pair, and lands in the step summary too.
    from junitparser import JUnitXml

    cases = [c for suite in JUnitXml.fromfile(str(xml)) for c in suite]
    assert len(cases) == data["cells"]
    failed = {(c.classname, c.name) for c in cases if not c.is_passed and not c.is_skipped}
    assert ("26651:fixture", "triton-draft-extend-v2@cg=graph,builder=kit,gpu_only=off") in failed
    assert ("baseline", "triton-draft-extend-v2@cg=graph,builder=kit,gpu_only=off") not in failed
    text = md.read_text()
    assert "**3 culprit(s)** among 4 candidates" in text
    assert "`26651:fixture` fails alone but passes reverted together with `26651:triton-kv-lens` on all" in text
    assert summary.read_text() == text


def test_parts_that_mask_each_other_are_found_though_reverting_both_passes(tmp_path):
    """On the kit-built draft extend, 26651's fixture and Triton parts each fail alone and pass
    reverted together: reverting every candidate together shows nothing, bisect still names both
    and the masking, and no set runs twice."""
    out = tmp_path / "b.json"
    kit = "triton-draft-extend-v2@cg=graph,builder=kit,gpu_only=off"
    r = run_cli(
        "bisect",
        "-s",
        kit,
        "-r",
        "26651:fixture,26651:triton-kv-lens",
        "--device",
        "cpu",
        "--json",
        str(out),
        "--all",  # a progress line per toggle set: each set is run once
        timeout=900,
        subprocess=True,
    )
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]
    data = json.loads(out.read_text())
    assert sorted(c["ids"][0] for c in data["culprits"]) == ["26651:fixture", "26651:triton-kv-lens"], data["culprits"]
    pairs = {(m["culprit"], m["masked_by"]) for m in data["masking"]}
    assert ("26651:fixture", "26651:triton-kv-lens") in pairs and ("26651:triton-kv-lens", "26651:fixture") in pairs
    lines = [line for line in r.err.splitlines() if line.startswith("bisect [")]
    sets = [line.split(" with ", 1)[1].split(" reverted")[0] for line in lines]
    assert len(sets) == len(set(sets)) == data["sets_run"] + 1, lines  # each set once; +1 the baseline
    assert f"the baseline and {data['sets_run']} toggle sets" in r.out


def test_bisect_refuses_unknown_ids_and_a_failing_baseline():
    assert_one_line_error(run_cli("bisect", "-r", "99999", "-s", SCENARIOS, "--device", "cpu"), "99999")
    # What SGLANG_DEBUG_REVERT_PR selects would be part of every set, the baseline included: refused,
    # unless --env-baseline takes it as the baseline on purpose (which must then pass).
    env = {"SGLANG_DEBUG_REVERT_PR": "26651:clamp"}
    args = ("bisect", "-r", "26738:glue-constant", "-s", SCENARIOS, "--device", "cpu")
    assert_one_line_error(run_cli(*args, env=env), "SGLANG_DEBUG_REVERT_PR=26651:clamp", "--env-baseline")
    r = run_cli(*args, "--env-baseline", env=env, timeout=600, subprocess=True)
    assert r.code == 1 and "the baseline (SGLANG_DEBUG_REVERT_PR=26651:clamp) fails 2 scenario(s)" in r.err, r.err[
        -2000:
    ]


DECODE = "triton-decode@cg=eager,gpu_only=off"
BACKEND = "sglfix.backends.srt.layers.attention.triton_backend.TritonAttnBackend."


def _synthetic(directory, n: int, *, culprit: int, unreached: int) -> None:
    """n single-part toggles on the eager decode path: one breaks it, one patches a CUDA-graph
    function eager decode never enters, the rest are harmless."""
    import yaml

    for i in range(n):
        if i == culprit:
            target, edit = (
                "forward_decode",
                {"match": "            layer.scaling,\n", "replacement": "            layer.scaling * 1.5,\n"},
            )
        elif i == unreached:
            target, edit = (
                "init_forward_metadata_replay_cuda_graph",
                {"match": "        seq_lens = seq_lens[:bs]\n", "append": "pass\n"},
            )
        else:
            target, edit = "forward_decode", {"match": "        md = self.forward_metadata\n", "append": "pass\n"}
        (directory / f"{81000 + i}.yaml").write_text(
            yaml.safe_dump(
                {"pr": 81000 + i, "title": f"synthetic {i}", "patches": [{"target": BACKEND + target, "edits": [edit]}]}
            )
        )


def test_one_culprit_among_16_in_log_time_and_unreachable_candidates_left_out(tmp_path):
    toggles = tmp_path / "toggles"
    toggles.mkdir()
    _synthetic(toggles, 16, culprit=11, unreached=3)
    reports = {}
    for flag in ((), ("--no-reachability",)):
        out = tmp_path / f"b{len(flag)}.json"
        r = run_cli(
            "--toggles",
            str(toggles),
            "bisect",
            "-s",
            DECODE,
            "--device",
            "cpu",
            "--json",
            str(out),
            *flag,
            timeout=600,
            subprocess=True,
        )
        assert r.code == 1, r.err[-2000:]
        reports[bool(flag)] = json.loads(out.read_text())
    reach, full = reports[False], reports[True]
    for data in (reach, full):
        assert [c["ids"] for c in data["culprits"]] == [["81011"]]
        assert data["culprits"][0]["verdict"] == "DIVERGE"
        # ceil(log2 n) complement halvings, the culprit alone and at most one "all but it"
        # (the baseline is not a toggle set); the naive matrix needs 16.
        assert data["runs"] <= 4 + 2, data["runs"]
        assert data["sets_run"] == data["runs"] + data["masking_runs"]
    (group,) = reach["groups"]
    assert reach["reachability"] and group["unreachable"] == ["81003"] and group["searched"] == 15
    assert not full["reachability"] and full["groups"][0]["unreachable"] == []
