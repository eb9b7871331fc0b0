"""Rich renderings of ingest reports, lookup results and store comparisons for the CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

if TYPE_CHECKING:  # annotations only: `rag --help` stays light
    from rag_core.compare import CandidateRow, StoreComparison
    from rag_core.ingest.pipeline import IngestReport
    from rag_core.lookup.contracts import LookupResult


#: Terminal width from which lookup evidence is one table (its seven columns need about this).
WIDE_COLUMNS = 120


def table(*columns: str, title: str | None = None) -> Table:
    """A rich table whose cells wrap (fold) instead of being cut with an ellipsis: doc ids and
    breadcrumbs stay whole when the output is narrow or piped (rich assumes 80 columns then)."""
    t = Table(title=title)
    for column in columns:
        t.add_column(column, overflow="fold")
    return t


def print_ingest_report(console: Console, report: IngestReport) -> None:
    console.print(
        f"[bold]Ingested {report.knowledge_dir}[/bold]: {report.documents_ingested} of "
        f"{report.documents_seen} documents, {report.chunks_total} chunks, "
        f"{report.chunks_embedded} embedded ({report.embedding_cache_hits} from the embedding cache)"
    )
    t = table("store", "added", "updated", "removed", "unchanged")
    for name, c in report.stores.items():
        t.add_row(name, str(c.added), str(c.updated), str(c.removed), str(c.unchanged))
    console.print(t)
    for name, change in report.model_changed.items():
        console.print(
            f"[yellow]{name}: embedding model changed ({change}): every chunk re-embedded[/yellow]", highlight=False
        )
    # One line per file (file:line (heading): reason), so 1,000 bad files stay greppable.
    for title, issues in (("skipped", report.skipped), ("warning (ingested)", report.warnings)):
        for issue in issues:
            console.print(f"{title}: {issue}", highlight=False, markup=False, soft_wrap=True)
        if issues:
            console.print(f"{len(issues)} file(s) {title}", highlight=False)
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in report.stage_seconds.items())
    console.print(f"seconds per stage: {stages} (total {sum(report.stage_seconds.values()):.2f}s)")


def print_lookup(console: Console, result: LookupResult, wide: bool | None = None) -> None:
    """Status, attempts, the evidence blocks and the context pack. ``wide`` (default: a console
    of at least ``WIDE_COLUMNS``) puts the blocks in one table; narrower, each block is a few
    lines of its own, as ``kubectl`` / ``gh`` do, so an 80-column terminal stays readable."""
    rt = result.retrieval_trace
    console.print(
        f"[bold]{result.relevance_level.value}[/bold] layer={rt.layer} "
        f"found={result.found} semanticSupport={result.semantic_support} — {result.message}"
    )
    for a in rt.attempts:
        console.print(
            f"  attempt {a.attempt}: filter={a.filter!r} candidates={a.candidate_count} "
            f"top={a.top_similarity} {a.duration_ms:.1f} ms"
            + (f" low quality: {a.low_quality_reason}" if a.low_quality_reason else "")
            + (f" error: {a.error}" if a.error else "")
        )
    if rt.fallback_reason:
        console.print(f"  fallback: {rt.fallback_reason}")
    if rt.sidecar.status != "disabled":
        console.print(f"  sidecar: {rt.sidecar.status} {rt.sidecar.reason or ''} {rt.sidecar.top_doc_ids}")
    wide = console.width >= WIDE_COLUMNS if wide is None else wide
    (print_blocks_table if wide else print_blocks_stacked)(console, result)
    pack = result.context_pack
    console.print(
        Panel(
            pack.packed_text or "(empty)",
            title=f"context pack {pack.used_chars}/{pack.char_budget} chars",
            subtitle=result.completeness_hint,
        )
    )


def _rerank_line(result: LookupResult) -> dict[str, str]:
    """doc id -> ``"dense+0.312, title+0.050 (rank 3->1)"`` of its rerank trace entry."""
    lines = {}
    for r in result.rerank_trace:
        contrib = ", ".join(f"{k}+{v:.3f}" for k, v in r.contributions.items())
        lines[r.doc_id] = f"{contrib} (rank {r.rank_before}->{r.rank_after})".strip()
    return lines


def print_blocks_table(console: Console, result: LookupResult) -> None:
    """The evidence blocks as one table (wide terminals)."""
    rerank = _rerank_line(result)
    t = table("#", "doc_id", "breadcrumb", "layer", "similarity", "final", "hit reasons / rerank")
    for b in result.evidence_blocks:
        extra = rerank.get(b.doc_id)
        t.add_row(
            str(b.rank),
            b.doc_id,
            b.breadcrumb,
            b.retrieval_layer,
            f"{b.similarity:.3f}",
            f"{b.final_score:.3f}",
            ", ".join(b.hit_reasons) + (f"\n{extra}" if extra else ""),
        )
    console.print(t)


def print_blocks_stacked(console: Console, result: LookupResult) -> None:
    """Each evidence block as a short stanza: rank and doc id, then breadcrumb, scores, hit
    reasons and rerank below it (narrow terminals)."""
    rerank = _rerank_line(result)
    for b in result.evidence_blocks:
        console.print(f"[bold]{b.rank}. {escape(b.doc_id)}[/bold]", highlight=False)
        console.print(f"   {escape(b.breadcrumb)}", highlight=False)
        console.print(
            f"   {b.retrieval_layer}, similarity {b.similarity:.3f}, final {b.final_score:.3f}", highlight=False
        )
        if b.hit_reasons:
            console.print(f"   hit reasons: {escape(', '.join(b.hit_reasons))}", highlight=False)
        if b.doc_id in rerank:
            console.print(f"   rerank: {rerank[b.doc_id]}", highlight=False)


def print_compare(console: Console, comparison: StoreComparison) -> None:
    console.print(
        f"[bold]{comparison.query}[/bold]  sidecar: {comparison.sidecar_status}"
        + (f" ({comparison.sidecar_reason})" if comparison.sidecar_reason else "")
    )
    t = table(
        "rank", "milvus doc_id", "breadcrumb", "similarity", "pgvector doc_id", "breadcrumb", "similarity", "same"
    )
    for row in comparison.rows:
        m, p = row.main, row.sidecar
        t.add_row(
            str(row.rank),
            m.doc_id if m else "",
            m.breadcrumb if m else "",
            _score(m),
            p.doc_id if p else "",
            p.breadcrumb if p else "",
            _score(p),
            "=" if row.same_doc else "≠",
            style=None if row.same_doc else "bold yellow",
        )
    console.print(t)
    console.print(
        f"top-5 doc overlap (over the ranks filled): {comparison.overlap_at_5:.2f}  "
        f"(raw scores are not comparable: {comparison.score_labels})"
    )


def _score(c: CandidateRow | None) -> str:
    """``similarity (raw score and the first part of its label)``; empty past a store's last rank."""
    if c is None:
        return ""
    return f"{c.similarity:.3f} ({c.raw_score:.3f} {c.score_label.split('[')[0]})"
