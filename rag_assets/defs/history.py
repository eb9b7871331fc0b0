"""The ``retrieval_history`` asset: the morning view across nights (``rag_assets.history``).

Not downstream of the blocking regression gate: a night that regressed must show up here.
"""

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl

from rag_assets.defs.checks import NotCompared, gate_against_baseline
from rag_assets.defs.evaluation import load_fixture_set
from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource
from rag_assets.history import (
    STORE_LABELS,
    TREND_NIGHTS,
    TREND_PNG,
    HistoryError,
    NightRecord,
    case_changes,
    document_changes,
    document_fingerprints,
    grouped_changes,
    night_of,
    outcomes,
    previous_of,
    store_night,
    stores_named,
    summary,
    why,
    write_history,
)
from rag_assets.layout import STORES, AssetFiles
from rag_assets.metadata import chart_md, floats, inline_images
from rag_assets.timing import NIGHTLY_FRESHNESS
from rag_core.evaluation.evaluator import EvaluationReport


@dg.asset(
    group_name="reports",
    ins={"main": dg.AssetIn("golden_evaluation_milvus"), "sidecar": dg.AssetIn("golden_evaluation_pgvector")},
    kinds={"json", "markdown"},
    freshness_policy=NIGHTLY_FRESHNESS,
)
def retrieval_history(
    context: dg.AssetExecutionContext,
    rag: RagSettingsResource,
    evaluation: EvaluationConfigResource,
    main: EvaluationReport,
    sidecar: EvaluationReport,
) -> dg.MaterializeResult:
    """The morning view: per night and store (main Milvus, sidecar pgvector) recall@5, MRR,
    strong/medium/miss and p95 lookup latency, appended to ``history.jsonl`` in the reports dir;
    ``history.md`` shows the verdict, the nights, the cases changed since the previous night
    (newly missed, strong to medium, newly found, first-hit rank moved; each case once with its
    stores) and a 30-night trend chart.

    A run of the nightly job records the night of its partition (a re-run replaces it); any other
    run (``make run``, a click in the UI) is recorded apart as a daytime run and never replaces
    a night. Fails when ``history.jsonl`` has a bad line (file and line named; the file is left
    as it is).
    """
    settings = rag.get_settings()
    partition = context.run.tags.get("dagster/partition")
    reports = {"milvus": main, "pgvector": sidecar}
    stores = {store: store_night(reports[store], load_fixture_set(settings, store, reports[store])) for store in STORES}
    night = NightRecord(
        # Keyed by the partition the nightly run evaluates; any other run is a daytime record.
        night=partition or night_of(main),
        kind="nightly" if partition else "daytime",
        recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        run_id=context.run.run_id,
        stores=stores,
        load_average=[round(x, 2) for x in os.getloadavg()],
        documents=_documents(AssetFiles.under(settings.data_dir).chunks_parquet),
        **_gate(evaluation, main),
    )
    reports_dir = evaluation.files(settings).reports_dir
    try:
        nights, md_path = write_history(reports_dir, night, _appendix(reports_dir))
    except HistoryError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    facts = summary(nights)
    metrics: dict[str, float | None] = {}
    for store, p in night.stores.items():
        metrics.update(
            {f"{store}/recall@5": p.recall_at_5, f"{store}/mrr": p.mrr, f"{store}/latency_p95_ms": p.latency_p95_ms}
        )
    changes: dict[str, list[str]] = facts["changes"]
    # What the page shows first (numbers and tables, not behind "Show Markdown"); then detail.
    metadata: dict[str, Any] = {
        "verdict": "; ".join(f"{STORE_LABELS.get(p, p)}: {v}" for p, v in facts["verdict"].items()),
        **floats(metrics),
        "night": night.night,
        "load_average": ", ".join(f"{x:.2f}" for x in night.load_average or []),
        "gate": night.gate or "unknown",
        "publishing_blocked": night.publishing_blocked,
        "nights_recorded": len(nights),
        "newly_missed": len(changes["newly missed"]),
        "strong_to_medium": len(changes["strong to medium"]),
        "newly_found": len(changes["newly found"]),
        "rank_moved": len(changes["rank worse"]) + len(changes["rank better"]),
        "nights": nights_table(nights),
        "changed_cases": changes_table(nights),
    }
    for store, p in night.stores.items():
        metadata[f"{store}/strong_medium_miss"] = f"{p.strong}/{p.medium}/{p.miss}"
    metadata |= {
        "trend_chart": chart_md(reports_dir / TREND_PNG, "recall@5, MRR and p95 lookup latency per night"),
        "history": dg.MetadataValue.md(inline_images(md_path.read_text(encoding="utf-8"), md_path.parent)),
        "summary": dg.MetadataValue.json(facts),
        "markdown_path": dg.MetadataValue.path(str(md_path)),
        "history_path": dg.MetadataValue.path(str(reports_dir / "history.jsonl")),
    }
    return dg.MaterializeResult(metadata=metadata)


_NIGHT_COLUMNS = [
    dg.TableColumn("night", "string"),
    dg.TableColumn("store", "string"),
    dg.TableColumn("recall@5", "float"),
    dg.TableColumn("MRR", "float"),
    dg.TableColumn("p95 lookup ms", "float"),
    dg.TableColumn("strong", "int"),
    dg.TableColumn("medium", "int"),
    dg.TableColumn("miss", "int"),
    dg.TableColumn("status", "string"),
]


def nights_table(nights: Sequence[NightRecord]) -> dg.TableMetadataValue:
    """The last ``TREND_NIGHTS`` nights (newest first), one row per store; rates in [0, 1]."""
    records = [
        dg.TableRecord(
            {
                "night": n.label,
                "store": STORE_LABELS.get(store, store),
                "recall@5": _rounded(p.recall_at_5),
                "MRR": _rounded(p.mrr),
                "p95 lookup ms": _rounded(p.latency_p95_ms, 1),
                "strong": p.strong,
                "medium": p.medium,
                "miss": p.miss,
                "status": p.status,
            }
        )
        for n in reversed(nights[-TREND_NIGHTS:])
        for store, p in n.stores.items()
    ]
    return dg.MetadataValue.table(records, schema=dg.TableSchema(columns=_NIGHT_COLUMNS))


def changes_table(nights: Sequence[NightRecord]) -> dg.TableMetadataValue:
    """Cases changed since the previous night (regressions first), each once with its stores:
    change, case, query, stores, before, after, why."""
    previous = previous_of(nights)
    changes = case_changes(previous, nights[-1]) if previous else []
    documents = document_changes(previous, nights[-1]) if previous else {}
    names = ("change", "case", "query", "stores", "before", "after", "why")
    columns = [dg.TableColumn(name, "string") for name in names]
    records = [
        dg.TableRecord(
            {
                "change": change,
                "case": case_id,
                "query": group[0].after.query,
                "stores": stores_named(group),
                "before": outcomes(group, "before"),
                "after": outcomes(group, "after"),
                "why": "; ".join(dict.fromkeys(why(c, documents) for c in group)),
            }
        )
        for change, case_id, group in grouped_changes(changes)
    ]
    return dg.MetadataValue.table(records, schema=dg.TableSchema(columns=columns))


def _appendix(reports_dir: Path) -> list[str]:
    """Beside the golden trend: the latest day's production signals (``production_signals``)
    and the production suite's knowledge-gap report, when they exist."""
    latest_signals = sorted((reports_dir / "signals").glob("*.md"))[-1:]
    gaps = reports_dir / "suites" / "production" / "knowledge-gaps.md"
    return [p.read_text(encoding="utf-8") for p in [*latest_signals, gaps] if p.is_file()]


def _gate(evaluation: EvaluationConfigResource, main: EvaluationReport) -> dict[str, Any]:
    """The night's ``gate`` and ``publishing_blocked``: the blocking check's verdict, computed alike."""
    result = gate_against_baseline(evaluation, main)
    if isinstance(result, NotCompared):
        return {"gate": f"not compared: {result.reason}", "publishing_blocked": not result.passed}
    verdict = "PASS" if result.passed else "FAIL: " + "; ".join(result.reasons)
    return {"gate": verdict, "publishing_blocked": not result.passed}


def _documents(chunks_parquet: Path) -> dict[str, str]:
    """The indexed documents' fingerprints from the ``chunks`` table ({} before the first ingest)."""
    if not chunks_parquet.exists():
        return {}
    frame = pl.read_parquet(chunks_parquet, columns=["doc_id", "content_hash"])
    return document_fingerprints(frame.iter_rows())


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
