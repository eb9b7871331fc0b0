"""Reports group: the main store's baseline report, the main-vs-sidecar comparison, publishing.

Reports are JSON + Markdown (+ a recall@K chart) in the reports dir (``<data_dir>/reports`` by
default): each report asset takes the evaluations as inputs and returns its report model (the
IO manager keeps it as the report's JSON; the checks take it as their input). In the UI the
chart is inlined in the report metadata (a PNG data URI). ``publish_reports`` copies them to
the published dir; it sits downstream of the blocking ``baseline_regression`` check, so a
regression keeps the last good reports published.
"""

import dagster as dg

from rag_assets.defs.evaluation import load_fixture_set, metric_values, summary_json
from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource
from rag_assets.files import copy_atomic
from rag_assets.metadata import chart_md, floats, inline_images, md_table, rounded
from rag_assets.timing import NIGHTLY_FRESHNESS
from rag_core.evaluation.evaluator import EvaluationReport
from rag_core.evaluation.fixtures import FixtureManifest
from rag_core.evaluation.reports import ComparisonReport, ReportFiles

REPORT_NAMES = ("baseline", "comparison")
REPORT_SUFFIXES = (".json", ".md", "-recall.png")


def _file_paths(files: ReportFiles) -> dict:
    return {
        "json_path": dg.MetadataValue.path(str(files.json_path)),
        "markdown_path": dg.MetadataValue.path(str(files.markdown_path)),
    }


def report_metadata(files: ReportFiles) -> dict:
    """The Markdown report with its recall@K chart inline (the UI cannot follow the file's
    relative image link), and the chart on its own as ``recall_chart``."""
    md_path = files.markdown_path
    metadata = {"report": dg.MetadataValue.md(inline_images(md_path.read_text(encoding="utf-8"), md_path.parent))}
    if files.chart_path.is_file():
        metadata["recall_chart"] = chart_md(files.chart_path, "recall@K per store")
    return metadata


def comparison_summary(comparison: ComparisonReport) -> dict:
    """The compact JSON shown in the UI: sidecar status, mean rank overlap per K, both summaries."""
    return {
        **comparison.model_dump(mode="json", include={"sidecar_status", "mean_rank_overlap"}),
        "main": comparison.main.summary.model_dump(mode="json"),
        "sidecar": comparison.sidecar.summary.model_dump(mode="json") if comparison.sidecar else None,
    }


@dg.asset(
    group_name="reports",
    ins={"report": dg.AssetIn("golden_evaluation_milvus")},
    kinds={"json", "markdown"},
    freshness_policy=NIGHTLY_FRESHNESS,
)
def baseline_report(
    rag: RagSettingsResource, evaluation: EvaluationConfigResource, report: EvaluationReport
) -> dg.Output[EvaluationReport]:
    """The main store's (Milvus) evaluation as ``baseline.json`` / ``baseline.md`` in the reports dir.

    Metadata: the Markdown report, the summary JSON, recall@K and MRR as numbers (charted by
    the UI over runs). Fails when the main-store evaluation has not been written.
    """
    from rag_core.evaluation.reports import write_baseline_report

    settings = rag.get_settings()
    written = write_baseline_report(report, evaluation.files(settings).reports_dir, "baseline")
    return dg.Output(
        report,
        metadata={
            **report_metadata(written.files),
            "summary": dg.MetadataValue.json(rounded(summary_json(report))),
            "status": report.store_status.status,
            **floats(metric_values(report)),
            **_file_paths(written.files),
        },
    )


@dg.asset(
    group_name="reports",
    ins={
        "main": dg.AssetIn("golden_evaluation_milvus"),
        "sidecar": dg.AssetIn("golden_evaluation_pgvector"),
        "main_fixtures": dg.AssetIn("retrieval_fixtures_milvus"),
        "sidecar_fixtures": dg.AssetIn("retrieval_fixtures_pgvector"),
    },
    kinds={"json", "markdown"},
    freshness_policy=NIGHTLY_FRESHNESS,
)
def comparison_report(
    context: dg.AssetExecutionContext,
    rag: RagSettingsResource,
    evaluation: EvaluationConfigResource,
    main: EvaluationReport,
    sidecar: EvaluationReport,
    main_fixtures: FixtureManifest,
    sidecar_fixtures: FixtureManifest,
) -> dg.Output[ComparisonReport]:
    """Milvus and pgvector side by side per case (doc id, breadcrumb, category, rank, score label).

    Materializes with the main-store results when the sidecar is unavailable and says why. The
    fixture manifests are inputs for the lineage; the fixtures are read from their directories.
    """
    from rag_core.evaluation.reports import write_comparison_report

    settings = rag.get_settings()
    main_fx = load_fixture_set(settings, "milvus", main)
    side_fx = load_fixture_set(settings, "pgvector", main)
    written = write_comparison_report(
        main, sidecar, main_fx, side_fx, sidecar.store_status, evaluation.files(settings).reports_dir
    )
    comparison = written.report
    side_status = comparison.sidecar_status
    if not side_status.available:
        context.log.warning("sidecar unavailable: %s", side_status.reason)
    return dg.Output(
        comparison,
        metadata={
            **report_metadata(written.files),
            "summary": dg.MetadataValue.json(rounded(comparison_summary(comparison))),
            "sidecar_status": side_status.status,
            "sidecar_reason": side_status.reason or "",
            **floats({f"top{k}_overlap": v for k, v in comparison.mean_rank_overlap.items()}),
            **_file_paths(written.files),
        },
    )


@dg.asset(group_name="reports", deps=["baseline_report", "comparison_report"], kinds={"markdown"})
def publish_reports(rag: RagSettingsResource, evaluation: EvaluationConfigResource) -> dg.MaterializeResult:
    """Copies the baseline and comparison reports to the published dir (``<data_dir>/published``).

    Skipped in a run whose ``baseline_regression`` check failed (the check is blocking).
    """
    settings = rag.get_settings()
    files = evaluation.files(settings)
    copied = []
    for name in REPORT_NAMES:
        for suffix in REPORT_SUFFIXES:
            source = files.reports_dir / f"{name}{suffix}"
            if source.is_file():
                copied.append(copy_atomic(source, files.published_dir / source.name))
    if not copied:
        raise dg.Failure(f"no report in {files.reports_dir} to publish")
    return dg.MaterializeResult(
        metadata={
            "published_dir": dg.MetadataValue.path(str(files.published_dir)),
            "files": dg.MetadataValue.md(md_table(["file", "bytes"], [[p.name, p.stat().st_size] for p in copied])),
            "file_count": len(copied),
        }
    )
