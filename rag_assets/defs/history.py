"""The ``retrieval_history`` asset: the morning view across nights (``rag_assets.history``).

Not downstream of the blocking regression gate: a night that regressed must show up here.
"""

from datetime import UTC, datetime
from typing import Any

import dagster as dg

from rag_assets.defs.evaluation import load_evaluation
from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource
from rag_assets.history import (
    STORE_LABELS,
    TREND_PNG,
    HistoryError,
    NightRecord,
    night_of,
    store_night,
    summary,
    write_history,
)
from rag_assets.layout import STORES, AssetFiles
from rag_assets.metadata import chart_md, floats, inline_images
from rag_assets.timing import NIGHTLY_FRESHNESS


@dg.asset(
    group_name="reports",
    deps=["golden_evaluation_milvus", "golden_evaluation_pgvector"],
    kinds={"json", "markdown"},
    freshness_policy=NIGHTLY_FRESHNESS,
)
def retrieval_history(
    context: dg.AssetExecutionContext, rag: RagSettingsResource, evaluation: EvaluationConfigResource
) -> dg.MaterializeResult:
    """The morning view: per night and store (main Milvus, sidecar pgvector) recall@5, MRR,
    strong/medium/miss and p95 lookup latency, appended to ``history.jsonl`` in the reports dir;
    ``history.md`` shows the verdict, the nights, the cases changed since the previous night
    (newly missed, newly found, first-hit rank moved) and a 30-night trend chart.

    Fails when the main-store evaluation is missing or ``history.jsonl`` has a bad line (file and
    line named; the file is left as it is).
    """
    from rag_core.evaluation.fixtures import load_fixtures

    settings = rag.get_settings()
    main = load_evaluation(settings, "milvus")
    if main is None:
        raise dg.Failure("no main-store evaluation to add to the history: materialize golden_evaluation_milvus")
    data = AssetFiles.under(settings.data_dir)
    stores = {}
    for store in STORES:
        report = main if store == "milvus" else load_evaluation(settings, store)
        if report is None:
            continue
        fixtures = load_fixtures(data.fixtures_dir(store), [c.case_id for c in report.cases])
        stores[store] = store_night(report, fixtures)
    night = NightRecord(
        night=night_of(main),
        recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        run_id=context.run.run_id,
        stores=stores,
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
    metadata: dict[str, Any] = {
        "history": dg.MetadataValue.md(inline_images(md_path.read_text(encoding="utf-8"), md_path.parent)),
        "trend_chart": chart_md(reports_dir / TREND_PNG, "recall@5, MRR and p95 lookup latency per night"),
        "verdict": "; ".join(f"{STORE_LABELS.get(p, p)}: {v}" for p, v in facts["verdict"].items()),
        "night": night.night,
        "nights_recorded": len(nights),
        "newly_missed": len(changes["newly missed"]),
        "newly_found": len(changes["newly found"]),
        "rank_moved": len(changes["rank worse"]) + len(changes["rank better"]),
        "summary": dg.MetadataValue.json(facts),
        **floats(metrics),
        "markdown_path": dg.MetadataValue.path(str(md_path)),
        "history_path": dg.MetadataValue.path(str(reports_dir / "history.jsonl")),
    }
    for store, p in night.stores.items():
        metadata[f"{store}/strong_medium_miss"] = f"{p.strong}/{p.medium}/{p.miss}"
    return dg.MaterializeResult(metadata=metadata)
