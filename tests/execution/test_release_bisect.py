"""The search over releases: the first release whose verdicts differ from the oldest's, in at most
ceil(log2 n) + 1 release runs; releases that cannot be tested stepped over; the changed
functions between two release trees; the one-line refusals of bad input, before anything runs.

The end-to-end measure on real wheels (a regression planted in a copied 0.5.22 wheel) is
``bench/release_bisect.py``, its result in ``bench/results/release-bisect-cpu.json``.
"""

from __future__ import annotations

import math
import textwrap

import pytest
from clihelp import assert_one_line_error, run_cli

from sglfix.common.errors import ConfigError
from sglfix.execution.release_bisect import ReleaseRun, ReleaseSearch, changed_functions, parse_range
from sglfix.report.release_bisect import ReleaseFound

RELEASES = [f"0.5.{i}" for i in range(13, 24)]


def _search(first_bad: str | None, *, untestable: tuple[str, ...] = ()) -> tuple[ReleaseFound, list[str]]:
    asked: list[str] = []

    def run(version: str) -> ReleaseRun:
        asked.append(version)
        if version in untestable:
            return ReleaseRun(version, untestable="no profile covers it", exit=2)
        bad = first_bad is not None and RELEASES.index(version) >= RELEASES.index(first_bad)
        return ReleaseRun(version, verdicts={"baseline::s": "DIVERGE" if bad else "PASS", "baseline::t": "PASS"})

    return ReleaseSearch(RELEASES, run=run).search(), asked


@pytest.mark.parametrize("first_bad", [*RELEASES[1:], None])
def test_the_first_release_unlike_the_oldest_is_found_in_log_time(first_bad):
    result, asked = _search(first_bad)
    assert result.first_bad == first_bad
    if first_bad is not None:
        assert result.last_good == RELEASES[RELEASES.index(first_bad) - 1]
        # As the report writes it: the first bad release is the key of its verdict.
        cells = [c.model_dump() for c in result.differing_cells or ()]
        assert cells == [{"cell": "baseline::s", "reference": "PASS", first_bad: "DIVERGE"}]
    assert len(asked) == len(set(asked)) <= 1 + math.ceil(math.log2(len(RELEASES)))


def test_a_release_that_cannot_be_tested_is_stepped_over():
    result, asked = _search("0.5.19", untestable=("0.5.18",))
    assert result.first_bad == "0.5.19" and result.last_good in ("0.5.17", "0.5.16")
    assert "0.5.18" in asked
    result, _ = _search("0.5.19", untestable=("0.5.18", "0.5.19"))
    # Nothing between the last good and the first bad found could be tested: both are named.
    assert result.first_bad == "0.5.20" and set(result.untested_between) <= {"0.5.18", "0.5.19"}


def test_the_oldest_release_must_be_testable():
    with pytest.raises(ConfigError, match=r"the oldest release, 0\.5\.13, cannot be tested"):
        _search("0.5.19", untestable=("0.5.13",))


def test_changed_functions_compares_each_function_of_the_modules(tmp_path):
    for version, body in (("good", "return x + 1"), ("bad", "return x + 2")):
        pkg = tmp_path / version / "pkgx"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "mod.py").write_text(
            textwrap.dedent(
                f"""\
                def same(x):
                    return x

                class C:
                    def f(self, x):
                        {body}
                """
            )
        )
    changed = changed_functions(tmp_path / "good", tmp_path / "bad", ["pkgx.mod"])
    assert list(changed) == ["pkgx.mod.C.f"]
    c = changed["pkgx.mod.C.f"]
    assert "x + 1" in c.old and "x + 2" in c.new and c.line == 5 and c.file == "pkgx/mod.py"


def test_bad_ranges_are_one_line_before_anything_runs():
    with pytest.raises(ConfigError, match="give a range of releases"):
        parse_range("0.5.21")
    with pytest.raises(ConfigError, match="not older than"):
        parse_range("0.5.23..0.5.21")
    assert_one_line_error(run_cli("bisect", "--releases", "0.5.23..0.5.21"), "--releases", "oldest release first")
    assert_one_line_error(run_cli("bisect", "--releases", "0.5.21..0.5.23", "--shard", "1/2"), "--shard does not apply")
    assert_one_line_error(run_cli("run", "--wheels", "/tmp"), "--wheels DIR")


def test_a_range_must_name_releases_the_wheels_hold(tmp_path):
    for v in ("0.5.21", "0.5.23"):
        (tmp_path / f"sglang-{v}-cp311-cp311-manylinux_2_34_x86_64.whl").write_bytes(b"")
    r = run_cli("bisect", "--releases", "0.5.21..0.5.22", "--wheels", str(tmp_path), subprocess=True)
    assert_one_line_error(r, "sglang 0.5.22 is not in --wheels", "0.5.21, 0.5.23")


def _wheels(tmp_path, *versions: str) -> str:
    for v in versions:
        (tmp_path / f"sglang-{v}-cp311-cp311-manylinux_2_34_x86_64.whl").write_bytes(b"")
    return str(tmp_path)


def test_every_option_acts_or_is_refused_before_a_release_is_fetched(tmp_path, monkeypatch):
    """--apply was never applied, --no-reachability and --env-baseline were dropped, a bad revert
    id or scenario was found only when the oldest release's run refused it (after its fetch)."""
    wheels = _wheels(tmp_path, "0.5.21", "0.5.22", "0.5.23")
    line = ["--wheels", wheels, "bisect", "--releases", "0.5.21..0.5.23"]
    env = {"SGLFIX_CACHE": str(tmp_path / "cache")}
    for extra, needle in (
        (["--apply", str(tmp_path / "missing.patch")], "missing.patch"),
        (["--no-reachability"], "--no-reachability does not apply"),
        (["-r", "99999"], "PR 99999 is not registered"),
        (["-s", "no-such-scenario*"], "no scenario matches"),
        (["--timeout", "0"], "--timeout 0"),
    ):
        r = run_cli(*line, *extra, env=env)
        got = assert_one_line_error(r, needle)
        assert "cannot be tested" not in got, got  # refused by the search itself, before any release ran
    inherited = run_cli(*line, env={**env, "SGLANG_DEBUG_REVERT_PR": "26972"})
    assert_one_line_error(inherited, "SGLANG_DEBUG_REVERT_PR=26972 is set", "--env-baseline")
    reproduction = run_cli("--profile", "reproduction", *line, env=env)
    assert_one_line_error(reproduction, "--profile reproduction replays the reproduction")
    older = run_cli("--wheels", wheels, "bisect", "--releases", "0.5.10..0.5.23", env=env)
    assert_one_line_error(older, "no profile covers sglang 0.5.10")
    assert not (tmp_path / "cache").exists()
    # What is accepted reaches every release's run: the fix applied, the MPS choice, the reverts.
    from sglfix.cli.context import Options
    from sglfix.cli.options import OPTIONS
    from sglfix.cli.release_bisect_cmd import check_release_bisect

    fix = tmp_path / "fix.patch"
    fix.write_text("--- a/python/sglang/x.py\n+++ b/python/sglang/x.py\n@@ -1,1 +1,1 @@\n-a = 1\n+a = 2\n")
    given = {name: default for name, (_, default) in OPTIONS.items()}
    given.update(releases="0.5.21..0.5.23", apply=[str(fix)], mps="off", candidates=["26972"], device="cpu")
    monkeypatch.delenv("SGLANG_DEBUG_REVERT_PR", raising=False)
    engine, releases, args = check_release_bisect(Options(wheels=wheels), given)
    assert (engine, releases) == ("sglang", ["0.5.21", "0.5.22", "0.5.23"])
    assert args[args.index("--apply") + 1] == str(fix) and args[args.index("--mps") + 1] == "off"
    assert args[args.index("-r") + 1] == "26972"
