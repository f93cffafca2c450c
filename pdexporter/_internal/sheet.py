"""What a command shows, as data: the library's jobs build these (pure), the CLI prints them
(`pdexporter.cli._common.show`), so no package below the CLI imports a terminal library.

- `Sheet`: a table (title, columns, rows of strings, caption); cells may hold rich markup.
- `Plain`: a line printed as it is (no highlighting, never wrapped by the console).
- any other `str`: a line printed with the console's defaults (markup, highlighting, wrapping)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Column", "Justify", "Plain", "Sheet", "Shown", "columns", "pct",
]


Justify = Literal["left", "right", "center"]


@dataclass(frozen=True)
class Column:
    header: str
    justify: Justify = "left"
    fold: bool = False  # long cells fold onto the next line instead of being cut
    no_wrap: bool = False


@dataclass
class Sheet:
    title: str
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    caption: str | None = None
    style: str = "plain"  # plain | compact (a header rule, no frame) | left (title on the left)

    def add_row(self, *cells: str) -> None:
        self.rows.append(list(cells))


class Plain(str):
    """A line printed as it is: no highlighting, not wrapped."""


Shown = Sheet | str


def columns(*headers: str, justify: Justify = "left", first: Justify | None = None) -> list[Column]:
    """Columns with one justification (`first`: the first column's, when it differs)."""
    return [Column(h, first if i == 0 and first is not None else justify) for i, h in enumerate(headers)]


def pct(x: float | None) -> str:
    """A percentage figure as the tables write it: `12.3 %`, `-` where there is none."""
    return "-" if x is None else f"{x:.1f} %"
