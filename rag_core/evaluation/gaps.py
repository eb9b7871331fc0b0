"""The knowledge-gap report for the people who write the runbooks.

From the production suite (cases decided in ``rag eval review``) and its evaluation per store:
clusters of unanswerable queries (documents nobody wrote yet, with how often agents asked), and
accepted cases the tool missed or ranked low, each with the document that should have answered
and the query words that document lacks (candidate aliases or keywords for its frontmatter).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rag_core.evaluation.cases import GoldenCase, load_cases
from rag_core.evaluation.evaluator import EvaluationReport
from rag_core.fileio import write_text_atomic
from rag_core.ingest.documents import load_document
from rag_core.markdown import md_table
from rag_core.text import STOPWORDS, is_cjk, tokenize

__all__ = [
    "GapCluster",
    "MissedCase",
    "missed_cases",
    "render_gaps_markdown",
    "unanswerable_clusters",
    "write_gaps_report",
]

#: A first-hit rank above this counts as ranked low (the agent reads the first few blocks).
LOW_RANK = 3
# Two queries share a cluster when their content-word sets overlap this much (Jaccard): "set up the
# office printer" and "office printer setup on the third floor" share 2 of 7 stems (0.29).
_CLUSTER_OVERLAP = 0.25
_WORD = re.compile(r"[^\W\d_][\w-]*")


@dataclass
class GapCluster:
    """Unanswerable queries about one missing topic: ``count`` lookups in all, ``words`` the
    content words they share most (the topic's likely title words)."""

    case_ids: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    count: int = 0
    words: list[str] = field(default_factory=list)
    _terms: set[str] = field(default_factory=set, repr=False)


@dataclass(frozen=True)
class MissedCase:
    """An answerable case missed (``rank`` None) or ranked below ``LOW_RANK`` on ``stores``;
    ``lacking``: query words absent from ``expected_doc`` (title, frontmatter and body)."""

    case_id: str
    query: str
    expected_doc: str
    stores: tuple[str, ...]
    rank: int | None
    lacking: tuple[str, ...]


def unanswerable_clusters(cases: Sequence[GoldenCase], counts: Mapping[str, int]) -> list[GapCluster]:
    """The unanswerable ``cases`` grouped by shared content words, most asked first. ``counts``:
    case id -> lookups seen (its provenance count; 1 when absent)."""
    clusters: list[GapCluster] = []
    for case in (c for c in cases if c.unanswerable):
        terms = set(tokenize(case.query))
        best = max(clusters, key=lambda g: _jaccard(g._terms, terms), default=None)
        if best is None or _jaccard(best._terms, terms) < _CLUSTER_OVERLAP:
            best = GapCluster()
            clusters.append(best)
        best.case_ids.append(case.id)
        best.queries.append(case.query)
        best.count += counts.get(case.id, 1)
        best._terms |= terms
    for cluster in clusters:
        words = [w for q in cluster.queries for w in _words(q)]
        cluster.words = sorted(set(words), key=lambda w: (-words.count(w), w))[:5]
    return sorted(clusters, key=lambda g: (-g.count, g.queries[0]))


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def _words(query: str) -> list[str]:
    """The query's content words as written (Chinese runs split into words), stop words out."""
    out = []
    for word in _WORD.findall(query):
        parts = tokenize(word, keep_stopwords=True) if is_cjk(word) else [word]
        out += [p for p in parts if p.casefold() not in STOPWORDS and len(p) > 1]
    return out


def missed_cases(
    cases: Sequence[GoldenCase], reports: Mapping[str, EvaluationReport], knowledge_dir: Path
) -> list[MissedCase]:
    """The answerable ``cases`` some store of ``reports`` (store -> its evaluation) missed or
    ranked below ``LOW_RANK``, once per case with the stores named; the worst rank is shown.
    Documents are read from ``knowledge_dir`` (an unreadable one lacks nothing we can name)."""
    out = []
    for case in (c for c in cases if not c.unanswerable):
        results = {s: r for s, report in reports.items() for r in report.cases if r.case_id == case.id}
        low = {s: r.first_hit_rank for s, r in results.items() if r.hit_level != "not_run" and _low(r.first_hit_rank)}
        if not low:
            continue
        ranks = [r for r in low.values() if r is not None]
        doc = case.expected_docs[0]
        out.append(
            MissedCase(
                case_id=case.id,
                query=case.query,
                expected_doc=doc,
                stores=tuple(sorted(low)),
                rank=None if len(ranks) < len(low) else max(ranks),
                lacking=tuple(_lacking(case.query, knowledge_dir, doc)),
            )
        )
    return out


def _low(rank: int | None) -> bool:
    return rank is None or rank > LOW_RANK


def _lacking(query: str, knowledge_dir: Path, doc_id: str) -> list[str]:
    try:
        doc = load_document(knowledge_dir / doc_id, knowledge_dir)
    except (OSError, ValueError):
        return []
    text = " ".join([doc.title, *doc.keywords, *doc.aliases, *doc.entities, doc.body])
    known = set(tokenize(text, keep_stopwords=True))
    return list(dict.fromkeys(w for w in _words(query) if not set(tokenize(w, keep_stopwords=True)) <= known))


def render_gaps_markdown(clusters: Sequence[GapCluster], missed: Sequence[MissedCase]) -> str:
    """The report: missing topics (clusters, most asked first), then the missed or low-ranked
    cases with the frontmatter words to add."""
    parts = ["# Knowledge gaps", "", "## Questions no document answers", ""]
    if clusters:
        rows = [[g.count, ", ".join(g.words), "; ".join(g.queries[:3]), ", ".join(g.case_ids)] for g in clusters]
        parts.append(md_table(["lookups", "topic words", "queries", "cases"], rows))
    else:
        parts.append("None: no case was marked unanswerable.")
    parts += ["", f"## Answers the tool missed or ranked below {LOW_RANK}", ""]
    if missed:
        rows = [
            [m.case_id, m.query, m.expected_doc, ", ".join(m.stores), m.rank or "missed", ", ".join(m.lacking)]
            for m in missed
        ]
        headers = ["case", "query", "document that answers it", "stores", "rank", "words to add (aliases/keywords)"]
        parts.append(md_table(headers, rows))
    else:
        parts.append("None: every accepted case ranks its document in the first few.")
    return "\n".join(parts) + "\n"


def write_gaps_report(
    cases_file: Path, reports: Mapping[str, EvaluationReport], knowledge_dir: Path, path: Path
) -> Path:
    """Write the report of the production suite ``cases_file`` (its cases' ``provenance.count``
    give the lookups per unanswerable case) evaluated as ``reports`` to ``path``; returns it.
    Raises CaseFileError for an unusable case file."""
    cases = load_cases(cases_file)
    raw = yaml.safe_load(cases_file.read_text(encoding="utf-8"))
    counts = {
        str(c["id"]): int((c.get("provenance") or {}).get("count") or 1)
        for c in (raw["cases"] if isinstance(raw, dict) else raw)
    }
    markdown = render_gaps_markdown(unanswerable_clusters(cases, counts), missed_cases(cases, reports, knowledge_dir))
    return write_text_atomic(path, markdown)
