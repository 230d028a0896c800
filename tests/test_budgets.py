"""The per-file time budgets (tests/budgets.py) in tiny inner sessions: a file over its budget or
without one fails the session naming it, a subset of a file is not held to it, a shared session
fixture is charged to itself, --write-budgets measures, and the files run fast first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

SLOW = """
import time

def test_one():
    time.sleep(0.3)

def test_two():
    pass
"""
FAST = "def test_quick():\n    pass\n"


@pytest.fixture(autouse=True)
def _only_the_plugin(monkeypatch):
    # The installed plugins (sglfix's own, xdist, hypothesis) would load in every inner session
    # and take ten times what the session itself does.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    # xdist's workers are processes of their own: they find the plugin on PYTHONPATH.
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))


def _budgets(pytester: pytest.Pytester, files: dict, fixtures: dict | None = None):
    entries = {name: {"measured_s": took, "budget_s": budget} for name, (took, budget) in files.items()}
    shared = {name: {"measured_s": took, "budget_s": budget} for name, (took, budget) in (fixtures or {}).items()}
    path = pytester.path / "budgets.json"
    path.write_text(json.dumps({"measured": "a test", "files": entries, "fixtures": shared}))
    return path


def _run(pytester: pytest.Pytester, path, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "budgets", "--budgets", str(path), "-p", "no:cacheprovider", *args)


def _budget_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if "budget" in line and " took " in line]


@pytest.fixture
def two_files(pytester: pytest.Pytester):
    pytester.makepyfile(test_slow=SLOW, test_fast=FAST)
    return pytester


def test_a_file_over_its_budget_fails_the_session_naming_it(two_files):
    path = _budgets(two_files, {"test_slow.py": (0.1, 0.1), "test_fast.py": (0.0, 30)})
    result = _run(two_files, path)
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    lines = _budget_lines(result)
    assert len(lines) == 1, result.outlines
    assert lines[0].startswith("test_slow.py took 0.3 s, over its budget of 0.1 s: make it faster or raise its budget")
    assert "(measured with a test)" in lines[0]
    # Within its budget, the same run passes.
    path = _budgets(two_files, {"test_slow.py": (0.3, 20), "test_fast.py": (0.0, 30)})
    assert _run(two_files, path).ret == pytest.ExitCode.OK


def test_a_file_without_a_budget_fails_the_session(two_files):
    path = _budgets(two_files, {"test_slow.py": (0.3, 20)})
    result = _run(two_files, path)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert [line.split(" took ")[0] for line in _budget_lines(result)] == ["test_fast.py"]
    assert "has no budget in budgets.json" in _budget_lines(result)[0]


@pytest.mark.parametrize(
    "subset",
    [("-k", "one"), ("-k", "not two"), ("--deselect", "test_slow.py::test_two"), ("test_slow.py::test_one",), ("-x",)],
)
def test_a_file_that_did_not_run_whole_is_not_held_to_its_budget(two_files, subset):
    two_files.makepyfile(test_fast="def test_quick():\n    assert False\n")  # -x stops the session here
    path = _budgets(two_files, {"test_slow.py": (0.1, 0.1)})
    result = _run(two_files, path, *subset)
    assert not [line for line in _budget_lines(result) if line.startswith("test_slow.py")], result.outlines
    # Without the subset the same budget fails: the subset, not the time, is why it passed.
    assert "test_slow.py took" in "\n".join(_budget_lines(_run(two_files, path)))


def test_no_budgets_checks_nothing(two_files):
    path = _budgets(two_files, {"test_slow.py": (0.1, 0.1)})
    result = _run(two_files, path, "--no-budgets")
    assert result.ret == pytest.ExitCode.OK and _budget_lines(result) == []


@pytest.fixture
def sharing(pytester: pytest.Pytester) -> dict:
    """Two files asking for one session fixture of 0.4 s; their budgets (measured, allowed)."""
    pytester.makeconftest("""
        import time, pytest

        @pytest.fixture(scope="session")
        def shared():
            time.sleep(0.4)
            return 1
    """)
    pytester.makepyfile(test_a="def test_a(shared):\n    pass\n", test_b="def test_b(shared):\n    pass\n")
    return {"test_a.py": (0.0, 0.2), "test_b.py": (0.0, 0.2)}


def test_a_shared_session_fixture_is_charged_to_itself_not_to_the_first_file_using_it(pytester, sharing):
    files = sharing
    result = _run(pytester, _budgets(pytester, files, {"conftest.py::shared": (0.4, 20)}))
    assert result.ret == pytest.ExitCode.OK, result.outlines
    result = _run(pytester, _budgets(pytester, files, {"conftest.py::shared": (0.1, 0.1)}))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert [line.split(",")[0] for line in _budget_lines(result)] == ["shared fixture conftest.py::shared took 0.4 s"]
    result = _run(pytester, _budgets(pytester, files))
    assert "shared fixture conftest.py::shared took 0.4 s and has no budget" in "\n".join(_budget_lines(result))


def test_write_budgets_measures_the_files_that_ran_whole(two_files):
    path = _budgets(two_files, {"test_gone.py": (1.0, 21), "test_fast.py": (5.0, 25)})
    result = _run(two_files, path, "--write-budgets", "-k", "not two")
    assert result.ret == pytest.ExitCode.OK
    written = json.loads(path.read_text())
    # test_slow.py did not run whole: not measured; test_gone.py no longer exists: dropped.
    assert set(written["files"]) == {"test_fast.py"}
    assert written["files"]["test_fast.py"]["measured_s"] < 1 and written["files"]["test_fast.py"]["budget_s"] == 20
    assert written["measured"] == "a test"  # some files re-measured: the suite's measure stays
    _run(two_files, path, "--write-budgets")
    assert json.loads(path.read_text())["measured"] == "a test"
    (two_files.path / "pyproject.toml").write_text("[tool.pytest.ini_options]\ntestpaths = ['.']\n")
    _run(two_files, path, "--write-budgets")  # the whole suite: its own measure
    assert json.loads(path.read_text())["measured"].startswith("pytest -p budgets --budgets -p no:cacheprovider")
    slow = json.loads(path.read_text())["files"]["test_slow.py"]
    assert 0.3 <= slow["measured_s"] < 1 and slow["budget_s"] == 21
    assert _run(two_files, path).ret == pytest.ExitCode.OK


def test_files_run_fast_first_and_a_file_without_a_measure_before_them(pytester):
    pytester.makepyfile(
        test_a="def test_a1():\n    pass\ndef test_a2():\n    pass\n",
        test_b="def test_b():\n    pass\n",
        test_c="def test_c():\n    pass\n",
    )
    path = _budgets(pytester, {"test_a.py": (50.0, 100), "test_b.py": (3.0, 23)})
    result = _run(pytester, path, "--collect-only", "-q")
    order = [line for line in result.outlines if "::" in line]
    assert order == ["test_c.py::test_c", "test_b.py::test_b", "test_a.py::test_a1", "test_a.py::test_a2"]


def test_a_broken_budget_file_is_a_usage_error_naming_it(two_files):
    path = two_files.path / "budgets.json"
    path.write_text(json.dumps({"measured": "x", "files": {"test_slow.py": {"budget_s": 3}}}))
    result = _run(two_files, path)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "budgets.json: not a budget file" in result.stderr.str()


def test_a_junit_xml_of_a_run_gives_each_files_time(two_files):
    from budgets import from_junit

    two_files.makepyfile(test_cls="class TestA:\n    def test_a(self):\n        pass\n")
    path = _budgets(two_files, {})
    _run(two_files, path, "--no-budgets", "--junitxml", "run.xml")
    took = from_junit(two_files.path / "run.xml", root=two_files.path)
    assert set(took) == {"test_slow.py", "test_fast.py", "test_cls.py"}
    assert 0.3 <= took["test_slow.py"] < 1 and took["test_fast.py"] < 0.3


def test_the_summary_names_the_slowest_files_that_ran_whole(two_files, monkeypatch):
    import budgets

    monkeypatch.setattr(budgets, "SLOWEST", 1)
    path = _budgets(two_files, {"test_slow.py": (0.3, 30), "test_fast.py": (0.0, 30)})
    result = _run(two_files, path)
    assert result.ret == pytest.ExitCode.OK
    at = result.outlines.index(next(line for line in result.outlines if "slowest 1 test files" in line))
    named = next(line.split() for line in result.outlines[at + 1 :] if line.strip())
    assert named[1:] == ["s", "test_slow.py", "(budget", "30", "s)"] and float(named[0]) >= 0.3
    assert not any("test files" in line for line in _run(two_files, path, "-k", "quick").outlines)


def test_a_moved_test_file_keeps_its_measure(tmp_path):
    from budgets import Budgets, Entry, follow_moves

    (tmp_path / "tests" / "execution").mkdir(parents=True)
    (tmp_path / "tests" / "execution" / "test_moved.py").write_text("")
    (tmp_path / "tests" / "test_stays.py").write_text("")
    budgets = Budgets(
        measured="x",
        files={name: Entry(measured_s=1, budget_s=21) for name in ("tests/test_moved.py", "tests/test_stays.py")}
        | {"tests/test_gone.py": Entry(measured_s=2, budget_s=22)},
    )
    assert follow_moves(budgets, root=tmp_path) == ["tests/test_moved.py -> tests/execution/test_moved.py"]
    assert list(budgets.files) == ["tests/execution/test_moved.py", "tests/test_gone.py", "tests/test_stays.py"]


def test_every_test_file_of_the_suite_has_a_budget():
    # A file without one fails the whole suite's run only at its end (CI's exit 1 after twenty
    # minutes); this says so when the file is added.
    root = Path(__file__).parent.parent
    budgets = json.loads((root / "tests" / "budgets.json").read_text())["files"]
    files = sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py"))
    assert [f for f in files if f not in budgets] == []


def _run_spread(pytester: pytest.Pytester, path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p", "xdist.plugin", "-p", "budgets", "--budgets", str(path), "-p", "no:cacheprovider", *args
    )


def test_under_xdist_the_workers_times_are_added_up_and_checked_once(two_files):
    two_files.makepyfile(test_other="import time\n\ndef test_other():\n    time.sleep(0.2)\n")
    path = _budgets(two_files, {"test_slow.py": (0.1, 0.1), "test_fast.py": (0.0, 30), "test_other.py": (0.2, 20)})
    result = _run_spread(two_files, path, "-n", "2")
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    lines = _budget_lines(result)
    assert len(lines) == 1 and lines[0].startswith("test_slow.py took 0.3 s, over its budget of 0.1 s"), result.outlines
    # Spread test by test (--dist load), a file's time still adds up over the workers.
    result = _run_spread(two_files, path, "-n", "2", "--dist", "load")
    assert [line.split(",")[0] for line in _budget_lines(result)] == ["test_slow.py took 0.3 s"]
    result = _run_spread(two_files, path, "-n", "2", "--write-budgets")
    assert result.ret == pytest.ExitCode.OK
    written = json.loads(path.read_text())["files"]
    assert set(written) == {"test_slow.py", "test_fast.py", "test_other.py"}
    assert 0.3 <= written["test_slow.py"]["measured_s"] < 1 and 0.2 <= written["test_other.py"]["measured_s"] < 1


def test_under_xdist_a_shared_fixture_is_charged_once_per_worker_not_summed(pytester, sharing):
    files = sharing
    # Both workers set it up, 0.4 s each: within a 0.7 s budget, which the sum would not be.
    result = _run_spread(pytester, _budgets(pytester, files, {"conftest.py::shared": (0.4, 0.7)}), "-n", "2")
    assert result.ret == pytest.ExitCode.OK, result.outlines
    result = _run_spread(pytester, _budgets(pytester, files, {"conftest.py::shared": (0.1, 0.1)}), "-n", "2")
    assert [line.split(",")[0] for line in _budget_lines(result)] == ["shared fixture conftest.py::shared took 0.4 s"]


def test_under_xdist_the_files_run_slow_first(pytester):
    many = "".join(f"def test_b{i}():\n    pass\n" for i in range(3))
    pytester.makepyfile(test_a="def test_a():\n    pass\n", test_b=many, test_c="def test_c():\n    pass\n")
    path = _budgets(pytester, {"test_a.py": (50.0, 100), "test_b.py": (3.0, 23), "test_c.py": (9.0, 29)})
    # One worker runs them in the order handed out: by time, not re-sorted by number of tests
    # (which --dist loadfile does unless told not to, and would put test_b.py first).
    result = _run_spread(pytester, path, "-n", "1", "-v", "--dist", "loadfile")
    order = [line.split()[-1] for line in result.outlines if " PASSED " in line]
    assert order == ["test_a.py::test_a", "test_c.py::test_c", *(f"test_b.py::test_b{i}" for i in range(3))], (
        result.outlines
    )
