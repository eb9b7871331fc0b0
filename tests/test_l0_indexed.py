"""The indexed L0 lookup answers exactly as the scan over every document did (issue 23).

Oracle: ``tests/l0_linear.py``, the pre-issue-23 loop kept verbatim. Queries are drawn from the
real corpora's own titles, H1s, file stems, keywords, entities and categories (with a letter
dropped, lower-cased and joined, or mixed with symptom words), not from golden files.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from l0_linear import LinearL0Index

from rag_core.ingest.documents import scan_documents
from rag_core.l0 import L0Index

CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"
ROOTS = [
    CORPORA / "prometheus-runbooks" / "content" / "runbooks",
    CORPORA / "kubesphere-runbooks-zh" / "content.zh" / "runbooks",
]


def _queries(docs: list, n: int = 150) -> list[str]:
    rng = random.Random(23)
    out = ["pods keep restarting after the deploy", "磁盘快满了怎么办", "证书过期", ""]
    for _ in range(n):
        d = rng.choice(docs)
        name = rng.choice([d.title, d.h1 or d.title, Path(d.doc_id).stem, *d.aliases])
        typo = name[:3] + name[4:] if len(name) > 8 else name
        terms = [*d.keywords, *d.entities, d.category]
        extra = rng.choice(terms) if terms else ""
        out += [name, typo, f"alert {typo.replace(' ', '')} firing on {extra}", f"{name.lower()} {extra} is failing"]
    return out


@pytest.fixture(scope="module")
def real_docs() -> list:
    if not all(r.is_dir() for r in ROOTS):
        pytest.skip(f"corpora not found under {CORPORA} (../shared/corpora)")
    docs = []
    for root in ROOTS:
        docs.extend(scan_documents(root)[0])
    return docs


def test_indexed_lookup_equals_the_linear_scan_on_the_real_corpora(real_docs) -> None:
    indexed = L0Index.build(real_docs)
    linear = LinearL0Index(indexed.entries.values())
    queries = _queries(real_docs)
    matched = 0
    for q in queries:
        new, old = indexed.analyze_query(q), linear.analyze_query(q)
        assert new.to_dict() == old.to_dict(), q
        matched += bool(new.matches)
    assert matched > len(queries) // 2  # the queries exercise matching, not only misses


def test_indexed_lookup_equals_the_scan_with_pasted_alert_and_metric_names(real_docs) -> None:
    indexed = L0Index.build(real_docs)
    linear = LinearL0Index(indexed.entries.values())
    for d in real_docs[:40]:
        stem = Path(d.doc_id).stem
        args = (f"firing: {d.title}", [stem, stem.lower()], ["node_filesystem_avail_bytes"])
        assert indexed.analyze_query(*args).to_dict() == linear.analyze_query(*args).to_dict()


def test_a_name_shared_by_many_documents_returns_the_best_matches_and_counts_all() -> None:
    from rag_core.l0 import MAX_MATCHES, L0Entry

    many = MAX_MATCHES * 3
    entries = [
        L0Entry(
            doc_id=f"svc{i:03d}/KubePodCrashLooping.md",
            title=f"svc{i:03d} KubePodCrashLooping",
            category="team-a" if i % 2 else "team-b",
            names=[f"svc{i:03d} KubePodCrashLooping", "KubePodCrashLooping"],
            keywords=["crashloop"] if i % 3 == 0 else [],
        )
        for i in range(many)
    ]
    indexed, linear = L0Index(entries), LinearL0Index(entries)
    hints = indexed.analyze_query("KubePodCrashLooping crashloop on svc007")
    assert hints.to_dict() == linear.analyze_query("KubePodCrashLooping crashloop on svc007").to_dict()
    assert hints.match_count == many and len(hints.matches) == len(hints.matched_doc_ids) == MAX_MATCHES
    scores = [m.score for m in hints.matches]
    assert scores == sorted(scores, reverse=True)
    # the keyword matches score above the title-only ones, so every one of them is kept
    assert {m.doc_id for m in hints.matches} >= {e.doc_id for e in entries if e.keywords}
    assert hints.domains == ["team-a", "team-b"] and hints.matched_keywords == ["crashloop"]


def _many_names(count: int) -> list:
    """``count`` entries whose CamelCase names (service + alert) crowd a few lengths, so a typo's
    length band holds more than ``_GRAM_FILTER_MIN`` names and the trigram filter runs."""
    from rag_core.l0 import L0Entry

    rng = random.Random(5)
    alerts = ["KubePodCrashLooping", "KubePodNotReady", "KubeNodeNotReady", "KubeJobFailed", "KubeletDown"]
    entries = []
    for i in range(count):
        service = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(6, 9))).capitalize()
        name = f"{service}{alerts[i % len(alerts)]}"
        entries.append(L0Entry(doc_id=f"{service.lower()}/{name}-{i}.md", title=name, category="k8s", names=[name]))
    return entries


def test_the_trigram_filter_of_a_large_index_answers_as_the_scan(monkeypatch) -> None:
    from rag_core.l0 import _GRAM_FILTER_MIN, _GramIndex

    filtered = []
    candidates = _GramIndex.candidates
    monkeypatch.setattr(_GramIndex, "candidates", lambda *a: filtered.append(a[1]) or candidates(*a))
    entries = _many_names(3 * _GRAM_FILTER_MIN)
    indexed, linear = L0Index(entries), LinearL0Index(entries)
    rng = random.Random(7)
    fuzzy = 0
    for e in rng.sample(entries, 25):
        j = rng.randrange(2, len(e.title) - 2)
        for q in (f"alert {e.title[:j] + e.title[j + 1 :]} firing", e.title.lower() + "x", e.title[:-3]):
            new = indexed.analyze_query(q)
            assert new.to_dict() == linear.analyze_query(q).to_dict(), q
            fuzzy += bool(new.corrections)
    assert fuzzy > 10  # typos matched, not only misses
    assert len(filtered) > 25  # through the trigram filter (the real corpora's tests: without it)


def test_the_trigram_filter_keeps_every_name_within_the_cutoff() -> None:
    from bisect import bisect_left, bisect_right

    from rapidfuzz import fuzz

    from rag_core.l0 import _GramIndex, _grams, _shared_grams

    names = sorted({e.title.lower() for e in _many_names(2000)}, key=len)
    lengths = [len(c) for c in names]
    grams, name_grams = _GramIndex(names), [set(_grams(c)) for c in names]
    rng = random.Random(11)
    checked = 0
    for name in rng.sample(names, 15):
        span = name[:5] + name[6:]
        start, end = bisect_left(lengths, len(span) - 2), bisect_right(lengths, len(span) + 2)
        for cutoff in (87.0, 90.0, 95.0):
            shared = min(_shared_grams(len(span), n, cutoff) for n in lengths[start:end])
            picked = grams.candidates(span, start, end, shared)
            assert picked is not None
            kept = set(picked.tolist())
            # the count filter exactly: the span's trigrams, with repeats, that the name holds
            counted = {j for j in range(start, end) if sum(g in name_grams[j] for g in _grams(span)) >= shared}
            assert kept == counted
            assert {j for j in range(start, end) if fuzz.ratio(span, names[j]) >= cutoff} <= kept
            checked += len(kept)
    assert checked > 15
