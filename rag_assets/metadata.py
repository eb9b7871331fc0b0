"""Small builders of Dagster metadata (tables, schemas, metric numbers) shared by the assets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg
import polars as pl

from rag_core.models import DocumentIssue

_POLARS_TYPES = {pl.Utf8: "string", pl.Int64: "int", pl.Int32: "int", pl.Float64: "float",
                 pl.Boolean: "bool"}


def md_cell(value: Any) -> str:
    """Text safe inside a Markdown table cell (``—`` for empty)."""
    text = "—" if value is None or value == "" else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def issues_table(issues: Sequence[DocumentIssue]) -> dg.TableMetadataValue:
    """Skipped documents as a table: path, line (0 = unknown), reason."""
    schema = dg.TableSchema(columns=[dg.TableColumn("path", "string"),
                                     dg.TableColumn("line", "int"),
                                     dg.TableColumn("reason", "string")])
    records = [dg.TableRecord({"path": i.path, "line": i.line or 0, "reason": i.reason})
               for i in issues]
    return dg.MetadataValue.table(records, schema=schema)


def table_schema(frame: pl.DataFrame, descriptions: Mapping[str, str] | None = None) -> dg.TableSchema:
    """The ``dagster/column_schema`` of a polars frame (type names: string, int, float, ...)."""
    descriptions = descriptions or {}
    columns = []
    for name, dtype in frame.schema.items():
        kind = _POLARS_TYPES.get(dtype, "datetime" if dtype.is_temporal() else str(dtype).lower())
        columns.append(dg.TableColumn(name, kind, description=descriptions.get(name)))
    return dg.TableSchema(columns=columns)


def floats(values: Mapping[str, float | None]) -> dict[str, dg.MetadataValue]:
    """Numeric metadata the UI plots over time; ``None`` values are left out."""
    return {k: dg.MetadataValue.float(float(v)) for k, v in values.items() if v is not None}
