"""Each test file's time against the budget kept for it in tests/budgets.json, and the order the
files run in: serially fast first, so a cheap test that breaks fails in the first minute, not the
thirtieth; spread over workers (-n), slow first, so the longest file does not start last.

A file is timed as the sum of its tests' setup, call and teardown. The time of a session-scoped
fixture from a conftest.py is its own entry, not the first file that happens to ask for it, so a
file costs the same run alone as in the whole suite. A file is checked only when every test of it
ran: not under -k, -m, a node id, --lf, or -x stopping early. Under -n (pytest-xdist) each worker
times what it ran and the controller adds the parts up, checks and writes. A file or shared
fixture with no budget fails the session as one over its budget does, so each new one gets a
budget.
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

BUDGETS = Path(__file__).with_name("budgets.json")
HEADROOM = "max(2 x measured, measured + 20 s)"
SLOWEST = 10  # the files the terminal summary names


def headroom(measured: float) -> int:
    """The budget a measured time gets: twice the time, and never less than 20 s above it, as a
    machine busier than the one that measured it needs room."""
    return math.ceil(max(2 * measured, measured + 20))


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    measured_s: float = Field(ge=0, description="the time it took on the machine named in `measured`")
    budget_s: float = Field(gt=0, description="the most it may take before the session fails")


class Budgets(BaseModel):
    """tests/budgets.json: per test file (its path from the repository root) and per shared
    session fixture (``path/conftest.py::name``), what it took and what it may take."""

    model_config = ConfigDict(extra="forbid")
    measured: str = Field(description="how and where the times were measured")
    headroom: str = HEADROOM
    files: dict[str, Entry] = {}
    fixtures: dict[str, Entry] = {}


def load(path: Path) -> Budgets:
    if not path.exists():
        return Budgets(measured="nothing measured yet")
    try:
        return Budgets.model_validate_json(path.read_text())
    except ValueError as e:
        raise pytest.UsageError(f"{path}: not a budget file ({e}); rewrite it with pytest --write-budgets") from None


def save(path: Path, budgets: Budgets) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(budgets.model_dump_json(indent=1) + "\n")
    os.replace(tmp, path)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("budgets", "time budget per test file")
    group.addoption(
        "--budgets", metavar="FILE", type=Path, default=BUDGETS,
        help="the budget file the files are ordered by and checked against (default: tests/budgets.json)",
    )  # fmt: skip
    group.addoption(
        "--write-budgets", action="store_true",
        help=f"rewrite the budget file from this run: each file that ran whole gets {HEADROOM}",
    )  # fmt: skip
    group.addoption(
        "--no-budgets", action="store_true",
        help="check no file against its budget (a machine much slower than CI's, or with a GPU)",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    budgets = load(config.getoption("budgets"))
    # Under -n each worker collects and runs its share and hands its times to the controller, which
    # checks and writes them. Serially the files run fast first; spread over workers, slow first,
    # so no long file starts last and holds the session while the other workers idle.
    worker = hasattr(config, "workerinput")
    distributed = worker or bool(config.getoption("numprocesses", None))
    config.pluginmanager.register(Order(budgets, slow_first=distributed), "budgets-order")
    controller = distributed and not worker
    if controller and hasattr(config.option, "loadscopereorder"):
        # --dist loadfile/loadscope hand out files in the collection's order, which is by time
        # here, unless told to re-sort them by their number of tests.
        config.option.loadscopereorder = False
    config.pluginmanager.register(Timer(config, budgets, worker=worker, controller=controller), "budgets-timer")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class Order:
    def __init__(self, budgets: Budgets, *, slow_first: bool = False) -> None:
        self.budgets = budgets
        self.slow_first = slow_first

    # Before the other plugins' hooks (a wrapper runs first), so --ff and --lf still put the
    # failures of the last run first.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]):
        # A file without a measure (a new one) goes first: it is the likeliest to break. The
        # tests of a file stay together and in their order, as module fixtures expect.
        first: dict[str, int] = {}
        for i, item in enumerate(items):
            first.setdefault(_file(item.nodeid), i)
        files = self.budgets.files

        def key(item: pytest.Item) -> tuple[float, int]:
            name = _file(item.nodeid)
            took = files[name].measured_s if name in files else -1.0
            return (-took if self.slow_first else took, first[name])

        items.sort(key=key)
        return (yield)


class Timer:
    def __init__(
        self, config: pytest.Config, budgets: Budgets, *, worker: bool = False, controller: bool = False
    ) -> None:
        self.config = config
        self.budgets = budgets
        self.worker = worker  # an xdist worker: times what it runs, hands it over
        self.controller = controller  # xdist's controller: adds the workers' parts up, checks
        self.collected: dict[str, set[str]] = defaultdict(set)
        self.ran: set[str] = set()
        self.spent: dict[str, float] = defaultdict(float)
        self.shared: dict[str, float] = defaultdict(float)
        self.current: str | None = None
        self.setting_up: list[str] = []
        self.lines: list[str] = []
        self.wrote: str | None = None

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]):
        # Every test collected before -k, -m and --deselect take theirs away: a file is whole
        # only if all of these ran.
        for item in items:
            self.collected[_file(item.nodeid)].add(item.nodeid)
        return (yield)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.current = _file(nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef):
        name = self._shared_name(fixturedef)
        if name is None:
            return (yield)
        start = time.perf_counter()
        self.setting_up.append(name)
        try:
            return (yield)
        finally:
            self.setting_up.pop()
            took = time.perf_counter() - start
            self.shared[name] += took
            # Out of whatever it was counted in: the fixture that asked for it, or the test.
            if self.setting_up:
                self.shared[self.setting_up[-1]] -= took
            elif self.current is not None:
                self.spent[self.current] -= took

    def _shared_name(self, fixturedef: pytest.FixtureDef) -> str | None:
        """``tests/conftest.py::name`` for a session fixture of a conftest.py of this repository;
        None for any other (a module's own belongs to its file, a plugin's costs next to nothing)."""
        if fixturedef.scope != "session":
            return None
        code = getattr(fixturedef.func, "__code__", None)
        where = Path(code.co_filename) if code is not None else None
        if where is None or where.name != "conftest.py" or not where.is_relative_to(self.config.rootpath):
            return None
        return f"{where.relative_to(self.config.rootpath).as_posix()}::{fixturedef.argname}"

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # The controller hears every worker's reports too; it counts the workers' own sums instead,
        # as only they know what a shared fixture took out of a test's setup.
        if self.controller:
            return
        self.spent[_file(report.nodeid)] += report.duration
        self.ran.add(report.nodeid)

    def _partial(self) -> set[str]:
        """Files named with a node id on the command line: only those tests of them were collected."""
        root, here = self.config.rootpath, self.config.invocation_params.dir
        named = set()
        for arg in self.config.args:
            if "::" in arg:
                path = (here / arg.split("::", 1)[0]).resolve()
                if path.is_relative_to(root):
                    named.add(path.relative_to(root).as_posix())
        return named

    def whole(self) -> dict[str, float]:
        """What each file that ran whole took, shared session fixtures left out."""
        if self.config.getoption("lf", False):
            return {}
        partial = self._partial()
        return {
            name: max(0.0, self.spent[name])
            for name, ids in self.collected.items()
            if name not in partial and ids <= self.ran
        }

    # A worker's part, as plain data (it crosses to the controller), and the controller's merge of
    # it: each file's time sums over the workers that ran its tests; a shared fixture is set up once
    # per worker, so its cost is the dearest worker's.
    def _part(self) -> dict:
        return {
            "collected": {name: sorted(ids) for name, ids in self.collected.items()},
            "ran": sorted(self.ran),
            "spent": dict(self.spent),
            "shared": dict(self.shared),
        }

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        part = getattr(node, "workeroutput", {}).get("budgets")
        if part is None:  # a worker that crashed hands nothing back: its files did not run whole
            return
        for name, ids in part["collected"].items():
            self.collected[name].update(ids)
        self.ran.update(part["ran"])
        for name, seconds in part["spent"].items():
            self.spent[name] += seconds
        for name, seconds in part["shared"].items():
            self.shared[name] = max(self.shared.get(name, 0.0), seconds)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.worker:
            self.config.workeroutput["budgets"] = self._part()  # type: ignore[attr-defined]
            return
        took = self.whole()
        if not took:
            return
        if self.config.getoption("write_budgets"):
            self._write(took)
        elif not self.config.getoption("no_budgets"):
            self._check(took)
            if self.lines and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _check(self, took: dict[str, float]) -> None:
        path = self._shown(self.config.getoption("budgets"))
        how = f"measured with {self.budgets.measured}"
        fix = f"make it faster or raise its budget in {path} ({how})"
        new = f"run it whole with pytest --write-budgets to give it one, or add it to {path} by hand"
        for kind, spent, entries in (
            ("", took, self.budgets.files),
            ("shared fixture ", self.shared, self.budgets.fixtures),
        ):
            for name, seconds in sorted(spent.items()):
                entry = entries.get(name)
                if entry is None:
                    self.lines.append(f"{kind}{name} took {seconds:.1f} s and has no budget in {path}: {new}")
                elif seconds > entry.budget_s:
                    self.lines.append(
                        f"{kind}{name} took {seconds:.1f} s, over its budget of {entry.budget_s:g} s: {fix}"
                    )

    def _write(self, took: dict[str, float]) -> None:
        path = self.config.getoption("budgets")
        # The command as typed, less this option and any absolute path (the file is committed).
        args = [
            a
            for a in self.config.invocation_params.args
            if a != "--write-budgets" and not os.path.isabs(a.split("=", 1)[-1])
        ]
        measured = " ".join(["pytest", *args, f"on {os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d}"])
        # The text names the run that measured the suite; a run of some files (a new one's first
        # budget) adds their entries under it.
        whole_suite = self.config.args_source == pytest.Config.ArgsSource.TESTPATHS and set(took) == set(self.collected)
        if not whole_suite and self.budgets.files:
            measured = self.budgets.measured
        root = self.config.rootpath

        def merged(old: dict[str, Entry], new: dict[str, float], exists) -> dict[str, Entry]:
            out = {name: e for name, e in old.items() if exists(name)}
            out.update({name: Entry(measured_s=round(s, 1), budget_s=headroom(round(s, 1))) for name, s in new.items()})
            return dict(sorted(out.items()))

        self.budgets = Budgets(
            measured=measured,
            files=merged(self.budgets.files, took, lambda name: (root / name).exists()),
            fixtures=merged(self.budgets.fixtures, self.shared, lambda name: (root / _file(name)).exists()),
        )
        save(path, self.budgets)
        self.wrote = f"wrote the budgets of {len(took)} files and {len(self.shared)} shared fixtures to {path}"

    def _shown(self, path: Path) -> str:
        path = path.resolve()
        return (
            path.relative_to(self.config.rootpath).as_posix()
            if path.is_relative_to(self.config.rootpath)
            else str(path)
        )

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.worker:
            return
        took = self.whole()
        if len(took) > SLOWEST:
            # CI's log quotes the files that cost most, beside --durations' slowest tests.
            terminalreporter.section(f"slowest {SLOWEST} test files")
            for name, seconds in sorted(took.items(), key=lambda kv: -kv[1])[:SLOWEST]:
                entry = self.budgets.files.get(name)
                budget = f" (budget {entry.budget_s:.0f} s)" if entry is not None else ""
                terminalreporter.write_line(f"{seconds:8.1f} s  {name}{budget}")
        if self.wrote:
            terminalreporter.write_line(self.wrote)
        if self.lines:
            terminalreporter.section("test file budgets", red=True)
            for line in self.lines:
                terminalreporter.write_line(line, red=True)


def from_junit(junit: Path, *, root: Path) -> dict[str, float]:
    """Each test file's time in a JUnit XML of a pytest run (its testcases' times, which are setup,
    call and teardown by pytest's default), by the file's path from ``root``."""
    import xml.etree.ElementTree as ET

    took: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        # The module's dotted path, then any class names: the longest prefix that is a file.
        for n in range(len(parts), 0, -1):
            name = "/".join(parts[:n]) + ".py"
            if (root / name).is_file():
                took[name] += float(case.get("time") or 0)
                break
    return dict(took)


def follow_moves(budgets: Budgets, *, root: Path) -> list[str]:
    """Each file entry whose file is gone, renamed to the one test file of its name now under
    tests/ (a test moved into a folder keeps its measure); what was renamed, as ``old -> new``."""
    moved = []
    files = {}
    for name, entry in budgets.files.items():
        if not (root / name).exists():
            found = sorted((root / "tests").rglob(Path(name).name))
            if len(found) == 1:
                new = found[0].relative_to(root).as_posix()
                moved.append(f"{name} -> {new}")
                name = new
        files[name] = entry
    budgets.files = dict(sorted(files.items()))
    return moved


def main(argv: list[str] | None = None) -> int:
    """Rewrite tests/budgets.json from the JUnit XML of a whole run (``--junit RUN.xml --measured
    TEXT``; ``pytest --write-budgets`` does the same from the run itself and gives the shared
    session fixtures their own budgets), or move the entries of test files moved into folders
    (``--follow-moves``)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--junit", type=Path, help="the JUnit XML of a run of the whole suite")
    parser.add_argument("--measured", help="how and where that run was measured")
    parser.add_argument("--follow-moves", action="store_true", help="rename the entries of moved test files")
    parser.add_argument("--budgets", type=Path, default=BUDGETS)
    args = parser.parse_args(argv)
    root = BUDGETS.parent.parent
    if args.junit is not None:
        if not args.measured:
            parser.error("--junit needs --measured: how and where the run was measured")
        took = from_junit(args.junit, root=root)
        files = {
            name: Entry(measured_s=round(s, 1), budget_s=headroom(round(s, 1))) for name, s in sorted(took.items())
        }
        save(args.budgets, Budgets(measured=args.measured, files=files, fixtures=load(args.budgets).fixtures))
        print(f"wrote the budgets of {len(files)} files to {args.budgets}")
    elif args.follow_moves:
        budgets = load(args.budgets)
        for line in follow_moves(budgets, root=root):
            print(line)
        save(args.budgets, budgets)
    else:
        parser.error("give --junit RUN.xml --measured TEXT, or --follow-moves")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
