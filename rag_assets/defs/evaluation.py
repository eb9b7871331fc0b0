"""Evaluation group: golden cases, recorded retrieval fixtures per store, golden evaluation per store.

Fixtures are recorded with the real lookup pipeline (``record_fixtures``; its lookups are traced
into ``tool_invocation`` like any agent call) and written under ``<data_dir>/fixtures/<store>``;
the fixtures asset's value is the directory's ``FixtureManifest``. The evaluation takes the
cases and the manifest as inputs, reads the fixtures only, and returns its ``EvaluationReport``
(the IO manager keeps it as JSON under ``<data_dir>/evaluation``). An unavailable sidecar yields
not_run cases, never a failed step.
"""

import hashlib
from collections import Counter
from pathlib import Path

import dagster as dg

from rag_assets.defs.index import MAIN_STORE_FIRST
from rag_assets.defs.resources import (
    EmbedderResource,
    EvaluationConfigResource,
    MilvusStoreResource,
    PgVectorStoreResource,
    RagSettingsResource,
)
from rag_assets.layout import AssetFiles
from rag_assets.metadata import floats, md_table
from rag_assets.timing import NIGHTLY_FRESHNESS
from rag_core.evaluation.cases import CaseFileError, GoldenCase, load_cases
from rag_core.evaluation.evaluator import EvaluationReport
from rag_core.evaluation.fixtures import FixtureManifest, StoreStatus
from rag_core.fileio import portable_path
from rag_core.settings import RagSettings


@dg.asset(group_name="evaluation", kinds={"yaml"})
def golden_cases(rag: RagSettingsResource) -> dg.Output[list[GoldenCase]]:
    """The validated golden cases (id, scenario, query, expected docs/keywords/breadcrumbs).

    Fails (dg.Failure naming the file and every problem) when the case file is unusable.
    """
    path = rag.get_settings().golden_cases
    try:
        cases = load_cases(path)
    except CaseFileError as exc:
        raise dg.Failure(description=str(exc), metadata={"cases_file": str(path)}, allow_retries=False) from None
    scenarios = Counter(c.scenario for c in cases)
    return dg.Output(
        cases,
        metadata={
            "dagster/row_count": len(cases),
            "case_count": len(cases),
            "scenarios": dg.MetadataValue.md(md_table(["scenario", "cases"], sorted(scenarios.items()))),
            "cases_file": dg.MetadataValue.path(str(Path(path).resolve())),
            "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
        },
    )


# --- fixtures --------------------------------------------------------------------------------


def _fixture_metadata(manifest: FixtureManifest, out_dir: Path) -> dict:
    """Metadata of a fixtures asset: store status and reason, fixture and case counts, corpus
    hash (16 hex digits), model, recording session, the fixtures directory."""
    return {
        "status": manifest.store_status.status,
        "reason": manifest.store_status.reason or "",
        "fixture_count": sum(1 for p in out_dir.glob("*.json") if p.name != "manifest.json"),
        "case_count": manifest.case_count or 0,
        "corpus_hash": (manifest.corpus_hash or "")[:16],
        "model_id": manifest.model_id or "",
        "session": (manifest.model_extra or {}).get("session") or "",
        "fixtures_dir": dg.MetadataValue.path(str(out_dir)),
    }


def _record(store: str, settings: RagSettings, embedder) -> tuple[FixtureManifest, dict]:
    """Record ``store``'s fixtures; the manifest written and the asset metadata."""
    from rag_core.recording.record import record_fixtures

    out_dir = AssetFiles.under(settings.data_dir).fixtures_dir(store)
    manifest = record_fixtures(
        settings,
        store,  # type: ignore[arg-type]
        settings.golden_cases,
        out_dir,
        embedder=embedder,
        progress=False,
    )
    return manifest, _fixture_metadata(manifest, out_dir)


@dg.asset(group_name="evaluation", deps=["milvus_collection", "golden_cases"], kinds={"json"}, op_tags=MAIN_STORE_FIRST)
def retrieval_fixtures_milvus(
    context: dg.AssetExecutionContext, rag: RagSettingsResource, embedder: EmbedderResource, milvus: MilvusStoreResource
) -> dg.Output[FixtureManifest]:
    """Candidates and evidence blocks of every golden case on the Milvus main store (one JSON each).

    Fails when Milvus cannot be opened: a main-store evaluation of nothing must not be reported
    or published (the manifest with the reason is still written).
    """
    with milvus.lock(context.log):
        manifest, metadata = _record("milvus", rag.get_settings(), embedder.get())
    if not manifest.store_status.available:
        reason = manifest.store_status.reason
        raise dg.Failure(description=f"main store (Milvus) unavailable: {reason}", metadata=metadata)
    return dg.Output(manifest, metadata=metadata)


@dg.asset(group_name="evaluation", deps=["pgvector_table", "golden_cases"], kinds={"json"})
def retrieval_fixtures_pgvector(
    context: dg.AssetExecutionContext,
    rag: RagSettingsResource,
    embedder: EmbedderResource,
    pgvector: PgVectorStoreResource,
) -> dg.Output[FixtureManifest]:
    """Fixtures of every golden case on the pgvector sidecar; a manifest saying ``unavailable``
    (with the reason) when the sidecar is disabled or cannot be opened."""
    from rag_core.evaluation.fixtures import write_manifest

    settings = rag.get_settings()
    if not settings.sidecar_enabled:
        out_dir = AssetFiles.under(settings.data_dir).fixtures_dir("pgvector")
        for old in out_dir.glob("*.json"):
            old.unlink()
        disabled = StoreStatus(status="unavailable", reason="sidecar disabled (RAG_SIDECAR_ENABLED=false)")
        manifest = FixtureManifest(
            store="pgvector", cases_file=portable_path(settings.golden_cases), store_status=disabled
        )
        written = write_manifest(out_dir, manifest)
        return dg.Output(written, metadata=_fixture_metadata(written, out_dir))
    with pgvector.lock(context.log):
        manifest, metadata = _record("pgvector", settings, embedder.get())
    if not manifest.store_status.available:
        context.log.warning("pgvector sidecar unavailable: %s", manifest.store_status.reason)
    return dg.Output(manifest, metadata=metadata)


# --- evaluation ------------------------------------------------------------------------------


def metric_values(report: EvaluationReport) -> dict[str, float | None]:
    """The headline numbers of a report: recall@K per K, MRR, nDCG@10, average first-hit rank."""
    s = report.summary
    values: dict[str, float | None] = {f"recall@{k}": v for k, v in s.recall_at_k.items()}
    values.update({"mrr": s.mrr, "ndcg@10": s.ndcg_at_10, "avg_first_hit_rank": s.avg_first_hit_rank})
    return values


def evaluation_metadata(report: EvaluationReport, json_path: Path) -> dict:
    """Metadata of one store's evaluation: status, hit-level counts, metrics, per-scenario table."""
    s = report.summary
    scenario_rows = [
        [
            name,
            m.case_count,
            m.strong,
            m.medium,
            m.miss,
            m.not_run,
            "n/a" if m.recall_at_k.get(5) is None else f"{m.recall_at_k[5]:.3f}",
            "n/a" if m.mrr is None else f"{m.mrr:.3f}",
        ]
        for name, m in report.by_scenario.items()
    ]
    return {
        "status": report.store_status.status,
        "reason": report.store_status.reason or "",
        "case_count": s.case_count,
        "run_count": s.run_count,
        "strong": s.strong,
        "medium": s.medium,
        "miss": s.miss,
        "not_run": s.not_run,
        **floats(metric_values(report)),
        "by_scenario": dg.MetadataValue.md(
            md_table(["scenario", "cases", "strong", "medium", "miss", "not run", "recall@5", "MRR"], scenario_rows)
        ),
        "json_path": dg.MetadataValue.path(str(json_path)),
    }


def evaluate_store(
    store: str, cases: list[GoldenCase], settings: RagSettings, config: EvaluationConfigResource
) -> EvaluationReport:
    """Evaluate ``store``'s recorded fixtures (``<data_dir>/fixtures/<store>``) on ``cases``."""
    from rag_core.evaluation.evaluator import evaluate
    from rag_core.evaluation.fixtures import load_fixtures

    fixtures = load_fixtures(AssetFiles.under(settings.data_dir).fixtures_dir(store), [c.id for c in cases])
    return evaluate(cases, fixtures, ks=config.ks, strong_k=config.strong_k)


def load_fixture_set(settings: RagSettings, store: str, report: EvaluationReport):  # -> FixtureSet
    """The recorded fixtures of ``store`` for the cases of ``report`` (latencies, candidates)."""
    from rag_core.evaluation.fixtures import load_fixtures

    return load_fixtures(AssetFiles.under(settings.data_dir).fixtures_dir(store), [c.case_id for c in report.cases])


def _evaluation_asset(store: str):
    @dg.asset(
        name=f"golden_evaluation_{store}",
        group_name="evaluation",
        ins={"fixtures": dg.AssetIn(f"retrieval_fixtures_{store}")},
        kinds={"json"},
        freshness_policy=NIGHTLY_FRESHNESS,
        description=f"Golden evaluation of the {store} store: strong/medium/miss/not_run per "
        "case, recall@K, MRR, nDCG@10, by scenario (JSON in <data_dir>/evaluation).",
    )
    def _asset(
        context: dg.AssetExecutionContext,
        rag: RagSettingsResource,
        evaluation: EvaluationConfigResource,
        golden_cases: list[GoldenCase],
        fixtures: FixtureManifest,
    ) -> dg.Output[EvaluationReport]:
        settings = rag.get_settings()
        report = evaluate_store(store, golden_cases, settings, evaluation)
        for warning in report.warnings:
            context.log.warning(warning)
        json_path = AssetFiles.under(settings.data_dir).evaluation_json(store)
        return dg.Output(report, metadata=evaluation_metadata(report, json_path))

    return _asset


golden_evaluation_milvus = _evaluation_asset("milvus")
golden_evaluation_pgvector = _evaluation_asset("pgvector")


def summary_json(report: EvaluationReport) -> dict:
    """The compact JSON shown in the UI: status, manifest, summary, by-scenario summaries."""
    return report.model_dump(
        mode="json", include={"store", "store_status", "manifest", "ks", "strong_k", "summary", "by_scenario"}
    )
