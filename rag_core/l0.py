"""L0: the keyword/frontmatter hint index.

Built from each document's frontmatter (title, category/domain, keywords, entities, aliases),
its first H1 and its path (file stem; the first folder is the category when frontmatter has
none). ``analyze_query`` returns hints only; it never answers a lookup on its own.

Matching works on :func:`rag_core.text.tokenize` tokens (NFKC, case, CamelCase split,
stemming, jieba for Chinese) and, for names written without spaces (CamelCase alert names,
Chinese terms), on a compact form: the text lower-cased with everything but letters and
digits removed, matched as a substring of the compact query.

A name (title, H1, stem, alias) matches when its compact form occurs in the query, or when
the IDF-weighted share of its tokens found in the query reaches ``NAME_COVERAGE`` (0.75):
parts shared by many names (``kube``, ``down``) weigh little, so "controller manager is
down" matches ``KubeControllerManagerDown`` without the ``kube`` prefix. IDF is the BM25
form log(1 + (N - n + 0.5) / (n + 0.5)) (Robertson & Zaragoza 2009) over the names.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from rag_core.models import KnowledgeDocument
from rag_core.text import normalize, tokenize

NAME_COVERAGE = 0.75
SUMMARY_CHARS = 600
_COMPACT = re.compile(r"[\W_]+", re.UNICODE)
# Compact names shorter than this match only as whole tokens (avoid "api" inside "rapid").
_MIN_COMPACT = 6


def compact(text: str) -> str:
    """Lower-case ``text`` with every non-alphanumeric character removed (NFKC first)."""
    return _COMPACT.sub("", normalize(text).lower())


@dataclass
class L0Entry:
    """What L0 knows of one document."""

    doc_id: str
    title: str
    category: str
    names: list[str]
    keywords: list[str] = field(default_factory=list)
    entities: list[str] = field(default_factory=list)
    priority: float | None = None
    summary: str = ""


@dataclass
class DocMatch:
    """One document L0 matched, with why (``title``, ``alias``, ``keyword:x``, ``entity:y``)."""

    doc_id: str
    title: str
    category: str
    score: float
    reasons: list[str]


@dataclass
class L0Hints:
    """Structured L0 hints for one query (JSON-ready with ``asdict``).

    ``domains`` are the nonblank categories of the documents matched by name, or of all
    matched documents when none matched by name (sorted; ``domains_from_names`` says which);
    ``matched_doc_ids`` are ordered by match score, best first.
    """

    matched_doc_ids: list[str] = field(default_factory=list)
    matched_titles: list[str] = field(default_factory=list)
    matched_keywords: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    entities: list[str] = field(default_factory=list)
    matches: list[DocMatch] = field(default_factory=list)
    domains_from_names: bool = False

    @property
    def matched(self) -> bool:
        return bool(self.matches)

    def match_for(self, doc_id: str) -> DocMatch | None:
        return next((m for m in self.matches if m.doc_id == doc_id), None)

    def to_dict(self) -> dict:
        return asdict(self)


class L0Index:
    """In-memory L0 index; ``save``/``load`` persist it as JSON in the data dir."""

    def __init__(self, entries: Iterable[L0Entry]):
        self.entries = {e.doc_id: e for e in entries}
        name_df: Counter[str] = Counter()
        for e in self.entries.values():
            for tok in {t for n in e.names for t in tokenize(n)}:
                name_df[tok] += 1
        n = max(1, len(self.entries))
        self._idf = {t: math.log(1 + (n - df + 0.5) / (df + 0.5)) for t, df in name_df.items()}
        self._default_idf = math.log(1 + (n + 0.5) / 0.5)
        self._names = {d: [self._name_form(name) for name in e.names] for d, e in self.entries.items()}

    def _name_form(self, name: str) -> tuple[str, frozenset[str], float]:
        """(compact form, coverage parts, their total IDF) of one name, computed once."""
        c, toks = _form(name)
        # The joined CamelCase form is the whole name; its parts carry the coverage.
        parts = frozenset(t for t in toks if t != c) or toks
        return c, parts, sum(self._idf.get(t, self._default_idf) for t in parts)

    @classmethod
    def build(cls, documents: Iterable[KnowledgeDocument]) -> L0Index:
        """Index documents: names are title, H1, file stem and aliases (deduplicated)."""
        entries = []
        for doc in documents:
            stem = Path(doc.doc_id).stem
            names = _unique([doc.title, doc.h1 or "", stem, *doc.aliases])
            entries.append(L0Entry(doc.doc_id, doc.title, doc.category, names,
                                   list(doc.keywords), list(doc.entities), doc.priority,
                                   summarize(doc.body)))
        return cls(entries)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(e) for e in self.entries.values()], ensure_ascii=False))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> L0Index:
        """Load a saved index; FileNotFoundError when ``rag ingest`` has not run yet."""
        return cls(L0Entry(**e) for e in json.loads(path.read_text()))

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def keywords(self) -> set[str]:
        return {k for e in self.entries.values() for k in e.keywords}

    @property
    def domains(self) -> set[str]:
        return {e.category for e in self.entries.values() if e.category}

    def analyze_query(self, query: str) -> L0Hints:
        """Hints for ``query``: matched documents (by name, keyword, entity) and their domains."""
        q_tokens = set(tokenize(query))
        q_compact = compact(query)
        matches: list[DocMatch] = []
        keywords: list[str] = []
        entities: list[str] = []
        for e in self.entries.values():
            reasons, score = [], 0.0
            name_score = max((self._name_score(f, q_tokens, q_compact) for f in self._names[e.doc_id]),
                             default=0.0)
            if name_score >= NAME_COVERAGE:
                reasons.append("title")
                score += 1.0 + name_score
            for kw in e.keywords:
                if self._term_in(kw, q_tokens, q_compact):
                    reasons.append(f"keyword:{kw}")
                    keywords.append(kw)
                    score += 0.5
            for ent in e.entities:
                if self._term_in(ent, q_tokens, q_compact):
                    reasons.append(f"entity:{ent}")
                    entities.append(ent)
                    score += 0.5
            if reasons:
                matches.append(DocMatch(e.doc_id, e.title, e.category, round(score, 4), reasons))
        matches.sort(key=lambda m: (-m.score, m.doc_id))
        # A matched name is a far stronger signal than a shared keyword: when any document
        # matched by name, only those documents' categories are domain hints.
        named = [m for m in matches if "title" in m.reasons] or matches
        return L0Hints(
            matched_doc_ids=[m.doc_id for m in matches],
            matched_titles=_unique(m.title for m in matches if "title" in m.reasons),
            matched_keywords=_unique(keywords),
            domains=sorted({m.category for m in named if m.category.strip()}),
            domains_from_names=any("title" in m.reasons for m in matches),
            entities=_unique(entities),
            matches=matches,
        )

    def _name_score(self, form: tuple[str, frozenset[str], float], q_tokens: set[str],
                    q_compact: str) -> float:
        c, parts, total = form
        if len(c) >= _MIN_COMPACT and c in q_compact:
            return 1.0
        if len(parts) < 2 or not total:
            return 0.0  # one-word names ("where is my order" -> "order") match only compactly
        found = parts & q_tokens
        return sum(self._idf.get(t, self._default_idf) for t in found) / total if found else 0.0

    @staticmethod
    def _term_in(term: str, q_tokens: set[str], q_compact: str) -> bool:
        c, toks = _form(term)
        if not c:
            return False
        if len(c) >= 2 and not c.isascii() and c in q_compact:
            return True  # Chinese (no spaces): substring of the query
        return bool(toks) and toks <= q_tokens


@lru_cache(maxsize=65536)
def _form(text: str) -> tuple[str, frozenset[str]]:
    """Compact form and token set of an index string (names and terms repeat every query)."""
    return compact(text), frozenset(tokenize(text))


def summarize(body: str, limit: int = SUMMARY_CHARS) -> str:
    """The first ``limit`` characters of a body without heading lines (L0 fallback evidence)."""
    lines = [ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
             and not set(ln.strip()) <= set("=-")]
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit].rstrip() + "…"


def _unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        item = item.strip()
        if item and item.lower() not in {s.lower() for s in seen}:
            seen[item] = None
    return list(seen)
