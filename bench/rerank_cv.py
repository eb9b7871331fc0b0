"""Cross-validation of the rerank: hand-set weights against a learned linear ranker, on the
known-item queries the corpora yield (``bench.known_items``), k-fold grouped by document.

1. **Features.** Every query runs through the real lookup pipeline (query transform, L0, dense +
   BM25 channels, RRF, document similarity, second model) on an ``InMemoryStore`` of its index
   (as ``bench.quality_floor`` does), and the post-processor's feature matrix
   (``KnowledgeEvidencePostProcessor.features``) is recorded with the fused candidate order.
   Records are cached under ``--cache`` (pickles keyed by index and the queries asked); delete
   them when the features change. Re-ranking a record offline with any weights reproduces the
   pipeline's document ranking (checked: ``parity``, hand weights against the ranking the
   pipeline returned).
2. **Model.** Pairwise logistic regression (RankNet-style linear pairwise model; Herbrich,
   Graepel & Obermayer 2000, "Large margin rank boundaries for ordinal regression"; scikit-learn
   ``LogisticRegression``, no intercept, L2 ``C``): for each query, the difference of the expected
   document's feature vector and every other candidate document's, each query weighing 1 in
   total. A document's vector is its best chunk's under the current weights (latent choice,
   re-chosen for ``ROUNDS`` rounds starting from the hand weights). One model for queries in the
   script of their candidates, one for the others (``LinearRanker``). Learned weights are scaled
   to the hand weights' L1 norm (ranking unchanged), so trace contributions read alike.
3. **CV.** ``GroupKFold`` by doc id (the same alert in both corpora is one group), ``--folds``;
   recall@5, MRR, nDCG@10 (``rag_core.evaluation.metrics``) per fold and in total per
   (query language -> corpus), hand vs learned on the same queries, with a paired Wilcoxon
   signed-rank test on the per-query reciprocal ranks (scipy).
4. ``--fit``: fit on every query and write the ranker JSON (``rag_core.lookup.ranker``) with how
   it was fitted and the CV figures; ``--suites``: the visible golden suites scored offline by
   both rankers as a check only (never fitted on).

Run: ``python -m bench.rerank_cv [--folds 5] [--fit] [--suites]``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import log, parse_command_line  # noqa: E402
from bench.known_items import EN, SEED, ZH, KnownItem, generate, index_dirs, size_table  # noqa: E402
from rag_core.evaluation.metrics import ndcg_at_k, recall_at_k, reciprocal_rank  # noqa: E402
from rag_core.lookup.postprocessor import KnowledgeEvidencePostProcessor, RerankWeights, keep_named  # noqa: E402
from rag_core.lookup.ranker import FEATURES, INDEX, RANKER_FORMAT, LinearRanker, shipped_ranker_path  # noqa: E402
from rag_core.markdown import md_table  # noqa: E402
from rag_core.settings import PROJECT_ROOT, RagSettings  # noqa: E402

CACHE = Path("/tmp/helper25/cv")
ROUNDS = 2
C = 1.0
MAX_BLOCKS = 5  # RagSettings.max_evidence_blocks default


@dataclass
class Record:
    """One query's rerank inputs: kept candidates' doc ids, RRF scores and feature matrix
    (len(kept), len(FEATURES)); flags; the doc ids of every fused candidate (ranking tail) and
    the pipeline's own doc ranking (evidence blocks then candidates)."""

    item_id: str
    docs: list[str]
    rrf: np.ndarray
    matrix: np.ndarray
    crosslingual: bool
    with_ensemble: bool
    named: set[str]
    tail: list[str]
    pipeline: list[str]
    # For offline variants (bench.symptom_cv): the kept candidates' chunk ids, the query vector
    # the pipeline searched with, its rewritten text and lexical terms.
    chunk_ids: list[str] = field(default_factory=list)
    query_vector: np.ndarray | None = None
    rewritten: str = ""
    lexical_terms: list[str] = field(default_factory=list)


@dataclass
class IndexDump:
    """Every chunk of one index as the pipeline saw it: ids, doc ids, embed texts (breadcrumb +
    text), breadcrumbs and the main model's (n, dim) unit vectors."""

    chunk_ids: list[str]
    doc_ids: list[str]
    texts: list[str]
    breadcrumbs: list[str]
    vectors: np.ndarray


def dedupe(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def rank(rec: Record, ranker: LinearRanker, max_blocks: int = MAX_BLOCKS, extra: np.ndarray | None = None) -> list[str]:
    """The pipeline's doc ranking of ``rec`` under ``ranker`` (postprocessor.process, then the
    candidates' docs in fused order; the pipeline's own ranking when nothing was kept).
    ``extra``: one more score per candidate chunk (shape ``(len(rec.docs),)``), added to the
    ranker's totals."""
    if not rec.docs:
        return rec.pipeline
    totals = rec.matrix @ ranker.weights(rec.crosslingual, rec.with_ensemble)
    if extra is not None:
        totals = totals + extra
    best: dict[str, tuple[float, float]] = {}
    order: dict[str, int] = {}
    for i, doc in enumerate(rec.docs):
        order.setdefault(doc, len(order) + 1)
        key = (float(totals[i]), float(rec.rrf[i]))
        if doc not in best or key > best[doc]:
            best[doc] = key
    scored = sorted(((best[d][0], order[d], d) for d in order), key=lambda s: (-s[0], s[1]))
    top = keep_named(scored, rec.named, max_blocks, key=lambda s: s[2])
    return dedupe([d for _, _, d in top] + rec.tail)


def doc_vectors(rec: Record, w: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Distinct docs of ``rec`` and the feature row of each one's best chunk under ``w``."""
    totals = rec.matrix @ w
    best: dict[str, int] = {}
    for i, doc in enumerate(rec.docs):
        if doc not in best or (totals[i], rec.rrf[i]) > (totals[best[doc]], rec.rrf[best[doc]]):
            best[doc] = i
    docs = list(best)
    return docs, rec.matrix[[best[d] for d in docs]]


def folded(rec: Record) -> Record:
    """``rec`` with the second model's column equal to the main one when it was off (what
    ``LinearRanker.weights`` does to the weights), so one weight vector fits both cases."""
    if rec.with_ensemble or not rec.docs:
        return rec
    matrix = rec.matrix.copy()
    matrix[:, INDEX["ensemble_dense"]] = matrix[:, INDEX["dense"]]
    return Record(**{**rec.__dict__, "matrix": matrix, "with_ensemble": True})


def fit_weights(
    records: Sequence[Record], expected: Sequence[str], start: np.ndarray, c: float = C, pairs: str = "all"
) -> np.ndarray:
    """Pairwise logistic weights (module docstring) over ``records`` whose expected doc is a
    candidate; ``start`` chooses each document's best chunk in the first round. ``pairs``:
    ``all`` weighs every (expected, other) pair of a query alike; ``delta-rr`` weighs a pair by
    how much swapping the two would change the reciprocal rank under the current weights
    (|1/r_expected - 1/r_other|, the LambdaRank weighting for MRR; Burges 2010, MSR-TR-2010-82).
    Each query weighs 1 in total. ``start`` when no record has a pair."""
    from sklearn.linear_model import LogisticRegression

    w = start
    for _ in range(ROUNDS):
        diffs, weights = [], []
        for rec, doc in zip(records, expected, strict=True):
            rec = folded(rec)
            docs, vectors = doc_vectors(rec, w)
            if doc not in docs or len(docs) < 2:
                continue
            pos = docs.index(doc)
            d = vectors[pos] - np.delete(vectors, pos, axis=0)
            if pairs == "delta-rr":
                ranks = np.empty(len(docs))
                ranks[np.argsort(-(vectors @ w), kind="stable")] = np.arange(1, len(docs) + 1)
                pair_w = np.abs(1.0 / ranks[pos] - 1.0 / np.delete(ranks, pos))
                pair_w = pair_w / pair_w.sum() if pair_w.sum() > 0 else np.full(len(d), 1.0 / len(d))
            else:
                pair_w = np.full(len(d), 1.0 / len(d))
            diffs += [d, -d]
            weights += [0.5 * pair_w] * 2
        if not diffs:
            return start
        x = np.vstack(diffs)
        y = np.concatenate([np.full(len(d), 1.0 - i % 2) for i, d in enumerate(diffs)])
        model = LogisticRegression(C=c, fit_intercept=False, max_iter=2000)
        model.fit(x, y, sample_weight=np.concatenate(weights))
        w = model.coef_[0] * (np.abs(start).sum() / max(1e-12, np.abs(model.coef_[0]).sum()))
    return np.asarray(w, dtype=np.float64)


def fit_ranker(
    records: Sequence[Record], items: Sequence[KnownItem], hand: LinearRanker, c: float = C, pairs: str = "all"
) -> LinearRanker:
    """A learned ``LinearRanker``: same-script weights fitted on the same-script records,
    cross-lingual ones on the others (the hand weights when a side has no records)."""
    sides = {}
    for xl in (False, True):
        pick = [i for i, r in enumerate(records) if r.crosslingual == xl and r.docs]
        start = hand.crosslingual if xl else hand.same_script
        sides[xl] = fit_weights([records[i] for i in pick], [items[i].doc_id for i in pick], start, c, pairs)
    return LinearRanker("learned", sides[False], sides[True], source=f"pairwise logistic regression, C={c}, {pairs}")


# --- features --------------------------------------------------------------------------------


def capture(
    items: Sequence[KnownItem], knowledge: Path, data: Path, shared: dict[str, Any]
) -> tuple[list[Record], IndexDump]:
    """A Record per item through the real pipeline on an in-memory index of ``knowledge``
    (embedding cache in ``data``; ``shared`` keeps the main embedder and the second model's and
    titles' vector caches across indexes), and the index's chunks."""
    from rag_core.embedding import make_embedder
    from rag_core.ingest.pipeline import ingest
    from rag_core.l0 import L0Index
    from rag_core.lookup.tool import LookupKnowledgeTool
    from rag_core.stores.memory import InMemoryStore

    settings = RagSettings(
        data_dir=data, knowledge_dir=knowledge, trace_enabled=False, sidecar_enabled=False, _env_file=None
    )
    if "embedder" not in shared:
        shared["embedder"] = make_embedder(settings)
    store = InMemoryStore()
    ingest(settings, shared["embedder"], [store], progress=False)
    tool = LookupKnowledgeTool(
        settings, store=store, embedder=shared["embedder"], l0=L0Index.load(settings.l0_index_path)
    )
    if "ensemble" in shared:  # the same chunk texts recur across held-out copies: embed once
        tool._ensemble, tool._ensemble_loaded, tool._documents = shared["ensemble"], True, shared["documents"]
    seen: list[Any] = []
    original = KnowledgeEvidencePostProcessor.features

    def spy(self: KnowledgeEvidencePostProcessor, *args: Any, **kw: Any) -> Any:
        seen.append(original(self, *args, **kw))
        return seen[-1]

    retrieved: list[Any] = []
    original_retrieve = tool._retrieve

    def spy_retrieve(tq: Any, timings: Any) -> Any:
        out = original_retrieve(tq, timings)
        retrieved.append((tq, out[0]))
        return out

    tool._retrieve = spy_retrieve  # type: ignore[method-assign]
    records = []
    KnowledgeEvidencePostProcessor.features = spy  # type: ignore[method-assign]
    try:
        for n, item in enumerate(items, start=1):
            seen.clear()
            retrieved.clear()
            result, candidates = tool.lookup_with_candidates(item.query)
            tq, outcome = retrieved[-1] if retrieved else (None, None)
            f = seen[-1] if seen else None
            kept = f.kept if f is not None else []
            records.append(
                Record(
                    item_id=item.id,
                    docs=[c.hit.doc_id for c in kept],
                    rrf=np.array([c.rrf for c in kept]),
                    matrix=f.matrix if f is not None else np.zeros((0, len(FEATURES))),
                    crosslingual=bool(f and f.crosslingual),
                    with_ensemble=bool(f and f.with_ensemble),
                    named=set(f.named) if f is not None else set(),
                    tail=dedupe(c.hit.doc_id for c in candidates),
                    pipeline=dedupe([b.doc_id for b in result.evidence_blocks] + [c.hit.doc_id for c in candidates]),
                    chunk_ids=[c.hit.chunk_id for c in kept],
                    query_vector=None if outcome is None else outcome.query_vector,
                    rewritten=tq.rewritten if tq is not None else "",
                    lexical_terms=list(tq.lexical_terms) if tq is not None else [],
                )
            )
            if n % 200 == 0:
                log(f"  {n}/{len(items)}")
    finally:
        KnowledgeEvidencePostProcessor.features = original  # type: ignore[method-assign]
    shared.setdefault("ensemble", tool.ensemble)
    shared.setdefault("documents", tool._documents)
    tool.close()
    ids = sorted(store.chunk_hashes())
    stored = store.fetch(ids)
    from rag_core.models import embed_text

    dump = IndexDump(
        chunk_ids=ids,
        doc_ids=[stored[i].doc_id for i in ids],
        texts=[embed_text(stored[i].breadcrumb, stored[i].text) for i in ids],
        breadcrumbs=[stored[i].breadcrumb for i in ids],
        vectors=np.vstack([stored[i].vector for i in ids]) if ids else np.zeros((0, 0), dtype=np.float32),
    )
    return records, dump


def cached_records(
    name: str, items: Sequence[KnownItem], knowledge: Path, data: Path, shared: dict[str, Any], root: Path
) -> list[Record]:
    """:func:`capture`, cached under ``root``/features by index name and the queries asked."""
    key = hashlib.sha1("\n".join(f"{i.id}\t{i.query}" for i in items).encode()).hexdigest()[:12]
    path = root / "features" / f"{name}-{key}.pkl"
    if path.is_file():
        with path.open("rb") as fh:
            records: list[Record] = _Unpickler(fh).load()
        return records
    t0 = time.perf_counter()
    log(f"features: {name} ({len(items)} queries)")
    records, dump = capture(items, knowledge, data, shared)
    log(f"features: {name} done in {time.perf_counter() - t0:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        pickle.dump(records, fh)
    with dump_path(name, root).open("wb") as fh:
        pickle.dump(dump, fh)
    return records


def dump_path(name: str, root: Path) -> Path:
    """Where :func:`cached_records` keeps the :class:`IndexDump` of index ``name``."""
    return root / "features" / f"{name}-chunks.pkl"


def load_dump(name: str, root: Path) -> IndexDump:
    """The :class:`IndexDump` of index ``name`` (written with its records)."""
    with dump_path(name, root).open("rb") as fh:
        dump: IndexDump = _Unpickler(fh).load()
    return dump


class _Unpickler(pickle.Unpickler):
    """Reads records pickled by ``python -m bench.rerank_cv`` (classes of ``__main__``) from any
    importer."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class("bench.rerank_cv" if module == "__main__" else module, name)


def data_dir_for(lang: str, root: Path) -> Path:
    """One data dir (embedding cache) per corpus language: held-out copies share most chunks."""
    data = root / f"data-{lang}"
    data.mkdir(parents=True, exist_ok=True)
    return data


def all_records(items: Sequence[KnownItem], root: Path) -> list[Record]:
    """Records of ``items`` in their order (features captured per index)."""
    dirs = index_dirs(items, root / "indexes")
    shared: dict[str, Any] = {}
    by_id: dict[str, Record] = {}
    for name, knowledge in dirs.items():
        part = [i for i in items if i.index == name]
        lang = name.split("-", 1)[0]
        for rec in cached_records(name, part, knowledge, data_dir_for(lang, root), shared, root):
            by_id[rec.item_id] = rec
    return [by_id[i.id] for i in items]


# --- evaluation --------------------------------------------------------------------------------


def per_query(records: Sequence[Record], expected: Sequence[Sequence[str]], ranker: LinearRanker) -> np.ndarray:
    """(n, 3): recall@5, reciprocal rank, nDCG@10 of each record under ``ranker``."""
    out = np.zeros((len(records), 3))
    for i, (rec, docs) in enumerate(zip(records, expected, strict=True)):
        ranking: list[str | None] = list(rank(rec, ranker))
        out[i] = (recall_at_k(ranking, docs, 5), reciprocal_rank(ranking, docs), ndcg_at_k(ranking, docs, 10))
    return out


def wilcoxon_p(a: np.ndarray, b: np.ndarray) -> float | None:
    """Two-sided Wilcoxon signed-rank p of paired ``a`` vs ``b`` (None when all pairs tie)."""
    from scipy.stats import wilcoxon

    if np.allclose(a, b):
        return None
    return float(wilcoxon(a, b, zero_method="wilcox").pvalue)


def group_of(item: KnownItem) -> str:
    return f"{item.language}->{item.corpus}"


def cross_validate(
    records: Sequence[Record],
    items: Sequence[KnownItem],
    hand: LinearRanker,
    folds: int,
    c: float = C,
    pairs: str = "all",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[LinearRanker]]:
    """Per-query figures (hand, learned) and the fold of each query, GroupKFold by doc id."""
    from sklearn.model_selection import GroupKFold

    groups = [i.doc_id for i in items]
    fold_of = np.zeros(len(items), dtype=int)
    hand_q = per_query(records, [[i.doc_id] for i in items], hand)
    learned_q = np.zeros_like(hand_q)
    rankers = []
    splitter = GroupKFold(n_splits=folds, shuffle=True, random_state=SEED)
    for k, (train, test) in enumerate(splitter.split(np.zeros(len(items)), groups=groups)):
        ranker = fit_ranker([records[i] for i in train], [items[i] for i in train], hand, c, pairs)
        rankers.append(ranker)
        learned_q[test] = per_query([records[i] for i in test], [[items[i].doc_id] for i in test], ranker)
        fold_of[test] = k
    return hand_q, learned_q, fold_of, rankers


def cv_tables(items: Sequence[KnownItem], hand_q: np.ndarray, learned_q: np.ndarray, fold_of: np.ndarray) -> str:
    """Markdown: totals per (query -> corpus) with the Wilcoxon p, then MRR per fold."""
    names = sorted({group_of(i) for i in items})
    member = {g: np.array([group_of(i) == g for i in items]) for g in names}
    member["all"] = np.ones(len(items), dtype=bool)
    rows = []
    for g in [*names, "all"]:
        m = member[g]
        h, lq = hand_q[m].mean(axis=0), learned_q[m].mean(axis=0)
        p = wilcoxon_p(hand_q[m, 1], learned_q[m, 1])
        rows.append(
            [
                f"{g} ({int(m.sum())})",
                *(f"{h[j]:.3f} / {lq[j]:.3f}" for j in range(3)),
                f"{lq[1] / max(h[1], 1e-9):.3f}x",
                "—" if p is None else f"{p:.2g}",
            ]
        )
    out = md_table(
        [
            "query -> corpus (n)",
            "recall@5 hand / learned",
            "MRR hand / learned",
            "nDCG@10 hand / learned",
            "MRR ratio",
            "Wilcoxon p (RR)",
        ],
        rows,
    )
    fold_rows = []
    for k in range(int(fold_of.max()) + 1):
        cells = []
        for g in [*names, "all"]:
            m = member[g] & (fold_of == k)
            cells.append(f"{hand_q[m, 1].mean():.3f} / {learned_q[m, 1].mean():.3f}" if m.any() else "—")
        fold_rows.append([str(k + 1), *cells])
    return out + "\n\nMRR per fold, hand / learned:\n\n" + md_table(["fold", *names, "all"], fold_rows)


def kind_table(items: Sequence[KnownItem], hand_q: np.ndarray, learned_q: np.ndarray) -> str:
    """MRR hand / learned per (query -> corpus, kind)."""
    rows = []
    cells: dict[tuple[str, str], list[int]] = defaultdict(list)
    for n, i in enumerate(items):
        cells[(group_of(i), i.kind)].append(n)
    for (g, kind), idx in sorted(cells.items()):
        rows.append(
            [
                g,
                kind,
                str(len(idx)),
                f"{hand_q[idx, 1].mean():.3f} / {learned_q[idx, 1].mean():.3f}",
                f"{hand_q[idx, 0].mean():.3f} / {learned_q[idx, 0].mean():.3f}",
            ]
        )
    return md_table(["query -> corpus", "kind", "n", "MRR hand / learned", "recall@5 hand / learned"], rows)


def weights_table(hand: LinearRanker, learned: LinearRanker) -> str:
    rows = [
        [
            f,
            f"{hand.same_script[j]:.3f}",
            f"{learned.same_script[j]:.3f}",
            f"{hand.crosslingual[j]:.3f}",
            f"{learned.crosslingual[j]:.3f}",
        ]
        for j, f in enumerate(FEATURES)
    ]
    return md_table(["feature", "hand", "learned", "hand (cross-lingual)", "learned (cross-lingual)"], rows)


# --- visible suites (check only) ----------------------------------------------------------------


def suite_records(root: Path) -> list[tuple[str, list[str], list[Record], list[list[str]]]]:
    """(suite, case ids, records, expected docs) of every visible golden suite that can run."""
    from rag_core.evaluation.cases import load_cases
    from rag_core.evaluation.suites import load_suites

    out = []
    shared: dict[str, Any] = {}
    for suite in load_suites():
        if suite.missing():
            continue
        cases = load_cases(suite.cases)
        items = [KnownItem(c.id, c.query, "", "", "", suite.name, "golden") for c in cases]
        lang = {EN.resolve(): "en", ZH.resolve(): "zh"}.get(suite.knowledge_dir.resolve(), f"suite-{suite.name}")
        data = data_dir_for(lang, root)
        records = cached_records(f"suite-{suite.name}", items, suite.knowledge_dir, data, shared, root)
        out.append((suite.name, [c.id for c in cases], records, [list(c.expected_docs) for c in cases]))
    return out


def suites_table(
    suites: Sequence[tuple[str, list[str], list[Record], list[list[str]]]], hand: LinearRanker, learned: LinearRanker
) -> str:
    rows = []
    for name, ids, records, expected in suites:
        h, lq = per_query(records, expected, hand), per_query(records, expected, learned)
        parity = sum(rank(r, hand) == r.pipeline for r in records)
        changed = [ids[i] for i in range(len(ids)) if h[i, 1] != lq[i, 1]]
        lost = sum(1 for i in range(len(ids)) if h[i, 0] > lq[i, 0])
        gained = sum(1 for i in range(len(ids)) if h[i, 0] < lq[i, 0])
        rows.append(
            [
                f"{name} ({len(ids)})",
                f"{h[:, 0].mean():.3f} / {lq[:, 0].mean():.3f}",
                f"{h[:, 1].mean():.3f} / {lq[:, 1].mean():.3f}",
                f"{h[:, 2].mean():.3f} / {lq[:, 2].mean():.3f}",
                f"-{lost} / +{gained}",
                f"{parity}/{len(ids)}",
                ", ".join(changed[:6]) + (" ..." if len(changed) > 6 else ""),
            ]
        )
    return md_table(
        [
            "visible suite (n)",
            "recall@5 hand / learned",
            "MRR hand / learned",
            "nDCG@10 hand / learned",
            "top-5 cases lost / gained",
            "hand parity",
            "cases whose first-hit rank moved",
        ],
        rows,
    )


# --- main --------------------------------------------------------------------------------------


def model_fingerprints() -> dict[str, Any]:
    """Fingerprints and ``backend:model`` keys of the default main and second models."""
    from rag_core import components

    settings = RagSettings(_env_file=None)
    main = components.make_embedder(settings)
    second = components.make_ensemble_embedder(settings)
    return {
        "models": {"main": main.fingerprint, "second": second.fingerprint if second else ""},
        "model_keys": {
            "main": f"{main.backend}:{main.model_id}",
            "second": f"{second.backend}:{second.model_id}" if second else "",
        },
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_command_line(
        __doc__,
        {
            "--folds": {"type": int, "default": 5},
            "--seed": {"type": int, "default": SEED, "help": "known-item generator seed"},
            "--c": {"type": float, "default": C, "help": "inverse L2 strength of the logistic regression"},
            "--cache": {"type": Path, "default": CACHE, "help": "features, embedding caches, held-out corpus copies"},
            "--pairs": {"default": "all", "choices": ["all", "delta-rr"], "help": "pair weighting (fit_weights)"},
            "--fit": {"action": "store_true", "help": "fit on every query and write the ranker file"},
            "--out": {
                "type": Path,
                "default": None,
                "help": "ranker file (default: the shipped one for the default models)",
            },
            "--suites": {"action": "store_true", "help": "also score the visible golden suites (check only)"},
        },
        argv,
    )
    items = generate(args.seed)
    print(f"Known-item queries (bench.known_items, seed {args.seed}):\n\n{size_table(items)}\n")
    records = all_records(items, args.cache)
    hand = RerankWeights().ranker()
    parity = sum(rank(r, hand) == r.pipeline for r in records)
    print(f"Offline hand ranking equals the pipeline's on {parity}/{len(records)} queries.\n")
    t0 = time.perf_counter()
    hand_q, learned_q, fold_of, _ = cross_validate(records, items, hand, args.folds, args.c, args.pairs)
    took = time.perf_counter() - t0
    print(f"## {args.folds}-fold CV grouped by document (C={args.c}, pairs {args.pairs}; {took:.0f} s)\n")
    cv = cv_tables(items, hand_q, learned_q, fold_of)
    print(cv + "\n\nBy kind:\n\n" + kind_table(items, hand_q, learned_q) + "\n")
    learned = fit_ranker(records, items, hand, args.c, args.pairs)
    print("Weights fitted on every query (L1-scaled to the hand weights):\n\n" + weights_table(hand, learned) + "\n")
    if args.suites:
        print("## Visible golden suites (check only, never fitted on)\n")
        print(suites_table(suite_records(args.cache), hand, learned) + "\n")
    if args.fit:
        ids = model_fingerprints()
        out = args.out or shipped_ranker_path(ids["model_keys"]["main"], ids["model_keys"]["second"])
        ranker = LinearRanker(
            "learned-pairwise-v1",
            learned.same_script,
            learned.crosslingual,
            meta={
                **ids,
                "version": 1,
                "fitted": {
                    "by": "python -m bench.rerank_cv --fit",
                    "date": time.strftime("%Y-%m-%d"),
                    "model": "pairwise logistic regression (scikit-learn LogisticRegression, no intercept, "
                    f"C={args.c}, pairs {args.pairs}), {ROUNDS} latent best-chunk rounds from the hand weights, "
                    "L1-scaled to the hand weights",
                    "data": f"bench.known_items seed {args.seed}: {len(items)} known-item queries generated from "
                    "the two runbook corpora (no golden case)",
                    "cv": f"{args.folds}-fold GroupKFold by doc id",
                    "cv_mrr": {
                        g: [round(float(hand_q[m, 1].mean()), 4), round(float(learned_q[m, 1].mean()), 4)]
                        for g in sorted({group_of(i) for i in items})
                        for m in [np.array([group_of(i) == g for i in items])]
                    },
                },
            },
        )
        import json

        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(ranker.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {out.relative_to(PROJECT_ROOT) if out.is_relative_to(PROJECT_ROOT) else out} ({RANKER_FORMAT})")


if __name__ == "__main__":
    main()
