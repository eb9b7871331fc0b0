"""L0: the keyword/frontmatter hint index.

Built from each document's frontmatter (title, category/domain, keywords, entities, aliases),
its first H1 and its path (file stem; the first folder is the category when frontmatter has
none). ``analyze_query`` returns hints only; it never answers a lookup on its own.

Matching works on :func:`rag_core.text.tokenize` tokens (NFKC, case, CamelCase split,
stemming, jieba for Chinese) and, for names written without spaces (CamelCase alert names,
Chinese terms), on a compact form: the text lower-cased with everything but letters and
digits removed, matched as a substring of the compact query.

A name (title, H1, stem, alias) matches in one of three ways, recorded in the reason:

- ``title``: exact; its compact form occurs in the query ("kube pod crash looping"), or all of
  its word parts do (Chinese aliases whose words the query orders differently).
- ``title~fuzzy:0.97``: a run of one to ``FUZZY_MAX_WORDS`` query words, joined, is within
  typing distance of the compact name ("kubeshedulerdown", "etcdhighnumberoffailedgrpcrequest"):
  rapidfuzz ``fuzz.ratio`` (normalised Indel similarity) of at least ``FUZZY_CUTOFF``, both
  strings at least ``FUZZY_MIN_LEN`` characters, and no other document's name within
  ``FUZZY_MARGIN`` of the best (names such as KubePodNotReady / KubeNodeNotReady are 90 apart:
  a typo between two names is ambiguous and matches neither).
- ``title~partial:0.80``: the IDF-weighted share of its word parts found in the query reaches
  ``NAME_COVERAGE`` (0.75) without all of them: parts shared by many names (``kube``, ``down``)
  weigh little, so "controller manager is down" matches ``KubeControllerManagerDown``. IDF is
  the BM25 form log(1 + (N - n + 0.5) / (n + 0.5)) (Robertson & Zaragoza 2009) over the names.
  A partial match is a hint, never a reason to filter.

``named_categories`` are the index's categories the query names outright (all the category's
words, or its compact form for names like ``kube-state-metrics``).

Lookups are indexed (issue 23), so a query's cost follows what it matches, not the corpus size:
candidate documents come from an Aho-Corasick automaton over the compact names and Chinese terms
(every one occurring in the compact query, in one pass: ``ahocorasick_rs``), an inverted index
token -> documents, and the fuzzy pass, which compares each query span only with the names of a
length the typo guard allows. Only candidates are scored, with the same rules, in index order,
so the hints equal those of a scan over every document (``bench/l0_linear.py``, tested on the
real corpora). A name is indexed under the prefix of its parts, rarest first, that any
``NAME_COVERAGE`` share must touch (prefix filtering: Chaudhuri, Ganti & Kaushik 2006, "A
primitive operator for similarity joins in data cleaning", ICDE), so parts shared by thousands
of names (``kube``) do not make every one of them a candidate; a keyword or entity, which
matches only with all its tokens, under its rarest token.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import ahocorasick_rs
from pydantic import Field
from rapidfuzz import fuzz, process

from rag_core.fileio import write_text_atomic
from rag_core.models import CamelModel, KnowledgeDocument
from rag_core.text import normalize, tokenize

NAME_COVERAGE = 0.75
# Fuzzy name matching (rapidfuzz fuzz.ratio, 0-100). 90 allows one missing/extra letter in a
# 10-character name, about one per 10 characters in longer ones; below 10 characters too many
# ordinary words are that close to a name. The margin keeps a typo between two similar names
# (measured on the runbook corpus: distinct names reach 95) from picking either.
FUZZY_CUTOFF = 90.0
FUZZY_MARGIN = 3.0
FUZZY_MIN_LEN = 10
FUZZY_MAX_WORDS = 4
# Length guard: a typo changes a name's length by a letter or two; "alertmanager cluster" is
# 0.90 similar to AlertmanagerClusterDown by ratio alone but is a prefix, not a typo.
FUZZY_LENGTH_SLACK = 0.1
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+")
SUMMARY_CHARS = 600
_COMPACT = re.compile(r"[\W_]+", re.UNICODE)
# Compact names shorter than this match only as whole tokens (avoid "api" inside "rapid").
_MIN_COMPACT = 6
# Prefix filtering's float guard: a name's indexed prefix is kept a little longer than needed, so
# rounding in a sum of IDFs can never leave out a name the scan would match.
_PREFIX_EPS = 1e-6
# The best this many matches are returned (score, then doc id): a name shared by thousands of
# documents of a large knowledge base (one alert's runbook per service) would otherwise put every
# one of them into the result, the trace and the rerank's lookups. The runbook corpora's golden
# queries match at most 9 documents.
MAX_MATCHES = 50


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
    chunk_count: int | None = None  # chunks the document was split into (None: index older than the count)


class DocMatch(CamelModel):
    """One document L0 matched, with why (``title``, ``title~fuzzy:0.97``,
    ``title~partial:0.80``, ``keyword:x``, ``entity:y``)."""

    doc_id: str
    title: str
    category: str
    score: float
    reasons: list[str]

    @property
    def name_kind(self) -> str | None:
        """``exact``, ``fuzzy``, ``partial`` or None (matched by keyword/entity only)."""
        for r in self.reasons:
            if r == "title":
                return "exact"
            if r.startswith("title~"):
                return r[6:].split(":", 1)[0]
        return None

    @property
    def strong_name(self) -> bool:
        """Matched by its whole name, exactly or through a typo."""
        return self.name_kind in ("exact", "fuzzy")


class L0Hints(CamelModel):
    """Structured L0 hints for one query; in the result and the trace as camelCase JSON.

    ``domains`` are the nonblank categories of the documents matched by whole name (exact or
    fuzzy), else of those matched partially by name, else of all matched documents, plus the
    categories the query names outright (sorted; ``domains_from_names`` is True when a whole
    name matched). ``named_categories``: categories named outright. ``matched_doc_ids`` are
    ordered by match score, best first: the best ``MAX_MATCHES`` of ``match_count`` matches
    (``domains``, keywords and entities are of all of them). ``alert_names`` /
    ``metric_names`` are the names lifted from a pasted alert, label set or PromQL expression;
    ``corrections`` maps a query span to the document name it fuzzy-matched
    (``{"kubeshedulerdown": "KubeSchedulerDown"}``).
    """

    matched_doc_ids: list[str] = Field(default_factory=list)
    matched_titles: list[str] = Field(default_factory=list)
    matched_keywords: list[str] = Field(default_factory=list)
    domains: list[str] = Field(default_factory=list)
    entities: list[str] = Field(default_factory=list)
    matches: list[DocMatch] = Field(default_factory=list)
    match_count: int = 0
    domains_from_names: bool = False
    named_categories: list[str] = Field(default_factory=list)
    alert_names: list[str] = Field(default_factory=list)
    metric_names: list[str] = Field(default_factory=list)
    corrections: dict[str, str] = Field(default_factory=dict)

    @property
    def matched(self) -> bool:
        return bool(self.matches)

    def match_for(self, doc_id: str) -> DocMatch | None:
        return next((m for m in self.matches if m.doc_id == doc_id), None)

    def to_dict(self) -> dict[str, Any]:
        """camelCase JSON-ready dict."""
        return self.model_dump(mode="json")


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
        # Fuzzy choices: (compact name, doc id, display name), long enough to be fuzzy-matched.
        # One per (compact form, doc); the identifier spelling (no spaces) wins, since it is
        # what the transformer adds to the query and what the lexical index holds joined.
        fuzzy: dict[tuple[str, str], str] = {}
        for d, e in self.entries.items():
            for form, name in zip(self._names[d], e.names, strict=True):
                if len(form[0]) >= FUZZY_MIN_LEN and form[0].isascii():
                    key = (form[0], d)
                    if key not in fuzzy or " " in fuzzy[key]:
                        fuzzy[key] = name
        self._fuzzy = [(c, d, name) for (c, d), name in fuzzy.items()]
        self._exact_names = {c for c, _, _ in self._fuzzy}
        # The fuzzy choices by length (then index order): a span is compared with the names its
        # length guard allows only.
        by_len = sorted(range(len(self._fuzzy)), key=lambda j: (len(self._fuzzy[j][0]), j))
        self._fuzzy_order = by_len
        self._fuzzy_sorted = [self._fuzzy[j][0] for j in by_len]
        self._fuzzy_lens = [len(c) for c in self._fuzzy_sorted]
        self._order = {d: i for i, d in enumerate(self.entries)}
        self._category_forms = [(cat, *_form(cat)) for cat in sorted(self.domains)]
        self._build_candidate_index()

    def _build_candidate_index(self) -> None:
        """The candidate indexes of ``analyze_query`` (module docstring): substrings (compact
        names of ``_MIN_COMPACT``+ characters, compact Chinese terms) -> doc ids, searched with
        one Aho-Corasick automaton; token -> doc ids."""
        substrings: dict[str, set[str]] = defaultdict(set)
        postings: dict[str, set[str]] = defaultdict(set)
        # (term, compact form, tokens) of every keyword and entity, computed once.
        self._term_forms = {
            d: ([(t, *_form(t)) for t in e.keywords], [(t, *_form(t)) for t in e.entities])
            for d, e in self.entries.items()
        }
        term_forms = {d: [(c, toks) for _, c, toks in (*kws, *ents)] for d, (kws, ents) in self._term_forms.items()}
        term_df: Counter[str] = Counter(t for forms in term_forms.values() for _, toks in forms for t in toks)
        for d in self.entries:
            for c, parts, total in self._names[d]:
                if len(c) >= _MIN_COMPACT:
                    substrings[c].add(d)
                if len(parts) >= 2 and total:
                    for tok in self._name_prefix(parts, total):
                        postings[tok].add(d)
            for c, toks in term_forms[d]:
                if len(c) >= 2 and not c.isascii():
                    substrings[c].add(d)
                if c and toks:
                    postings[min(toks, key=lambda t: (term_df[t], t))].add(d)
        self._patterns = list(substrings)
        self._pattern_docs = [substrings[p] for p in self._patterns]
        self._automaton = ahocorasick_rs.AhoCorasick(self._patterns) if self._patterns else None
        self._postings = dict(postings)

    def _name_prefix(self, parts: frozenset[str], total: float) -> list[str]:
        """The parts of a name, rarest (highest IDF) first, up to where the remaining parts'
        IDF falls below the ``NAME_COVERAGE`` share: any match covers one of these."""
        prefix, rest = [], total
        for tok in sorted(parts, key=lambda t: (-self._idf.get(t, self._default_idf), t)):
            if rest < NAME_COVERAGE * total - _PREFIX_EPS * total:
                break
            prefix.append(tok)
            rest -= self._idf.get(tok, self._default_idf)
        return prefix

    def _candidates(self, q_tokens: set[str], q_compact: str, fuzzy: Mapping[str, float]) -> list[str]:
        """Doc ids that may match (a superset of the matches), in index order."""
        found: set[str] = set(fuzzy)
        for tok in q_tokens:
            found.update(self._postings.get(tok, ()))
        if self._automaton is not None and q_compact:
            for j in {m[0] for m in self._automaton.find_matches_as_indexes(q_compact, overlapping=True)}:
                found.update(self._pattern_docs[j])
        return sorted(found, key=self._order.__getitem__)

    def _name_form(self, name: str) -> tuple[str, frozenset[str], float]:
        """(compact form, coverage parts, their total IDF) of one name, computed once."""
        c, toks = _form(name)
        # The joined CamelCase form is the whole name; its parts carry the coverage.
        parts = frozenset(t for t in toks if t != c) or toks
        return c, parts, sum(self._idf.get(t, self._default_idf) for t in parts)

    @classmethod
    def build(cls, documents: Iterable[KnowledgeDocument], chunk_counts: Mapping[str, int] | None = None) -> L0Index:
        """Index documents: names are title, H1, file stem and aliases (deduplicated);
        ``chunk_counts`` maps doc id -> number of chunks (the rerank's document support)."""
        return cls(cls.entries_of(documents, chunk_counts))

    @staticmethod
    def entries_of(
        documents: Iterable[KnowledgeDocument], chunk_counts: Mapping[str, int] | None = None
    ) -> list[L0Entry]:
        """The ``L0Entry`` of each document, as ``build`` indexes them, without building the
        index (the streaming ingest writes entries batch by batch: ``save``'s JSON list)."""
        entries = []
        counts = chunk_counts or {}
        for doc in documents:
            stem = Path(doc.doc_id).stem
            names = _unique([doc.title, doc.h1 or "", stem, *doc.aliases])
            entries.append(
                L0Entry(
                    doc.doc_id,
                    doc.title,
                    doc.category,
                    names,
                    list(doc.keywords),
                    list(doc.entities),
                    doc.priority,
                    summarize(doc.body),
                    counts.get(doc.doc_id),
                )
            )
        return entries

    def save(self, path: Path) -> None:
        write_text_atomic(path, json.dumps([asdict(e) for e in self.entries.values()], ensure_ascii=False))

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

    def analyze_query(self, query: str, alert_names: Iterable[str] = (), metric_names: Iterable[str] = ()) -> L0Hints:
        """Hints for ``query``: matched documents (by name, keyword, entity) and their domains.

        ``alert_names`` and ``metric_names`` (lifted from a pasted alert or PromQL by the
        transformer) are matched as names too and reported in the hints.
        """
        alerts, metrics = _unique(alert_names), _unique(metric_names)
        text = " ".join([query, *alerts, *(m.replace("_", " ") for m in metrics)])
        q_tokens = set(tokenize(text))
        q_compact = compact(text)
        fuzzy, corrections = self._fuzzy_matches(text, q_compact)
        matches: list[DocMatch] = []
        keywords: list[str] = []
        entities: list[str] = []
        for doc_id in self._candidates(q_tokens, q_compact, fuzzy):
            e = self.entries[doc_id]
            reasons, score = [], 0.0
            name_score = max((self._name_score(f, q_tokens, q_compact) for f in self._names[e.doc_id]), default=0.0)
            if name_score >= 1.0:
                reasons.append("title")
                score += 2.0
            elif e.doc_id in fuzzy:
                reasons.append(f"title~fuzzy:{fuzzy[e.doc_id] / 100:.2f}")
                score += 1.0 + fuzzy[e.doc_id] / 100
            elif name_score >= NAME_COVERAGE:
                reasons.append(f"title~partial:{name_score:.2f}")
                score += 1.0 + name_score
            kw_forms, ent_forms = self._term_forms[doc_id]
            for kw, c, toks in kw_forms:
                if _form_in(c, toks, q_tokens, q_compact):
                    reasons.append(f"keyword:{kw}")
                    keywords.append(kw)
                    score += 0.5
            for ent, c, toks in ent_forms:
                if _form_in(c, toks, q_tokens, q_compact):
                    reasons.append(f"entity:{ent}")
                    entities.append(ent)
                    score += 0.5
            if reasons:
                # Built from checked values: construct skips pydantic's per-match validation
                # (a query can match thousands of documents of a large knowledge base).
                matches.append(
                    DocMatch.model_construct(
                        doc_id=e.doc_id, title=e.title, category=e.category, score=round(score, 4), reasons=reasons
                    )
                )
        matches.sort(key=lambda m: (-m.score, m.doc_id))
        fuzzy_names = {m.title for m in matches if m.name_kind == "fuzzy"} | {
            n for m in matches if m.name_kind == "fuzzy" for n in self.entries[m.doc_id].names
        }
        corrections = {span: name for span, name in corrections.items() if name in fuzzy_names}
        named_categories = self._named_categories(q_tokens, q_compact)
        # A whole-name match is a far stronger signal than a partial one, and both than a shared
        # keyword: domain hints come from the strongest kind present.
        by_name = [m for m in matches if m.strong_name] or [m for m in matches if m.name_kind == "partial"] or matches
        best = matches[:MAX_MATCHES]
        return L0Hints(
            matched_doc_ids=[m.doc_id for m in best],
            matched_titles=_unique(m.title for m in best if m.name_kind),
            matched_keywords=_unique(keywords),
            domains=sorted({m.category for m in by_name if m.category.strip()} | set(named_categories)),
            domains_from_names=any(m.strong_name for m in matches),
            entities=_unique(entities),
            matches=best,
            match_count=len(matches),
            named_categories=named_categories,
            alert_names=alerts,
            metric_names=metrics,
            corrections=corrections,
        )

    def _named_categories(self, q_tokens: set[str], q_compact: str) -> list[str]:
        """Categories the query names outright; a category whose name is part of another named
        one (``prometheus`` in ``prometheus-operator``) is dropped for the longer one."""
        named = []
        for cat, c, toks in self._category_forms:
            if not c:
                continue
            if (toks and toks <= q_tokens and len(toks) == 1) or (
                len(c) >= _MIN_COMPACT and len(toks) > 1 and c in q_compact
            ):
                named.append(cat)
        return sorted(c for c in named if not any(c != o and compact(c) in compact(o) for o in named))

    def _fuzzy_matches(self, text: str, q_compact: str) -> tuple[dict[str, float], dict[str, str]]:
        """``({doc_id: best ratio}, {query span: matched name})`` for typo'd names (see module)."""
        if not self._fuzzy:
            return {}, {}
        words = _ASCII_WORD.findall(normalize(text))
        spans: dict[str, None] = {}
        for n in range(1, FUZZY_MAX_WORDS + 1):
            for i in range(len(words) - n + 1):
                span = "".join(words[i : i + n]).lower()
                if len(span) >= FUZZY_MIN_LEN and span not in self._exact_names:
                    spans[span] = None
        if not spans:
            return {}, {}
        best: dict[str, float] = {}
        corrections: dict[str, str] = {}
        for span in spans:
            per_doc: dict[str, tuple[float, str]] = {}
            for j, score in self._fuzzy_scores(span):
                c, doc_id, name = self._fuzzy[j]
                if abs(len(c) - len(span)) > max(2.0, FUZZY_LENGTH_SLACK * len(c)):
                    continue  # a prefix or a longer phrase, not a typo of the name
                if score > per_doc.get(doc_id, (0.0, ""))[0]:
                    per_doc[doc_id] = (score, name)
            ranked = sorted(per_doc.items(), key=lambda kv: -kv[1][0])
            if not ranked or ranked[0][1][0] < FUZZY_CUTOFF:
                continue
            if len(ranked) > 1 and ranked[1][1][0] > ranked[0][1][0] - FUZZY_MARGIN:
                continue  # between two names: ambiguous
            doc_id, (score, name) = ranked[0]
            if score > best.get(doc_id, 0.0):
                best[doc_id] = round(score, 1)
                corrections[span] = name
        return best, corrections

    def _fuzzy_scores(self, span: str) -> list[tuple[int, float]]:
        """``[(choice index, fuzz.ratio)]`` of the choices within the cutoff less the margin,
        among those whose length the typo guard allows for ``span`` (a superset: the caller
        applies the exact guard), in choice-index order."""
        n = len(span)
        lo = math.floor(min(n - 2.0, n / (1 + FUZZY_LENGTH_SLACK)))
        hi = math.ceil(max(n + 2.0, n / (1 - FUZZY_LENGTH_SLACK)))
        start, end = bisect_left(self._fuzzy_lens, lo), bisect_right(self._fuzzy_lens, hi)
        if start >= end:
            return []
        row = process.cdist(
            [span], self._fuzzy_sorted[start:end], scorer=fuzz.ratio, score_cutoff=FUZZY_CUTOFF - FUZZY_MARGIN
        )[0]
        return sorted((self._fuzzy_order[start + int(p)], float(row[p])) for p in row.nonzero()[0])

    def _name_score(self, form: tuple[str, frozenset[str], float], q_tokens: set[str], q_compact: str) -> float:
        c, parts, total = form
        if len(c) >= _MIN_COMPACT and c in q_compact:
            return 1.0
        if len(parts) < 2 or not total:
            return 0.0  # one-word names ("where is my order" -> "order") match only compactly
        found = parts & q_tokens
        if found == parts:
            return 1.0
        return sum(self._idf.get(t, self._default_idf) for t in found) / total if found else 0.0

    @staticmethod
    def _term_in(term: str, q_tokens: set[str], q_compact: str) -> bool:
        return _form_in(*_form(term), q_tokens, q_compact)


def _form_in(c: str, toks: frozenset[str], q_tokens: set[str], q_compact: str) -> bool:
    """A keyword or entity (compact form ``c``, tokens ``toks``) occurs in the query."""
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
    lines = [
        ln
        for ln in body.splitlines()
        if ln.strip() and not ln.lstrip().startswith("#") and not set(ln.strip()) <= set("=-")
    ]
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit].rstrip() + "…"


def _unique(items: Iterable[str]) -> list[str]:
    """Stripped, nonblank ``items`` in order, the first of each case-insensitive spelling."""
    seen: dict[str, None] = {}
    lowered: set[str] = set()
    for item in items:
        item = item.strip()
        if item and item.lower() not in lowered:
            seen[item] = None
            lowered.add(item.lower())
    return list(seen)
