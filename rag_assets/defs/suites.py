"""Suites group: one asset per golden suite of ``golden/suites.yaml`` (case file + its corpus).

Each asset ingests its suite's corpus into the suite's own index, records fixtures on both
stores, evaluates them (with L0 filter cost accounting) and gates the main store against the
suite's stored baseline. Reports go to ``<reports_dir>/suites/<suite>/``. A suite whose files
are missing (``../shared`` not mounted) materializes with ``status=skipped`` and the reason.
"""

import logging
from pathlib import Path
from typing import Any

import dagster as dg

from rag_assets.defs.resources import EmbedderResource, EvaluationConfigResource, RagSettingsResource
from rag_assets.metadata import floats, md_table
from rag_core.evaluation.evaluator import EvaluationReport
from rag_core.evaluation.suites import GoldenSuite, SuiteFileError, load_suites

log = logging.getLogger(__name__)


def _store_metadata(store: str, report: EvaluationReport) -> dict[str, Any]:
    s = report.summary
    values = {f"{store}/recall@{k}": v for k, v in s.recall_at_k.items()}
    values.update({f"{store}/mrr": s.mrr, f"{store}/ndcg@10": s.ndcg_at_10})
    return {
        f"{store}/status": report.store_status.status,
        f"{store}/strong_medium_miss": f"{s.strong}/{s.medium}/{s.miss}",
        **floats({k: None if v is None else round(v, 4) for k, v in values.items()}),
    }


def _filter_cost_md(report: EvaluationReport) -> str:
    cost = report.filter_cost
    rows = [] if cost is None else [[effect, n] for effect, n in cost.counts.items()]
    hurt = [c.case_id for c in report.cases if c.filter_outcome and c.filter_outcome.effect == "hurt"]
    return md_table(["L0 filter effect", "cases"], rows) + (f"\n\nHurt: {', '.join(hurt)}" if hurt else "")


def _suite_asset(suite: GoldenSuite) -> dg.AssetsDefinition:
    @dg.asset(
        name=f"golden_suite_{suite.slug}",
        group_name="suites",
        kinds={"json"},
        tags={"rag/suite": suite.name},
        description=f"Golden suite `{suite.name}`: {suite.description or suite.cases.name}. "
        "Ingests its corpus into its own index, records both stores, evaluates, "
        "gates the main store against its stored baseline.",
    )
    def _asset(
        context: dg.AssetExecutionContext,
        rag: RagSettingsResource,
        embedder: EmbedderResource,
        evaluation: EvaluationConfigResource,
    ) -> dg.MaterializeResult:
        from rag_core.recording.suites import run_suite

        settings = rag.get_settings()
        out_dir = evaluation.files(settings).reports_dir / "suites"
        outcome = run_suite(settings, suite, embedder.get(), out_dir, with_sidecar=settings.sidecar_enabled)
        if outcome.status == "failed":
            raise dg.Failure(description=f"suite {suite.name} failed: {outcome.reason}")
        metadata: dict[str, Any] = {"status": outcome.status, "reason": outcome.reason or ""}
        if outcome.status == "skipped":
            context.log.warning("suite %s skipped: %s", suite.name, outcome.reason)
            return dg.MaterializeResult(metadata=metadata)
        for store, report in outcome.reports.items():
            metadata.update(_store_metadata(store, report))
        metadata["filter_cost"] = dg.MetadataValue.md(_filter_cost_md(outcome.reports["milvus"]))
        if outcome.gate is not None:
            metadata["gate"] = "pass" if outcome.gate.passed else "FAIL: " + "; ".join(outcome.gate.reasons)
            metadata["gate_report"] = dg.MetadataValue.md(outcome.gate.to_markdown())
        if outcome.current_files is not None:
            metadata["report"] = dg.MetadataValue.path(str(outcome.current_files.markdown_path))
        if outcome.gaps_file is not None:
            metadata["knowledge_gaps"] = dg.MetadataValue.md(Path(outcome.gaps_file).read_text(encoding="utf-8"))
        return dg.MaterializeResult(metadata=metadata)

    return _asset


def _suite_assets() -> list[dg.AssetsDefinition]:
    try:
        return [_suite_asset(s) for s in load_suites()]
    except SuiteFileError as exc:  # the rest of the code location must still load
        log.warning("no golden suite assets: %s", exc)
        return []


suite_assets = _suite_assets()
