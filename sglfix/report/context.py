"""What a report dict says about how it was judged, read back so that a saved or merged report
judges the same: its mode, its baseline set, its expectation rows, and a cell's key figure. Part
of the one judgement (``sglfix.report.outcome``)."""

from __future__ import annotations

from sglfix.report.expectations import Expect

__all__ = ["base_of", "expects_of", "key_figure", "mode_of"]


def key_figure(cell: dict) -> str:
    """The message of a report cell's first finding with the cell's verdict, as the tables show it
    ('' where none has it: a PASS), as ``CellResult.key_figure`` gives it for a live cell."""
    return next(
        (
            str(f.get("message", ""))
            for f in cell.get("findings") or ()
            if isinstance(f, dict) and f.get("verdict") == cell.get("verdict")
        ),
        "",
    )


def base_of(report: dict) -> tuple[str, ...]:
    """The toggle set the report's cells were judged against: its ``judged`` baseline, else its
    ``SGLANG_DEBUG_REVERT_PR`` (an older report); () for no toggle."""
    judged = report.get("judged")
    if isinstance(judged, dict) and isinstance(judged.get("baseline"), list):
        return tuple(judged["baseline"])
    env = report.get("env_revert")
    if env in (None, "", "0"):
        return ()
    return tuple(t.strip() for t in str(env).split(",") if t.strip())


def mode_of(report: dict) -> str:
    """``gate`` or ``findings``: as the report was judged, else as its command implies."""
    judged = report.get("judged")
    if isinstance(judged, dict) and judged.get("mode") in ("gate", "findings"):
        return judged["mode"]
    words = str(report.get("command") or "").split()
    if "matrix" in words:
        return "gate"
    if "run" in words:
        return "findings"
    return "gate" if (report.get("expectations") or report.get("stray") or report.get("not_run")) else "findings"


def expects_of(report: dict) -> list[Expect]:
    """The report's expectation rows: ``expect`` (written since the judgement has a home), else
    the rows its checks name (an older report: the unchecked ones are then only its ``not_run``)."""
    rows = report.get("expect")
    if isinstance(rows, list):
        return [Expect.from_json(r) for r in rows if isinstance(r, dict)]
    out: dict[Expect, None] = {}
    for e in report.get("expectations") or ():
        if isinstance(e, dict) and isinstance(e.get("revert"), list):
            out[Expect.from_json(e)] = None
    return list(out)
