"""A CPU worker's address space is capped: code that asks for far more memory than any cell needs
(metadata gone wrong, a poison value read as a length) fails in its cell, where the report names
the allocation, instead of exhausting the machine's memory for every process on it."""

from __future__ import annotations

import json

import pytest
from builders import write_toggle
from clihelp import run_cli

from sglfix.execution.devices import MEMORY_ENV, memory_cap

GREEDY = "        __import__('torch').empty(3 << 30, dtype=__import__('torch').uint8)\n"  # 3 GiB, never touched


@pytest.mark.parametrize(("cap", "verdict"), [("2", "CRASH"), ("0", "PASS")])
def test_an_allocation_past_the_cap_fails_in_its_cell_and_none_without_one(tmp_path, cap, verdict):
    d = tmp_path / "toggles"
    d.mkdir()
    write_toggle(d, 88821, append=GREEDY, title="asks for 3 GiB")
    out = tmp_path / "run.json"
    r = run_cli(
        "--toggles", str(d), "run", "-r", "88821", "-s", "triton-decode@cg=eager,gpu_only=off",
        "--device", "cpu", "--no-cache", "--json", str(out), env={MEMORY_ENV: cap}, subprocess=True,
    )  # fmt: skip
    assert r.code in (0, 1), r.err
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["verdict"] == verdict, cell
    if verdict == "CRASH":
        assert "allocate" in cell["findings"][0]["message"], cell


def test_the_cap_defaults_to_a_share_of_the_machine_and_can_be_set_or_turned_off(monkeypatch):
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    default = memory_cap()
    assert default is not None and default >= 4 << 30
    monkeypatch.setenv(MEMORY_ENV, "6")
    assert memory_cap() == 6 << 30
    for off in ("0", "off"):
        monkeypatch.setenv(MEMORY_ENV, off)
        assert memory_cap() is None


@pytest.mark.parametrize(("asked", "kept"), [(3 << 30, True), (1 << 20, False)])
def test_the_store_keeps_an_allocation_refused_for_being_beyond_the_cap_not_one_refused_for_want_of_memory(
    monkeypatch, asked, kept
):
    from sglfix.execution.store import unstorable
    from sglfix.harness.result import CellResult

    monkeypatch.setenv(MEMORY_ENV, "2")
    result = CellResult(scenario="s", toggles=[], device="cpu")
    result.add(
        "CRASH",
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        f"you tried to allocate {asked} bytes. Error code 12 (Cannot allocate memory) [forward, x.py:1 in f]",
    )
    assert (unstorable(result.finish()) is None) is kept
