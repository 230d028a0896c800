"""Tables whose first column is a name that identifies the row (a scenario, a toggle set): the
name is never cut. When the table fits the width with its names whole, the other columns wrap;
when it cannot, each row is printed as one record line, the name first and whole, the other
columns after it as ``header: value``, so a narrow terminal or a CI log with COLUMNS=60 still
shows every name in full and greppable."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

# The narrowest a wrapped column may get (unless its longest value is shorter) before a table
# stops being the readable layout: a key figure folded into a few characters a line is not.
_MIN_COLUMN = 20


def named_rows(
    headers: Sequence[str], rows: Sequence[Sequence[Text | str]], *, title: str, width: int
) -> list[Text | Table]:
    """``rows[i][0]`` is the name; a Table that keeps names whole, or record lines when the
    table cannot (see the module's docstring)."""
    cells = [[c if isinstance(c, Text) else Text(c) for c in row] for row in rows]
    # A column with nothing in it (no key figure when every cell passed) takes no width.
    keep = [0, *(i for i in range(1, len(headers)) if any(r[i].plain for r in cells))]
    headers = [headers[i] for i in keep]
    cells = [[r[i] for i in keep] for r in cells]
    name_width = max([len(headers[0]), *(r[0].cell_len for r in cells)])
    others = [min(_MIN_COLUMN, max([len(h), *(r[i].cell_len for r in cells)])) for i, h in enumerate(headers) if i > 0]
    # rich's heavy box: one rule per column and two edges, one space of padding either side.
    need = name_width + sum(others) + 3 * len(headers) + 1
    if need <= width:
        table = Table(title=Text(title))
        table.add_column(headers[0], no_wrap=True, min_width=name_width)
        for h in headers[1:]:
            table.add_column(h, overflow="fold")
        for r in cells:
            table.add_row(*r)
        return [table]
    lines: list[Text | Table] = [Text(title, style="italic")]
    for r in cells:
        line = Text()
        line.append_text(r[0])
        for h, c in zip(headers[1:], r[1:]):
            if c.plain:
                line.append(f"  {h}: ", style="dim")
                line.append_text(c)
        lines.append(line)
    return lines
