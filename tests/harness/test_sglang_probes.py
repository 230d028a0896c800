"""Probe scenarios against the installed real sglang 0.5.23: fixes outside any attention backend.

Each built-in probe scenario (profiles/sglang-0.5.23/scenarios/probes.yaml) must PASS with every
fix in place and give its toggle's verdict with that toggle reverted; unrelated toggles leave it
PASS. Real sglang runs only in fresh interpreters (one per toggle set, reverted the production
way: ``SGLANG_DEBUG_REVERT_PR`` read by the start-up hook), never in the test process; a missing
sglang fails with the install line. The format and refusal tests need no sglang.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from builders import ROOT
from clihelp import assert_one_line_error, run_cli
from real_sglang import STANDINS, clean_env, known_divergences, require_sglang

from sglfix.codebases import CODEBASES, REPRODUCTION, check_scenarios_runnable
from sglfix.common.errors import ConfigError
from sglfix.scenario import load_scenario_file
from sglfix.scenario.modes import PROBE_RULES, PROBES

PROBES_FILE = ROOT / "profiles" / "sglang-0.5.23" / "scenarios" / "probes.yaml"
SGLANG = CODEBASES["sglang-0.5.23"]

# toggle id -> {scenario: verdict} for the scenarios it must fail; every other scenario run with
# it must stay PASS. The draft probes are costly (the draft loop runs its interpreted kernels):
# only 25015's set and the baseline run them.
EXPECT = {
    # The widening it removes is what holds the allocator's whole page under DCP as well.
    "26972": {
        "probe-req-to-token-tree-paged": "INVARIANT",
        "probe-req-to-token-chain-paged": "INVARIANT",
        "probe-req-to-token-chain-dcp": "INVARIANT",
        "probe-req-to-token-tree-dcp": "INVARIANT",
        "probe-req-to-token-tree-aligned": "INVARIANT",
    },
    "26329": {"probe-eagle-prefill-tail": "DIVERGE"},
    "25015": {"probe-draft-positions-chain": "DIVERGE", "probe-draft-positions-tree": "DIVERGE"},
    "26738:overlap-guard": {
        "probe-needs-cpu-seq-lens@gpu_only=on": "CRASH",
        "probe-needs-cpu-seq-lens@gpu_only=off": "CRASH",
        "probe-draft-extend-idle@gpu_only=on": "CRASH",
    },
    # The idle rank's draft extend: Triton reads the absent field; FlashInfer (kept off gpu_only
    # batches by the scheduler) reads the absent pre-built indices.
    "28221:triton": {"probe-draft-extend-idle@gpu_only=off": "CRASH", "probe-draft-extend-idle@gpu_only=on": "CRASH"},
    "28221:flashinfer": {"probe-draft-extend-idle@gpu_only=off": "CRASH"},
    # A captured verify or draft extend after a prefill that fell back to FlashInfer takes the fallback.
    "32288:gate": {
        "probe-trtllm-capture-fallback@mode=TARGET_VERIFY": "INVARIANT",
        "probe-trtllm-capture-fallback@mode=DRAFT_EXTEND_V2": "INVARIANT",
    },
    # Long requests past the graph's max_bs overrun the FULL_MASK buffer; short ones fit by luck.
    "33127:fits": {
        "probe-verify-mask-long@gpu_only=off": "INVARIANT",
        "probe-verify-mask-long@gpu_only=on": "INVARIANT",
    },
}
DRAFT = ("probe-draft-positions-chain", "probe-draft-positions-tree")

# A finding on real sglang 0.5.23 with every fix in place: with page_size 1 the req_to_token
# headroom stays 4 + num_draft_tokens (12) while a tree draft reserves 2 x max(topk x num_steps,
# num_draft_tokens) = 24 positions per decode step, so a request within 24 positions of the
# context limit writes past its row into the next request's.
FINDING = """\
name: finding-req-to-token-tree-unpaged
probe: req-to-token-headroom
mode: DECODE
batch: {prefix_lens: [253, 240]}
max_context_len: 256
page_size: 1
spec: {topk: 4, num_steps: 3, num_draft_tokens: 8}
"""

# Runs in a fresh interpreter: the cells of the given files (optionally only some names), then
# whether the probes left sglang's published server args and the kit's module as they found them.
RUN = """
import json, sys
import sglfix
from sglfix import codebases
codebases.activate("sglang-0.5.23")
from sglfix.harness.cell import run_cell
from sglfix.scenario import load_scenario_file
args = json.loads(sys.argv[1])
from sglang.srt.runtime_context import get_context
from sglang.test.kits.attention_unittest.runner_modes import speculative_draft_runner as sdr
# The draft kit's one-time process set-up (a worker's first draft or MLA cell makes it: it imports
# sglang.test.test_utils once) comes before the snapshot; a probe that replaces the module after is
# still caught.
from sglfix.harness.kits import kit
kit("drafts").prepare()
from sglang.srt.layers.attention import flashinfer_mla_backend as fimla, trtllm_mla_backend as trt
from sglang.srt.speculative import eagle_utils
# What the probes bind around the code under test (kernel launches, device queries) and must put back.
def bound():
    return (vars(trt).get("flashinfer"), trt._jit_fixup_module, trt.can_use_set_mla_kv_concat_q,
            fimla.FlashInferMLAAttnBackend.__dict__["forward_extend"],
            vars(eagle_utils).get("build_tree_kernel_efficient_func"), vars(eagle_utils).get("sgl_build_tree_kernel_efficient"))
before = (get_context()._server_args, sdr._seeded_rng, sys.modules.get("sglang.test.test_utils"), *bound())
for path in args["files"]:
    for s in load_scenario_file(path):
        if args["only"] is None or s.name in args["only"]:
            r = run_cell(s, device="cpu", toggles=args["toggles"])
            print("CELL " + json.dumps({"name": s.name, "verdict": r.verdict, "key": r.key_figure,
                                         "findings": r.findings, "ms": r.timings_ms.get("total")}))
after = (get_context()._server_args, sdr._seeded_rng, sys.modules.get("sglang.test.test_utils"), *bound())
print("STATE " + json.dumps({"reverted": sglfix.reverted_ids(),
                             "clean": all(a is b for a, b in zip(before, after))}))
"""


def _run(toggle: str | None, files: list[str], only: list[str] | None = None) -> dict:
    env = clean_env(SGLFIX_PROFILE="sglang-0.5.23", **({"SGLANG_DEBUG_REVERT_PR": toggle} if toggle else {}))
    arg = json.dumps({"files": files, "only": only, "toggles": [toggle] if toggle else []})
    r = _python(RUN, env, arg)
    assert r.returncode == 0, f"toggle {toggle}: exit {r.returncode}\n{r.stderr[-4000:]}"
    cells, state = {}, None
    for line in r.stdout.splitlines():
        if line.startswith("CELL "):
            cell = json.loads(line[5:])
            cells[cell["name"]] = cell
        elif line.startswith("STATE "):
            state = json.loads(line[6:])
    assert state is not None, r.stdout[-2000:] + r.stderr[-2000:]
    return {"cells": cells, "state": state}


def _python(code: str, env: dict, arg: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", STANDINS + code, arg],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=str(ROOT),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """One fresh interpreter per toggle set (two at a time: the CI box has two cores)."""
    require_sglang()
    finding = tmp_path_factory.mktemp("probes") / "finding.yaml"
    finding.write_text(FINDING)
    names = [s.name for s in load_scenario_file(PROBES_FILE)]
    jobs = {None: ([str(PROBES_FILE), str(finding)], None)}
    for toggle in EXPECT:
        jobs[toggle] = ([str(PROBES_FILE)], names if toggle == "25015" else [n for n in names if n not in DRAFT])
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {t: pool.submit(_run, t, files, only) for t, (files, only) in jobs.items()}
        return {t: f.result() for t, f in futures.items()}


# ------------------------------------------------------------------ against real sglang


def _known() -> dict[str, str]:
    """Built-in probe scenarios the profile lists as known upstream divergences -> their verdict."""
    names = [s.name for s in load_scenario_file(PROBES_FILE)]
    return {name: verdicts[0] for name, verdicts in known_divergences(names).items()}


def test_every_probe_scenario_passes_with_the_fixes_in_place(runs):
    base = runs[None]
    known = _known()
    assert known, "the page-size-1 finding is built in, listed as a known divergence"
    names = [s.name for s in load_scenario_file(PROBES_FILE) if s.name not in known]
    assert set(names) <= set(base["cells"]), sorted(base["cells"])
    failing = {
        n: (base["cells"][n]["verdict"], base["cells"][n]["key"])
        for n in names
        if base["cells"][n]["verdict"] != "PASS"
    }
    assert not failing, failing
    assert {n: base["cells"][n]["verdict"] for n in known} == known  # shown with its verdict, never hidden
    for n in names:  # a PASS says what it measured
        assert base["cells"][n]["findings"][0]["verdict"] == "PASS" and base["cells"][n]["key"], base["cells"][n]
    assert base["state"] == {"reverted": [], "clean": True}, base["state"]


@pytest.mark.parametrize("toggle", list(EXPECT))
def test_each_toggle_gives_its_verdict_and_leaves_the_other_probes_passing(runs, toggle):
    got = runs[toggle]
    # The revert really went in (a toggle without parts is its one part "main").
    assert got["state"]["reverted"] == [toggle if ":" in toggle else f"{toggle}:main"], got["state"]
    assert got["state"]["clean"], got["state"]
    verdicts = {n: c["verdict"] for n, c in got["cells"].items()}
    known = _known()
    want = {n: EXPECT[toggle].get(n, known.get(n, "PASS")) for n in verdicts}
    assert verdicts == want, {n: (c["verdict"], c["key"]) for n, c in got["cells"].items()}


def test_the_findings_name_what_went_wrong(runs):
    cells = {t: runs[t]["cells"] for t in EXPECT}
    r2t = cells["26972"]["probe-req-to-token-tree-paged"]["key"]
    assert "request 0 (committed 253) needs up to 512" in r2t and "the row holds 268" in r2t, r2t
    spill = [f["message"] for f in cells["26972"]["probe-req-to-token-tree-paged"]["findings"]]
    assert any("spilled past a req_to_token row" in m and "request 1's row" in m for m in spill), spill
    tail = cells["26329"]["probe-eagle-prefill-tail"]["key"]
    assert "request 2 (chunked prefill, prompt continues)" in tail and "the target's sampled token" in tail, tail
    draft = cells["25015"]["probe-draft-positions-tree"]
    assert "(+1)" in draft["key"] and "18/18" in draft["key"], draft["key"]
    crash = cells["26738:overlap-guard"]["probe-needs-cpu-seq-lens@gpu_only=on"]["findings"][0]
    assert crash["type"] == "AttributeError" and crash["frame"].startswith("srt/managers/overlap_utils.py:"), crash
    assert crash["stage"] == "forward", crash
    undeclared = cells["26738:overlap-guard"]["probe-needs-cpu-seq-lens@gpu_only=off"]["key"]
    assert "'UndeclaredAttnBackend' object has no attribute 'needs_cpu_seq_lens'" in undeclared, undeclared
    idle = cells["28221:triton"]["probe-draft-extend-idle@gpu_only=off"]["findings"][0]
    assert idle["type"] == "AttributeError" and "kv_indptr" in idle["message"], idle
    assert idle["stage"] == "triton: idle metadata init" and idle["frame"].startswith(
        "srt/layers/attention/triton_backend.py:"
    )
    stale = cells["28221:flashinfer"]["probe-draft-extend-idle@gpu_only=off"]["findings"][0]
    assert stale["stage"] == "flashinfer: idle metadata init" and "kv_indices" in stale["message"], stale
    overrun = cells["33127:fits"]["probe-verify-mask-long@gpu_only=off"]["key"]
    assert "past max_bs (3 requests, 747 cached tokens)" in overrun and "3036 FULL_MASK cells" in overrun, overrun
    assert "the backend's buffer of 2080" in overrun, overrun
    stale = cells["32288:gate"]["probe-trtllm-capture-fallback@mode=TARGET_VERIFY"]["key"]
    assert "TARGET_VERIFY captured at 2 after a prefill on prefixes [40, 70]" in stale, stale
    assert "reached FlashInfer MLA prefill fallback" in stale, stale


def test_an_idle_pass_says_what_it_ran(runs):
    base = runs[None]["cells"]
    both = base["probe-draft-extend-idle@gpu_only=off"]["key"]
    assert "padded to 8 tokens (2 rows of request row 0)" in both and "triton, flashinfer" in both, both
    alone = base["probe-draft-extend-idle@gpu_only=on"]["key"]
    assert "flashinfer not run (the scheduler keeps CPU seq_lens for it)" in alone, alone
    fits = base["probe-verify-mask-short"]["key"]
    assert "past max_bs (3 requests): 288 FULL_MASK cells in its own allocation" in fits, fits
    assert "past max_bs, mask unread (3 requests): 48 QLEN_ONLY cells in its own allocation" in fits, fits
    assert "within max_bs (2 requests): 140 FULL_MASK cells in the backend's buffer" in fits, fits


def test_the_draft_extend_view_finding_names_the_rows_and_its_fix_clears_it(runs):
    base = runs[None]["cells"]
    padded = base["probe-draft-extend-view@cg=graph-padded,gpu_only=off"]
    assert padded["verdict"] == "INVARIANT", padded
    for want in (
        "a batch of 3 replayed at 4 (buffers of 8)",
        "req_pool_indices has 8 rows for a batch of 4",
        "seq_lens_cpu has 8 rows",
        "num_padding is None, the replay pads 1 row(s)",
    ):
        assert want in padded["key"], (want, padded["key"])
    mirrorless = base["probe-draft-extend-view@cg=graph,gpu_only=on"]["key"]
    assert "seq_lens_cpu" not in mirrorless and "replayed at 3" in mirrorless, mirrorless
    fix = ROOT / "profiles" / "sglang-0.5.23" / "fixes" / "draft-extend-view-bucket.patch"
    r = run_cli(
        "--profile",
        "sglang-0.5.23",
        "run",
        "-s",
        "probe-draft-extend-view*",
        "--device",
        "cpu",
        "--apply",
        str(fix),
        "--expect-fixes",
        "probe-draft-extend-view*",
        subprocess=True,
    )
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    assert "+draft-extend-view-bucket: fixes known divergence probe-draft-extend-view@" in r.out, r.out[-2000:]
    assert "breaks nothing" in r.out, r.out[-2000:]


def test_a_baseline_finding_on_real_sglang_is_shown_not_hidden(runs):
    cell = runs[None]["cells"]["finding-req-to-token-tree-unpaged"]
    assert cell["verdict"] == "INVARIANT", cell
    assert "needs up to 277" in cell["key"] and "the row holds 268" in cell["key"], cell["key"]


# ------------------------------------------------------------------ format and refusal (no sglang)


def test_the_probe_table_and_the_code_base_agree():
    assert set(SGLANG.probes) == set(PROBES), (sorted(SGLANG.probes), PROBES)
    assert REPRODUCTION.probes == {}
    for module in SGLANG.probes.values():
        assert module.startswith("sglfix.harness.probes.sglang."), module
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module
    scenarios = load_scenario_file(PROBES_FILE)
    covered = {s.probe for s in scenarios}
    assert covered == set(PROBES), covered  # every probe has a built-in scenario
    for s in scenarios:
        assert s.backend is None and s.mode in PROBE_RULES[s.probe].modes, s
        assert s.to_json()["probe"] == s.probe and type(s).from_json(s.to_json()) == s


def test_a_probe_scenario_is_refused_on_a_code_base_without_the_probe():
    scenarios = load_scenario_file(PROBES_FILE)
    check_scenarios_runnable(scenarios, SGLANG)
    with pytest.raises(ConfigError) as info:
        check_scenarios_runnable(scenarios, REPRODUCTION)
    message = str(info.value)
    assert "\n" not in message, message
    assert f"{PROBES_FILE}:" in message and "probe-req-to-token-tree-paged" in message, message
    assert "probe req-to-token-headroom does not exist on reproduction" in message, message
    assert "it runs on sglang-0.5.23" in message, message


def test_the_cli_refuses_probe_scenarios_under_the_reproduction_profile_before_any_cell():
    assert_one_line_error(
        run_cli("run", "--scenario-file", str(PROBES_FILE), "--device", "cpu"),
        "probe req-to-token-headroom does not exist on reproduction",
    )


BAD_PROBES = [
    (
        "name: x\nprobe: draft-position\nmode: DRAFT_DECODE\nbatch: {prefix_lens: [3]}\n",
        2,
        "did you mean 'draft-positions'",
    ),
    (
        "name: x\nprobe: draft-positions\nbackend: triton\nmode: DRAFT_DECODE\nbatch: {prefix_lens: [3]}\n",
        3,
        "give exactly one",
    ),
    ("name: x\nprobe: eagle-prefill-tail\nmode: DECODE\nbatch: {prefix_lens: [3]}\n", 3, "takes mode EXTEND"),
    (
        "name: x\nprobe: eagle-prefill-tail\nmode: EXTEND\nbatch: {prefix_lens: [3], extend_lens: 2}\npage_size: 16\n",
        5,
        "does not read page_size; drop it",
    ),
    (
        "name: x\nprobe: needs-cpu-seq-lens\nmode: DECODE\nbatch: {prefix_lens: [3]}\ncuda_graph: {capture_bs: [1]}\n",
        5,
        "does not read cuda_graph",
    ),
    (
        "name: x\nprobe: draft-positions\nmode: DRAFT_DECODE\nbatch: {prefix_lens: [3]}\npage_size: 16\n",
        5,
        "takes page_size 1",
    ),
    (
        "name: x\nprobe: draft-extend-view\nmode: DRAFT_EXTEND_V2\nbatch: {prefix_lens: [3]}\n",
        2,
        "replays a CUDA graph: give cuda_graph",
    ),
    (
        "name: x\nprobe: draft-positions\nmode: DRAFT_DECODE\nbatch: {prefix_lens: [3]}\nmodel: {sliding_window: 4}\n",
        5,
        "builds no sliding-window layer",
    ),
    (
        "name: x\nprobe: req-to-token-headroom\nmode: DECODE\nbatch: {prefix_lens: [3, 255]}\nmax_context_len: 256\n",
        4,
        "never reaches",
    ),
]


@pytest.mark.parametrize("text,line,needle", BAD_PROBES)
def test_bad_probe_scenarios_are_one_line_errors_citing_the_line(tmp_path, text, line, needle):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_scenario_file(f)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{f}:{line}:"), message
    assert needle in message, message


def test_a_bad_probe_name_on_the_cli_is_one_line_with_the_nearest_name(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD_PROBES[0][0])
    assert_one_line_error(
        run_cli("scenarios", "--scenario-file", str(f)), "bad.yaml:2:", "did you mean 'draft-positions'"
    )


# ------------------------------------------------------------------ a probe that does not fit the tree

_ENGINE = """\
def lens(reqs):
    out = []
    for r in reqs:
        out.append(r.kv_allocated_len)  # this tree keeps the field on the request itself
    return out


def broken(slot):
    return slot.needs_cpu_seq_lens  # the engine's own bug: a None slot
"""

_MISFIT_PROBE = """\
try:
    from sglfix.harness.misfit import Standin
except ImportError:  # how a probe built its stand-ins before
    from types import SimpleNamespace as Standin


class Probe:
    name = "req-to-token-headroom"

    def run(self, scenario, *, device, result, stage):
        stage("forward")
        from fakeengine_misfit import alloc

        how = scenario.name.split("-")[-1]
        if how == "standin":
            alloc.lens([Standin(kv=Standin(kv_allocated_len=1))])
        elif how == "attr":
            alloc.get_alloc_page_size()
        elif how == "import":
            from fakeengine_misfit.allocation import assign  # noqa: F401
        elif how == "call":
            alloc.lens([], reserve=1)
        else:
            alloc.broken(None)


PROBE = Probe()
"""


def test_a_probe_that_does_not_fit_the_tree_is_an_error_of_sglfix_not_a_crash(tmp_path, monkeypatch):
    """A tree whose interfaces moved (a field read off the request itself, a function renamed, a
    module moved, an argument dropped): the probe's failure, ERROR "this probe does not support
    this code base"; the engine's own bug in the same place stays its CRASH."""
    from sglfix.codebases import CodeBase
    from sglfix.common.codebase import active_codebase, clear_package_dirs, set_active
    from sglfix.harness.cell import run_cell
    from sglfix.scenario import load_scenarios

    (tmp_path / "fakeengine_misfit").mkdir()
    (tmp_path / "fakeengine_misfit" / "__init__.py").write_text("")
    (tmp_path / "fakeengine_misfit" / "alloc.py").write_text(_ENGINE)
    (tmp_path / "fakeprobe_misfit.py").write_text(_MISFIT_PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    clear_package_dirs()
    cases = ("standin", "attr", "import", "call", "bug")
    f = tmp_path / "s.yaml"
    f.write_text(
        "scenarios:\n"
        + "".join(
            f"  - {{name: misfit-{c}, probe: req-to-token-headroom, mode: DECODE, batch: {{prefix_lens: [5]}}, "
            f"page_size: 1, spec: {{topk: 1, num_steps: 1, num_draft_tokens: 2}}}}\n"
            for c in cases
        )
    )
    cb = CodeBase(
        name="fake-misfit", package="fakeengine_misfit", summary="", distribution="fakeengine-misfit",
        version="1.0", probes={"req-to-token-headroom": "fakeprobe_misfit"},
    )  # fmt: skip
    before = active_codebase()
    set_active(cb)
    try:
        cells = {s.name.split("-")[-1]: run_cell(s, device="cpu") for s in load_scenarios([f], builtin=False)}
    finally:
        set_active(before)
        clear_package_dirs()
    got = {c: (r.verdict, r.findings[0]["message"]) for c, r in cells.items()}
    for case, needle in (
        ("standin", "lens (alloc.py:4) reads .kv_allocated_len of sglfix's stand-in Standin"),
        ("attr", "fakeengine_misfit.alloc has no attribute get_alloc_page_size"),
        ("import", "no module fakeengine_misfit.allocation"),
        ("call", "lens() got an unexpected keyword argument 'reserve' (fakeengine_misfit.alloc.lens of this tree)"),
    ):
        verdict, message = got[case]
        assert verdict == "ERROR" and f"this probe does not support this code base: {needle}" in message, got[case]
    assert got["bug"][0] == "CRASH" and "needs_cpu_seq_lens" in got["bug"][1], got["bug"]


def test_a_real_tree_the_probe_does_not_fit_is_an_error_and_its_known_divergence_not_judged(tmp_path):
    """sglang with the request's KV lengths moved (what a 0.5.19-dev tree did to the req-to-token
    probe): the probe's ERROR, and the divergence the profile lists for that scenario is "not
    judged", never "not seen (fixed?)": its cell ran to no verdict."""
    import os
    import shutil

    sglang = Path(require_sglang())
    tree = tmp_path / "tree"
    shutil.copytree(sglang, tree / "sglang", copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))
    sizing = tree / "sglang" / "srt" / "mem_cache" / "allocation_sizing.py"
    text = sizing.read_text()
    assert text.count("cur = r.kv.kv_allocated_len") == 1, "the line this test edits has moved"
    sizing.unlink()
    sizing.write_text(text.replace("cur = r.kv.kv_allocated_len", "cur = r.kv_allocated_len"))
    out = tmp_path / "run.json"
    r = run_cli(
        "--profile", "sglang-0.5.23", "run", "-s", "probe-req-to-token-tree-ps1", "--device", "cpu",
        "--json", str(out), env={"PYTHONPATH": str(tree), "SGLFIX_STORE": "0"}, timeout=300, subprocess=True,
    )  # fmt: skip
    assert r.code == 1, (r.code, r.out[-1500:], r.err[-1500:])
    report = json.loads(out.read_text())
    (cell,) = report["cells"]
    message = cell["findings"][0]["message"]
    assert cell["verdict"] == "ERROR", cell
    assert "this probe does not support this code base: page_aligned_decode_alloc_lens" in message, message
    (known,) = [k for k in report["known_divergences"] if k["scenario"] == "probe-req-to-token-tree-ps1"]
    assert known["status"].startswith("not judged: 1 of its 1 cell(s) ran to no verdict (ERROR)"), known


def test_a_probe_cell_shows_a_mutant_equivalent_or_changed(tmp_path):
    """A probe digests what the engine code it runs built for the path it judges
    (``fingerprint.observe``): a mutant that builds the same (``len(seq_lens - 1)`` in the
    FlashInfer-MLA prefill planning the TRT-LLM MLA backend falls back to) is suspected equivalent
    with that evidence, and so is one that changes only state no launch of the probe reads (the
    parent's graph buffer, one slot larger); a change to the stale prefill plan itself is left to
    the cells that run that plan's kernel, which kill it."""
    require_sglang()
    out = tmp_path / "m.json"
    r = run_cli(
        "--profile",
        "sglang-0.5.23",
        "mutate",
        "--function",
        "*FlashInferMLAIndicesUpdaterPrefill.call_begin_forward",
        "--function",
        "*FlashInferMLAAttnBackend.init_cuda_graph_state",
        "--operators",
        "off-by-one",
        "-s",
        "probe-trtllm-capture-fallback@mode=TARGET_VERIFY",
        "-s",
        "sglang-fimla-extend",
        "--all-cells",
        "--device",
        "cpu",
        "--jobs",
        "2",
        "--no-cache",
        "--json",
        str(out),
        env=clean_env(),
        subprocess=True,
        timeout=600,
    )
    assert r.code in (0, 1), r.stderr[-3000:]
    mutants = {m["id"]: m for m in json.loads(out.read_text())["mutants"]}
    by_status = {s: [m for m in mutants.values() if m["status"] == s] for s in ("survived", "error", "equivalent")}
    assert not by_status["error"], by_status["error"][0]
    same = mutants["m-543c1df603"]  # bs = len((seq_lens - 1))
    assert same["status"] == "equivalent" and same["evidence"]["cells"] == 2, same
    slack = mutants["m-06fa8d6192"]  # the parent's cuda_graph_kv_indices, max_bs * (max_context_len + 1)
    assert slack["status"] == "equivalent" and slack["reached_by"] == [
        "probe-trtllm-capture-fallback@mode=TARGET_VERIFY"
    ]
    shifted = mutants["m-1cc312e1ec"]  # qo_indptr from seq_lens - prefix_lens + 1
    assert shifted["status"] == "killed" and {k["scenario"] for k in shifted["killed_by"]} == {"sglang-fimla-extend"}


def test_the_verify_input_check_derives_the_tree_from_its_parents_and_names_a_difference():
    """The verify-mask probe's judge of what the tree kernel built: from the parent list alone,
    every mask row, position, retrieve link and token; one cell, one position, one link off is
    named."""
    from types import SimpleNamespace

    import torch

    from sglfix.harness.probes.sglang.verify_mask_fits import _check_tree, _draft_tree, _tree_facts

    spec = SimpleNamespace(topk=4, num_steps=3, num_draft_tokens=8)
    tree = _draft_tree(spec=spec, seed=0)
    assert tree[0] == -1 and all(0 <= tree[i] < i for i in range(1, 8))
    assert all(tree[i] <= tree[i + 1] for i in range(1, 7))  # breadth first
    depth, seen, first_child, sibling = _tree_facts(tree)
    lens = [5, 3]
    rows = []
    for s in lens:
        for i in range(8):
            rows += [1] * s + [int(x) for x in seen[i]]
    good = dict(
        custom_mask=torch.tensor(rows, dtype=torch.bool),
        positions=torch.tensor([s + depth[i] for s in lens for i in range(8)]),
        retrieve_index=torch.tensor([[b * 8 + i for i in range(8)] for b in range(2)]),
        retrieve_next_token=torch.tensor([first_child] * 2),
        retrieve_next_sibling=torch.tensor([sibling] * 2),
        draft_token=torch.tensor([t for b in range(2) for t in [b + 1, *range(100, 107)]]),
        draft_token_num=8,
        topk=4,
        spec_steps=3,
        num_tokens_per_req=8,
        num_tokens_for_logprob_per_req=8,
        prepared_out_cache_loc=None,
    )
    call = {"mode": "FULL_MASK", "ndt": 8}
    slots = torch.arange(2 * 32).reshape(2, 32) + 1000

    def check(**changes):
        return _check_tree(
            SimpleNamespace(**{**good, **changes}),
            call=call,
            lens=lens,
            spec=spec,
            tree=tree,
            prefix_filled=True,
            slots=slots,
        )

    assert check() is None
    flipped = good["custom_mask"].clone()
    flipped[5 + 8 + 5 + 7] = True  # request 0, draft token 1 would see draft token 7
    assert "request 0 draft token 1 sees draft token 7" in check(custom_mask=flipped)
    assert "positions" in check(positions=good["positions"] + 1)
    linked = good["retrieve_next_sibling"].clone()
    linked[1, 1] = -1
    assert "retrieve_next_sibling" in check(retrieve_next_sibling=linked)
    assert "topk is 5" in check(topk=5)
    assert "custom_mask holds" in check(custom_mask=good["custom_mask"][:-1])
    # A prefix cell nothing wrote holds the poison, which reads as a bool True: named by its byte.
    from sglfix.harness.poison import poison_

    unfilled = good["custom_mask"].clone()
    poison_(unfilled[5 + 8 + 2 : 5 + 8 + 3])  # request 0, draft token 1, prefix token 2
    assert bool(unfilled.all() == good["custom_mask"].all())
    assert "request 0 draft token 1, prefix token 2: a byte nothing wrote" in check(custom_mask=unfilled)
    # The CUDA kernel writes a byte per cell whatever the buffer's dtype: a float32 buffer holds
    # its cells in the bytes of its elements, which the verify kernel then reads as floats.
    from sglfix.harness.probes.sglang.verify_mask_fits import _as_bytes

    floats = torch.zeros(good["custom_mask"].numel(), dtype=torch.float32)
    _as_bytes(floats)[: good["custom_mask"].numel()] = good["custom_mask"].view(torch.uint8)
    assert "does not see prefix token" in check(custom_mask=floats)
    assert _as_bytes(good["custom_mask"]) is good["custom_mask"]
    # The verify forward plans and keeps logits by these; a chain builder's write slots are the rows'.
    assert "num_tokens_per_req is 9" in check(num_tokens_per_req=9)
    assert "num_tokens_for_logprob_per_req is 7" in check(num_tokens_for_logprob_per_req=7)
    written = torch.tensor([int(slots[b][s + i]) for b, s in enumerate(lens) for i in range(8)])
    assert check(prepared_out_cache_loc=written) is None
    assert "prepared_out_cache_loc" in check(prepared_out_cache_loc=written + 1)


def test_the_verify_probe_judges_the_idle_input_and_the_mask_owner_layout():
    """An idle rank's verify input keeps the draft's sizes and has no rows; a mask its backend
    reads is FULL_MASK, one it never reads QLEN_ONLY, each with room for max_bs requests."""
    from types import SimpleNamespace

    import torch

    from sglfix.harness.probes.sglang.verify_mask_fits import _check_idle, _check_owner

    spec = SimpleNamespace(topk=1, num_steps=3, num_draft_tokens=4)
    empty = dict(
        draft_token=torch.empty(0),
        custom_mask=torch.empty(0),
        positions=torch.empty(0),
        retrieve_index=torch.empty(0, 4),
        retrieve_next_token=torch.empty(0, 4),
        retrieve_next_sibling=torch.empty(0, 4),
        draft_token_num=4,
        topk=1,
        spec_steps=3,
        num_tokens_per_req=4,
        num_tokens_for_logprob_per_req=4,
    )
    assert _check_idle(SimpleNamespace(**empty), spec=spec) is None
    assert "spec_steps is 4" in _check_idle(SimpleNamespace(**{**empty, "spec_steps": 4}), spec=spec)
    assert "(0, 4)" in _check_idle(SimpleNamespace(**{**empty, "retrieve_index": torch.empty(0, 5)}), spec=spec)
    assert "no rows" in _check_idle(SimpleNamespace(**{**empty, "positions": torch.zeros(1)}), spec=spec)

    backend = SimpleNamespace(max_context_len=64)

    def mask(mode, numel, *, is_read, max_bs=2):
        return SimpleNamespace(
            mode=SimpleNamespace(name=mode), buffer=torch.zeros(numel), is_read=is_read, max_bs=max_bs
        )

    full, qlen = 2 * 4 * (64 + 4), 2 * 4 * 4
    assert (
        _check_owner(mask("FULL_MASK", full, is_read=True), owner="read", max_bs=2, spec=spec, backend=backend) is None
    )
    assert (
        _check_owner(mask("QLEN_ONLY", qlen, is_read=False), owner="unread", max_bs=2, spec=spec, backend=backend)
        is None
    )
    assert "needs QLEN_ONLY" in _check_owner(
        mask("FULL_MASK", full, is_read=False), owner="unread", max_bs=2, spec=spec, backend=backend
    )
    assert f"write {qlen}" in _check_owner(
        mask("QLEN_ONLY", qlen - 1, is_read=False), owner="unread", max_bs=2, spec=spec, backend=backend
    )
    assert "max_bs 3" in _check_owner(
        mask("FULL_MASK", full * 2, is_read=True, max_bs=3), owner="read", max_bs=2, spec=spec, backend=backend
    )


def test_the_draft_tree_judge_grows_the_tree_from_the_model_and_names_a_difference():
    """The draft-positions probe's judge of draft_forward's output: from the first draft tokens and
    each step's logits alone, the candidates, their path scores and tokens; a frontier that is not
    a best topk, a token the model did not give, a wrong write slot and a short output are named."""
    from types import SimpleNamespace

    import torch

    from sglfix.harness.probes.sglang.draft_positions import _check_steps, _check_tree

    spec = SimpleNamespace(topk=2, num_steps=3, num_draft_tokens=4)
    # One request; step 0 runs the root's two children, step 1 the frontier (candidates 2 and 4).
    start = {"p": torch.tensor([[0.6, 0.4]]), "tokens": torch.tensor([[7, 8]]), "slots": list(range(100, 106)), "bs": 1}
    logits0 = torch.full((2, 16), -9.0)
    logits0[0, 3], logits0[0, 4] = 4.0, 1.0  # child of 7: token 3 (p ~0.95), then 4
    logits0[1, 5], logits0[1, 6] = 4.0, 3.9  # child of 8: tokens 5 and 6, nearly even
    logits1 = torch.full((2, 16), -9.0)
    logits1[0, 9], logits1[1, 10] = 5.0, 5.0
    steps = [
        {"input_ids": [7, 8], "out_cache_loc": [100, 103], "logits": logits0},
        {"input_ids": [3, 5], "out_cache_loc": [101, 104], "logits": logits1},
    ]
    assert _check_steps(steps, start=start, spec=spec) is None
    # Candidates: 0:7 (.6) 1:8 (.4) | 2:3 (.57) 3:4 (.03) 4:5 (.21) 5:6 (.19) | 6:9 (.57) 7 | 8:10 (.21) 9
    good = (torch.tensor([[-1, 0, 1, 2, 4]]), torch.tensor([[0, 2, 6]]), torch.tensor([[7, 3, 9]]))
    assert _check_tree(good, steps, start=start, spec=spec) is None
    assert "draft tokens [7, 8, 4]" in _check_tree(
        (good[0], good[1], torch.tensor([[7, 8, 4]])), steps, start=start, spec=spec
    )
    assert "not the 3 best-scored" in _check_tree(
        (good[0], torch.tensor([[0, 1, 3]]), torch.tensor([[7, 8, 4]])), steps, start=start, spec=spec
    )
    assert "frontier [2, 3] is not a best 2" in _check_tree(
        (torch.tensor([[-1, 0, 1, 2, 3]]), good[1], good[2]), steps, start=start, spec=spec
    )
    assert "has 0 rows for 1 requests" in _check_tree((good[0][:0], good[1], good[2]), steps, start=start, spec=spec)
    moved = [dict(steps[0]), steps[1]]
    moved[0]["out_cache_loc"] = [100, 104]
    assert "request 0 branch 1 owns slot 103" in _check_steps(moved, start=start, spec=spec)


def test_the_decode_allocation_is_judged_where_it_starts_and_where_it_ends(tmp_path):
    """The req_to_token probe judges a decode allocation against the request's own state, not the
    figures the code under test returned: one that starts off the request's allocated length (a
    held position handed a fresh slot, or a position no slot backs) and one that holds more than
    the draft can write are both failures, and so is a length list one entry longer than the
    batch."""
    require_sglang()
    out = tmp_path / "m.json"
    r = run_cli(
        *("--profile", "sglang-0.5.23", "mutate", "--function", "*allocation_sizing.page_aligned_decode_alloc_lens"),
        *("--operators", "off-by-one", "-s", "probe-req-to-token-*", "--device", "cpu", "--jobs", "2"),
        *("--no-cache", "--json", str(out)),
        env=clean_env(),
        subprocess=True,
        timeout=600,
    )
    assert r.code in (0, 1), r.stderr[-3000:]
    mutants = {m["mutated"].strip(): m for m in json.loads(out.read_text())["mutants"]}

    def killed_saying(mutated: str) -> str:
        m = mutants[mutated]
        assert m["status"] == "killed", m
        return json.dumps(m["killed_by"])

    assert "starts at" in killed_saying("cur = (r.kv.kv_allocated_len - 1)")
    assert "starts at" in killed_saying("cur = (r.kv.kv_allocated_len + 1)")
    over = next(k for k in mutants if k.endswith("// page_size * page_size + 1),"))
    assert "no draft writes" in killed_saying(over)
    # One length more than the batch has requests: the engine zips them with its requests strictly.
    assert "one each" in killed_saying("cur_kv_lens = [0] * (len(reqs) + 1)")
