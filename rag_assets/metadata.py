"""Small builders of Dagster metadata (tables, schemas, metric numbers) shared by the assets."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from rag_core.markdown import md_cell, md_table
from rag_core.models import DocumentIssue

__all__ = ["issues_table", "md_cell", "md_table"]

_POLARS_TYPES = {pl.Utf8: "string", pl.Int64: "int", pl.Int32: "int", pl.Float64: "float", pl.Boolean: "bool"}


def issues_table(issues: Sequence[DocumentIssue]) -> dg.TableMetadataValue:
    """Skipped documents as a table: path, line (0 = unknown), reason."""
    schema = dg.TableSchema(
        columns=[dg.TableColumn("path", "string"), dg.TableColumn("line", "int"), dg.TableColumn("reason", "string")]
    )
    records = [dg.TableRecord({"path": i.path, "line": i.line or 0, "reason": i.reason}) for i in issues]
    return dg.MetadataValue.table(records, schema=schema)


def table_schema(frame: pl.DataFrame, descriptions: Mapping[str, str] | None = None) -> dg.TableSchema:
    """The ``dagster/column_schema`` of a polars frame (type names: string, int, float, ...)."""
    descriptions = descriptions or {}
    columns = []
    for name, dtype in frame.schema.items():
        kind = _POLARS_TYPES.get(dtype, "datetime" if dtype.is_temporal() else str(dtype).lower())
        columns.append(dg.TableColumn(name, kind, description=descriptions.get(name)))
    return dg.TableSchema(columns=columns)


#: Decimal places kept in float metadata: 0.8, not 0.7999999999999998.
FLOAT_DIGITS = 4
_IMAGE_REF = re.compile(r"!\[([^\]]*)\]\(([^)\s:]+\.png)\)")


def floats(values: Mapping[str, float | None]) -> dict[str, dg.MetadataValue]:
    """Numeric metadata the UI plots over time, rounded to ``FLOAT_DIGITS``; ``None`` left out."""
    return {k: dg.MetadataValue.float(round(float(v), FLOAT_DIGITS)) for k, v in values.items() if v is not None}


def rounded(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, numbers) with every float rounded to ``FLOAT_DIGITS``."""
    if isinstance(value, float):
        return round(value, FLOAT_DIGITS)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def png_data_uri(path: Path) -> str:
    """``data:image/png;base64,...`` of a PNG file (OSError when unreadable)."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def inline_images(markdown: str, base_dir: Path) -> str:
    """``markdown`` with each relative ``![alt](name.png)`` whose file is in ``base_dir``
    replaced by a data URI: the Dagster UI cannot resolve a path relative to a report file,
    but its Markdown renderer displays ``data:`` images. Missing files are left as they are."""

    def embed(match: re.Match[str]) -> str:
        file = base_dir / match.group(2)
        return f"![{match.group(1)}]({png_data_uri(file)})" if file.is_file() else match.group(0)

    return _IMAGE_REF.sub(embed, markdown)


def chart_md(png: Path, alt: str) -> dg.MetadataValue:
    """A Markdown metadata value showing the PNG ``png`` inline (a data URI)."""
    return dg.MetadataValue.md(f"![{alt}]({png_data_uri(png)})")
