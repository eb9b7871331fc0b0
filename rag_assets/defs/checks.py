"""Asset checks: regression gate (blocking), sidecar parity (warning), document and fixture hygiene.

Each check takes the value of the asset it checks as an input (loaded by the IO manager), never
a file path of its own.
"""

from dataclasses import dataclass

import dagster as dg

from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource
from rag_assets.layout import AssetFiles
from rag_assets.metadata import floats, md_table
from rag_core.evaluation.cases import GoldenCase
from rag_core.evaluation.evaluator import EvaluationReport
from rag_core.evaluation.fixtures import FixtureManifest
from rag_core.evaluation.gate import GateResult
from rag_core.evaluation.reports import ComparisonReport
from rag_core.ingest.plan import DocumentScan

HOW_TO_BASELINE = (
    "store a baseline: `cp {current} {baseline}` (or `rag eval run --cases ... "
    "--fixtures <data_dir>/fixtures/milvus --out {folder}`) and commit it"
)


@dg.asset_check(asset="baseline_report", blocking=True)
def baseline_regression(
    rag: RagSettingsResource, evaluation: EvaluationConfigResource, baseline_report: EvaluationReport
) -> dg.AssetCheckResult:
    """The main store against the stored baseline (``rag_core.evaluation.gate``): fails when
    recall@5, MRR or the share of strong hits drops more than the tolerance, a case goes
    strong -> miss, or a case that ran in the baseline no longer runs.

    Blocking: ``publish_reports`` does not run in a run where this fails. Passes, with a note,
    when no baseline is stored yet or the baseline shares no case with the current golden set.
    """
    stored = evaluation.baseline()
    current_path = evaluation.files(rag.get_settings()).baseline_json
    result = gate_against_baseline(evaluation, baseline_report)
    if isinstance(result, NotCompared):
        description = result.reason
        if not stored.is_file():
            description += "; " + HOW_TO_BASELINE.format(current=current_path, baseline=stored, folder=stored.parent)
        return dg.AssetCheckResult(
            passed=result.passed, description=description[:1000], metadata={"baseline": str(stored), "compared": False}
        )
    return dg.AssetCheckResult(
        passed=result.passed,
        description="; ".join(result.reasons) or f"no regression over {result.compared_cases} cases",
        metadata={
            "gate": dg.MetadataValue.md(result.to_markdown()),
            "baseline": str(stored),
            "compared": True,
            "compared_cases": result.compared_cases,
            "newly_missed": ", ".join(result.newly_missed) or "none",
            **floats(
                {
                    "baseline_recall@5": result.baseline_recall_at_5,
                    "current_recall@5": result.current_recall_at_5,
                    "baseline_mrr": result.baseline_mrr,
                    "current_mrr": result.current_mrr,
                    # Shown beside the verdict, which does not use it (see the gate's Markdown).
                    "mrr_change_p_value_not_gated": result.significance.p_value if result.significance else None,
                }
            ),
        },
    )


@dataclass(frozen=True)
class NotCompared:
    """Why the gate compared nothing, and whether that passes (an unreadable baseline does not)."""

    passed: bool
    reason: str


def gate_against_baseline(evaluation: EvaluationConfigResource, current: EvaluationReport) -> GateResult | NotCompared:
    """The gate of ``current`` (the main store) against the stored baseline, or why nothing was
    compared (no baseline stored, baseline unreadable, no case in common). Shared by the
    blocking check and the morning view."""
    from rag_core.evaluation.gate import compare
    from rag_core.evaluation.reports import load_report

    stored = evaluation.baseline()
    if not stored.is_file():
        return NotCompared(True, f"no stored baseline at {stored}")
    try:
        baseline = load_report(stored)
    except (OSError, ValueError) as exc:
        return NotCompared(False, f"stored baseline {stored} unreadable: {exc}")
    if not {c.case_id for c in baseline.cases} & {c.case_id for c in current.cases}:
        return NotCompared(
            True,
            f"baseline {stored} has no case in common with the current golden set (another corpus?); nothing compared",
        )
    return compare(baseline, current, evaluation.recall_tolerance, evaluation.mrr_tolerance)


def _lowest_overlap_rows(comparison: ComparisonReport, limit: int = 10) -> list[list]:
    """``[case, top-5 overlap, main hit level, sidecar hit level]`` of the ``limit`` cases with
    the lowest top-5 overlap (cases run on both stores only)."""
    overlaps = [(overlap, c) for c in comparison.cases if (overlap := c.rank_overlap.get(5)) is not None]
    overlaps.sort(key=lambda pair: (pair[0], pair[1].case_id))
    return [[c.case_id, f"{overlap:.2f}", c.main_hit_level, c.sidecar_hit_level] for overlap, c in overlaps[:limit]]


@dg.asset_check(asset="comparison_report")
def sidecar_parity(evaluation: EvaluationConfigResource, comparison_report: ComparisonReport) -> dg.AssetCheckResult:
    """Warns when the mean top-5 doc overlap of pgvector vs Milvus is below
    ``parity_min_overlap``, or when the sidecar was unavailable (parity not measured)."""
    comparison = comparison_report
    status = comparison.sidecar_status
    threshold = evaluation.parity_min_overlap
    if not status.available:
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"sidecar {status.status}: {status.reason or 'no reason given'}; parity not measured",
            metadata={"sidecar_status": status.status},
        )
    overlap = comparison.mean_rank_overlap.get(5)
    passed = overlap is not None and overlap >= threshold
    shown = "n/a" if overlap is None else f"{overlap:.3f}"
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"mean top-5 overlap {shown} (threshold {threshold:.2f})",
        metadata={
            **floats({"top5_overlap": overlap, "threshold": threshold}),
            "lowest_overlap_cases": dg.MetadataValue.md(
                md_table(["case", "top-5 overlap", "milvus", "pgvector"], _lowest_overlap_rows(comparison))
            ),
        },
    )


@dg.asset_check(asset="knowledge_documents")
def documents_have_title_and_category(knowledge_documents: DocumentScan) -> dg.AssetCheckResult:
    """Every document has a non-blank title and category (frontmatter, H1/stem, or first folder).

    A document at the knowledge root without a ``category`` fails it: L0 cannot offer its domain.
    """
    documents = knowledge_documents.documents
    bad = [
        [d.doc_id, "missing" if not d.title.strip() else "ok", "missing" if not d.category.strip() else "ok"]
        for d in documents
        if not (d.title.strip() and d.category.strip())
    ]
    return dg.AssetCheckResult(
        passed=not bad,
        description=(
            f"{len(bad)} of {len(documents)} documents lack a title or category"
            if bad
            else f"all {len(documents)} documents have both"
        ),
        metadata={
            "failing_documents": dg.MetadataValue.md(md_table(["document", "title", "category"], bad)),
            "failing_count": len(bad),
        },
    )


def fixture_coverage(store: str, settings, cases: list[GoldenCase], manifest: FixtureManifest) -> dg.AssetCheckResult:
    """Passes when every golden case has a fixture file on ``store`` (or the sidecar is
    unavailable: that is the parity check's concern)."""
    out_dir = AssetFiles.under(settings.data_dir).fixtures_dir(store)
    status = manifest.store_status.status
    if store == "pgvector" and status == "unavailable":
        return dg.AssetCheckResult(
            passed=True,
            metadata={"status": status},
            description="sidecar unavailable: no fixtures expected (see sidecar_parity)",
        )
    missing = [c.id for c in cases if not (out_dir / f"{c.id}.json").is_file()]
    return dg.AssetCheckResult(
        passed=not missing,
        description=(
            f"{len(missing)} of {len(cases)} golden cases have no {store} fixture (store status: {status})"
            if missing
            else f"all {len(cases)} cases recorded"
        ),
        metadata={"missing_count": len(missing), "missing": ", ".join(missing[:50]) or "none", "status": status},
    )


@dg.asset_check(
    asset="retrieval_fixtures_milvus",
    name="every_case_has_a_fixture",
    additional_ins={"golden_cases": dg.AssetIn()},
    description="No golden case without a recorded milvus fixture.",
)
def every_case_has_a_milvus_fixture(
    rag: RagSettingsResource, retrieval_fixtures_milvus: FixtureManifest, golden_cases: list[GoldenCase]
) -> dg.AssetCheckResult:
    """Every golden case has a Milvus fixture file (``fixture_coverage``)."""
    return fixture_coverage("milvus", rag.get_settings(), golden_cases, retrieval_fixtures_milvus)


@dg.asset_check(
    asset="retrieval_fixtures_pgvector",
    name="every_case_has_a_fixture",
    additional_ins={"golden_cases": dg.AssetIn()},
    description="No golden case without a recorded pgvector fixture.",
)
def every_case_has_a_pgvector_fixture(
    rag: RagSettingsResource, retrieval_fixtures_pgvector: FixtureManifest, golden_cases: list[GoldenCase]
) -> dg.AssetCheckResult:
    """Every golden case has a pgvector fixture file (``fixture_coverage``)."""
    return fixture_coverage("pgvector", rag.get_settings(), golden_cases, retrieval_fixtures_pgvector)
