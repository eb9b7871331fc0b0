"""The ``retrieval_history`` asset: the morning view across nights (``rag_assets.history``).

Not downstream of the blocking regression gate: a night that regressed must show up here.
"""

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from rag_assets.defs.evaluation import load_fixture_set
from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource
from rag_assets.history import (
    STORE_LABELS,
    TREND_NIGHTS,
    TREND_PNG,
    HistoryError,
    NightRecord,
    case_changes,
    case_outcome,
    night_of,
    store_night,
    summary,
    write_history,
)
from rag_assets.layout import STORES
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
    (newly missed, newly found, first-hit rank moved) and a 30-night trend chart.

    Fails when ``history.jsonl`` has a bad line (file and line named; the file is left as it is).
    """
    settings = rag.get_settings()
    reports = {"milvus": main, "pgvector": sidecar}
    stores = {store: store_night(reports[store], load_fixture_set(settings, store, reports[store])) for store in STORES}
    night = NightRecord(
        night=night_of(main),
        recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        run_id=context.run.run_id,
        stores=stores,
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    reports_dir = evaluation.files(settings).reports_dir
    try:
        nights, md_path = write_history(reports_dir, night)
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
        "nights_recorded": len(nights),
        "newly_missed": len(changes["newly missed"]),
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
                "night": n.night,
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
    """Cases changed since the previous night (regressions first): change, store, case, before, after."""
    changes = case_changes(nights[-2], nights[-1]) if len(nights) > 1 else []
    columns = [dg.TableColumn(name, "string") for name in ("change", "store", "case", "before", "after")]
    records = [
        dg.TableRecord(
            {
                "change": c.change,
                "store": STORE_LABELS.get(c.store, c.store),
                "case": c.case_id,
                "before": case_outcome(c.before),
                "after": case_outcome(c.after),
            }
        )
        for c in changes
    ]
    return dg.MetadataValue.table(records, schema=dg.TableSchema(columns=columns))


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
