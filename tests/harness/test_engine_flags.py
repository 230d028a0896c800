"""A scenario's engine flags (``env:``) on real sglang 0.5.23: checked against the flags the
installed sglang declares before any cell runs, set for the cell's whole run in the worker and put
back after, and reaching the path they switch: FlashInfer's multi-step draft planned on the host
(``SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR``), whose host plan the judge compares with the device's
page table, so that a wrong host plan is seen though the device's is right.
"""

from __future__ import annotations

import textwrap

import pytest
from clihelp import assert_one_line_error, run_probe
from clihelp import run_cli as run_cli_raw
from real_sglang import breaking_patch, require_sglang, run_cli

_FLAG = "SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPTR"


def _scenario(tmp_path, name: str, env: str, *, backend: str = "flashinfer") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"scenarios:\n  - name: env-{name}\n    backend: {backend}\n    mode: DECODE\n"
        f"    batch: {{prefix_lens: [9, 30]}}\n    env: {env}\n"
    )
    return str(path)


@pytest.mark.parametrize(
    "name, env, profile, needles",
    [
        ("typo", "{SGLANG_OPT_FLASHINFER_DRAFT_HOST_INDPT: true}", True, ("is no engine flag", repr(_FLAG))),
        ("value", f"{{{_FLAG}: maybe}}", True, (_FLAG, "takes true or false", "'maybe'")),
        ("name", "{CUDA_VISIBLE_DEVICES: 0}", True, ("not an engine flag name",)),
        ("repro", f"{{{_FLAG}: true}}", False, ("reproduction reads no engine flags",)),
    ],
)
def test_an_engine_flag_the_code_base_would_not_read_is_one_line_before_any_cell(tmp_path, name, env, profile, needles):
    require_sglang()
    args = ("--profile", "sglang-0.5.23") if profile else ()
    backend = "flashinfer" if profile else "triton"
    r = run_cli_raw(
        *args, "run", "--scenario-file", _scenario(tmp_path, name, env, backend=backend), "--device", "cpu", timeout=120
    )
    assert_one_line_error(r, "env", *needles)


def test_the_flags_are_set_for_the_cell_and_put_back_after():
    """In a fresh interpreter: activating the profile's code base must not touch this process."""
    require_sglang()
    out = run_probe(
        textwrap.dedent(f"""
            import json
            import os
            import sglfix.codebases as codebases
            codebases.activate("sglang-0.5.23")
            from sglfix.harness.kits import kit
            from sglfix.harness.unavailable import Unavailable

            engine_flags = kit("attention").engine_flags
            os.environ.pop("{_FLAG}", None)
            os.environ["SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN"] = "0"
            with engine_flags({{"{_FLAG}": "true", "SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN": "true"}}):
                from sglang.srt.environ import envs

                inside = (envs.{_FLAG}.get(), envs.SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN.get())
            after = ("{_FLAG}" in os.environ, os.environ.get("SGLANG_OPT_FLASHINFER_VERIFY_HOST_PLAN"))
            try:
                with engine_flags({{"SGLANG_NOT_A_FLAG_OF_THIS_RELEASE": "1"}}):
                    missing = "entered"
            except Unavailable as exc:
                missing = str(exc)
            print(json.dumps({{"inside": inside, "after": after, "missing": missing,
                              "left": "SGLANG_NOT_A_FLAG_OF_THIS_RELEASE" in os.environ}}))
        """),
        timeout=300,
    )
    assert out["inside"] == [True, True], out
    assert out["after"] == [False, "0"], out
    # A release that lacks a flag lacks the path it switches: the cell says so (SKIP), nothing set.
    assert "SGLANG_NOT_A_FLAG_OF_THIS_RELEASE" in out["missing"] and not out["left"], out


def test_a_host_plan_that_disagrees_with_the_device_page_table_is_seen(tmp_path):
    """The host plan of the draft steps counts one token fewer per branch and step than the
    draft kernel writes: the device's page tables stay right (the kernel does not read the host
    plan), but FlashInfer's plan would read the host's. The judge compares the two; without the
    flag the host plan is not made, and the same edit changes nothing."""
    require_sglang()
    patch = breaking_patch(
        tmp_path, "flashinfer_backend", "[offset + branch * (step + 1) for", "[offset + branch * step for"
    )
    cells = run_cli(
        tmp_path, "-s", "fi-draft-host-indptr@topk=4,cg=eager", "-s", "fi-draft-fits@*", "--apply", str(patch)
    )["cells"]
    patched = {c["scenario"]: c for c in cells if c.get("toggles")}
    cell = patched["fi-draft-host-indptr@topk=4,cg=eager"]
    assert cell["verdict"] == "DIVERGE", cell["findings"]
    message = next(f["message"] for f in cell["findings"] if "host plan" in f["message"])
    assert message.startswith("metadata reference: step 0's host plan indptr[1] = 37, expected 38"), message
    assert all(c["verdict"] == "PASS" for n, c in patched.items() if n.startswith("fi-draft-fits")), patched
