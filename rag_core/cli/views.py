"""Rich renderings of ingest reports, lookup results, store comparisons, servers and traces for
the CLI. Every value that comes from outside (paths, doc ids, breadcrumbs, queries, errors) goes
through ``rag_core.text.escape_controls`` and is printed without markup, so a file name or a stored
query cannot forge a line, recolour the terminal or clear it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rag_core.text import escape_controls

if TYPE_CHECKING:  # annotations only: `rag --help` stays light
    from rag_core.compare import CandidateRow, StoreComparison
    from rag_core.ingest.pipeline import IngestReport
    from rag_core.lookup.contracts import EvidenceBlock, LookupResult
    from rag_core.traces.rows import TraceRow


#: Terminal width from which lookup evidence is one table (its columns need about this).
WIDE_COLUMNS = 120
#: Lines of each evidence block's content ``rag lookup`` shows (the whole text: ``--json``).
EVIDENCE_LINES = 3
INDENT = 3


def table(*columns: str, title: str | None = None) -> Table:
    """A rich table whose cells wrap (fold) instead of being cut with an ellipsis: doc ids and
    breadcrumbs stay whole when the output is narrow or piped (rich assumes 80 columns then)."""
    t = Table(title=title)
    for column in columns:
        t.add_column(column, overflow="fold")
    return t


def plain(value: object) -> Text:
    """``value`` as text without markup, control characters escaped (``escape_controls``)."""
    return Text(escape_controls(str(value)))


def indented(text: str | Text, indent: int = INDENT, style: str = "") -> Padding:
    """``text`` indented by ``indent`` columns; its wrapped lines keep the indent (rich wraps
    the text inside the padding). A ``str`` is escaped (``plain``), a ``Text`` printed as is."""
    body = Text(escape_controls(text), style=style) if isinstance(text, str) else text
    return Padding(body, (0, 0, 0, indent), expand=False)


def record(console: Console, head: Text, fields: Iterable[tuple[str, object]]) -> None:
    """One record as a header line and ``name  value`` lines below it, indented: URIs, ids and
    paths stay whole on one line (folded only when longer than the terminal)."""
    console.print(head, overflow="fold")
    pairs = [(name, escape_controls(str(value))) for name, value in fields if value not in (None, "")]
    width = max((len(name) for name, _ in pairs), default=0)
    for name, value in pairs:
        console.print(indented(Text(f"{name:<{width}}  ", style="dim") + Text(value)), overflow="fold")


def print_ingest_report(console: Console, report: IngestReport) -> None:
    console.print(
        Text.assemble(
            ("Ingested ", "bold"),
            (escape_controls(str(report.knowledge_dir)), "bold"),
            f": {report.documents_ingested} of {report.documents_seen} documents, {report.chunks_total} chunks, "
            f"{report.chunks_embedded} embedded ({report.embedding_cache_hits} from the embedding cache)",
        )
    )
    t = table("store", "added", "updated", "removed", "unchanged")
    for name, c in report.stores.items():
        t.add_row(name, str(c.added), str(c.updated), str(c.removed), str(c.unchanged))
    console.print(t)
    for name, change in report.model_changed.items():
        console.print(
            f"[yellow]{name}: embedding model changed ({change}): every chunk re-embedded[/yellow]", highlight=False
        )
    # One line per file (file:line (heading): reason), so 1,000 bad files stay greppable; a line
    # break in a file name or a reason is written as \n, so it cannot forge a line of its own.
    for title, issues in (("skipped", report.skipped), ("warning (ingested)", report.warnings)):
        for issue in issues:
            console.print(f"{title}: {escape_controls(str(issue))}", highlight=False, markup=False, soft_wrap=True)
        if issues:
            console.print(f"{len(issues)} file(s) {title}", highlight=False)
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in report.stage_seconds.items())
    console.print(f"seconds per stage: {stages} (total {sum(report.stage_seconds.values()):.2f}s)")


def print_lookup(console: Console, result: LookupResult, wide: bool | None = None, explain: bool = False) -> None:
    """The answer first: the verdict (relevance, status, found, message), then one block per
    document (rank, doc id, breadcrumb, similarity, the first ``EVIDENCE_LINES`` lines of its
    evidence). ``explain`` adds how it was found: the attempts, fallback and sidecar, each
    block's hit reasons and rerank arithmetic, and the context pack. ``wide`` (default: a console
    of at least ``WIDE_COLUMNS``) puts the blocks in one table."""
    console.print(
        Text.assemble(
            (result.relevance_level.value, "bold"),
            f"  status {result.status}, found={result.found}, semanticSupport={result.semantic_support}, "
            f"layer {result.retrieval_trace.layer}",
        )
    )
    console.print(indented(result.message))
    if explain:
        _print_attempts(console, result)
    if not result.evidence_blocks:
        return
    wide = console.width >= WIDE_COLUMNS if wide is None else wide
    (print_blocks_table if wide else print_blocks_stacked)(console, result, explain)
    pack = result.context_pack
    if explain:
        console.print(
            Panel(
                Text(
                    "\n".join(
                        escape_controls(line.expandtabs(4)) for line in (pack.packed_text or "(empty)").splitlines()
                    )
                ),
                title=f"context pack {pack.used_chars}/{pack.char_budget} chars",
                subtitle=escape_controls(result.completeness_hint),
            )
        )
    else:
        console.print(
            f"context pack {pack.used_chars}/{pack.char_budget} chars; --explain: how it was found and ranked",
            highlight=False,
            style="dim",
        )


def _print_attempts(console: Console, result: LookupResult) -> None:
    rt = result.retrieval_trace
    for a in rt.attempts:
        console.print(
            indented(
                f"attempt {a.attempt}: filter={a.filter!r} candidates={a.candidate_count} "
                f"top={a.top_similarity} {a.duration_ms:.1f} ms"
                + (f" low quality: {a.low_quality_reason}" if a.low_quality_reason else "")
                + (f" error: {a.error}" if a.error else ""),
                INDENT + 2,
            )
        )
    if rt.fallback_reason:
        console.print(indented(f"fallback: {rt.fallback_reason}", INDENT + 2))
    if rt.sidecar.status != "disabled":
        side = f"sidecar: {rt.sidecar.status} {rt.sidecar.reason or ''} {', '.join(rt.sidecar.top_doc_ids)}"
        console.print(indented(side, INDENT + 2))


def _rerank_line(result: LookupResult) -> dict[str, str]:
    """doc id -> ``"dense+0.312, title+0.050 (rank 3->1)"`` of its rerank trace entry."""
    lines = {}
    for r in result.rerank_trace:
        contrib = ", ".join(f"{k}+{v:.3f}" for k, v in r.contributions.items())
        lines[r.doc_id] = f"{contrib} (rank {r.rank_before}->{r.rank_after})".strip()
    return lines


def evidence_lines(block: EvidenceBlock, count: int = EVIDENCE_LINES) -> list[str]:
    """The first ``count`` non-blank lines of ``block``'s content, tabs expanded, controls escaped."""
    lines = [line.expandtabs(4).rstrip() for line in block.content.splitlines() if line.strip()]
    return [escape_controls(line) for line in lines[:count]]


def print_blocks_table(console: Console, result: LookupResult, explain: bool = False) -> None:
    """The evidence blocks as one table (wide terminals); ``explain`` adds hit reasons and rerank."""
    rerank = _rerank_line(result)
    columns = ["#", "doc_id", "breadcrumb", "similarity", "evidence"] + (["hit reasons / rerank"] if explain else [])
    t = table(*columns)
    for b in result.evidence_blocks:
        row: list[str | Text] = [str(b.rank), plain(b.doc_id), plain(b.breadcrumb), f"{b.similarity:.3f}"]
        row.append(Text("\n".join(evidence_lines(b))))
        if explain:
            extra = rerank.get(b.doc_id)
            row.append(plain(", ".join(b.hit_reasons)) + Text(f"\n{extra}" if extra else ""))
        t.add_row(*row)
    console.print(t)


def print_blocks_stacked(console: Console, result: LookupResult, explain: bool = False) -> None:
    """Each evidence block as a short stanza (narrow terminals): rank and doc id, then its
    breadcrumb, similarity and first lines of evidence, indented; ``explain`` adds the layer,
    final score, hit reasons and rerank."""
    rerank = _rerank_line(result)
    for b in result.evidence_blocks:
        console.print(Text(f"{b.rank}. {escape_controls(b.doc_id)}", style="bold"), overflow="fold")
        console.print(indented(b.breadcrumb))
        console.print(indented(f"similarity {b.similarity:.3f}", style="dim"))
        for line in evidence_lines(b):
            console.print(indented(line, INDENT + 2))
        if explain:
            console.print(indented(f"{b.retrieval_layer}, final {b.final_score:.3f}", style="dim"))
            if b.hit_reasons:
                console.print(indented(f"hit reasons: {', '.join(b.hit_reasons)}", style="dim"))
            if b.doc_id in rerank:
                console.print(indented(f"rerank: {rerank[b.doc_id]}", style="dim"))


def print_servers(console: Console, rows: list[dict[str, object]], title: str) -> None:
    """One record per embedded server: name, state, pid, uptime and engine on the first line,
    its URI and data path whole below (``record``)."""
    console.print(title, style="bold")
    for r in rows:
        facts = ["running" if r["running"] else "not running"]
        facts += [f"pid {r['pid']}"] if r.get("pid") else []
        facts += [f"up {r['uptime_s']:.0f} s"] if isinstance(r.get("uptime_s"), float | int) else []
        facts += [f"{r.get('engine', '')} {r.get('engine_version', '')}".strip()] if r.get("engine") else []
        facts += ["in use" if r.get("in_use") else "not in use"]
        head = Text(f"{r['server']:<9}", style="bold") + Text(", ".join(facts))
        record(console, head, [("uri", r.get("uri")), ("data", r.get("db_path") or r.get("data_dir"))])


def print_traces(console: Console, rows: list[TraceRow]) -> None:
    """One record per tool invocation: time, status, layer, latency and session on the first line,
    the input (and the error) below it, each cut to one line (``--json`` gives them whole)."""
    for r in rows:
        latency = f"{r.latency_ms:.1f} ms" if r.latency_ms is not None else ""
        session = f"session {r.session_id}" if r.session_id else ""
        facts = [str(r.created_at)[:19], r.status or "", r.retrieval_layer or "", latency, session]
        console.print(plain("  ".join(f for f in facts if f)), overflow="ellipsis", no_wrap=True)
        console.print(indented(r.input or ""), overflow="ellipsis", no_wrap=True)
        if r.error:
            console.print(indented(f"error: {r.error}", style="red"), overflow="ellipsis", no_wrap=True)


def print_compare(console: Console, comparison: StoreComparison) -> None:
    console.print(
        Text.assemble(
            (escape_controls(comparison.query), "bold"),
            f"  sidecar: {comparison.sidecar_status}",
            f" ({escape_controls(comparison.sidecar_reason)})" if comparison.sidecar_reason else "",
        )
    )
    t = table(
        "rank", "milvus doc_id", "breadcrumb", "similarity", "pgvector doc_id", "breadcrumb", "similarity", "same"
    )
    for row in comparison.rows:
        m, p = row.main, row.sidecar
        t.add_row(
            str(row.rank),
            plain(m.doc_id) if m else "",
            plain(m.breadcrumb) if m else "",
            _score(m),
            plain(p.doc_id) if p else "",
            plain(p.breadcrumb) if p else "",
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
