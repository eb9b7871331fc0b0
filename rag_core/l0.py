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

Lookups are indexed (issue 23), so a query's cost follows what it matches and returns, not the
corpus size. The index is over distinct names and terms, not documents: candidate names and
keywords/entities come from an Aho-Corasick automaton over the compact names and Chinese terms
(every one occurring in the compact query, in one pass: ``ahocorasick_rs``) and an inverted index
token -> names and terms; each candidate is checked once (a keyword shared by thousands of
documents is one check). Scoring is sparse: the postings of the names and terms that match are
concatenated and ``np.unique`` gives the matched documents, over which alone the scores are
computed (no per-query array over every document); the best ``MAX_MATCHES`` are picked with
``np.argpartition`` on one integer key (score, then doc id) and only those sorted.

A name is indexed under the prefix of its parts, rarest first, that any ``NAME_COVERAGE`` share
must touch (prefix filtering: Chaudhuri, Ganti & Kaushik 2006, "A primitive operator for
similarity joins in data cleaning", ICDE), so parts shared by thousands of names (``kube``) do
not make every one of them a candidate; a keyword or entity, which matches only with all its
tokens, under its rarest token.

The fuzzy pass compares each query span only with the distinct names of a length the typo guard
allows and, in a large index, only with those sharing enough character trigrams to reach the
cutoff (the q-gram count filter, ``_shared_grams``; the trigram postings of a length band are
found with one ``searchsorted`` and counted in one ``bincount``). It runs at ``FUZZY_CUTOFF``
first, whose trigram bound prunes more, and only after a hit looks for the names within
``FUZZY_MARGIN`` of the best.

The hints equal those of a scan over every document (``tests/l0_linear.py``, tested on the real
corpora, and on a generated index large enough for the trigram filter).
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import ahocorasick_rs
import numpy as np
from pydantic import Field
from rapidfuzz import fuzz, process

from rag_core.acronyms import AcronymTable, compounds_of
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
    compounds: list[str] = field(default_factory=list)  # rag_core.acronyms.compounds_of(body)


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


@dataclass
class _Scored:
    """One query's matches, sparse: ``positions`` ``(m,)`` are the matched documents' positions in
    index order (sorted), and each other array is ``(m,)`` over them: the best name score, the
    name match kind (exact, fuzzy, partial; at most one is True) and the match score. ``terms``
    are the matched term groups."""

    positions: np.ndarray
    name_score: np.ndarray
    exact: np.ndarray
    fuzzy: np.ndarray
    partial: np.ndarray
    scores: np.ndarray
    terms: list[int]


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
        # Fuzzy choices: each distinct compact name, long enough to be fuzzy-matched, with its
        # (scan order, doc id, display name) per document. One per (compact form, doc); the
        # identifier spelling (no spaces) wins, since it is what the transformer adds to the query
        # and what the lexical index holds joined.
        fuzzy: dict[tuple[str, str], str] = {}
        for d, e in self.entries.items():
            for form, name in zip(self._names[d], e.names, strict=True):
                if len(form[0]) >= FUZZY_MIN_LEN and form[0].isascii():
                    key = (form[0], d)
                    if key not in fuzzy or " " in fuzzy[key]:
                        fuzzy[key] = name
        by_name: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
        for order, ((c, d), name) in enumerate(fuzzy.items()):
            by_name[c].append((order, d, name))
        # Sorted by length: a span is compared with the names its length guard allows only.
        self._fuzzy_sorted = sorted(by_name, key=lambda c: (len(c), by_name[c][0][0]))
        self._fuzzy_docs = [by_name[c] for c in self._fuzzy_sorted]
        self._fuzzy_lens = [len(c) for c in self._fuzzy_sorted]
        self._exact_names = set(self._fuzzy_sorted)
        self._fuzzy_array = np.array(self._fuzzy_sorted, dtype=object)
        self._fuzzy_grams = _GramIndex(self._fuzzy_sorted)
        self._pos = {d: i for i, d in enumerate(self.entries)}
        self._category_forms = [(cat, *_form(cat)) for cat in sorted(self.domains)]
        self._build_candidate_index()

    def _build_candidate_index(self) -> None:
        """The candidate indexes of ``analyze_query`` (module docstring), over distinct names and
        terms rather than documents: a query scores each distinct name form and keyword/entity
        once and adds the scores to its documents with numpy, so a name or keyword shared by
        thousands of documents costs one check, not thousands. Substrings (compact names of
        ``_MIN_COMPACT``+ characters, compact Chinese terms) -> groups, searched with one
        Aho-Corasick automaton; token -> groups."""
        ids = list(self.entries)
        self._ids = ids
        self._id_rank = np.argsort(np.argsort(np.array(ids, dtype=object)))  # rank in doc-id order
        self._categories = sorted({e.category for e in self.entries.values()})
        cat_pos = {c: i for i, c in enumerate(self._categories)}
        self._cat_of = np.array([cat_pos[e.category] for e in self.entries.values()], dtype=np.int32)
        # (term, compact form, tokens) of every keyword and entity of a document, computed once.
        self._term_forms = {
            d: ([(t, *_form(t)) for t in e.keywords], [(t, *_form(t)) for t in e.entities])
            for d, e in self.entries.items()
        }
        name_docs: dict[tuple[str, frozenset[str], float], list[int]] = defaultdict(list)
        # (kind, term) -> doc positions, one per occurrence (a repeated keyword counts twice, as in the scan).
        term_docs: dict[tuple[str, str], list[int]] = defaultdict(list)
        term_first: dict[tuple[str, str], tuple[int, int]] = {}  # where the scan first meets a term
        for i, d in enumerate(ids):
            for form in dict.fromkeys(self._names[d]):
                name_docs[form].append(i)
            for kind, forms in zip(("keyword", "entity"), self._term_forms[d], strict=True):
                for pos, (t, _, _) in enumerate(forms):
                    term_docs[kind, t].append(i)
                    term_first.setdefault((kind, t), (i, pos))
        self._name_groups = list(name_docs)
        self._name_group_docs = _Postings([name_docs[f] for f in self._name_groups])
        self._term_groups = [(kind, t, *_form(t)) for kind, t in term_docs]
        self._term_group_docs = _Postings(list(term_docs.values()))
        self._term_first = list(term_first.values())
        term_df: Counter[str] = Counter()
        for (_, t), docs in term_docs.items():
            term_df.update({tok: len(docs) for tok in _form(t)[1]})
        substrings: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        postings: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        for g, (c, parts, total) in enumerate(self._name_groups):
            if len(c) >= _MIN_COMPACT:
                substrings[c][0].append(g)
            if len(parts) >= 2 and total:
                for tok in self._name_prefix(parts, total):
                    postings[tok][0].append(g)
        for g, (_, _, c, toks) in enumerate(self._term_groups):
            if len(c) >= 2 and not c.isascii():
                substrings[c][1].append(g)
            if c and toks:
                postings[min(toks, key=lambda t: (term_df[t], t))][1].append(g)
        self._patterns = list(substrings)
        self._pattern_groups = [substrings[p] for p in self._patterns]
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

    def _candidate_groups(self, q_tokens: set[str], q_compact: str) -> tuple[set[int], set[int]]:
        """(name groups, term groups) that may match: a superset of those that do."""
        names: set[int] = set()
        terms: set[int] = set()
        hits = [self._postings[t] for t in q_tokens if t in self._postings]
        if self._automaton is not None and q_compact:
            found = {m[0] for m in self._automaton.find_matches_as_indexes(q_compact, overlapping=True)}
            hits += [self._pattern_groups[j] for j in found]
        for n, t in hits:
            names.update(n)
            terms.update(t)
        return names, terms

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
                    compounds_of(doc.body),
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

    @cached_property
    def acronyms(self) -> AcronymTable:
        """The acronyms of the documents' compound terms (``rag_core.acronyms``); the index's
        names, keywords, entities and summaries are the vocabulary an acronym must not be in.
        Built on first use and kept (0.6 s at 100k documents)."""
        vocabulary = (t for e in self.entries.values() for t in (*e.names, *e.keywords, *e.entities, e.summary))
        return AcronymTable({d: e.compounds for d, e in self.entries.items()}, vocabulary)

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
        scored = self._score(q_tokens, q_compact, fuzzy)
        found = {self._term_groups[g][:2] for g in scored.terms}
        best = [
            self._match(int(scored.positions[k]), float(scored.name_score[k]), float(scored.scores[k]), fuzzy, found)
            for k in self._top(scored).tolist()
        ]
        fuzzy_names = {
            n for i in scored.positions[scored.fuzzy].tolist() for n in (self._entry(i).title, *self._entry(i).names)
        }
        corrections = {span: name for span, name in corrections.items() if name in fuzzy_names}
        named_categories = self._named_categories(q_tokens, q_compact)
        # A whole-name match is a far stronger signal than a partial one, and both than a shared
        # keyword: domain hints come from the strongest kind present.
        strong = scored.exact | scored.fuzzy
        by_name = next((scored.positions[m] for m in (strong, scored.partial) if m.any()), scored.positions)
        categories = {self._categories[c] for c in np.unique(self._cat_of[by_name]).tolist()}
        terms = [self._term_groups[g][:2] for g in sorted(scored.terms, key=self._term_first.__getitem__)]
        return L0Hints(
            matched_doc_ids=[m.doc_id for m in best],
            matched_titles=_unique(m.title for m in best if m.name_kind),
            matched_keywords=_unique(t for kind, t in terms if kind == "keyword"),
            domains=sorted({c for c in categories if c.strip()} | set(named_categories)),
            domains_from_names=bool(strong.any()),
            entities=_unique(t for kind, t in terms if kind == "entity"),
            matches=best,
            match_count=len(scored.positions),
            named_categories=named_categories,
            alert_names=alerts,
            metric_names=metrics,
            corrections=corrections,
        )

    def _score(self, q_tokens: set[str], q_compact: str, fuzzy: Mapping[str, float]) -> _Scored:
        """The matched documents of a query and their scores, by the scan's rules (``_match``):
        each distinct name and term is checked once, and only the postings of those that match
        are touched (no array over every document)."""
        name_groups, term_groups = self._candidate_groups(q_tokens, q_compact)
        named, name_scores = [], []
        for g in name_groups:
            score = self._name_score(self._name_groups[g], q_tokens, q_compact)
            if score >= NAME_COVERAGE:  # below it a name adds no reason
                named.append(self._name_group_docs[g])
                name_scores.append(score)
        terms = [g for g in term_groups if _form_in(*self._term_groups[g][2:], q_tokens, q_compact)]
        termed = [self._term_group_docs[g] for g in terms]
        fuzzy_pos = np.array([self._pos[d] for d in fuzzy], dtype=np.int32)
        # One array of every posting touched: names, then fuzzy documents, then terms.
        sizes = [len(x) for x in named]
        n_named, n_fuzzy = sum(sizes), len(fuzzy_pos)
        touched = np.concatenate([*named, fuzzy_pos, *termed])
        positions, inverse = np.unique(touched, return_inverse=True)
        m = len(positions)
        name_score = np.zeros(m)
        np.maximum.at(name_score, inverse[:n_named], np.repeat(name_scores, sizes))
        fuzzy_at = inverse[n_named : n_named + n_fuzzy]
        term_count = np.bincount(inverse[n_named + n_fuzzy :], minlength=m)
        exact = name_score >= 1.0
        is_fuzzy = np.zeros(m, dtype=bool)
        is_fuzzy[fuzzy_at] = True
        is_fuzzy &= ~exact
        partial = ~exact & ~is_fuzzy & (name_score >= NAME_COVERAGE)
        fuzzy_part = np.zeros(m)
        fuzzy_part[fuzzy_at] = [1.0 + r / 100 for r in fuzzy.values()]
        name_part = np.where(exact, 2.0, np.where(is_fuzzy, fuzzy_part, np.where(partial, 1.0 + name_score, 0.0)))
        scores = _scan_scores(name_part, term_count)
        return _Scored(positions, name_score, exact, is_fuzzy, partial, scores, terms)

    def _top(self, scored: _Scored) -> np.ndarray:
        """Indexes into ``scored`` of the best ``MAX_MATCHES`` matches, by score then doc id: a
        partial selection over one integer key, then a sort of the selected."""
        # Scores are rounded to 4 decimals (``_scan_scores``), so 1e4 x score is an exact integer.
        key = np.rint(scored.scores * -1e4).astype(np.int64) << 32 | self._id_rank[scored.positions]
        if len(key) > MAX_MATCHES:
            picked = np.argpartition(key, MAX_MATCHES - 1)[:MAX_MATCHES]
            return picked[np.argsort(key[picked])]
        return np.argsort(key)

    def _entry(self, pos: int) -> L0Entry:
        return self.entries[self._ids[pos]]

    def _match(
        self,
        pos: int,
        name_score: float,
        score: float,
        fuzzy: Mapping[str, float],
        found: set[tuple[str, str]],
    ) -> DocMatch:
        """The ``DocMatch`` of a matched document (at ``pos`` in index order, its ``score`` from
        ``_score``), its reasons in the scan's order: the name's, then each keyword and entity
        found in the query (``found``: the matched ``(kind, term)`` groups)."""
        e = self._entry(pos)
        reasons = []
        if name_score >= 1.0:
            reasons.append("title")
        elif e.doc_id in fuzzy:
            reasons.append(f"title~fuzzy:{fuzzy[e.doc_id] / 100:.2f}")
        elif name_score >= NAME_COVERAGE:
            reasons.append(f"title~partial:{name_score:.2f}")
        kw_forms, ent_forms = self._term_forms[e.doc_id]
        for kind, forms in (("keyword", kw_forms), ("entity", ent_forms)):
            reasons += [f"{kind}:{term}" for term, _, _ in forms if (kind, term) in found]
        # Built from checked values: construct skips pydantic's validation.
        return DocMatch.model_construct(
            doc_id=e.doc_id, title=e.title, category=e.category, score=score, reasons=reasons
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
        if not self._fuzzy_sorted:
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
            hit = self._fuzzy_best(span)
            if hit is not None and hit[1] > best.get(hit[0], 0.0):
                best[hit[0]] = round(hit[1], 1)
                corrections[span] = hit[2]
        return best, corrections

    def _fuzzy_best(self, span: str) -> tuple[str, float, str] | None:
        """``(doc id, ratio, name)`` of the one document whose name ``span`` is a typo of, or
        None: no name within ``FUZZY_CUTOFF``, or another document's name within ``FUZZY_MARGIN``
        of the best (ambiguous; documents sharing the best name tie)."""
        # Most spans are no typo of any name: a first pass at the cutoff (whose trigram bound is
        # stricter than the margin's) settles them. After a hit, only names within the margin of
        # the best can tie or make it ambiguous: the second pass looks for those alone.
        first = self._fuzzy_hits(span, FUZZY_CUTOFF)
        if not first:
            return None
        top = max(score for score, _ in first)
        hits = self._fuzzy_hits(span, top - FUZZY_MARGIN)
        tops = [(order, d, name) for score, j in hits if score == top for order, d, name in self._fuzzy_docs[j]]
        doc_id = tops[0][1]
        if any(d != doc_id for _, d, _ in tops):
            return None
        for score, j in hits:
            if top > score > top - FUZZY_MARGIN and any(d != doc_id for _, d, _ in self._fuzzy_docs[j]):
                return None
        return doc_id, top, min(tops)[2]

    def _fuzzy_hits(self, span: str, cutoff: float) -> list[tuple[float, int]]:
        """``[(fuzz.ratio, choice index)]`` of the distinct names within ``cutoff`` of ``span``
        whose length the typo guard allows (else a prefix, not a typo)."""
        return [
            (score, j)
            for j, score in self._fuzzy_scores(span, cutoff)
            if abs(len(self._fuzzy_sorted[j]) - len(span)) <= max(2.0, FUZZY_LENGTH_SLACK * len(self._fuzzy_sorted[j]))
        ]

    def _fuzzy_scores(self, span: str, cutoff: float) -> list[tuple[int, float]]:
        """``[(choice index, fuzz.ratio)]`` of the distinct names within ``cutoff``, among those
        whose length the typo guard allows for ``span`` (a superset: the caller applies the exact
        guard)."""
        n = len(span)
        lo = math.floor(min(n - 2.0, n / (1 + FUZZY_LENGTH_SLACK)))
        hi = math.ceil(max(n + 2.0, n / (1 - FUZZY_LENGTH_SLACK)))
        start, end = bisect_left(self._fuzzy_lens, lo), bisect_right(self._fuzzy_lens, hi)
        if start >= end:
            return []
        picked = None
        if end - start >= _GRAM_FILTER_MIN:
            lengths = range(self._fuzzy_lens[start], self._fuzzy_lens[end - 1] + 1)
            shared = min(_shared_grams(n, k, cutoff) for k in lengths)
            picked = self._fuzzy_grams.candidates(span, start, end, shared)
        if picked is None:
            choices, index = self._fuzzy_sorted[start:end], range(start, end)
        else:
            choices, index = self._fuzzy_array[picked].tolist(), picked.tolist()
        row = process.cdist([span], choices, scorer=fuzz.ratio, score_cutoff=cutoff)[0]
        return [(index[p], float(row[p])) for p in row.nonzero()[0]]

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


class _Postings:
    """Groups -> document positions, as one flat int32 array with offsets (CSR): about 4 bytes a
    posting instead of a Python list's 8 plus its int objects."""

    def __init__(self, lists: list[list[int]]) -> None:
        self._offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in lists], out=self._offsets[1:])
        self._flat = np.fromiter((i for x in lists for i in x), dtype=np.int32, count=int(self._offsets[-1]))

    def __getitem__(self, g: int) -> np.ndarray:
        return self._flat[self._offsets[g] : self._offsets[g + 1]]


_GRAM = 3
# Below this many choices in a span's length band one cdist over all of them is cheaper than the
# trigram filter (measured on 10k generated documents: 500 to 1000 alike, 2000 a quarter slower;
# the runbook corpora's bands hold under 100).
_GRAM_FILTER_MIN = 500


def _grams(text: str) -> list[str]:
    return [text[i : i + _GRAM] for i in range(len(text) - _GRAM + 1)]


def _shared_grams(m: int, n: int, cutoff: float) -> int:
    """The fewest character trigrams (counted with repeats) two strings of lengths ``m`` and
    ``n`` share when ``fuzz.ratio`` >= ``cutoff``, less one for float safety. The ratio is
    200 * LCS / (m + n); of the LCS's L - q + 1 q-grams, each run of characters outside the LCS
    breaks at most q - 1 in either string, so at least (2q - 1) L - (q - 1)(m + n) - q + 1 are
    q-grams of both (the q-gram count filter: Ukkonen 1992, "Approximate string-matching with
    q-grams and maximal matches", TCS 92)."""
    lcs = math.ceil(cutoff * (m + n) / 200 - 1e-9)
    return (2 * _GRAM - 1) * lcs - (_GRAM - 1) * (m + n) - _GRAM + 1 - 1


class _GramIndex:
    """Trigram -> sorted choice indexes: the q-gram count filter over a range of choices. The
    postings are one flat array keyed ``gram id << 32 | choice index`` (sorted), so one
    ``searchsorted`` finds every trigram's slice of a length band at once."""

    def __init__(self, choices: list[str]) -> None:
        postings: dict[str, list[int]] = defaultdict(list)
        for j, c in enumerate(choices):
            for g in dict.fromkeys(_grams(c)):
                postings[g].append(j)
        self._ids = {g: i for i, g in enumerate(postings)}
        keys = (np.int64(i) << 32 | np.array(v, dtype=np.int64) for i, v in enumerate(postings.values()))
        self._keys = np.concatenate(list(keys)) if postings else np.zeros(0, dtype=np.int64)
        self._choices = (self._keys & 0xFFFFFFFF).astype(np.int32)

    def candidates(self, span: str, start: int, end: int, shared: int) -> np.ndarray | None:
        """Sorted indexes in ``[start, end)`` whose trigrams include at least ``shared`` of
        ``span``'s (an upper bound of the shared count: each span occurrence counts once when the
        choice has that trigram); None when the filter cannot prune (``shared`` < 1)."""
        if shared < 1:
            return None
        # A trigram the span holds r times is counted r times: its slice is taken r times.
        ids = np.array([self._ids[g] for g in _grams(span) if g in self._ids], dtype=np.int64)
        bounds = np.searchsorted(self._keys, np.concatenate([ids << 32 | start, ids << 32 | end])).tolist()
        slices = [self._choices[a:b] for a, b in zip(bounds[: len(ids)], bounds[len(ids) :], strict=True)]
        if not slices:
            return np.zeros(0, dtype=np.int64)
        # Counted over [0, end) and cut (cheaper than shifting every posting by ``start``).
        counts = np.bincount(np.concatenate(slices), minlength=end)[start:]
        return np.flatnonzero(counts >= shared) + start


def _scan_scores(name_part: np.ndarray, term_count: np.ndarray) -> np.ndarray:
    """Match scores exactly as the per-document scan sums them: ``round(name part + 0.5 + 0.5
    ..., 4)``, one Python sum per distinct (name part, term count) pair."""
    if not len(name_part):
        return np.zeros(0)
    # A complex key sorts as one 1-D array (np.unique over axis=1 sorts rows as structures).
    pairs, inverse = np.unique(name_part + 1j * term_count, return_inverse=True)
    exact = []
    for pair in pairs.tolist():
        score = 0.0 + pair.real
        for _ in range(int(pair.imag)):
            score += 0.5
        exact.append(round(score, 4))
    return np.array(exact)[inverse]


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
