"""Tables that never cut a name: `print_table` and its `Column`.

Names, numbers and codes are never cut, in a pipe or a narrow terminal: `print_table` wraps
only prose columns, and when even that does not fit it prints one block per row (the key cells
on one line, each prose cell indented below). Plain lines are printed with soft wrap, so the
terminal may fold them on screen but the text stream keeps every name whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len
from rich.table import Table

from dspark_hub.cli._terminal import TerminalText as Text
from dspark_hub.cli._terminal import stdout

#: A prose column narrower than this wraps into a column of single words: use blocks instead.
MIN_PROSE_WIDTH = 16

Cell = str | Text



@dataclass(frozen=True)
class Column:
    """A table column. `prose` columns wrap at word boundaries; the others are never wrapped or cut.

    `label`: in the block layout, show the cell as `name value` (for numbers that mean nothing bare).
    """

    name: str
    prose: bool = False
    label: bool = False
    justify: Literal["left", "right"] = "left"


def _width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


def _longest_word(cell: Cell) -> int:
    return max((cell_len(word) for word in str(cell).split()), default=0)


def _column_widths(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int) -> list[int] | None:
    """Widths that keep every non-prose cell and every word whole within `width`; None if there are none."""
    natural = [max([_width(Text(c.name))] + [_width(row[i]) for row in rows]) for i, c in enumerate(columns)]
    prose = [i for i, c in enumerate(columns) if c.prose]
    available = width - (3 * len(columns) + 1) - sum(w for i, w in enumerate(natural) if i not in prose)
    least = {i: max([min(natural[i], MIN_PROSE_WIDTH), *(_longest_word(row[i]) for row in rows)]) for i in prose}
    if sum(least.values()) > available:
        return None
    if sum(natural[i] for i in prose) <= available:
        return natural
    spare = available - sum(least.values())
    growth = {i: natural[i] - least[i] for i in prose}
    total_growth = sum(growth.values()) or 1
    widths = list(natural)
    for i in prose:
        widths[i] = least[i] + spare * growth[i] // total_growth
    return widths


def print_table(title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> None:
    """Print rows as a table that fits the console, or as blocks when no table can keep every name whole."""
    rows = [[Text(cell) if isinstance(cell, str) else cell for cell in row] for row in rows]   # measured as shown
    widths = _column_widths(columns, rows, stdout.width)
    if widths is not None:
        table = Table(title=title, expand=False)
        for column, w in zip(columns, widths, strict=True):
            table.add_column(column.name, justify=column.justify, width=w, no_wrap=not column.prose,
                             overflow="fold" if column.prose else "ignore")
        for row in rows:
            table.add_row(*row)
        stdout.print(table)
        return
    if title:
        stdout.print(title)
    for row in rows:
        key = [Text.assemble(f"{c.name} ", cell) if c.label else cell
               for c, cell in zip(columns, row, strict=True) if not c.prose and str(cell)]
        stdout.print(Text("  ").join(Text(k) if isinstance(k, str) else k for k in key))
        named = False
        for column, cell in zip(columns, row, strict=True):
            if column.prose and str(cell):
                stdout.print(Text.assemble("    ", f"{column.name}: " if named else "", cell))
            named = named or column.prose
