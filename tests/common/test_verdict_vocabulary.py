"""One verdict vocabulary: each verdict's letter, console style and picture colour come from one
table (``sglfix.common.verdicts.LOOKS``) that the console grid, Markdown and the heatmap read when
they draw, so a look changed in the table changes each of them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglfix.common import verdicts
from sglfix.common.verdicts import LOOKS, MARKS, NOT_RUN, Look, Verdict

# A look for every verdict that no renderer could show by chance: distinct letters, styles and
# colours not in the table.
SENTINELS = {
    v: Look(
        letter="abcdefghijk"[i],
        style=f"color({i + 20})",
        colour=f"#{i + 1:02x}{i + 1:02x}a1",
        ink=f"#a1{i + 1:02x}{i + 1:02x}",
        description=f"sentinel {i}",
    )
    for i, v in enumerate(MARKS)
}
NOT_RUN_SENTINEL = Look(letter="~", style="", colour="#a2a2a2", ink="#000000", description="not run")


@pytest.fixture
def sentinels(monkeypatch):
    for v, look in SENTINELS.items():
        monkeypatch.setitem(LOOKS, v, look)
    monkeypatch.setattr(verdicts, "NOT_RUN", NOT_RUN_SENTINEL)
    return SENTINELS


def _report() -> dict:
    """A report with one scenario per verdict in the baseline column, and a toggle column that
    ran only the PASS scenario (the others are not run there)."""
    cells = []
    for v in MARKS:
        for toggles in ([], ["1"]) if v == "PASS" else ([],):
            label = ",".join(toggles) or "baseline"
            cells.append(
                {
                    "id": f"{label}::s-{v}",
                    "scenario": f"s-{v}",
                    "toggles": toggles,
                    "device": "cpu",
                    "verdict": v,
                    "findings": [] if v == "PASS" else [{"verdict": v, "message": "why"}],
                    "error": None,
                    "timings_ms": {"total": 1.0},
                    "revert_env": label,
                }
            )
    return {
        "tool": "sglfix",
        "command": "sglfix matrix",
        "device": "cpu",
        "device_name": "cpu",
        "wall_s": 1.0,
        "date": "2026-01-01T00:00:00+00:00",
        "cells": cells,
        "summary": {},
        "expectations": [],
        "stray": [],
        "not_run": [],
    }


def test_every_verdict_has_one_distinct_letter_a_style_and_a_colour():
    import matplotlib.colors
    from rich.style import Style

    assert list(LOOKS) == list(MARKS)
    letters = [look.letter for look in LOOKS.values()] + [NOT_RUN.letter]
    assert all(len(c) == 1 for c in letters) and len(set(letters)) == len(letters), letters
    for v, look in LOOKS.items():
        Style.parse(look.style)  # a style rich cannot parse raises
        assert matplotlib.colors.is_color_like(look.colour) and matplotlib.colors.is_color_like(look.ink), v
        assert look.description, v
        # Failures are capitals; the three that are no finding are not.
        assert look.letter.isupper() == Verdict(v).failed, v


def test_the_console_grid_draws_each_verdict_as_the_table_says(sentinels):
    from sglfix.cli.common import verdict_text
    from sglfix.cli.matrix import _draw

    scenarios = [SimpleNamespace(name=f"s-{v}") for v in MARKS]
    sets = [(), ("1",)]
    results = {((), f"s-{v}"): v for v in MARKS}  # nothing ran with "1" reverted
    # Too narrow for the table of names: the compact grid, a letter per cell and a key.
    parts = _draw(None, results, scenarios, sets, title="t", width=10)
    lines = {p.plain.split("  ", 1)[-1]: p for p in parts if p.plain.endswith(tuple(s.name for s in scenarios))}
    key = next(p for p in parts if p.plain.startswith("marks: "))
    for v, look in sentinels.items():
        line = lines[f"s-{v}"]
        assert line.plain.startswith(look.letter + NOT_RUN_SENTINEL.letter), line.plain
        assert line.spans[0].style == look.style
        assert f"{look.letter} {v}" in key.plain
        assert verdict_text(v).style == look.style
    assert f"{NOT_RUN_SENTINEL.letter} not run" in key.plain


def test_markdown_marks_pass_and_no_result_by_the_tables_letters(sentinels):
    from sglfix.report.markdown import render_markdown

    md = render_markdown(_report())
    pass_mark, none = sentinels["PASS"].letter, NOT_RUN_SENTINEL.letter
    assert f"| `s-PASS` | {pass_mark} | {pass_mark} |" in md, md
    for v in MARKS:  # the other verdicts by name, and not run with "1" reverted
        assert v == "PASS" or f"| `s-{v}` | {v} | {none} |" in md, md
    assert f"`{pass_mark}` PASS." in md


def test_the_heatmap_colours_and_letters_come_from_the_table(sentinels, monkeypatch):
    import matplotlib
    import matplotlib.colors

    from sglfix.report.heatmap import render_heatmap

    made = []
    listed = matplotlib.colors.ListedColormap

    def recording(colours, *args, **kwargs):
        made.append(list(colours))
        return listed(colours, *args, **kwargs)

    monkeypatch.setattr(matplotlib.colors, "ListedColormap", recording)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, to find the letters
        svg = render_heatmap(_report(), fmt="svg").decode()
    assert made == [[look.colour for look in sentinels.values()] + [NOT_RUN_SENTINEL.colour]]
    for v, look in sentinels.items():
        assert look.colour in svg, v  # its legend entry
        if v != "PASS":  # a PASS cell carries its colour alone
            assert f">{look.letter}  {v}: 1<" in svg, v
            assert look.ink in svg, v
    assert f">{NOT_RUN_SENTINEL.letter}  not run: " in svg
