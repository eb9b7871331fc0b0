"""Running a golden suite end to end: ingest its corpus, record fixtures per store, evaluate.

Like ``record``, this module runs the online stack (stores, model); the evaluation it calls
reads fixtures only. Used by ``rag eval suites`` (``rag_core.cli.recording``) and the Dagster
``golden_suite_*`` assets.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from rag_core.evaluation.cases import load_cases
from rag_core.evaluation.evaluator import EvaluationReport, evaluate
from rag_core.evaluation.fixtures import FixtureSet, load_fixtures
from rag_core.evaluation.gaps import write_gaps_report
from rag_core.evaluation.gate import GateResult
from rag_core.evaluation.gate import compare as gate_compare
from rag_core.evaluation.reports import ReportFiles, load_report, write_baseline_report, write_comparison_report
from rag_core.evaluation.suites import GoldenSuite, suite_settings
from rag_core.settings import RagSettings

__all__ = ["SuiteOutcome", "run_suite"]

log = logging.getLogger(__name__)


class SuiteOutcome(BaseModel):
    """What one suite run produced.

    ``status``: ``ok``, ``skipped`` (files missing; ``reason`` says which) or ``failed``
    (``reason`` has the error). ``reports`` maps store name -> its evaluation (the sidecar's
    says ``unavailable`` when it could not run); ``gate`` is the comparison with the stored
    baseline (None when there is none); ``report_dir`` holds ``current.{json,md}``
    (``current_files``: the main store's report, the sidecar beside it in the Markdown),
    ``comparison.{json,md}`` (``comparison_files``) and ``knowledge-gaps.md`` (``gaps_file``:
    ``rag_core.evaluation.gaps``).
    """

    suite: str
    status: Literal["ok", "skipped", "failed"]
    reason: str | None = None
    reports: dict[str, EvaluationReport] = {}
    gate: GateResult | None = None
    report_dir: str | None = None
    current_files: ReportFiles | None = None
    comparison_files: ReportFiles | None = None
    gaps_file: str | None = None
    ingest: dict[str, Any] = {}


def run_suite(
    base: RagSettings,
    suite: GoldenSuite,
    embedder: Any,
    out_dir: Path,
    with_sidecar: bool = True,
    progress: bool = False,
) -> SuiteOutcome:
    """Ingest ``suite``'s corpus into its own index, record both stores, evaluate, gate.

    Never raises for a suite problem: missing files give ``skipped``, any other error
    ``failed`` with the reason (other suites go on).
    """
    missing = suite.missing()
    if missing:
        return SuiteOutcome(suite=suite.name, status="skipped", reason=missing)
    settings = suite_settings(base, suite).model_copy(update={"sidecar_enabled": with_sidecar})
    try:
        ingest_report = _ingest(settings, embedder, progress)
        reports, fixture_sets = _record_and_evaluate(settings, suite, embedder, progress)
    except Exception as exc:  # one suite's failure never stops the others
        log.exception("golden suite %s failed", suite.name)
        return SuiteOutcome(suite=suite.name, status="failed", reason=f"{type(exc).__name__}: {exc}"[:500])
    report_dir = out_dir / suite.name
    main, side = reports["milvus"], reports.get("pgvector")
    current = write_baseline_report(
        main, report_dir, "current", other_stores=[side] if side and side.store_status.available else []
    )
    comparison = write_comparison_report(
        main,
        side,
        fixture_sets["milvus"],
        fixture_sets.get("pgvector"),
        side.store_status if side else None,
        report_dir,
    )
    gaps = write_gaps_report(suite.cases, reports, suite.knowledge_dir, report_dir / "knowledge-gaps.md")
    return SuiteOutcome(
        suite=suite.name,
        status="ok",
        reports=reports,
        gate=_gate(suite, main),
        report_dir=str(report_dir),
        current_files=current.files,
        comparison_files=comparison.files,
        gaps_file=str(gaps),
        ingest=ingest_report,
    )


def _ingest(settings: RagSettings, embedder: Any, progress: bool) -> dict[str, Any]:
    from rag_core.components import make_stores
    from rag_core.ingest.pipeline import ingest

    stores = make_stores(settings)
    try:
        return ingest(settings, embedder, stores, progress=progress).to_dict()
    finally:
        for store in stores:
            store.close()


def _record_and_evaluate(
    settings: RagSettings, suite: GoldenSuite, embedder: Any, progress: bool
) -> tuple[dict[str, EvaluationReport], dict[str, FixtureSet]]:
    from rag_core.recording.record import STORE_NAMES, record_fixtures

    cases = load_cases(suite.cases)
    reports: dict[str, EvaluationReport] = {}
    fixture_sets: dict[str, FixtureSet] = {}
    for store in STORE_NAMES if settings.sidecar_enabled else STORE_NAMES[:1]:
        fixtures_dir = settings.data_dir / "fixtures" / store
        record_fixtures(settings, store, suite.cases, fixtures_dir, embedder=embedder, progress=progress)
        fixture_sets[store] = load_fixtures(fixtures_dir, [c.id for c in cases])
        reports[store] = evaluate(cases, fixture_sets[store])
    return reports, fixture_sets


def _gate(suite: GoldenSuite, current: EvaluationReport) -> GateResult | None:
    if suite.baseline is None or not suite.baseline.is_file():
        return None
    return gate_compare(load_report(suite.baseline), current)
