"""GitHub-flavoured Markdown tables: the one builder of every report, metadata and benchmark table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["md_cell", "md_table", "md_table_lines"]


def md_cell(value: Any) -> str:
    """Text safe inside a table cell: ``—`` for None or empty, ``|`` escaped, line breaks as spaces."""
    text = "—" if value is None or value == "" else str(value)
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def md_table_lines(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Header row, separator and one line per row (cells through ``md_cell``)."""
    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in rows]
    return lines


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """``md_table_lines`` joined with newlines."""
    return "\n".join(md_table_lines(headers, rows))
