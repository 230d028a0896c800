"""pytest plugin: revert fixes for a test session, and check that regression tests catch the
bug they claim to guard (mutation testing where the mutant is the historical fix).

- ``pytest --sglfix-revert 26651,27460:sizing``: the reverts hold for the whole session, in
  this process through the start-up hook's machinery and in every child process (xdist workers,
  engines a test starts) through ``REVERT_PR``.
- ``@pytest.mark.fixed_by("26651:clamp", ...)``: the fixes a test claims to guard.
- ``pytest --sglfix-check-fixes``: each marked test also runs once per claimed fix with that fix
  reverted (in this process and, through the variable, in the processes the test starts), then
  once as usual, last: that run is the test's result, its teardown the real one. Each claim is
  judged from both runs by ``sglfix.report.outcome.judge_claim`` (the plugin does not re-derive
  the rule): "caught" only when the test passes with the fix in place and fails with it reverted;
  "NOT caught" when it passes reverted (the session fails, exit 1); "inconclusive" when it fails
  with the fix in place too (an ``ImportError``, a broken fixture: failing reverted proves
  nothing); "not run" when either run was skipped or is xfail (it cannot show the revert);
  "ERROR" when the revert could not be applied (the session fails). The run with the fix reverted
  differs from the run with it in place by the revert alone: it runs first with the revert in this
  process and the environment as the other run has it; only a test that passes so runs again with
  the revert in ``REVERT_PR`` too (for the processes it starts), and where the run
  with the fix in place has the variable unset, that failure counts only if the test passes with
  the variable set to ``0`` (nothing reverted): a test that fails whenever the variable is set is
  "NOT caught", and says so. The variable set in the environment of a session that checks claims
  without ``--sglfix-revert`` is a usage error (the runs with the fixes in place would not be the
  code as installed). Each claim is also a result
  of its own, ``<test>[sglfix-revert=ID]``: caught passes, NOT caught and ERROR fail, not run and
  inconclusive are skipped with the reason. An inconclusive claim does not fail the session on
  its own: the test's own failure already does, and a second failure for the same cause would
  only repeat it. So the counts, ``--junitxml`` and the exit status agree. The summary lists
  inconclusive claims apart and says why. Unknown ids are a usage error before any test runs.
  Results travel on the test's last report (its teardown's), so xdist workers' results reach the
  summary too; ``SGLFIX_CHECK_REPORT`` names a JSON file for them, ``{nodeid: [{id, outcome,
  detail, fixed, reverted}]}`` (``outcome`` a ``Claim``, ``fixed``/``reverted`` the two runs'
  outcomes).
- With ``REVERT_PR`` (or ``--sglfix-revert``) in effect, the start-up hook's finders
  are kept in front of pytest's assertion rewriter, and every selected target whose module is
  imported by collection's end or a test's setup is reverted, whichever loader imported it; one
  that cannot be is a usage error (``RevertGuard``).

Loaded by the ``pytest11`` entry point, this module only adds its options and the marker; the
plugin proper registers itself only when one of the options is used (as pytest's stepwise
does), so without them it changes nothing. ``SGLFIX_PROFILE`` picks the toggle set, as everywhere.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sglfix.common.environ import envs

ENV_VAR = envs.REVERT_PR.name
MARK = "fixed_by"
PROPERTY = "sglfix-check-fixes"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sglfix", "revert historical fixes (sglfix)")
    group.addoption(
        "--sglfix-revert",
        action="store",
        metavar="IDS",
        default=None,
        help="revert these fixes for the whole session, child processes included (26651,27460:sizing)",
    )
    group.addoption(
        "--sglfix-check-fixes",
        action="store_true",
        default=False,
        help="run each @pytest.mark.fixed_by test once per claimed fix with that fix reverted; "
        "exit 1 unless every claim is caught",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}(*ids): the historical fixes this test guards (sglfix ids like 26651:clamp); "
        "pytest --sglfix-check-fixes checks that reverting each makes the test fail",
    )
    revert = config.getoption("--sglfix-revert")
    check = config.getoption("--sglfix-check-fixes")
    if revert is not None or check:
        config.pluginmanager.register(SglfixPlugin(config, revert=revert, check=check), "sglfix-session")
    import sys

    hook = sys.modules.get("sglfix.toggling.hook")  # loaded only when a revert is selected
    if hook is not None and (hook.armed() is not None or getattr(hook, "_STATE", None) is not None):
        hook.ensure_first()
        config.pluginmanager.register(RevertGuard(hook), "sglfix-revert-guard")


class RevertGuard:
    """While the start-up hook applies REVERT_PR (the variable, or
    ``--sglfix-revert``): its finders stay in front of pytest's assertion rewriter, and before
    collection ends and before each test every selected target whose module is imported by then
    is reverted, whichever loader imported it; one that cannot be is an error, never a silent
    pass."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook

    def _settle(self) -> None:
        from sglfix.common.errors import SglfixError

        self.hook.ensure_first()
        try:
            self.hook.settle()
        except SglfixError as exc:
            raise _usage(exc) from None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._settle()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self._settle()


def _usage(exc: Exception) -> pytest.UsageError:
    return pytest.UsageError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


class SglfixPlugin:
    def __init__(self, config: pytest.Config, *, revert: str | None, check: bool) -> None:
        self.config = config
        self.check = check
        self.results: dict[str, list[dict]] = {}
        self.revert_value = None
        self.old_env = envs.REVERT_PR.get()
        self.armed_here = False
        from sglfix.toggling import selects_nothing

        if revert is not None:
            self._arm(revert)
        elif check and not selects_nothing(self.old_env):
            # Selected at start-up, the revert is in this process already: the runs "with the fix in
            # place" would not be the code as installed, and a claim of that fix could not be tried.
            raise pytest.UsageError(
                f"--sglfix-check-fixes: {ENV_VAR}={self.old_env} is set, so the runs with the fixes in place "
                f"would not run the code as installed; unset it, or give --sglfix-revert {self.old_env.strip()} "
                "to check the claims with that revert held for the session"
            )
        self.extra_claims: dict[str, list[str]] = json.loads(envs.SGLFIX_CHECK_CLAIMS.get() or "{}")
        # While a checked test's ordinary run runs: the item, its reports so far, and each claim's
        # reverted run (outcome, what shows it).
        self._ordinary: tuple[pytest.Item, list, dict[str, tuple[str, str]]] | None = None

    # -- --sglfix-revert ------------------------------------------------------------------------

    def _arm(self, value: str) -> None:
        from sglfix.common.errors import SglfixError
        from sglfix.toggling import hook, selects_nothing

        if selects_nothing(value):
            raise pytest.UsageError(f"--sglfix-revert {value!r} selects nothing; give ids like 26651,27460:sizing")
        if self.old_env not in (None, "", "0") and self.old_env.strip() != value.strip():
            raise pytest.UsageError(f"--sglfix-revert {value} but {ENV_VAR}={self.old_env} is set; use one of them")
        try:
            from sglfix.toggling.env import parse_env_value

            # Checked as the option it was given as, before the hook reads the same ids from
            # the environment variable it will carry to every child.
            parse_env_value(value, what="--sglfix-revert")
            was = hook.armed()
            hook.arm(value)
        except SglfixError as exc:
            raise _usage(exc) from None
        self.armed_here = was is None
        self.revert_value = value.strip()
        envs.REVERT_PR.set(self.revert_value)  # xdist workers and every child process

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
        envs.REVERT_PR.set(self.old_env)  # None: unset, as it was

    # -- --sglfix-check-fixes -------------------------------------------------------------------

    def _claims(self, item: pytest.Item) -> list[str]:
        ids: list[str] = []
        for mark in item.iter_markers(MARK):
            for arg in mark.args:
                ids += [t.strip() for t in str(arg).split(",")] if isinstance(arg, (str, int)) else [arg]
        # Outside claims name a test (all its parameter sets) or one parametrized case.
        ids += self.extra_claims.get(item.nodeid, []) + (
            self.extra_claims.get(item.nodeid.split("[")[0], []) if "[" in item.nodeid else []
        )
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
                        raise pytest.UsageError(
                            f"{item.nodeid}: @pytest.mark.{MARK}({rid!r}): give fix ids like 26651:clamp"
                        )
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
        reverted = {rid: self._mutant(item, rid, runtestprotocol) for rid in claims}
        # The ordinary run last: its reports are the test's result, logged as pytest logs them (so
        # -x, --pdb and the terminal see each phase when it happens), its teardown the real one.
        # The claims need its outcome, known only at its end: pytest_runtest_makereport gathers
        # its reports and puts the judged claims on the last one, the teardown's, before it is
        # logged (an xdist worker sends it to the controller from pytest_runtest_logreport).
        self._ordinary = (item, [], reverted)
        try:
            runtestprotocol(item, nextitem=nextitem, log=True)
        finally:
            self._ordinary = None
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        # Outermost wrapper: the report as every plugin left it (skipping's xfail included).
        report = yield
        if self._ordinary is not None and self._ordinary[0] is item:
            _, reports, reverted = self._ordinary
            reports.append(report)
            if report.when == "teardown":
                fixed = _run_outcome(reports)
                judged = [_judge(rid, fixed, rev) for rid, rev in reverted.items()]
                report.user_properties.append((PROPERTY, json.dumps(judged)))
        return report

    def _mutant(self, item: pytest.Item, rid: str, runtestprotocol: Any) -> tuple[str, str]:
        """The test's outcome with ``rid`` reverted (``error``: the revert could not be applied)
        and what shows it, from runs that differ from the run with the fix in place by the revert
        alone. First in this process, the environment as that run has it. A test that passes so
        may see the fix only in the processes it starts: again with the revert in the variable
        too; where the run with the fix in place has the variable unset, a failure then counts
        only if the test passes with the variable set and nothing reverted (``0``)."""
        from sglfix.common.errors import SglfixError
        from sglfix.toggling.revert import revert

        try:
            held = revert([rid], what=f"{item.nodeid}: @pytest.mark.{MARK}")
        except SglfixError as exc:
            return "error", str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        try:
            here = self._run_with(item, runtestprotocol, env=None)
            if here[0] != "passed":
                return here
            children = self._run_with(item, runtestprotocol, env=",".join(filter(None, [self.revert_value, rid])))
        finally:
            held.restore()
        if children[0] != "failed" or envs.REVERT_PR.get():
            return children
        alone = self._run_with(item, runtestprotocol, env="0")
        if alone[0] == "passed":
            return "failed", f"{children[1]}; through {ENV_VAR}, in the processes the test starts"
        return "passed", (
            f"in this process; with {ENV_VAR} set it fails whether or not the fix is reverted, "
            f"set to 0 too: {alone[1] or alone[0]}"
        )

    def _run_with(self, item: pytest.Item, runtestprotocol: Any, *, env: str | None) -> tuple[str, str]:
        """One run of the test, with ``REVERT_PR`` set to ``env`` for it (None: as
        it is), torn down to the parent: module and session fixtures stay for the ordinary run."""
        old = envs.REVERT_PR.get()
        if env is not None:
            envs.REVERT_PR.set(env)
        try:
            return _run_outcome(runtestprotocol(item, nextitem=item.parent, log=False))
        finally:
            envs.REVERT_PR.set(old)  # None: unset, as it was

    @pytest.hookimpl(trylast=True)  # the test's own report first, everywhere; then its claims'
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.check or report.nodeid in self.results:
            return
        for name, value in getattr(report, "user_properties", ()):
            if name == PROPERTY:
                self.results[report.nodeid] = json.loads(value)
                # The claims' own results come from the process that reports to the user (an
                # xdist worker may only report the item it runs; its controller gets here too).
                if not hasattr(self.config, "workerinput"):
                    for outcome in self.results[report.nodeid]:
                        _log_claim(self.config, report, outcome)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.check and self._uncaught() and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        path = envs.SGLFIX_CHECK_REPORT.get()
        if self.check and path and not hasattr(self.config, "workerinput"):  # the xdist controller or a plain run
            from sglfix.common.atomic import write_atomic

            write_atomic(path, json.dumps(self.results, indent=1))

    def _uncaught(self) -> list[tuple[str, dict]]:
        """The claims that fail the session (``Claim.fails_session``)."""
        from sglfix.report.outcome import Claim

        return [
            (node, o) for node, outcomes in self.results.items() for o in outcomes if Claim(o["outcome"]).fails_session
        ]

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if not self.check or exitstatus == pytest.ExitCode.USAGE_ERROR:
            return
        from sglfix.report.outcome import Claim

        tr = terminalreporter
        tr.write_sep("=", "sglfix: does each test catch the fixes it claims?")
        if not self.results:
            tr.write_line(f"no test is marked @pytest.mark.{MARK}: nothing checked")
            return
        for node, outcomes in self.results.items():
            for o in outcomes:
                claim = Claim(o["outcome"])
                tr.write_line(
                    f"{_LABELS[claim]:<12} {o['id']:<24} {node}  ({o['detail']})",
                    green=claim is Claim.CAUGHT,
                    red=claim.fails_session,
                    yellow=claim is not Claim.CAUGHT and not claim.fails_session,
                )
        bad = self._uncaught()
        claims = [Claim(o["outcome"]) for v in self.results.values() for o in v]
        caught, not_run, inconclusive = (claims.count(c) for c in (Claim.CAUGHT, Claim.NOT_RUN, Claim.INCONCLUSIVE))
        tr.write_line(
            f"{caught}/{len(claims)} claims caught"
            + (f"; {not_run} not run (skipped or xfail)" if not_run else "")
            + (f"; {inconclusive} inconclusive (fails with the fix in place too)" if inconclusive else "")
            + (f"; {len(bad)} not: exit 1" if bad else "")
        )


_LABELS = {
    "caught": "caught",
    "not-caught": "NOT caught",
    "inconclusive": "inconclusive",
    "not-run": "not run",
    "error": "ERROR",
}


def _run_outcome(reports: list) -> tuple[str, str]:
    """One run's reports (setup, call, teardown) taken together, as one of
    ``sglfix.report.outcome.TEST_OUTCOMES`` but ``error`` (a revert that could not be applied),
    and what shows it: the first failure, the skip's or the xfail's reason."""
    xfail = next((r for r in reports if hasattr(r, "wasxfail")), None)
    if xfail is not None:  # expected to fail (or xpassed): it cannot tell the revert either way
        return "xfail", xfail.wasxfail or "no reason given"
    failed = next((r for r in reports if r.failed), None)
    if failed is not None:
        crash = getattr(failed.longrepr, "reprcrash", None)
        text = str((crash and crash.message) or failed.longrepr or "")
        return "failed", f"{failed.when}: {text.splitlines()[0] if text.strip() else 'failed'}"
    skipped = next((r for r in reports if r.skipped), None)
    if skipped is not None:
        reason = skipped.longrepr[2] if isinstance(skipped.longrepr, tuple) else str(skipped.longrepr)
        return "skipped", reason.removeprefix("Skipped: ")
    return "passed", ""


def _judge(rid: str, fixed: tuple[str, str], reverted: tuple[str, str]) -> dict:
    """A claim judged by ``judge_claim`` from the runs with the fix in place and reverted (each
    an outcome and what shows it), as the report carries it: the detail is judge_claim's reason
    and what shows it (the reverted run's, but the run with the fix in place's where that run is
    what the judgement rests on)."""
    from sglfix.report.outcome import Claim, judge_claim

    claim, why = judge_claim(fixed=fixed[0], reverted=reverted[0])
    shown = reverted[1]
    if claim is Claim.INCONCLUSIVE or (claim is Claim.NOT_RUN and reverted[0] not in ("skipped", "xfail")):
        shown = fixed[1]
    return {
        "id": rid,
        "outcome": claim.value,
        "detail": f"{why} ({shown})" if shown else why,
        "fixed": fixed[0],
        "reverted": reverted[0],
    }


def _log_claim(config: pytest.Config, report: pytest.TestReport, outcome: dict) -> None:
    """Each claim as a result of its own (``<test>[sglfix-revert=ID]``): caught passes, NOT caught
    and ERROR fail (``Claim.fails_session``), not run and inconclusive are skipped with the
    reason. Reported through pytest's own hook, so the terminal counts and ``--junitxml`` see what
    the exit status says."""
    from _pytest.reports import TestReport

    from sglfix.report.outcome import Claim

    nodeid = f"{report.nodeid}[sglfix-revert={outcome['id']}]"
    location = report.location
    claim = Claim(outcome["outcome"])
    label = _LABELS[claim]
    if claim is Claim.CAUGHT:
        result, longrepr = "passed", None
    elif claim.fails_session:
        result, longrepr = "failed", f"{label}: {outcome['detail']}"
    else:
        result, longrepr = "skipped", (str(location[0]), (location[1] or 0) + 1, f"{label}: {outcome['detail']}")
    for when, res, rep in (("setup", "passed", None), ("call", result, longrepr), ("teardown", "passed", None)):
        config.hook.pytest_runtest_logreport(report=TestReport(nodeid, location, {}, res, rep, when))
