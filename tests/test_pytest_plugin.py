"""The pytest plugin on a user's own test file (no conftest): --sglfix-check-fixes, --sglfix-revert,
the fixed_by marker, xdist, and nothing changed without its options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from builders import ROOT

USER_TESTS = textwrap.dedent("""
    import os, subprocess, sys
    import pytest
    from sglfix.backends.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

    @pytest.mark.fixed_by("26738:overlap-guard")
    def test_none_backends_are_skipped():
        assert decide_needs_cpu_seq_lens([None]) is False

    @pytest.mark.fixed_by("26738:glue-constant")
    def test_wrongly_marked():
        assert decide_needs_cpu_seq_lens([]) is False

    def test_unmarked():
        assert decide_needs_cpu_seq_lens([]) is False

    def test_report_state():
        import sglfix
        child = subprocess.run([sys.executable, "-c",
            "from sglfix.backends.srt.managers.overlap_utils import decide_needs_cpu_seq_lens as d\\n"
            "try:\\n    print(d([None]))\\nexcept AttributeError:\\n    print('pre-fix')"],
            capture_output=True, text=True).stdout.strip()
        with open(os.environ["STATE_FILE"] + "." + os.environ.get("PYTEST_XDIST_WORKER", "main"), "w") as fh:
            fh.write(repr((sglfix.reverted_ids(), child, "sglfix.toggling.registry" in sys.modules)))
""")


def _pytest(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # The outer run's own pytest variables stay out too: under xdist PYTEST_XDIST_WORKER would make
    # the user's single-process run look like a worker.
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLANG_DEBUG_REVERT_PR", "SGLFIX_TOGGLES_DIR", "SGLFIX_PROFILE", "PYTEST_ADDOPTS", "PYTHONPATH")
        and not k.startswith("PYTEST_XDIST")
        and k != "PYTEST_CURRENT_TEST"
    }
    full.update(STATE_FILE=str(tmp_path / "state"), **(env or {}))
    # hypothesis's and anyio's plugins come with this suite's extras, not with a user's suite, and
    # took a fifth of each inner session's start (in every xdist worker too).
    quiet = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:anyio")
    return subprocess.run(
        [sys.executable, "-m", "pytest", *quiet, "-q", "test_user.py", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=full,
        timeout=600,
    )


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    return tmp_path


def _states(tmp_path: Path) -> dict[str, tuple]:
    import ast

    return {p.suffix[1:]: ast.literal_eval(p.read_text()) for p in tmp_path.glob("state.*")}


def _outcomes(stdout: str) -> list[str]:
    return sorted(
        line.split()[0] + " " + line.split("::")[-1].split()[0]
        for line in stdout.splitlines()
        if line.startswith(("caught ", "NOT caught ", "ERROR ")) and "::" in line
    )


def test_check_fixes_names_the_wrongly_marked_test_and_exits_1(user_dir):
    r = _pytest(user_dir, "--sglfix-check-fixes")
    assert r.returncode == 1, r.stdout + r.stderr
    # The ordinary runs all pass; each claim is a result of its own, so the one NOT caught is the
    # one failure the exit status stands for.
    assert "1 failed, 5 passed" in r.stdout, r.stdout
    assert "test_user.py::test_wrongly_marked[sglfix-revert=26738:glue-constant]" in r.stdout
    caught = [line for line in r.stdout.splitlines() if line.startswith("caught ")]
    missed = [line for line in r.stdout.splitlines() if line.startswith("NOT caught ")]
    assert len(caught) == 1 and "26738:overlap-guard" in caught[0] and "test_none_backends_are_skipped" in caught[0]
    assert "AttributeError" in caught[0]
    assert len(missed) == 1 and "26738:glue-constant" in missed[0] and "test_wrongly_marked" in missed[0]
    assert "1/2 claims caught" in r.stdout
    # The mutant runs leave nothing reverted behind them, here or in the children.
    assert _states(user_dir)["main"][:2] == ([], "False")


def test_a_claim_of_a_test_that_did_not_run_is_not_run_and_the_junit_file_agrees_with_the_exit(user_dir):
    text = USER_TESTS + textwrap.dedent("""
        @pytest.mark.skip(reason="needs a GPU")
        @pytest.mark.fixed_by("26738:overlap-guard")
        def test_skipped():
            assert decide_needs_cpu_seq_lens([None]) is False

        @pytest.mark.xfail(reason="known broken")
        @pytest.mark.fixed_by("26738:overlap-guard")
        def test_xfail():
            assert decide_needs_cpu_seq_lens([None]) is False
            assert False
    """)
    (user_dir / "test_user.py").write_text(text)
    r = _pytest(user_dir, "--sglfix-check-fixes", "--junitxml", "out.xml")
    lines = {
        line.split("::")[-1].split()[0]: line.split()[0]
        + (" " + line.split()[1] if line.startswith(("NOT", "not")) else "")
        for line in r.stdout.splitlines()
        if line.startswith(("caught ", "NOT caught ", "not run ")) and "::" in line
    }
    assert lines["test_skipped"] == "not run" and lines["test_xfail"] == "not run", r.stdout
    assert lines["test_wrongly_marked"] == "NOT caught" and lines["test_none_backends_are_skipped"] == "caught"
    assert "1/4 claims caught; 2 not run (skipped or xfail); 1 not: exit 1" in r.stdout
    assert r.returncode == 1
    import xml.etree.ElementTree as ET

    suite = ET.parse(user_dir / "out.xml").getroot().find("testsuite")
    assert int(suite.get("failures")) == 1, ET.tostring(suite)[:2000]  # red on the console, red in the file
    names = {c.get("name"): c for c in suite.iter("testcase")}
    assert names["test_wrongly_marked[sglfix-revert=26738:glue-constant]"].find("failure") is not None
    assert names["test_skipped[sglfix-revert=26738:overlap-guard]"].find("skipped") is not None
    assert names["test_none_backends_are_skipped[sglfix-revert=26738:overlap-guard]"].find("failure") is None
    # Without the wrong claim: every claim that ran is caught, the two not run do not fail the session.
    (user_dir / "test_user.py").write_text(text.replace('@pytest.mark.fixed_by("26738:glue-constant")\n', ""))
    r = _pytest(user_dir, "--sglfix-check-fixes", "--junitxml", "out.xml")
    assert r.returncode == 0, r.stdout + r.stderr
    suite = ET.parse(user_dir / "out.xml").getroot().find("testsuite")
    assert int(suite.get("failures")) == 0


def test_a_test_that_fails_with_the_fix_in_place_too_is_inconclusive_not_caught(user_dir):
    """Failing with the fix reverted proves nothing when the test fails with it in place too (an
    ImportError, a broken fixture): such a claim is inconclusive, counted apart and said why; the
    test's own failure fails the session, the claim adds no second failure. Under xdist too."""
    text = USER_TESTS.replace('@pytest.mark.fixed_by("26738:glue-constant")\n', "") + textwrap.dedent("""
        @pytest.mark.fixed_by("26738:overlap-guard")
        def test_broken_import():
            from sglfix.backends.srt.managers.overlap_utils import no_such_name
            assert no_such_name([None]) is False

        @pytest.fixture
        def broken():
            import sglfix_no_such_module

        @pytest.mark.fixed_by("26738:overlap-guard")
        def test_broken_fixture(broken):
            assert decide_needs_cpu_seq_lens([None]) is False
    """)
    (user_dir / "test_user.py").write_text(text)
    for args in ((), ("-n", "2")):
        report = user_dir / "claims.json"
        report.unlink(missing_ok=True)
        r = _pytest(
            user_dir, "--sglfix-check-fixes", "--junitxml", "out.xml", *args, env={"SGLFIX_CHECK_REPORT": str(report)}
        )
        out = r.stdout + r.stderr
        lines = {
            line.split("::")[-1].split()[0]: line
            # the plugin's section only (the short summary's "ERROR <test>" lines are pytest's)
            for line in r.stdout.split("catch the fixes it claims?")[-1].split("short test summary")[0].splitlines()
            if line.startswith(("caught ", "NOT caught ", "inconclusive ", "not run ", "ERROR ")) and "::" in line
        }
        assert lines["test_broken_import"].startswith("inconclusive "), out
        assert (
            "ImportError" in lines["test_broken_import"]
            and "fails with the fix in place too" in lines["test_broken_import"]
        )
        assert (
            lines["test_broken_fixture"].startswith("inconclusive ")
            and "setup: ModuleNotFoundError" in lines["test_broken_fixture"]
        ), out
        # The test that passes with the fix and fails with it reverted is still caught.
        assert (
            lines["test_none_backends_are_skipped"].startswith("caught ")
            and "AttributeError" in lines["test_none_backends_are_skipped"]
        )
        assert "1/3 claims caught; 2 inconclusive (fails with the fix in place too)" in r.stdout, out
        assert "not: exit 1" not in r.stdout
        # The two tests fail on their own (the exit status stands for them); their claims are
        # skipped with the reason, the caught one passes.
        assert r.returncode == 1, out
        assert "1 failed, 5 passed, 2 skipped, 1 error" in r.stdout, out
        import xml.etree.ElementTree as ET

        suite = ET.parse(user_dir / "out.xml").getroot().find("testsuite")
        cases = {c.get("name"): c for c in suite.iter("testcase")}
        skipped = cases["test_broken_import[sglfix-revert=26738:overlap-guard]"].find("skipped")
        assert skipped is not None and "inconclusive" in skipped.get("message", ""), ET.tostring(suite)[:3000]
        assert cases["test_broken_import"].find("failure") is not None
        assert int(suite.get("failures")) + int(suite.get("errors")) == 2
        claims = json.loads(report.read_text())
        assert claims["test_user.py::test_broken_import"] == [
            {
                "id": "26738:overlap-guard",
                "outcome": "inconclusive",
                "detail": claims["test_user.py::test_broken_import"][0]["detail"],
                "fixed": "failed",
                "reverted": "failed",
            }
        ], claims
        assert claims["test_user.py::test_broken_fixture"][0]["outcome"] == "inconclusive"
        assert claims["test_user.py::test_none_backends_are_skipped"][0]["outcome"] == "caught"
        assert claims["test_user.py::test_none_backends_are_skipped"][0]["fixed"] == "passed"
    # Without the broken tests nothing is inconclusive, and the session passes.
    (user_dir / "test_user.py").write_text(
        text.split('@pytest.mark.fixed_by("26738:overlap-guard")\ndef test_broken_import')[0]
    )
    r = _pytest(user_dir, "--sglfix-check-fixes")
    assert r.returncode == 0 and "1/1 claims caught" in r.stdout and "inconclusive" not in r.stdout, r.stdout


def test_a_test_that_fails_only_because_the_variable_is_set_is_not_caught(user_dir):
    """A claim's run with the fix reverted differs from the run with it in place by the revert
    alone: a test that fails whenever SGLANG_DEBUG_REVERT_PR is set is NOT caught (and says so),
    while one that sees the fix only in a process it starts is still caught, through the variable.
    The variable already set in the session's environment is a usage error."""
    text = textwrap.dedent("""
        import os, subprocess, sys
        import pytest

        @pytest.mark.fixed_by("26738:glue-constant")
        def test_fails_whenever_the_variable_is_set():
            assert not os.environ.get("SGLANG_DEBUG_REVERT_PR")

        @pytest.mark.fixed_by("26738:overlap-guard")
        def test_in_a_child():
            code = "from sglfix.backends.srt.managers.overlap_utils import decide_needs_cpu_seq_lens as d; print(d([None]))"
            child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            assert child.stdout.strip() == "False"
    """)
    (user_dir / "test_user.py").write_text(text)
    r = _pytest(user_dir, "--sglfix-check-fixes")
    out = r.stdout + r.stderr
    assert _outcomes(r.stdout) == ["NOT test_fails_whenever_the_variable_is_set", "caught test_in_a_child"], out
    lines = {line.split("::")[-1].split()[0]: line for line in r.stdout.splitlines() if "::" in line}
    assert "fails whether or not the fix is reverted" in lines["test_fails_whenever_the_variable_is_set"], out
    assert "in the processes the test starts" in lines["test_in_a_child"], out
    assert r.returncode == 1 and "1/2 claims caught; 1 not: exit 1" in r.stdout, out
    r = _pytest(user_dir, "--sglfix-check-fixes", env={"SGLANG_DEBUG_REVERT_PR": "26738:glue-constant"})
    assert r.returncode == pytest.ExitCode.USAGE_ERROR, r.stdout + r.stderr
    assert "SGLANG_DEBUG_REVERT_PR=26738:glue-constant is set" in r.stderr and "--sglfix-revert" in r.stderr


def test_all_claims_caught_exits_0(user_dir):
    (user_dir / "test_user.py").write_text(USER_TESTS.replace('@pytest.mark.fixed_by("26738:glue-constant")\n', ""))
    r = _pytest(user_dir, "--sglfix-check-fixes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1/1 claims caught" in r.stdout


def test_without_options_the_plugin_changes_nothing(user_dir):
    plain = _pytest(user_dir, "-rA")
    without = _pytest(user_dir, "-rA", "-p", "no:sglfix")
    assert plain.returncode == without.returncode == 0, plain.stdout + without.stdout

    def passed(text: str) -> list[str]:
        return sorted(line for line in text.splitlines() if line.startswith(("PASSED", "FAILED", "ERROR")))

    assert passed(plain.stdout) == passed(without.stdout) and len(passed(plain.stdout)) == 4
    assert "sglfix" not in plain.stdout
    # No registry, YAML or toggle was loaded, nothing reverted, the child ran the fixed code.
    assert _states(user_dir)["main"] == ([], "False", False)


def test_unknown_ids_are_a_usage_error_before_any_test_runs(user_dir):
    text = USER_TESTS.replace('"26738:glue-constant"', '"26738:glue"')
    (user_dir / "test_user.py").write_text(text)
    r = _pytest(user_dir, "--sglfix-check-fixes")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "26738 has no part 'glue'" in r.stderr and "test_wrongly_marked" in r.stderr
    assert not _states(user_dir)
    r = _pytest(user_dir, "--sglfix-revert", "99999")
    assert r.returncode == 4 and "99999" in r.stderr and "registered" in r.stderr


def test_session_revert_holds_in_the_process_and_its_children(user_dir):
    r = _pytest(user_dir, "--sglfix-revert", "26738:overlap-guard")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 3 passed" in r.stdout and "test_none_backends_are_skipped" in r.stdout
    assert _states(user_dir)["main"][:2] == (["26738:overlap-guard"], "pre-fix")


def test_xdist_workers_get_the_session_revert_and_report_their_checks(user_dir):
    r = _pytest(user_dir, "-n", "2", "--sglfix-revert", "26738:overlap-guard")
    assert r.returncode == 1 and "1 failed, 3 passed" in r.stdout, r.stdout + r.stderr
    states = _states(user_dir)
    assert set(states) <= {"gw0", "gw1"} and len(states) == 1, states
    assert next(iter(states.values()))[:2] == (["26738:overlap-guard"], "pre-fix")
    r = _pytest(user_dir, "-n", "2", "--sglfix-check-fixes")
    assert r.returncode == 1, r.stdout + r.stderr
    assert _outcomes(r.stdout) == ["NOT test_wrongly_marked", "caught test_none_backends_are_skipped"]


def test_doctor_caught_by_runs_each_toggles_tests_with_it_reverted(tmp_path):
    """A toggle whose caught_by test fails on the revert passes; one whose test does not is named."""
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    toggles = tmp_path / "toggles"
    toggles.mkdir()
    src = ROOT / "toggles" / "26738.yaml"
    text = src.read_text()
    head, _, rest = text.partition("caught_by:")
    body = rest.split("\nparts:", 1)[1]
    good = head + "caught_by:\n  - test_user.py::test_none_backends_are_skipped\nparts:" + body
    (toggles / "26738.yaml").write_text(good)
    env = {
        k: v for k, v in os.environ.items() if k not in ("SGLANG_DEBUG_REVERT_PR", "SGLFIX_TOGGLES_DIR", "PYTHONPATH")
    }

    def doctor() -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "sglfix",
                "--toggles",
                str(toggles),
                "doctor",
                "--caught-by",
                "--tests-root",
                str(tmp_path),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            cwd=tmp_path,
        )

    r = doctor()
    assert r.returncode == 0, r.stdout + r.stderr
    checks = {c["id"]: c for c in json.loads(r.stdout)["toggles"]}
    assert checks["26738 caught_by"]["ok"]
    (toggles / "26738.yaml").write_text(
        good.replace(
            "  - test_user.py::test_none_backends_are_skipped\n",
            "  - test_user.py::test_none_backends_are_skipped\n"
            "  - test_user.py::test_wrongly_marked\n"
            "  - test_gone.py::test_x\n",
        )
    )
    r = doctor()
    assert r.returncode == 1, r.stdout + r.stderr
    bad = {c["id"]: c for c in json.loads(r.stdout)["toggles"]}["26738 caught_by"]
    assert not bad["ok"]
    assert "test_user.py::test_wrongly_marked: NOT caught" in bad["error"]
    assert "test_gone.py::test_x: names no test file" in bad["error"]
    assert "test_none_backends_are_skipped" not in bad["error"]


def test_the_projects_own_fixed_by_tests_catch_their_fixes():
    root = ROOT
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLANG_DEBUG_REVERT_PR", "SGLFIX_TOGGLES_DIR", "PYTEST_ADDOPTS")
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--sglfix-check-fixes",
            "-m",
            "fixed_by",
            "tests/backends",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    caught = [line for line in r.stdout.splitlines() if line.startswith("caught ")]
    assert len(caught) >= 8 and not [line for line in r.stdout.splitlines() if line.startswith("NOT caught")]
