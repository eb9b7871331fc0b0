"""Traces group: daily exports of the ``tool_invocation`` table to Parquet, and the day's
production signals (``production_signals``).

A partition is one UTC day; its file is ``<data_dir>/traces/tool_invocation/day=<key>/
part-0.parquet`` (hive layout, so ``pl.scan_parquet(".../tool_invocation/**/*.parquet")``
reads them all). Rows spooled locally while PostgreSQL was down are replayed first, so an
export holds every lookup of the day, the nightly evaluation's own lookups included.
"""

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource, TraceStoreResource
from rag_assets.layout import AssetFiles
from rag_assets.metadata import floats, md_table, table_schema
from rag_assets.timing import DAILY_PARTITIONS, NIGHTLY_FRESHNESS
from rag_core.evaluation.signals import SIGNALS, day_signals, drift, flag_lookups
from rag_core.fileio import write_text_atomic
from rag_core.lookup.trace_row import RetrievalDetails
from rag_core.traces.rows import PRODUCTION_ORIGINS, TraceRow

# The table's columns come from TraceRow's fields (text unless listed), with the details JSON as
# text last and the details the reports need flattened before it.
_ROW_COLUMNS = [name for name in TraceRow.model_fields if name != "retrieval_details"]
_NON_TEXT: dict[str, Any] = {"latency_ms": pl.Float64, "created_at": pl.Datetime("us", "UTC")}
_DETAIL_COLUMNS: dict[str, Any] = {
    "fallback_reason": pl.Utf8,
    "candidate_count": pl.Int64,
    "final_block_count": pl.Int64,
    "relevance_level": pl.Utf8,
}
TRACE_SCHEMA: dict[str, Any] = {
    **{name: _NON_TEXT.get(name, pl.Utf8) for name in _ROW_COLUMNS},
    **_DETAIL_COLUMNS,
    "retrieval_details": pl.Utf8,
}
TRACE_DESCRIPTIONS = {
    "retrieval_layer": "L1, L0+L1, L0 (fallback) or none",
    "latency_ms": "lookup wall time in milliseconds",
    "fallback_reason": "why attempt 2 or the L0 fallback ran (null: attempt 1 sufficed)",
    "retrieval_details": "the row's retrieval_details JSON, as text",
}

#: The table the agent service's lookups (and the nightly evaluation's) write; not built here.
tool_invocation = dg.AssetSpec(
    "tool_invocation",
    group_name="traces",
    kinds={"postgres"},
    description="PostgreSQL table with one row per lookup_knowledge call (agent service and "
    "the evaluation's fixture recording), written by rag_core's recorder.",
)


def trace_frame(rows: Sequence[TraceRow]) -> pl.DataFrame:
    """Trace rows as a frame of ``TRACE_SCHEMA`` (details flattened where reports need them)."""
    records = []
    for row in rows:
        details = row.retrieval_details or {}
        flat = RetrievalDetails.read(details).model_dump(mode="json", include=set(_DETAIL_COLUMNS))
        records.append(
            {
                **{name: getattr(row, name) for name in _ROW_COLUMNS},
                **flat,
                "retrieval_details": json.dumps(details, ensure_ascii=False),
            }
        )
    return pl.DataFrame(records, schema=TRACE_SCHEMA)


def trace_stats(frame: pl.DataFrame) -> dict[str, Any]:
    """Row count, retrieval-layer counts, fallback / L0-fallback / error rates (shares in
    [0, 1], None without rows) and latency p50/p95/p99 in milliseconds (None without rows)."""
    n = frame.height
    layers = Counter(frame["retrieval_layer"].fill_null("none").to_list())
    latency = frame["latency_ms"].drop_nulls()

    def share(mask: pl.Series) -> float | None:
        return float(mask.sum()) / n if n else None

    def pct(q: float) -> float | None:
        return float(latency.quantile(q, interpolation="linear")) if latency.len() else None

    return {
        "row_count": n,
        "layers": dict(sorted(layers.items())),
        "fallback_rate": share(frame["fallback_reason"].is_not_null()),
        "l0_fallback_rate": share(frame["retrieval_layer"] == "L0"),
        "error_rate": share(frame["status"] == "error"),
        "latency_p50_ms": pct(0.50),
        "latency_p95_ms": pct(0.95),
        "latency_p99_ms": pct(0.99),
    }


def replay_spool(settings, log) -> bool:
    """Push rows spooled while PostgreSQL was down into the trace table (best effort).

    Returns True when the spool was drained (or empty) within 30 s.
    """
    if not settings.trace_spool_path.exists():
        return True
    from rag_core.traces.recorder import ToolInvocationRecorder

    recorder = ToolInvocationRecorder.from_settings(settings)
    try:
        drained = recorder.flush(30.0)
    finally:
        recorder.close()
    if not drained:
        log.warning("trace spool %s not fully replayed; rows may be missing", settings.trace_spool_path)
    return drained


@dg.asset(
    group_name="traces",
    partitions_def=DAILY_PARTITIONS,
    deps=[tool_invocation],
    kinds={"polars", "parquet"},
    freshness_policy=NIGHTLY_FRESHNESS,
)
def trace_tables(
    context: dg.AssetExecutionContext, rag: RagSettingsResource, traces: TraceStoreResource
) -> dg.Output[pl.DataFrame]:
    """The ``tool_invocation`` rows of one UTC day as a frame (the IO manager writes it as
    Parquet at ``day=<key>/part-0.parquet``), with row count, retrieval-layer
    distribution, fallback rate and latency percentiles (ms) in metadata.

    Fails (StoreError) when the trace store is unreachable: an empty export would claim a day
    without lookups. Re-materializing a partition rewrites its file.
    """
    settings = rag.get_settings()
    window = context.partition_time_window
    with traces.open() as store:  # fails fast when PostgreSQL is down, before any replay wait
        replayed = replay_spool(settings, context.log)
        rows = store.rows_between(window.start, window.end)
    frame = trace_frame(rows)
    path = AssetFiles.under(settings.data_dir).trace_parquet(context.partition_key)
    stats = trace_stats(frame)
    layer_rows = [[layer, count, f"{count / frame.height:.1%}"] for layer, count in stats["layers"].items()]
    return dg.Output(
        frame,
        metadata={
            "dagster/row_count": stats["row_count"],
            "dagster/column_schema": table_schema(frame, TRACE_DESCRIPTIONS),
            "retrieval_layers": dg.MetadataValue.md(md_table(["layer", "rows", "share"], layer_rows)),
            "retrieval_layer_counts": dg.MetadataValue.json(stats["layers"]),
            **floats(
                {
                    k: stats[k]
                    for k in (
                        "fallback_rate",
                        "l0_fallback_rate",
                        "error_rate",
                        "latency_p50_ms",
                        "latency_p95_ms",
                        "latency_p99_ms",
                    )
                }
            ),
            "window": f"[{window.start.isoformat()}, {window.end.isoformat()})",
            "spool_replayed": replayed,
            "path": dg.MetadataValue.path(str(path)),
        },
    )


def frame_rows(frame: pl.DataFrame) -> list[TraceRow]:
    """The ``TraceRow`` s of a ``trace_tables`` frame (its details JSON text parsed back)."""
    rows = []
    for record in frame.select(*_ROW_COLUMNS, "retrieval_details").iter_rows(named=True):
        text = record["retrieval_details"]
        rows.append(TraceRow.from_stored({**record, "retrieval_details": json.loads(text) if text else None}))
    return rows


@dg.asset(
    group_name="traces",
    partitions_def=DAILY_PARTITIONS,
    kinds={"json", "markdown"},
    freshness_policy=NIGHTLY_FRESHNESS,
)
def production_signals(
    context: dg.AssetExecutionContext,
    rag: RagSettingsResource,
    evaluation: EvaluationConfigResource,
    trace_tables: pl.DataFrame,
) -> dg.MaterializeResult:
    """How production lookups went on one UTC day, per origin (the nightly evaluation's own
    lookups left out): lookups and the shares of each signal of ``rag_core.evaluation.signals``
    (weak, L0 fallback, degraded, retried, truncated, slow, re-asked, store disagreement), each
    beside its trend over the last nights and a drift flag against the trailing weeks.

    Writes ``<reports>/signals/<day>.json`` (the trend's source; re-materializing a day rewrites
    it) and ``<day>.md`` (shown in the morning view); headline figures of all production origins
    as metadata values, detail in Markdown.
    """
    settings = rag.get_settings()
    day = context.partition_key
    flagged = flag_lookups(frame_rows(trace_tables), settings.trace_slow_ms, settings.trace_reask_window_s)
    figures = day_signals(flagged)
    signals_dir = evaluation.files(settings).signals_dir
    trailing = _earlier_figures(signals_dir, day)
    drifts = {o: drift(f, [n[o] for n in trailing if o in n]) for o, f in figures.items()}
    path = write_text_atomic(signals_dir / f"{day}.json", json.dumps({"day": day, "figures": figures}, indent=2))
    markdown = signals_markdown(day, figures, trailing, drifts, settings.trace_slow_ms)
    write_text_atomic(signals_dir / f"{day}.md", markdown)  # the morning view shows the latest
    headline = figures.get("production", {})
    evaluation_rows = sum(1 for f in flagged if f.origin not in PRODUCTION_ORIGINS)
    return dg.MaterializeResult(
        metadata={
            "production_lookups": int(headline.get("lookups", 0)),
            "evaluation_lookups_left_out": evaluation_rows,
            **floats({f"{s}_share": float(headline[s]) for s in SIGNALS if s in headline}),
            "drift": "; ".join(f"{o}: {s} {d}" for o, ds in drifts.items() for s, d in ds.items()) or "none",
            "lookups_per_origin": dg.MetadataValue.json({o: f["lookups"] for o, f in figures.items()}),
            "signals": dg.MetadataValue.md(markdown),
            "path": dg.MetadataValue.path(str(path)),
        }
    )


def _earlier_figures(signals_dir: Path, day: str) -> list[dict[str, Any]]:
    """The figures of the days before ``day`` that have a signals file, oldest first."""
    out = []
    for path in sorted(signals_dir.glob("*.json")):
        if path.stem < day:
            try:
                out.append(json.loads(path.read_text(encoding="utf-8"))["figures"])
            except (OSError, ValueError, KeyError) as exc:
                raise dg.Failure(f"{path}: unreadable production signals ({exc}); delete or fix the file") from None
    return out


def signals_markdown(
    day: str,
    figures: dict[str, dict[str, Any]],
    trailing: list[dict[str, Any]],
    drifts: dict[str, dict[str, str]],
    slow_ms: float,
) -> str:
    """The day's production signals as Markdown: one table per origin, each signal's share, the
    last 7 nights before it (oldest first) and its drift flag."""
    parts = [f"# Production signals {day}", "", f"Production lookups only; slow SLO {slow_ms:g} ms."]
    if not figures:
        parts.append("\nNo production lookups this day.")
    for origin, f in figures.items():
        history = [n[origin] for n in trailing if origin in n][-7:]
        rows = [
            [
                signal,
                f"{f[signal]:.1%}",
                " ".join(f"{n.get(signal, 0.0):.0%}" for n in history) or "-",
                drifts[origin].get(signal, ""),
            ]
            for signal in SIGNALS
        ]
        parts += [
            "",
            f"## {origin}: {f['lookups']} lookups",
            "",
            md_table(["signal", "share", "last nights", "drift"], rows),
        ]
    return "\n".join(parts) + "\n"
