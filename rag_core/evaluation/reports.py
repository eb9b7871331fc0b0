"""Baseline and comparison reports: JSON (the models), Markdown for people, recall@K chart.

``write_baseline_report`` writes one store's ``EvaluationReport``; ``write_comparison_report``
puts the main store (Milvus) and the sidecar (pgvector) side by side per case and keeps the
main-store results when the sidecar is unavailable. Both return the model they wrote with its
files (``WrittenReport``), so callers use the model instead of reading the JSON back.
``load_report`` / ``load_comparison`` read a report written earlier, also one of format
version 1 (``rag_core.evaluation.formats``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from itertools import zip_longest
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from rag_core.evaluation.evaluator import (
    CaseResult,
    EvaluationReport,
    HitLevel,
    MetricSummary,
)
from rag_core.evaluation.filter_cost import FILTER_EFFECTS
from rag_core.evaluation.fixtures import FixtureCandidate, FixtureSet, StoreStatus
from rag_core.evaluation.formats import LegacyNames, VersionedFile, read_json_model
from rag_core.evaluation.metrics import normalize_doc_id, rank_overlap_at_k, ranked_docs
from rag_core.fileio import portable_path
from rag_core.markdown import md_cell, md_table_lines

__all__ = [
    "OVERLAP_KS",
    "CaseComparison",
    "ComparisonReport",
    "ReportFiles",
    "SideBySideEntry",
    "WrittenReport",
    "build_comparison",
    "load_comparison",
    "load_report",
    "render_baseline_markdown",
    "render_comparison_markdown",
    "summary_rows",
    "write_baseline_report",
    "write_comparison_report",
    "write_recall_chart",
]

OVERLAP_KS: tuple[int, ...] = (5, 10)
SIDE_BY_SIDE_DEPTH = 5
_LEVEL_MARK = {
    "strong": "strong",
    "medium": "medium",
    "miss": "**MISS**",
    "not_run": "_not run_",
    "abstained": "abstained",
    "claimed": "**CLAIMED**",
}


# --------------------------------------------------------------------------- models


class SideBySideEntry(LegacyNames):
    """One position of a store's doc ranking, as shown side by side (rank 1 = top);
    ``similarity`` in [0, 1], ``raw_score`` in the store's unit (``score_label``)."""

    V1_NAMES = {"normalized_score": "similarity"}
    rank: int
    doc_id: str | None
    breadcrumb: str
    category: str
    score_label: str
    raw_score: float | None
    similarity: float | None


class CaseComparison(BaseModel):
    """One case on both stores: hit levels, first-hit ranks, top-5 docs, rank overlap.

    ``differing_ranks`` are the ranks (1..5) whose doc differs between the stores;
    ``rank_overlap`` maps K -> |top-K main ∩ top-K sidecar| / K (``None`` unless both ran).
    """

    case_id: str
    scenario: str
    query: str
    expected_docs: list[str]
    main_hit_level: HitLevel
    sidecar_hit_level: HitLevel | None
    main_first_hit_rank: int | None
    sidecar_first_hit_rank: int | None
    main_top: list[SideBySideEntry]
    sidecar_top: list[SideBySideEntry]
    differing_ranks: list[int]
    rank_overlap: dict[int, float | None]


class ComparisonReport(VersionedFile):
    """Main store vs sidecar: both evaluations in full, per-case comparison, mean overlap.

    ``sidecar`` is ``None`` when no sidecar evaluation exists; ``sidecar_status`` then says
    why. ``mean_rank_overlap`` maps K -> mean over cases run on both stores (``None`` if none).
    """

    V1_NAMES = {"main_path": "main_store", "sidecar_path": "sidecar_store"}
    main_store: str | None
    sidecar_store: str | None
    sidecar_status: StoreStatus
    overlap_ks: list[int]
    mean_rank_overlap: dict[int, float | None]
    cases: list[CaseComparison]
    main: EvaluationReport
    sidecar: EvaluationReport | None = None


class ReportFiles(BaseModel):
    """The files of one written report: the model as JSON, the Markdown for people and the
    recall@K chart (PNG) it links to."""

    json_path: Path
    markdown_path: Path
    chart_path: Path


R = TypeVar("R", bound=BaseModel)


class WrittenReport(BaseModel, Generic[R]):
    """What a report writer returns: the ``report`` model it wrote (the JSON file holds exactly
    this model) and where its ``files`` are."""

    report: R
    files: ReportFiles


# --------------------------------------------------------------------------- formatting


def _num(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _share(count: int, total: int) -> str:
    return f"{count}" if total == 0 else f"{count} ({100 * count / total:.0f}%)"


def _short_hash(value: str | None) -> str:
    if not value:
        return "unknown"
    algo, _, digest = value.rpartition(":")
    return f"{algo + ':' if algo else ''}{digest[:12]}"


def _store_name(report: EvaluationReport | None, fallback: str) -> str:
    return (report.store if report else None) or fallback


# One summary row: (metric, value formatter, numeric value for deltas, meaning).
_Row = tuple[str, Callable[[MetricSummary], str], Callable[[MetricSummary], float | None], str]


def _recall_row(k: int) -> _Row:
    return (
        f"recall@{k}",
        lambda s: _num(s.recall_at_k.get(k)),
        lambda s: s.recall_at_k.get(k),
        f"share of run cases with an expected doc in the top {k} docs (hit rate, 0–1)",
    )


def _summary_row_specs(ks: Sequence[int], strong_k: int) -> list[_Row]:
    rows: list[_Row] = [
        (
            "cases",
            lambda s: f"{s.case_count} ({s.run_count} run)",
            lambda s: s.case_count,
            "golden cases; rates below are over run cases",
        ),
        (
            "strong",
            lambda s: _share(s.strong, s.run_count),
            lambda s: s.strong,
            f"expected doc in top {strong_k} and keyword/breadcrumb coverage met",
        ),
        (
            "medium",
            lambda s: _share(s.medium, s.run_count),
            lambda s: s.medium,
            f"expected doc in top {strong_k}, coverage not met",
        ),
        (
            "miss",
            lambda s: _share(s.miss, s.run_count),
            lambda s: s.miss,
            f"no expected doc in top {strong_k}",
        ),
        (
            "not run",
            lambda s: str(s.not_run),
            lambda s: s.not_run,
            "no usable fixture (see reasons); not in the rates",
        ),
    ]
    rows += [_recall_row(k) for k in ks]
    rows += [
        (
            "MRR",
            lambda s: _num(s.mrr),
            lambda s: s.mrr,
            "mean of 1/rank of the first expected doc (0 when not retrieved; 0–1)",
        ),
        (
            "nDCG@10",
            lambda s: _num(s.ndcg_at_10),
            lambda s: s.ndcg_at_10,
            "binary relevance, log2 discount (Järvelin & Kekäläinen 2002; 0–1)",
        ),
        (
            "avg first-hit rank",
            lambda s: _num(s.avg_first_hit_rank, 2),
            lambda s: s.avg_first_hit_rank,
            "mean rank (1 = top) of the first expected doc, over the cases where it was found",
        ),
        (
            "context-pack survival",
            lambda s: _num(s.context_pack_survival_rate),
            lambda s: s.context_pack_survival_rate,
            "share of cases with an expected doc in the evidence whose context pack kept it (0–1)",
        ),
    ]
    return rows


def summary_rows(summaries: Sequence[MetricSummary], ks: Sequence[int], strong_k: int = 5) -> list[list[str]]:
    """Rows ``[metric, value per summary..., meaning]`` of the summary table (CLI, Markdown)."""
    return [[name, *(fmt(s) for s in summaries), meaning] for name, fmt, _, meaning in _summary_row_specs(ks, strong_k)]


def _summary_table(
    columns: Sequence[tuple[str, MetricSummary | None]],
    ks: Sequence[int],
    strong_k: int,
    with_delta: bool = False,
) -> list[str]:
    headers = ["metric", *(name for name, _ in columns)]
    if with_delta:
        headers.append("Δ (sidecar − main)")
    headers.append("what it means")
    rows = []
    for name, fmt, value, meaning in _summary_row_specs(ks, strong_k):
        row = [name, *(fmt(s) if s else "n/a" for _, s in columns)]
        if with_delta:
            a, b = (value(s) if s else None for _, s in columns)
            row.append(_delta(a, b))
        rows.append([*row, meaning])
    return md_table_lines(headers, rows)


def _delta(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "n/a"
    if isinstance(before, int) and isinstance(after, int):
        return f"{after - before:+d}"
    return f"{after - before:+.3f}"


def _manifest_lines(report: EvaluationReport, label: str = "") -> list[str]:
    """Bullets saying what was evaluated; ``label`` (e.g. "main") prefixes each bullet."""
    m = report.manifest
    status = report.store_status
    state = "available" if status.available else f"**unavailable**: {status.reason}"

    def bullet(word: str, text: str) -> str:
        return f"- {label} {word}: {text}" if label else f"- {word.capitalize()}: {text}"

    lines = [bullet("store", f"`{report.store or 'unknown'}` ({state})")]
    if m is None:
        return [*lines, bullet("manifest", f"missing (fixtures in `{report.fixtures_dir}`)")]
    index = f" · index `{json.dumps(m.index_params, sort_keys=True)}`" if m.index_params else ""
    second = f" + `{m.ensemble_model_id}` (rerank)" if m.ensemble_model_id else ""
    return [
        *lines,
        bullet("recorded", f"{m.recorded_at or 'unknown'} at commit `{m.git_commit or 'unknown'}`"),
        bullet("corpus", f"`{_short_hash(m.corpus_hash)}` · model `{m.model_id or 'unknown'}`{second}{index}"),
        bullet("cases", f"`{m.cases_file or 'unknown'}` · fixtures `{report.fixtures_dir}`"),
    ]


def _regenerate_line(report: EvaluationReport, name: str, out_dir: Path) -> str:
    cases = (report.manifest.cases_file if report.manifest else None) or "<cases file>"
    ks = ",".join(str(k) for k in report.ks)
    return (
        f"Regenerate: `rag eval run --cases {cases} --fixtures {report.fixtures_dir} "
        f"--k {ks} --out {portable_path(out_dir)} --name {name}` (fixtures from `rag eval record`)."
    )


def _case_rows(cases: Sequence[CaseResult]) -> list[list[str | None]]:  # None: _cell shows —
    return [
        [
            f"`{c.case_id}`",
            c.scenario,
            _LEVEL_MARK[c.hit_level],
            "—" if c.first_hit_rank is None else str(c.first_hit_rank),
            # "; "-separated, not <br>: renderers that do not pass raw HTML (the Dagster UI)
            # drop the tag. Cells are escaped once, by _table.
            "; ".join(c.top_candidates[:3]),
            "; ".join(c.failed_checks) or c.not_run_reason,
        ]
        for c in cases
    ]


def _not_run_lines(report: EvaluationReport) -> list[str]:
    not_run = [c for c in report.cases if c.hit_level == "not_run"]
    if not not_run:
        return []
    return ["", "## Not run", "", *(f"- `{md_cell(c.case_id)}`: {md_cell(c.not_run_reason)}" for c in not_run)]


def _filter_cost_lines(report: EvaluationReport) -> list[str]:
    """The L0 filter cost section: counts per effect, then the filtered cases, hurt first."""
    cost = report.filter_cost
    if cost is None:
        return []
    lines = [
        "",
        "## L0 category filter cost",
        "",
        f"The L0 category filter was used in {cost.filtered_cases} of {len(report.cases)} cases. "
        "Each such case was also run with the filter disabled; ranks are first-hit ranks of an "
        "expected doc with and without the filter.",
        "",
    ]
    lines += md_table_lines(
        ["effect", "cases"], [[effect, n] for effect, n in cost.counts.items() if effect != "no_filter"]
    )
    filtered = [c for c in report.cases if c.filter_outcome and c.filter_outcome.effect != "no_filter"]
    filtered.sort(key=lambda c: (FILTER_EFFECTS.index(c.filter_outcome.effect), c.case_id))  # type: ignore[union-attr]
    if filtered:
        lines += [""]
        lines += md_table_lines(
            ["case", "effect", "filter", "rank with filter", "rank without filter"],
            [
                [
                    f"`{c.case_id}`",
                    o.effect,
                    f"`{o.category_filter}`",
                    _rank_cell(o.rank_with_filter),
                    _rank_cell(o.rank_without_filter),
                ]
                for c in filtered
                if (o := c.filter_outcome) is not None
            ],
        )
    return lines


def _rank_cell(rank: int | None) -> str:
    return "—" if rank is None else str(rank)


def _warning_lines(warnings: Sequence[str], title: str = "Warnings") -> list[str]:
    if not warnings:
        return []
    return ["", f"## {title}", "", *(f"- {w}" for w in warnings)]


# --------------------------------------------------------------------------- baseline


def render_baseline_markdown(
    report: EvaluationReport,
    *,
    name: str = "baseline",
    other_stores: Sequence[EvaluationReport] = (),
    chart_file: str | None = None,
    out_dir: Path | None = None,
) -> str:
    """Markdown for people: what was evaluated, summary table, per scenario, per case."""
    k = report.strong_k
    lines = [f"# Retrieval evaluation {name}: store `{report.store or 'unknown'}`", ""]
    lines += _manifest_lines(report)
    lines += [
        (
            f"- Strong hit: an expected doc in the top {k} docs and every expected keyword in "
            f"the top-{k} evidence (and an expected breadcrumb, when given). Ranks are "
            "positions in the doc ranking: evidence blocks first, then the remaining "
            "retrieved candidates."
        ),
        f"- {_regenerate_line(report, name, out_dir or Path('.'))}",
        "",
        "## Summary",
        "",
    ]
    columns = [(f"`{report.store or 'value'}`", report.summary)]
    columns += [(f"`{o.store or '?'}`", o.summary) for o in other_stores]
    lines += _summary_table(columns, report.ks, k)
    if chart_file:
        lines += ["", f"![recall@K per store]({chart_file})"]
    lines += abstention_lines([report, *other_stores])

    lines += ["", "## By scenario", ""]
    headers = ["scenario", "cases", "strong", "medium", "miss", "not run"]
    headers += [f"recall@{k_}" for k_ in report.ks] + ["MRR", "nDCG@10", "avg first-hit rank"]
    rows = [
        [
            f"`{scenario}`",
            s.case_count,
            s.strong,
            s.medium,
            s.miss,
            s.not_run,
            *(_num(s.recall_at_k.get(k_)) for k_ in report.ks),
            _num(s.mrr),
            _num(s.ndcg_at_10),
            _num(s.avg_first_hit_rank, 2),
        ]
        for scenario, s in report.by_scenario.items()
    ]
    lines += md_table_lines(headers, rows)

    lines += ["", "## Per case", ""]
    lines += md_table_lines(
        ["case", "scenario", "hit", "first-hit rank", "top 3 (raw score, label)", "failed checks"],
        _case_rows(report.cases),
    )
    lines += _filter_cost_lines(report)
    lines += _not_run_lines(report)
    lines += _warning_lines(report.warnings)
    return "\n".join(lines) + "\n"


def _share_of(part: int | None, whole: int) -> str:
    return "n/a" if part is None or not whole else f"{part}/{whole} ({part / whole:.2f})"


def abstention_lines(reports: Sequence[EvaluationReport]) -> list[str]:
    """The "Abstention" section: per store, unanswerable cases answered honestly (not labelled
    PRECISE/RELEVANT) and with ``found`` true, answerable cases claimed, top-1 precision per
    relevance band, and the expected calibration error of ``confidence``
    (:mod:`rag_core.evaluation.abstention`); [] when no report has the figures."""
    figures = [(r.store or "?", r.abstention) for r in reports if r.abstention is not None]
    if not figures:
        return []
    levels = [b.level for b in figures[0][1].bands]
    rows = [
        ["unanswerable honest", *(_share_of(f.unanswerable_honest, f.unanswerable) for _, f in figures)],
        ["unanswerable found", *(_share_of(f.unanswerable_found, f.unanswerable) for _, f in figures)],
        ["answerable claimed", *(_share_of(f.answerable_claimed, f.answerable) for _, f in figures)],
        *(
            [
                f"{level} top-1 precision (n)",
                *(f"{_num(b.precision)} ({b.n})" for _, f in figures for b in f.bands if b.level == level),
            ]
            for level in levels
        ),
        ["ECE of confidence (n)", *(f"{_num(f.ece)} ({f.calibrated_n})" for _, f in figures)],
    ]
    return [
        "",
        "## Abstention",
        "",
        "Honest: an unanswerable case not labelled PRECISE/RELEVANT; claimed: an answerable case labelled "
        "PRECISE/RELEVANT; top-1 precision: answerable cases of the band whose first evidence block is "
        "expected; ECE: expected calibration error of `confidence` against that (10 bins).",
        "",
        *md_table_lines(["figure", *(f"`{name}`" for name, _ in figures)], rows),
    ]


def write_recall_chart(reports: Sequence[EvaluationReport], png_path: str | Path) -> Path:
    """PNG line chart of recall@K (y, 0–1) against K (x), one line per store."""
    import matplotlib

    matplotlib.use("Agg")  # headless; also keeps pyplot from picking a GUI backend
    import matplotlib.pyplot as plt

    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    try:
        for report in reports:
            points = [(k, v) for k in report.ks if (v := report.summary.recall_at_k.get(k)) is not None]
            ks = [k for k, _ in points]
            values = [v for _, v in points]
            label = f"{report.store or 'unknown'} ({report.summary.run_count} cases run)"
            ax.plot(ks, values, marker="o", label=label)
        ax.set_xlabel("K (top-K documents)")
        ax.set_ylabel("recall@K (hit rate)")
        ax.set_ylim(0, 1.05)
        ax.set_xticks(sorted({k for r in reports for k in r.ks}))
        ax.grid(True, alpha=0.3)
        ax.set_title("Golden retrieval recall@K per store")
        ax.legend(loc="lower right")
        fig.tight_layout()
        # No software/date metadata, so an unchanged chart is byte-identical.
        fig.savefig(png_path, format="png", metadata={"Software": None})
    finally:
        plt.close(fig)
    return png_path


def _write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _write_report(
    model: R,
    out_dir: Path,
    name: str,
    charted: Sequence[EvaluationReport],
    markdown: Callable[[str], str],
) -> WrittenReport[R]:
    """Write ``<name>-recall.png`` (a line per ``charted`` report), ``<name>.json`` (``model``)
    and ``<name>.md`` (``markdown(chart file name)``) into ``out_dir``."""
    chart = write_recall_chart(charted, out_dir / f"{name}-recall.png")
    json_path = _write_text(out_dir / f"{name}.json", model.model_dump_json(indent=2) + "\n")
    md_path = _write_text(out_dir / f"{name}.md", markdown(chart.name))
    files = ReportFiles(json_path=json_path, markdown_path=md_path, chart_path=chart)
    return WrittenReport[R](report=model, files=files)


def write_baseline_report(
    report: EvaluationReport,
    out_dir: str | Path,
    name: str = "baseline",
    *,
    other_stores: Sequence[EvaluationReport] = (),
) -> WrittenReport[EvaluationReport]:
    """Write ``<name>.json`` (the report model), ``<name>.md`` and ``<name>-recall.png``.

    ``other_stores`` (reports of other stores) add columns to the Markdown summary and lines
    to the recall@K chart; the JSON holds ``report`` only. Returns ``report`` and its files.
    """
    out_dir = Path(out_dir)

    def markdown(chart: str) -> str:
        return render_baseline_markdown(report, name=name, other_stores=other_stores, chart_file=chart, out_dir=out_dir)

    return _write_report(report, out_dir, name, [report, *other_stores], markdown)


def load_report(path: str | Path) -> EvaluationReport:
    """Read an ``EvaluationReport`` JSON written by ``write_baseline_report`` (any readable
    format version; version 1 has its old names mapped).

    Raises ``OSError`` when unreadable, ``FormatVersionError`` (a ``ValueError``: one line
    naming the file and the version) for an unknown format version, and
    ``pydantic.ValidationError`` (a ``ValueError``) for invalid content.
    """
    return read_json_model(path, EvaluationReport)


def load_comparison(path: str | Path) -> ComparisonReport:
    """Read a ``ComparisonReport`` JSON written by ``write_comparison_report``; raises as
    ``load_report`` does."""
    return read_json_model(path, ComparisonReport)


# --------------------------------------------------------------------------- comparison


def _side_entries(fixtures: FixtureSet | None, case_id: str) -> list[SideBySideEntry]:
    fixture = fixtures.fixtures.get(case_id) if fixtures else None
    if fixture is None:
        return []
    items: list[FixtureCandidate] = ranked_docs(fixture.evidence_blocks, fixture.candidates)
    return [
        SideBySideEntry(
            rank=position,
            doc_id=normalize_doc_id(item.doc_id),
            breadcrumb=item.breadcrumb or item.title,
            category=item.category,
            score_label=item.score_label,
            raw_score=item.raw_score,
            similarity=item.similarity,
        )
        for position, item in enumerate(items[:SIDE_BY_SIDE_DEPTH], start=1)
    ]


def _compare_case(
    main: CaseResult,
    side: CaseResult | None,
    main_fixtures: FixtureSet,
    sidecar_fixtures: FixtureSet | None,
) -> CaseComparison:
    main_top = _side_entries(main_fixtures, main.case_id)
    side_top = _side_entries(sidecar_fixtures, main.case_id) if side else []
    both_ran = side is not None and "not_run" not in (main.hit_level, side.hit_level)
    differing: list[int] = []
    if both_ran:
        pairs = zip_longest((e.doc_id for e in main_top), (e.doc_id for e in side_top))
        differing = [rank for rank, (a, b) in enumerate(pairs, 1) if a is None or a != b]
    return CaseComparison(
        case_id=main.case_id,
        scenario=main.scenario,
        query=main.query,
        expected_docs=main.expected_docs,
        main_hit_level=main.hit_level,
        sidecar_hit_level=side.hit_level if side else None,
        main_first_hit_rank=main.first_hit_rank,
        sidecar_first_hit_rank=side.first_hit_rank if side else None,
        main_top=main_top,
        sidecar_top=side_top,
        differing_ranks=differing,
        rank_overlap={
            k: rank_overlap_at_k(main.top_docs, side.top_docs, k) if both_ran and side is not None else None
            for k in OVERLAP_KS
        },
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def build_comparison(
    main: EvaluationReport,
    sidecar: EvaluationReport | None,
    main_fixtures: FixtureSet,
    sidecar_fixtures: FixtureSet | None,
    sidecar_status: dict[str, Any] | StoreStatus | None = None,
) -> ComparisonReport:
    """Assemble the ``ComparisonReport`` (cases in the main report's order).

    ``sidecar_status`` (``{"status": "available"|"unavailable", "reason": ...}``) defaults
    to the sidecar report's own status; a missing sidecar report is always unavailable.
    """
    if sidecar_status is None:
        sidecar_status = sidecar.store_status if sidecar else {"status": "unavailable"}
    status = StoreStatus.model_validate(sidecar_status)
    if sidecar is None and status.available:
        status = StoreStatus(status="unavailable", reason="no sidecar evaluation was provided")
    side_by_id = {c.case_id: c for c in sidecar.cases} if sidecar else {}
    cases = [_compare_case(c, side_by_id.get(c.case_id), main_fixtures, sidecar_fixtures) for c in main.cases]
    return ComparisonReport(
        main_store=main.store,
        sidecar_store=sidecar.store if sidecar else None,
        sidecar_status=status,
        overlap_ks=list(OVERLAP_KS),
        mean_rank_overlap={k: _mean([v for c in cases if (v := c.rank_overlap[k]) is not None]) for k in OVERLAP_KS},
        cases=cases,
        main=main,
        sidecar=sidecar,
    )


def _entry_cells(entry: SideBySideEntry | None, highlight: bool) -> list[str]:
    if entry is None:
        return ["—", "—", "—", "—"]
    doc_id = md_cell(entry.doc_id or "(no doc id)")
    doc_id = f"**{doc_id}**" if highlight else doc_id
    raw = f" (raw {entry.raw_score:.3f} {entry.score_label})".rstrip() if entry.raw_score is not None else ""
    return [doc_id, entry.breadcrumb, entry.category, f"{_num(entry.similarity)}{raw}"]


def _case_comparison_lines(case: CaseComparison, with_sidecar: bool) -> list[str]:
    head = f"### `{md_cell(case.case_id)}` ({md_cell(case.scenario)}): main {_LEVEL_MARK[case.main_hit_level]}"
    if with_sidecar:
        side_level = _LEVEL_MARK[case.sidecar_hit_level or "not_run"]
        head += f", sidecar {side_level}"
        overlap = ", ".join(f"@{k} {_num(v, 2)}" for k, v in case.rank_overlap.items())
        head += f" · overlap {overlap}"
    lines = [
        head,
        "",
        f"Query: {md_cell(case.query)} · expected: {', '.join(f'`{md_cell(d)}`' for d in case.expected_docs)}"
        f" · first-hit rank main {case.main_first_hit_rank or '—'}"
        + (f", sidecar {case.sidecar_first_hit_rank or '—'}" if with_sidecar else ""),
        "",
    ]
    depth = max(len(case.main_top), len(case.sidecar_top) if with_sidecar else 0)
    if depth == 0:
        return [*lines, "_No ranked documents._", ""]
    headers = ["rank", "main doc_id", "breadcrumb", "category", "similarity (raw, label)"]
    if with_sidecar:
        headers += ["≠", "sidecar doc_id", "breadcrumb", "category", "similarity (raw, label)"]
    rows = []
    for rank in range(1, depth + 1):
        differs = rank in case.differing_ranks
        main_entry = case.main_top[rank - 1] if rank <= len(case.main_top) else None
        row = [str(rank), *_entry_cells(main_entry, differs)]
        if with_sidecar:
            side_entry = case.sidecar_top[rank - 1] if rank <= len(case.sidecar_top) else None
            row += ["≠" if differs else "=", *_entry_cells(side_entry, differs)]
        rows.append(row)
    return [*lines, *md_table_lines(headers, rows), ""]


def render_comparison_markdown(comparison: ComparisonReport, chart_file: str | None = None) -> str:
    """Markdown: sidecar status, manifests, summary side by side, per-case top-5 tables."""
    main, side, status = comparison.main, comparison.sidecar, comparison.sidecar_status
    with_sidecar = side is not None and status.available
    main_name = _store_name(main, "main")
    side_name = _store_name(side, "sidecar")
    lines = [f"# Retrieval comparison: main `{main_name}` vs sidecar `{side_name}`", ""]
    if with_sidecar:
        lines.append(f"**Sidecar status: available** (`{side_name}`).")
    else:
        lines.append(
            f"**Sidecar status: unavailable**: {status.reason or 'no reason given'}. "
            "The main-store results are reported below on their own."
        )
    lines += ["", *_manifest_lines(main, "Main"), ""]
    if side is not None:
        lines += [*_manifest_lines(side, "Sidecar"), ""]
    lines += [
        (
            "Ranks are positions in each store's doc ranking (evidence blocks, then the "
            "remaining candidates). Similarities are normalised cosine similarities in [0, 1] and "
            "comparable across stores; raw scores are in each store's own unit (see the label) and "
            "are not. `≠` (and **bold** doc ids) mark ranks whose documents differ."
        ),
        "",
        "## Summary",
        "",
    ]
    columns: list[tuple[str, MetricSummary | None]] = [(f"main `{main_name}`", main.summary)]
    if with_sidecar and side is not None:
        columns.append((f"sidecar `{side_name}`", side.summary))
    lines += _summary_table(columns, main.ks, main.strong_k, with_delta=len(columns) == 2)
    if with_sidecar:
        lines += [""]
        lines += [
            f"- Mean rank overlap@{k} (|top-{k} main ∩ top-{k} sidecar| / {k}, cases run on both stores): {_num(v)}"
            for k, v in comparison.mean_rank_overlap.items()
        ]
    if chart_file:
        lines += ["", f"![recall@K per store]({chart_file})"]
    lines += ["", "## Per case", ""]
    for case in comparison.cases:
        lines += _case_comparison_lines(case, with_sidecar)
    lines += _not_run_lines(main)
    lines += _warning_lines(main.warnings, "Main-store warnings")
    if side is not None:
        lines += _warning_lines(side.warnings, "Sidecar warnings")
    return "\n".join(lines) + "\n"


def write_comparison_report(
    main: EvaluationReport,
    sidecar: EvaluationReport | None,
    main_fixtures: FixtureSet,
    sidecar_fixtures: FixtureSet | None,
    sidecar_status: dict[str, Any] | StoreStatus | None,
    out_dir: str | Path,
    name: str = "comparison",
) -> WrittenReport[ComparisonReport]:
    """Write ``<name>.json`` (``ComparisonReport``), ``<name>.md`` and ``<name>-recall.png``.

    Works with the sidecar missing (``sidecar=None`` or status unavailable): the report says
    so, with the reason, and still holds the main-store results. Returns the
    ``ComparisonReport`` (``build_comparison``) and its files.
    """
    comparison = build_comparison(main, sidecar, main_fixtures, sidecar_fixtures, sidecar_status)
    charted = [main] + ([sidecar] if sidecar and comparison.sidecar_status.available else [])

    def markdown(chart: str) -> str:
        return render_comparison_markdown(comparison, chart)

    return _write_report(comparison, Path(out_dir), name, charted, markdown)
