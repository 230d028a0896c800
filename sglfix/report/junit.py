"""JUnit XML from a report dict, for CI test-report views: one ``<testsuite>`` per toggle set,
one ``<testcase>`` per cell (classname = the toggle set, name = the scenario).

Each cell's testcase says what its meaning (``sglfix.report.outcome``) says, the meaning the exit
code reads: ``gate=False`` (``run``) judges findings (a verdict that is not a pass fails unless it
is a known divergence or its baseline's own); ``gate=True`` (``matrix``) judges by the
expectations (an unexpected verdict or a cell of an unmet expectation fails). An explained
non-PASS verdict (expected, known, same as baseline) is a passing testcase with the verdict, the
reason and the key figure in ``<system-out>``. ERROR, FAULT and TIMEOUT (sglfix could not judge
the cell) are ``<error>``; SKIP is ``<skipped>`` with the reason, and so is NOT_REACHED (never a
pass: it did not run). The suites' properties name the code base and the baseline.
"""

from __future__ import annotations

import importlib.util
import json
import re

from sglfix.common.errors import ConfigError
from sglfix.report.context import key_figure
from sglfix.report.grid import set_label
from sglfix.report.output import check_output_file, write_atomic

__all__ = ["SUFFIXES", "build_junit", "check_junit_path", "junit_xml", "write_junit", "xml_text"]

SUFFIXES = (".xml",)
# Not judged: the tool, the worker or the clock failed, not the code under test.
UNJUDGED = frozenset({"ERROR", "FAULT", "TIMEOUT"})
# Characters XML 1.0 cannot carry (worker output tails may hold them).
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: object) -> str:
    """``text`` as XML 1.0 can carry it: each character it cannot, U+FFFD."""
    return _NOT_XML.sub("\ufffd", str(text))


def check_junit_path(path: str | None, *, option: str = "--junit") -> None:
    """Exit 2 now if ``path`` is not a writable ``.xml`` file path."""
    check_output_file(path, option=option, suffixes=SUFFIXES)
    if path is not None and importlib.util.find_spec("junitparser") is None:
        raise ConfigError(f"{option} needs junitparser, which is not installed: pip install 'junitparser>=3'")


def _details(cell: dict, why: str | None = None) -> str:
    lines = [f"cell {cell.get('id', '?')}: {cell.get('verdict')}"]
    if why:
        lines.append(why)
    for f in cell.get("findings") or ():
        lines.append(f"{f.get('verdict')}: {f.get('message', '')}")
        for k, v in f.items():
            if k not in ("verdict", "message"):
                lines.append(f"    {k}: {v if isinstance(v, str) else json.dumps(v)}")
    if cell.get("error") and not any("max_abs_err" in f for f in cell.get("findings") or ()):
        lines.append("error sizes: " + ", ".join(f"{k}={v}" for k, v in cell["error"].items()))
    if cell.get("timings_ms"):
        lines.append("timings ms: " + ", ".join(f"{k}={v}" for k, v in cell["timings_ms"].items()))
    return xml_text("\n".join(lines))


def build_junit(report: dict, *, gate: bool | None = None, judgement=None):
    """The ``junitparser.JUnitXml`` of ``report`` (``judgement``: its ``outcome.judge``, made here
    when not given; ``gate`` picks the mode, default the report's own)."""
    from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

    from sglfix.report.outcome import codebase_label, judge

    if judgement is None:
        judgement = judge(report, mode=None if gate is None else "gate" if gate else "findings")
    baseline = judgement.baseline_note() or "the code as installed"
    suites: dict[str, TestSuite] = {}
    for cell in report.get("cells") or ():
        label = set_label(cell.get("toggles") or ())
        suite = suites.get(label)
        if suite is None:
            suite = suites[label] = TestSuite(xml_text(label))
            if report.get("date"):
                suite.timestamp = report["date"]
            if report.get("host"):
                suite.hostname = xml_text(report["host"])
            for key in ("command", "device", "device_name", "env_revert"):
                if report.get(key) is not None:
                    suite.add_property(key, xml_text(report[key]))
            suite.add_property("codebase", xml_text(codebase_label(report)))
            suite.add_property("baseline", xml_text(baseline))
        verdict = cell.get("verdict", "?")
        case = TestCase(
            xml_text(cell["scenario"]),
            xml_text(label),
            round(float((cell.get("timings_ms") or {}).get("total", 0.0)) / 1000, 6),
        )
        figure = xml_text(key_figure(cell) or verdict)
        meaning = judgement.of(cell.get("id"))
        fails = meaning is not None and meaning.meaning.fails
        if verdict in ("SKIP", "NOT_REACHED") and not fails:
            case.result = [Skipped(figure)]
        elif fails:
            result = (Error if verdict in UNJUDGED else Failure)(figure, verdict)
            result.text = _details(cell, f"{meaning.meaning.value} {verdict}: {meaning.why}")
            case.result = [result]
        elif verdict != "PASS":
            what = meaning.meaning.value if meaning is not None else "expected"
            why = f" ({meaning.why})" if meaning is not None else ""
            case.system_out = xml_text(f"{what} {verdict}: {figure}{why}")
        suite.add_testcase(case)
    if judgement.drifted:
        # A revert that no longer applies to the code is a failed check of its own, with no cell.
        suite = suites.setdefault("drifted", TestSuite("reverts that no longer apply"))
        for rid, why in judgement.drifted.items():
            case = TestCase(xml_text(rid), "drifted")
            case.result = [Failure(xml_text(why), "DRIFTED")]
            suite.add_testcase(case)
    xml = JUnitXml("sglfix")
    for suite in suites.values():
        suite.update_statistics()
        xml.add_testsuite(suite)
    xml.update_statistics()
    return xml


def junit_xml(report: dict, *, gate: bool | None = None, judgement=None) -> str:
    from xml.dom.minidom import parseString

    # tostring() and minidom's indentation, as junitparser's own pretty writer (whose file
    # argument changed in junitparser 4): the text goes through write_atomic.
    return (
        parseString(build_junit(report, gate=gate, judgement=judgement).tostring())
        .toprettyxml(indent="\t", encoding="utf-8")
        .decode("utf-8")
    )


def write_junit(report: dict, path: str, *, gate: bool | None = None, judgement=None) -> None:
    """JUnit XML of ``report`` to ``path``, atomically (``gate``: the matrix's pass/fail rule)."""
    write_atomic(path, junit_xml(report, gate=gate, judgement=judgement))
