"""GitHub-flavoured Markdown tables: the one builder of every report, metadata and benchmark table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rag_core.text import escape_controls

__all__ = ["md_cell", "md_table", "md_table_lines"]


def md_cell(value: Any) -> str:
    """Text safe inside a table cell: ``—`` for None or empty, ``|`` escaped, control characters
    written out (``\\n``, ``\\x1b``: ``rag_core.text.escape_controls``), so a doc id or a query
    cannot break the row or reach a terminal that shows the report raw."""
    text = "—" if value is None or value == "" else str(value)
    return escape_controls(text).replace("|", "\\|")


def md_table_lines(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Header row, separator and one line per row (cells through ``md_cell``)."""
    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in rows]
    return lines


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """``md_table_lines`` joined with newlines."""
    return "\n".join(md_table_lines(headers, rows))
