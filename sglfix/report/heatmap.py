"""The toggle-set x scenario grid of a report dict as a picture: one coloured cell per verdict.

Rows are the scenarios grouped by base name (before the first ``@``: one backend and mode per
group), each group labelled on the left and fenced by lines; columns are the toggle sets, fenced
by PR. The figure grows with the grid so that labels keep one legible size (a 155 x 25 matrix is
about 16 x 36 inches at 100 dpi). Needs matplotlib (``pip install 'sglfix[plot]'``), imported only
when a picture is drawn.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

from sglfix.common.errors import ConfigError
from sglfix.common.verdicts import MARKS, Look, look_of
from sglfix.report.grid import Grid
from sglfix.report.output import check_output_file, write_atomic

__all__ = ["SUFFIXES", "check_heatmap_path", "render_heatmap", "write_heatmap"]

SUFFIXES = (".png", ".svg")
INSTALL_HINT = "pip install 'sglfix[plot]'"
NOT_RUN = "not run"


def _look(name: str) -> Look | None:
    """How a grid entry is drawn (``sglfix.common.verdicts.LOOKS``): a verdict, or not run."""
    return look_of(None if name == NOT_RUN else name)


def _colour(name: str) -> str:
    look = _look(name)
    return look.colour if look else "#999999"


def _code(name: str) -> str:
    """The letter drawn in a cell, so the picture reads without colour too; none in a PASS cell
    (the most of a grid: its colour says it, and the findings stand out)."""
    look = _look(name)
    return "" if name == "PASS" else look.letter if look else name[:1]


def _ink(name: str) -> str:
    look = _look(name)
    return look.ink if look else "black"


FONT = 8.5  # points, every label
ROW_H = 0.2  # inches per scenario row
COL_W = 0.36  # inches per toggle-set column
CHAR_W = 0.60  # a label character's width, in units of the font size
DPI = 100


def check_heatmap_path(path: str | None, *, option: str = "--heatmap") -> None:
    """Exit 2 now if ``path`` is not a writable ``.png``/``.svg`` path or matplotlib is missing."""
    if path is None:
        return
    check_output_file(path, option=option, suffixes=SUFFIXES)
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(f"{option} needs matplotlib, which is not installed: {INSTALL_HINT}")


def _text_in(chars: int, size: float = FONT) -> float:
    return chars * size * CHAR_W / 72


def _pr_of(label: str) -> str:
    return label.split(",", 1)[0].split(":", 1)[0]


def _title(report: dict, *, cells: int, rows: int, columns: int) -> str:
    where = report.get("device") or "?"
    if report.get("device_name") and report["device_name"] != where:
        where += f" ({report['device_name']})"
    wall = report.get("wall_s")
    command = " ".join(str(report.get("command") or "sglfix").split()[:2])
    return (
        f"{command} on {where}: {cells} cells, {rows} scenario{'s' * (rows != 1)} x "
        f"{columns} toggle set{'s' * (columns != 1)}"
        + (f", {float(wall):.0f} s" if isinstance(wall, (int, float)) else "")
        + (f", {str(report['date'])[:10]}" if report.get("date") else "")
    )


def render_heatmap(report: dict, *, fmt: str = "png") -> bytes:
    """The picture of ``report``'s grid as PNG or SVG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.transforms import blended_transform_factory

    grid = Grid.of(report)
    columns = grid.columns or ["(none)"]
    rows = grid.rows or ["(no cells)"]
    groups = grid.groups or [("(no cells)", rows)]
    names = [*MARKS, NOT_RUN]
    names += sorted({c.get("verdict", "?") for c in grid.cells.values()} - set(names))
    index = {v: i for i, v in enumerate(names)}
    data = [[index[grid.verdict(c, s) or NOT_RUN] for c in columns] for s in rows]
    counts: dict[str, int] = {}
    for row in data:
        for i in row:
            counts[names[i]] = counts.get(names[i], 0) + 1

    suffix = [s.split("@", 1)[1] if "@" in s else "" for s in rows]
    row_h = ROW_H if len(rows) * ROW_H < 250 else max(0.12, 250 / len(rows))
    font = FONT if row_h >= ROW_H else FONT * row_h / ROW_H
    pad = 0.15
    group_w = _text_in(max(len(g) for g, _ in groups), font) + 2 * pad
    suffix_w = _text_in(max((len(s) for s in suffix), default=0), font) + 2 * pad
    col_h = _text_in(max(len(c) for c in columns), font) + pad
    grid_w, grid_h = max(len(columns) * COL_W, 2.0), len(rows) * row_h
    cells = sum(counts.values()) - counts.get(NOT_RUN, 0)
    title = _title(report, cells=cells, rows=len(grid.rows), columns=len(grid.columns))
    shown = [v for v in names if counts.get(v)]
    labels = [(f"{_code(v)}  " if _code(v) else "") + f"{v}: {counts[v]}" for v in shown]
    entry_w = _text_in(max(len(t) for t in labels) + 6, font * 1.1)
    left, right = 0.2 + group_w + suffix_w, 0.4
    width = max(left + grid_w + right, 7.0, _text_in(len(title), font * 1.5) + 0.6)
    ncol = max(1, min(len(labels), int((width - 0.4) // entry_w)))
    nrow = -(-len(labels) // ncol)
    title_h, legend_h = 0.75, 0.2 + 0.25 * nrow
    top, bottom = title_h + legend_h + col_h, col_h + 0.3
    height = top + grid_h + bottom
    fig = Figure(figsize=(width, height), dpi=DPI)
    ax = fig.add_axes((left / width, bottom / height, grid_w / width, grid_h / height))

    cmap = ListedColormap([_colour(v) for v in names])
    norm = BoundaryNorm([i - 0.5 for i in range(len(names) + 1)], cmap.N)
    ax.imshow(
        data,
        cmap=cmap,
        norm=norm,
        aspect="auto",
        interpolation="nearest",
        extent=(-0.5, len(columns) - 0.5, len(rows) - 0.5, -0.5),
    )
    ax.set_xlim(-0.5, len(columns) - 0.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=font, family="monospace")
    ax.tick_params(axis="x", top=True, labeltop=True, bottom=True, labelbottom=True, length=2)
    ax.set_yticks(range(len(rows)), suffix, fontsize=font, family="monospace")
    ax.tick_params(axis="y", length=0, pad=pad * 72)
    ax.set_xticks([i + 0.5 for i in range(len(columns) - 1)], minor=True)
    ax.set_yticks([i + 0.5 for i in range(len(rows) - 1)], minor=True)
    ax.tick_params(which="minor", length=0)
    ax.grid(which="minor", color="white", linewidth=0.8)
    for spine in ax.spines.values():
        spine.set_linewidth(1.2)

    for y, row in enumerate(data):
        for x, i in enumerate(row):
            code = _code(names[i])
            if code:
                ax.text(
                    x,
                    y,
                    code,
                    ha="center",
                    va="center",
                    fontsize=font * 0.9,
                    fontweight="bold",
                    color=_ink(names[i]),
                    family="monospace",
                )

    # Row groups: a band behind every other group's labels, a line between groups, the group name.
    side = blended_transform_factory(ax.transAxes, ax.transData)
    x_group = -(group_w + suffix_w) / grid_w
    start = 0
    for n, (group, members) in enumerate(groups):
        end = start + len(members)
        if n % 2:
            ax.add_patch(
                Rectangle(
                    (x_group, start - 0.5),
                    -x_group,
                    end - start,
                    transform=side,
                    facecolor="#eeeeee",
                    edgecolor="none",
                    clip_on=False,
                    zorder=-1,
                )
            )
        if n:
            ax.plot(
                [x_group, 1], [start - 0.5, start - 0.5], transform=side, color="#444444", linewidth=1.2, clip_on=False
            )
        ax.text(
            x_group + pad / grid_w,
            (start + end - 1) / 2,
            group,
            transform=side,
            ha="left",
            va="center",
            fontsize=font,
            fontweight="bold",
            family="monospace",
        )
        start = end
    ax.text(
        x_group + pad / grid_w,
        -0.6,
        "scenario",
        transform=side,
        ha="left",
        va="bottom",
        fontsize=font,
        fontweight="bold",
        family="monospace",
    )
    ax.text(
        -pad / grid_w,
        -0.6,
        "@ variant",
        transform=side,
        ha="right",
        va="bottom",
        fontsize=font,
        fontweight="bold",
        family="monospace",
    )
    # Column groups: a line between toggle sets of different PRs.
    for x in range(1, len(columns)):
        if _pr_of(columns[x]) != _pr_of(columns[x - 1]):
            ax.axvline(x - 0.5, color="#444444", linewidth=1.2)

    fig.text(0.5, 1 - 0.3 / height, title, ha="center", va="center", fontsize=font * 1.5, fontweight="bold")
    handles = [Patch(facecolor=_colour(v), edgecolor="#444444", linewidth=0.5, label=t) for v, t in zip(shown, labels)]
    # matplotlib fills a legend column by column; this order reads row by row, most severe first.
    order = [r * ncol + c for c in range(ncol) for r in range(nrow) if r * ncol + c < len(handles)]
    fig.legend(
        handles=[handles[i] for i in order],
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - title_h / height),
        ncol=ncol,
        frameon=False,
        handlelength=1.6,
        columnspacing=1.6,
        prop={"family": "monospace", "size": font * 1.1},
    )
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=DPI, facecolor="white", metadata={"Software": None} if fmt == "png" else None)
    return buf.getvalue()


def write_heatmap(report: dict, path: str) -> None:
    """The picture of ``report`` to ``path`` (``.png`` or ``.svg``, by extension), atomically."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if f".{fmt}" not in SUFFIXES:
        raise ConfigError(f"heatmap {path}: the file name must end in {' or '.join(SUFFIXES)}")
    write_atomic(path, render_heatmap(report, fmt=fmt))
