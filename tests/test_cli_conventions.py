"""What users of a Typer/rich tool and CI logs expect of the command line: choices shown in the
help and checked, shell completion of toggle ids and scenario names, names never cut at any
width, a summary line at the end of a run, and progress lines when no terminal is attached."""

from __future__ import annotations

import pytest
from clihelp import assert_one_line_error, run_cli


@pytest.mark.parametrize(("option", "choices"), [("--device", "<auto|cpu|cuda>"), ("--executor", "<local|ray>")])
def test_options_with_fixed_values_show_their_choices_and_refuse_others(option, choices):
    r = run_cli("run", "--help", timeout=60)
    assert r.code == 0, r.err
    line = next(line for line in r.out.splitlines() if line.strip().startswith(option + " "))
    assert choices in line, line
    assert "<str>" not in line
    assert_one_line_error(run_cli("run", option, "gpu", "-s", "x", timeout=60), option, "gpu")


def _complete(*words: str, env: dict | None = None) -> list[str]:
    line = " ".join(("sglfix", *words))
    r = run_cli(
        env={"_SGLFIX_COMPLETE": "complete_bash", "COMP_WORDS": line, "COMP_CWORD": str(len(words)), **(env or {})},
        timeout=60,
    )
    assert r.code == 0, r.err
    return r.out.split()


def test_shell_completion_offers_commands_choices_ids_and_scenario_names():
    from sglfix.scenario import load_scenarios
    from sglfix.toggling.profiles import get_profile
    from sglfix.toggling.registry import load_registry

    assert _complete("ma") == ["matrix"]
    assert _complete("run", "--device", "c") == ["cpu", "cuda"]
    ids = load_registry().ids(parts=True)
    assert _complete("run", "-r", "") == ids
    part = next(i for i in ids if ":" in i)
    first, rest = part.split(":")[0], [i for i in ids if i != part]
    # A comma list completes its last item.
    assert _complete("run", "-r", f"{rest[0]},{first}") == [f"{rest[0]},{i}" for i in ids if i.startswith(first)]
    names = [s.name for s in load_scenarios()]
    stem = names[0].split("@")[0]
    assert _complete("matrix", "-s", stem) == [n for n in names if n.startswith(stem)]
    # The profile given earlier on the line decides what is offered.
    sglang_ids = load_registry(get_profile("sglang-0.5.23").toggles_dir).ids()
    assert _complete("--profile", "sglang-0.5.23", "show", "") == sglang_ids
    assert _complete("--profile", "sg") == ["sglang-0.5.23"]


def test_the_completion_script_can_be_shown_for_a_shell():
    r = run_cli("--show-completion", "bash", env={"SHELL": "/bin/bash"}, timeout=60)
    assert r.code == 0, r.err
    assert "_SGLFIX_COMPLETE" in r.out and "complete" in r.out
