"""pytest plugin: revert fixes for a test session, and check that regression tests catch the
bug they claim to guard (mutation testing where the mutant is the historical fix).

- ``pytest --sglfix-revert 26651,27460:sizing``: the reverts hold for the whole session, in
  this process through the start-up hook's machinery and in every child process (xdist workers,
  engines a test starts) through ``SGLANG_DEBUG_REVERT_PR``.
- ``@pytest.mark.fixed_by("26651:clamp", ...)``: the fixes a test claims to guard.
- ``pytest --sglfix-check-fixes``: each marked test also runs once per claimed fix with that fix
  reverted (in this process and, through the variable, in the processes the test starts). A
  failing run is "caught", a passing one "NOT caught" and fails the session (exit 1). Unknown
  ids are a usage error before any test runs. Results travel on the test reports, so xdist
  workers' results reach the summary too.

Loaded by the ``pytest11`` entry point, this module only adds its options and the marker; the
plugin proper registers itself only when one of the options is used (as pytest's stepwise
does), so without them it changes nothing. ``SGLFIX_PROFILE`` picks the toggle set, as everywhere.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

ENV_VAR = "SGLANG_DEBUG_REVERT_PR"
MARK = "fixed_by"
PROPERTY = "sglfix-check-fixes"
CLAIMS_ENV = "SGLFIX_CHECK_CLAIMS"  # JSON {nodeid: [ids]}: claims from outside (doctor --caught-by)
REPORT_ENV = "SGLFIX_CHECK_REPORT"  # where to write {nodeid: [{id, outcome, detail}]} as JSON


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sglfix", "revert historical fixes (sglfix)")
    group.addoption("--sglfix-revert", action="store", metavar="IDS", default=None,
                    help="revert these fixes for the whole session, child processes included (26651,27460:sizing)")
    group.addoption("--sglfix-check-fixes", action="store_true", default=False,
                    help="run each @pytest.mark.fixed_by test once per claimed fix with that fix reverted; "
                         "exit 1 unless every claim is caught")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}(*ids): the historical fixes this test guards (sglfix ids like 26651:clamp); "
                   "pytest --sglfix-check-fixes checks that reverting each makes the test fail")
    revert = config.getoption("--sglfix-revert")
    check = config.getoption("--sglfix-check-fixes")
    if revert is None and not check:
        return
    config.pluginmanager.register(SglfixPlugin(config, revert=revert, check=check), "sglfix-session")


def _usage(exc: Exception) -> pytest.UsageError:
    return pytest.UsageError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


class SglfixPlugin:
    def __init__(self, config: pytest.Config, *, revert: str | None, check: bool) -> None:
        self.config = config
        self.check = check
        self.results: dict[str, list[dict]] = {}
        self.revert_value = None
        self.old_env = os.environ.get(ENV_VAR)
        self.armed_here = False
        if revert is not None:
            self._arm(revert)
        self.extra_claims: dict[str, list[str]] = json.loads(os.environ.get(CLAIMS_ENV) or "{}")

    # -- --sglfix-revert ------------------------------------------------------------------------

    def _arm(self, value: str) -> None:
        from sglfix.common.errors import SglfixError
        from sglfix.toggling import hook, selects_nothing

        if selects_nothing(value):
            raise pytest.UsageError(f"--sglfix-revert {value!r} selects nothing; give ids like 26651,27460:sizing")
        if self.old_env not in (None, "", "0") and self.old_env.strip() != value.strip():
            raise pytest.UsageError(f"--sglfix-revert {value} but {ENV_VAR}={self.old_env} is set; use one of them")
        try:
            was = hook.armed()
            hook.arm(value)
        except SglfixError as exc:
            raise _usage(exc) from None
        self.armed_here = was is None
        self.revert_value = value.strip()
        os.environ[ENV_VAR] = self.revert_value  # xdist workers and every child process

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        lines = []
        if self.revert_value:
            lines.append(f"sglfix: reverted for the session: {self.revert_value}")
        if self.check:
            lines.append("sglfix: checking that each fixed_by test fails with its fix reverted")
        return lines

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.revert_value is None:
            return
        from sglfix.toggling import hook

        if self.armed_here:
            hook.disarm()
        if self.old_env is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = self.old_env

    # -- --sglfix-check-fixes -------------------------------------------------------------------

    def _claims(self, item: pytest.Item) -> list[str]:
        ids: list[str] = []
        for mark in item.iter_markers(MARK):
            for arg in mark.args:
                ids += [t.strip() for t in str(arg).split(",")] if isinstance(arg, (str, int)) else [arg]
        # Outside claims name a test (all its parameter sets) or one parametrized case.
        ids += self.extra_claims.get(item.nodeid, []) + (
            self.extra_claims.get(item.nodeid.split("[")[0], []) if "[" in item.nodeid else [])
        return list(dict.fromkeys(ids))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        if not self.check:
            return
        from sglfix.common.errors import SglfixError
        from sglfix.toggling.registry import load_registry

        try:
            registry = load_registry()
            for item in items:
                for rid in self._claims(item):
                    if not isinstance(rid, str) or not rid:
                        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARK}({rid!r}): give fix ids like 26651:clamp")
                    registry.select(rid, what=f"{item.nodeid}: @pytest.mark.{MARK}")
        except SglfixError as exc:
            raise _usage(exc) from None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        claims = self._claims(item) if self.check else []
        if not claims:
            return None
        from _pytest.runner import runtestprotocol

        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        outcomes = []
        for rid in claims:
            outcomes.append(self._mutant(item, rid, runtestprotocol))
        # The ordinary run last: its reports are the test's result, its teardown the real one.
        item.user_properties.append((PROPERTY, json.dumps(outcomes)))
        runtestprotocol(item, nextitem=nextitem, log=True)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _mutant(self, item: pytest.Item, rid: str, runtestprotocol: Any) -> dict:
        from sglfix.common.errors import SglfixError
        from sglfix.toggling.revert import revert

        old = os.environ.get(ENV_VAR)
        try:
            held = revert([rid], what=f"{item.nodeid}: @pytest.mark.{MARK}")
        except SglfixError as exc:
            return {"id": rid, "outcome": "error", "detail": str(exc).splitlines()[0]}
        os.environ[ENV_VAR] = ",".join(filter(None, [self.revert_value, rid]))
        try:
            # Torn down to the parent: module and session fixtures stay for the ordinary run.
            reports = runtestprotocol(item, nextitem=item.parent, log=False)
        finally:
            held.restore()
            if old is None:
                os.environ.pop(ENV_VAR, None)
            else:
                os.environ[ENV_VAR] = old
        failed = [r for r in reports if r.failed]
        if not failed:
            return {"id": rid, "outcome": "not-caught", "detail": "passed with the fix reverted"}
        first = failed[0]
        text = str(getattr(first.longrepr, "reprcrash", None) and first.longrepr.reprcrash.message or first.longrepr)
        return {"id": rid, "outcome": "caught", "detail": f"{first.when}: {text.splitlines()[0] if text else 'failed'}"}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.check or report.nodeid in self.results:
            return
        for name, value in getattr(report, "user_properties", ()):
            if name == PROPERTY:
                self.results[report.nodeid] = json.loads(value)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.check and self._uncaught() and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        path = os.environ.get(REPORT_ENV)
        if self.check and path and not hasattr(self.config, "workerinput"):  # the xdist controller or a plain run
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(self.results, fh, indent=1)

    def _uncaught(self) -> list[tuple[str, dict]]:
        return [(node, o) for node, outcomes in self.results.items() for o in outcomes if o["outcome"] != "caught"]

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if not self.check or exitstatus == pytest.ExitCode.USAGE_ERROR:
            return
        tr = terminalreporter
        tr.write_sep("=", "sglfix: does each test catch the fixes it claims?")
        if not self.results:
            tr.write_line(f"no test is marked @pytest.mark.{MARK}: nothing checked")
            return
        for node, outcomes in self.results.items():
            for o in outcomes:
                label = {"caught": "caught", "not-caught": "NOT caught", "error": "ERROR"}[o["outcome"]]
                tr.write_line(f"{label:<11} {o['id']:<24} {node}  ({o['detail']})",
                              green=o["outcome"] == "caught", red=o["outcome"] != "caught")
        bad = self._uncaught()
        total = sum(len(v) for v in self.results.values())
        tr.write_line(f"{total - len(bad)}/{total} claims caught" + (f"; {len(bad)} not: exit 1" if bad else ""))
