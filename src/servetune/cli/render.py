"""What the CLI prints for people: a console as wide as where the text goes, tables that
fit it without losing a character, and `simulate`'s report of each point.

Rich lays a table out at the console's width; when it does not fit, cells are shortened
with an ellipsis and the rest is cropped ("deepse…", "39…"), and output that is not a
terminal gets rich's fallback of 80 columns. So a pipe or a file gets PIPED_WIDTH columns
(or $COLUMNS when set), and a table wider than the console is printed as blocks of its
columns, each block repeating the row labels (the way wide data frames are printed). Only a
single column wider than the whole console still folds: its cells break across lines.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

# Output that goes to a file or a pipe is read in an editor, a pager or a log viewer, not
# a terminal: as wide as the widest table servetune prints (the model catalog, ~150).
PIPED_WIDTH = 200
_UNBOUNDED = 100_000  # a width no table reaches: measures a table's natural width


def console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A rich console for stdout (or stderr): the terminal's width on a terminal, $COLUMNS
    when set, else PIPED_WIDTH."""
    stream = sys.stderr if stderr else sys.stdout
    on_terminal = getattr(stream, "isatty", lambda: False)()
    width = None if on_terminal or os.environ.get("COLUMNS", "").isdigit() else PIPED_WIDTH
    return Console(stderr=stderr, width=width, **kwargs)


def print_tables(*tables: Table | None, keep: int = 1, con: Console | None = None) -> None:
    """Print each table (None: skipped) on `con` (default: stdout), in blocks of columns
    when it is wider than the console (`fit_columns`)."""
    con = con or console()
    for table in tables:
        if table is not None:
            for part in fit_columns(table, con, keep):
                con.print(part)


def natural_width(table: Table, con: Console) -> int:
    """Columns the table takes when nothing has to wrap."""
    return con.measure(table, options=con.options.update_width(_UNBOUNDED)).maximum


def fit_columns(table: Table, con: Console, keep: int = 1) -> list[Table]:
    """`table` itself when it fits `con`; else blocks of its columns that each fit, every
    block led by the first `keep` columns (the row labels). A block holds at least one
    column besides those, so a column too wide on its own folds there (set its overflow)."""
    if natural_width(table, con) <= con.width or len(table.columns) <= keep + 1:
        return [table]
    head = list(range(keep))
    groups: list[list[int]] = [[]]
    for i in range(keep, len(table.columns)):
        wider = groups[-1] + [i]
        if groups[-1] and natural_width(_columns(table, head + wider), con) > con.width:
            groups.append([i])
        else:
            groups[-1] = wider
    parts = [_columns(table, head + g) for g in groups]
    for n, part in enumerate(parts):
        if n and isinstance(table.title, str):
            part.title = f"{table.title} (continued)"
        if n < len(parts) - 1:
            part.caption = None
    return parts


def _columns(table: Table, indexes: list[int]) -> Table:
    """A copy of `table` with only the columns at `indexes` (same rows and styles)."""
    part = copy.copy(table)
    part.columns = [
        replace(table.columns[i], _index=n, _cells=list(table.columns[i].cells))
        for n, i in enumerate(indexes)
    ]
    part.rows = list(table.rows)
    return part
