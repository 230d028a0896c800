"""The app object is the command line: invoked in-process (``typer.testing.CliRunner``, as the
tests' ``run_cli`` does) it ends as ``python -m sglfix`` does, with the same exit code and the
same line on stderr; sglfix's own options are read wherever they stand on the line; and what a
command leaves in the process is undone after an in-process run."""

from __future__ import annotations

import os

import pytest
from clihelp import assert_one_line_error, run_cli

CASES = {
    "bad option": (["list", "--no-such-option"], 2),
    "--debug after the command": (["show", "99999", "--debug"], 2),
    "SGLFIX_DEBUG=1": (["show", "99999"], 2),
    "--git-bisect maps 2 to 125": (["run", "-s", "no-such-scenario*", "--device", "cpu", "--git-bisect"], 125),
    "--profile after the command": (["list", "--profile", "no-such-profile"], 2),
    "--release after the command, refused before any download": (["list", "--release", "not-a-version"], 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_app_in_process_ends_as_the_console_script_does(case):
    args, code = CASES[case]
    env = {"SGLFIX_DEBUG": "1"} if case.startswith("SGLFIX_DEBUG") else None
    inside = run_cli(*args, env=env)
    real = run_cli(*args, env=env, subprocess=True)
    assert inside.code == real.code == code, (inside, real)
    assert inside.out == real.out
    last = [line for line in real.err.splitlines() if line.strip()][-1]
    assert last.startswith("sglfix: error: ")
    assert [line for line in inside.err.splitlines() if line.strip()][-1] == last
    debug = "debug" in case.lower()
    assert ("Traceback" in inside.err) == ("Traceback" in real.err) == debug, (inside.err, real.err)


def test_options_of_sglfix_read_the_same_before_and_after_the_command():
    before = run_cli("--profile", "reproduction", "list", "--json")
    after = run_cli("list", "--json", "--profile", "reproduction")
    assert before.code == after.code == 0, (before.err, after.err)
    assert before.out == after.out and before.out.strip()
    assert_one_line_error(run_cli("--wheels", "/nowhere", "list"), "--wheels DIR", "give --release")
    assert_one_line_error(run_cli("list", "--wheels", "/nowhere"), "--wheels DIR", "give --release")


def test_a_failure_of_sglfix_in_process_is_one_line_and_exit_2(monkeypatch):
    """An exception inside a command is sglfix's failure: one line and exit 2, not an exception
    the runner swallows (exit 1) or a traceback; ``--debug`` adds the traceback."""
    from sglfix.cli.context import Options

    def boom(self, directory=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(Options, "registry", boom)
    line = assert_one_line_error(run_cli("list"), "internal error", "RuntimeError: boom")
    assert line.startswith("sglfix: internal error")
    loud = run_cli("list", "--debug")
    assert loud.code == 2 and "Traceback" in loud.err and "RuntimeError: boom" in loud.err


def test_what_a_command_sets_in_the_process_is_undone_after_it(tmp_path, monkeypatch):
    """``--codebase-version`` sets SGLFIX_CODEBASE_VERSION for the processes a command starts;
    the working directory and the environment given to the call are the call's own."""
    from sglfix.codebases.installed import CODEBASE_VERSION_ENV

    monkeypatch.delenv(CODEBASE_VERSION_ENV, raising=False)
    monkeypatch.setenv("COLUMNS", "91")
    here = os.getcwd()
    r = run_cli("--codebase-version", "0.5.23", "list", env={"SGLFIX_GIVEN_TO_THE_CALL": "1"}, cwd=str(tmp_path))
    assert r.code == 2 and "reproduction" in r.err  # checked, and refused, after the variable was set
    assert CODEBASE_VERSION_ENV not in os.environ and "SGLFIX_GIVEN_TO_THE_CALL" not in os.environ
    assert os.getcwd() == here and os.environ["COLUMNS"] == "91"


def test_tables_take_the_width_of_the_output_they_are_written_to(capsys, monkeypatch):
    """The console follows the stream it prints to when it prints (an in-process run, a test
    capturing output), with COLUMNS for a pipe, as the console script's does."""
    from sglfix.cli.context import out

    long = "x" * 230
    monkeypatch.setenv("COLUMNS", "250")
    out.print(long)
    assert capsys.readouterr().out == long + "\n"
    monkeypatch.setenv("COLUMNS", "100")
    out.print(long)
    assert capsys.readouterr().out == long + "\n"  # soft wrap: never cut, whatever the width
    assert out.width == 100
