"""Cross-validation of the rerank (``rag eval cv``): hand-set weights against a learned linear
ranker, on the known-item queries the corpora yield (:mod:`rag_core.evaluation.known_items`),
k-fold grouped by document.

1. **Features.** Every query runs through the real lookup pipeline (query transform, L0, dense +
   BM25 channels, RRF, document similarity, second model) on an ``InMemoryStore`` of its index,
   and the post-processor's feature matrix (``KnowledgeEvidencePostProcessor.features``) is
   recorded with the fused candidate order (:class:`Record`). Records are cached under the
   cache dir (pickles keyed by index and the queries asked: a trusted, local cache; delete it
   when the features or the models change). Re-ranking a record offline with any weights
   reproduces the pipeline's document ranking (``parity``: hand weights against the ranking
   the pipeline returned).
2. **Model.** Pairwise logistic regression (RankNet-style linear pairwise model; Herbrich,
   Graepel & Obermayer 2000, "Large margin rank boundaries for ordinal regression";
   scikit-learn ``LogisticRegression``, no intercept, L2 ``C``): for each query, the difference
   of the expected document's feature vector and every other candidate document's, each query
   weighing 1 in total. A document's vector is its best chunk's under the current weights
   (latent choice, re-chosen for ``ROUNDS`` rounds starting from the hand weights). One weight
   vector for queries in the script of their candidates and one for the others, or
   (``split="script"``) one per query script too (``LinearRanker.by_script``). Learned weights
   are scaled to the hand weights' L1 norm (ranking unchanged), so trace contributions read
   alike; ``shrink`` < 1 keeps that share of the way from the hand weights to the learned ones.
3. **CV.** ``GroupKFold`` by doc id (the same alert in both corpora is one group); recall@5, MRR,
   nDCG@10 (:mod:`rag_core.evaluation.metrics`) per fold and in total per (query language ->
   corpus), hand vs learned on the same queries, with a paired Wilcoxon signed-rank test on the
   per-query reciprocal ranks (scipy).
4. The visible golden suites are scored offline by both rankers as a check only (never fitted
   on); the adoption rule of issue 25 (:func:`verdict`). ``fit_all`` + :func:`ranker_file`: the
   ranker JSON (:mod:`rag_core.lookup.ranker`) fitted on every known item, with how it was made.

Needs scikit-learn and scipy (the ``cv`` extra); the ranker it writes needs only NumPy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_core.evaluation.known_items import SEED, KnownItem, index_dirs
from rag_core.evaluation.metrics import ndcg_at_k, recall_at_k, reciprocal_rank
from rag_core.fileio import write_text_atomic
from rag_core.lookup.postprocessor import KnowledgeEvidencePostProcessor, keep_named
from rag_core.lookup.ranker import FEATURES, INDEX, SCRIPTS, LinearRanker
from rag_core.markdown import md_table
from rag_core.settings import RagSettings
from rag_core.text import script

if TYPE_CHECKING:
    from rag_core.lookup.tool import LookupKnowledgeTool

__all__ = [
    "CvConfig",
    "CvResult",
    "Record",
    "all_records",
    "cross_validate",
    "fit_ranker",
    "in_memory_tool",
    "rank",
    "ranker_file",
    "run_cv",
    "suite_records",
    "write_report",
]

log = logging.getLogger(__name__)

ROUNDS = 2
MAX_BLOCKS = 5  # RagSettings.max_evidence_blocks default
METRICS = ("recall@5", "mrr", "ndcg@10")


@dataclass
class Record:
    """One query's rerank inputs: kept candidates' doc ids, RRF scores and feature matrix
    (len(kept), len(FEATURES)); flags; the doc ids of every fused candidate (ranking tail), the
    pipeline's own doc ranking (evidence blocks then candidates) and the query's script."""

    item_id: str
    docs: list[str]
    rrf: np.ndarray
    matrix: np.ndarray
    crosslingual: bool
    with_ensemble: bool
    named: set[str]
    tail: list[str]
    pipeline: list[str]
    script: str | None = None


@dataclass(frozen=True)
class CvConfig:
    """How the learned ranker is fitted: ``c`` inverse L2 strength; ``pairs`` ``all`` (every
    pair of a query alike) or ``delta-rr`` (weighed by the reciprocal-rank change of swapping
    them; LambdaRank, Burges 2010, MSR-TR-2010-82); ``split`` ``crosslingual`` (same-script and
    cross-lingual weights) or ``script`` (same-script weights per query script too); ``shrink``
    in (0, 1]: the share of the way from the hand weights to the fitted ones."""

    c: float = 1.0
    pairs: str = "all"
    split: str = "crosslingual"
    shrink: float = 1.0

    def describe(self) -> str:
        return f"C={self.c}, pairs {self.pairs}, split {self.split}, shrink {self.shrink}"


def dedupe(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def rank(rec: Record, ranker: LinearRanker, max_blocks: int = MAX_BLOCKS) -> list[str]:
    """The pipeline's doc ranking of ``rec`` under ``ranker`` (postprocessor.process, then the
    candidates' docs in fused order; the pipeline's own ranking when nothing was kept)."""
    if not rec.docs:
        return rec.pipeline
    totals = rec.matrix @ ranker.weights(rec.crosslingual, rec.with_ensemble, rec.script)
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
    return replace(rec, matrix=matrix, with_ensemble=True)


def fit_weights(records: Sequence[Record], expected: Sequence[str], start: np.ndarray, config: CvConfig) -> np.ndarray:
    """(len(FEATURES),) pairwise logistic weights (module docstring) over ``records`` whose
    expected doc is a candidate with others; ``start`` (the hand weights) chooses each
    document's best chunk in the first round and is returned when no record has a pair."""
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
            if config.pairs == "delta-rr":
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
        model = LogisticRegression(C=config.c, fit_intercept=False, max_iter=2000)
        model.fit(x, y, sample_weight=np.concatenate(weights))
        w = model.coef_[0] * (np.abs(start).sum() / max(1e-12, np.abs(model.coef_[0]).sum()))
    return np.asarray(start + config.shrink * (w - start), dtype=np.float64)


def fit_ranker(
    records: Sequence[Record], expected: Sequence[str], hand: LinearRanker, config: CvConfig = CvConfig()
) -> LinearRanker:
    """A learned ``LinearRanker``: same-script weights fitted on the same-script records (per
    query script too with ``config.split == "script"``), cross-lingual ones on the others (the
    hand weights for a side without records)."""

    def fit(pick: Callable[[Record], bool], start: np.ndarray) -> np.ndarray:
        chosen = [i for i, r in enumerate(records) if r.docs and pick(r)]
        return fit_weights([records[i] for i in chosen], [expected[i] for i in chosen], start, config)

    def same_script_in(name: str) -> Callable[[Record], bool]:
        return lambda r: not r.crosslingual and r.script == name

    same = fit(lambda r: not r.crosslingual, hand.same_script)
    cross = fit(lambda r: r.crosslingual, hand.crosslingual)
    by_script = {}
    if config.split == "script":
        by_script = {name: fit(same_script_in(name), hand.same_script) for name in SCRIPTS}
    return LinearRanker(
        "learned",
        same,
        cross,
        source=f"pairwise logistic regression, {config.describe()}",
        by_script=by_script,
    )


# --- features --------------------------------------------------------------------------------


def in_memory_tool(settings: RagSettings, embedder: Any) -> LookupKnowledgeTool:
    """The real lookup pipeline on an ``InMemoryStore`` (exact NumPy cosine, BM25; ``tool.store``)
    holding ``settings.knowledge_dir`` ingested with ``embedder`` (vectors from the embedding cache
    of ``settings.data_dir`` when it has them) and its L0 index. Close the tool when done."""
    from rag_core.ingest.pipeline import ingest
    from rag_core.l0 import L0Index
    from rag_core.lookup.tool import LookupKnowledgeTool
    from rag_core.stores.memory import InMemoryStore

    store = InMemoryStore()
    ingest(settings, embedder, [store], progress=False)
    return LookupKnowledgeTool(settings, store=store, embedder=embedder, l0=L0Index.load(settings.l0_index_path))


def capture(items: Sequence[KnownItem], settings: RagSettings, shared: dict[str, Any]) -> list[Record]:
    """A Record per item through the real pipeline on an in-memory index of
    ``settings.knowledge_dir`` (:func:`in_memory_tool`; ``shared`` keeps the main embedder and the
    second model's and titles' vector caches across indexes)."""
    from rag_core.embedding import make_embedder

    if "embedder" not in shared:
        shared["embedder"] = make_embedder(settings)
    tool = in_memory_tool(settings, shared["embedder"])
    if "ensemble" in shared:  # the same chunk texts recur across held-out copies: embed once
        tool._ensemble, tool._ensemble_loaded, tool._documents = shared["ensemble"], True, shared["documents"]
    seen: list[Any] = []
    original = KnowledgeEvidencePostProcessor.features

    def spy(self: KnowledgeEvidencePostProcessor, *args: Any, **kw: Any) -> Any:
        seen.append(original(self, *args, **kw))
        return seen[-1]

    records = []
    KnowledgeEvidencePostProcessor.features = spy  # type: ignore[method-assign]
    try:
        for n, item in enumerate(items, start=1):
            seen.clear()
            result, candidates = tool.lookup_with_candidates(item.query)
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
                    script=script(item.query),
                )
            )
            if n % 200 == 0:
                log.info("cv features: %d/%d", n, len(items))
    finally:
        KnowledgeEvidencePostProcessor.features = original  # type: ignore[method-assign]
    shared.setdefault("ensemble", tool.ensemble)
    shared.setdefault("documents", tool._documents)
    tool.close()
    return records


class _Unpickler(pickle.Unpickler):
    """Reads records pickled before the CV moved here (``bench.rerank_cv``, or its ``__main__``)."""

    def find_class(self, module: str, name: str) -> Any:
        moved = module in ("__main__", "bench.rerank_cv") and name == "Record"
        return super().find_class(__name__ if moved else module, name)


def cached_records(
    name: str, items: Sequence[KnownItem], settings: RagSettings, shared: dict[str, Any], root: Path
) -> list[Record]:
    """:func:`capture`, cached under ``root``/features by index name and the queries asked."""
    key = hashlib.sha1("\n".join(f"{i.id}\t{i.query}" for i in items).encode()).hexdigest()[:12]
    path = root / "features" / f"{name}-{key}.pkl"
    if path.is_file():
        with path.open("rb") as fh:
            records: list[Record] = _Unpickler(fh).load()
    else:
        t0 = time.perf_counter()
        log.info("cv features: %s (%d queries)", name, len(items))
        records = capture(items, settings, shared)
        log.info("cv features: %s done in %.0f s", name, time.perf_counter() - t0)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            pickle.dump(records, fh)
    for rec, item in zip(records, items, strict=True):
        rec.script = script(item.query)  # records cached before the field existed
    return records


def _settings(base: RagSettings, knowledge: Path, data: Path) -> RagSettings:
    data.mkdir(parents=True, exist_ok=True)
    return base.model_copy(
        update={"data_dir": data, "knowledge_dir": knowledge, "trace_enabled": False, "sidecar_enabled": False}
    )


def all_records(
    items: Sequence[KnownItem], corpora: Mapping[str, Path], base: RagSettings, root: Path, shared: dict[str, Any]
) -> list[Record]:
    """Records of ``items`` in their order (features captured per index; one data dir, i.e.
    embedding cache, per corpus language under ``root``: held-out copies share most chunks)."""
    by_id: dict[str, Record] = {}
    for name, knowledge in index_dirs(items, corpora, root / "indexes").items():
        part = [i for i in items if i.index == name]
        settings = _settings(base, knowledge, root / f"data-{name.split('-', 1)[0]}")
        for rec in cached_records(name, part, settings, shared, root):
            by_id[rec.item_id] = rec
    return [by_id[i.id] for i in items]


@dataclass
class SuiteRecords:
    """One visible golden suite's records: case ids, records, expected docs of each case."""

    name: str
    ids: list[str]
    records: list[Record]
    expected: list[list[str]]


def suite_records(
    corpora: Mapping[str, Path], base: RagSettings, root: Path, shared: dict[str, Any]
) -> list[SuiteRecords]:
    """Records of the answerable cases of every visible golden suite that can run
    (``golden/suites.yaml``)."""
    from rag_core.evaluation.cases import load_cases
    from rag_core.evaluation.suites import load_suites

    lang_of = {p.resolve(): lang for lang, p in corpora.items()}
    out = []
    for suite in load_suites():
        if suite.missing():
            continue
        cases = [c for c in load_cases(suite.cases) if not c.unanswerable]  # no rank to score
        if not cases:
            continue
        items = [KnownItem(c.id, c.query, "", "", "", suite.name, "golden") for c in cases]
        lang = lang_of.get(suite.knowledge_dir.resolve(), f"suite-{suite.name}")
        settings = _settings(base, suite.knowledge_dir, root / f"data-{lang}")
        records = cached_records(f"suite-{suite.name}", items, settings, shared, root)
        out.append(SuiteRecords(suite.name, [c.id for c in cases], records, [list(c.expected_docs) for c in cases]))
    return out


# --- evaluation --------------------------------------------------------------------------------


def per_query(records: Sequence[Record], expected: Sequence[Sequence[str]], ranker: LinearRanker) -> np.ndarray:
    """(n, 3): recall@5, reciprocal rank, nDCG@10 (``METRICS``) of each record under ``ranker``."""
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


@dataclass
class Folds:
    """Per-query figures (n, 3) of hand and learned on the same queries, each query's fold."""

    hand: np.ndarray
    learned: np.ndarray
    fold_of: np.ndarray


def cross_validate(
    records: Sequence[Record],
    items: Sequence[KnownItem],
    hand: LinearRanker,
    folds: int = 5,
    config: CvConfig = CvConfig(),
    seed: int = SEED,
) -> Folds:
    """``folds``-fold ``GroupKFold`` by doc id: fit on the training folds, score the test fold.
    ValueError (scikit-learn's) when there are fewer documents than folds."""
    from sklearn.model_selection import GroupKFold

    groups = [i.doc_id for i in items]
    fold_of = np.zeros(len(items), dtype=int)
    hand_q = per_query(records, [[i.doc_id] for i in items], hand)
    learned_q = np.zeros_like(hand_q)
    splitter = GroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    for k, (train, test) in enumerate(splitter.split(np.zeros(len(items)), groups=groups)):
        ranker = fit_ranker([records[i] for i in train], [items[i].doc_id for i in train], hand, config)
        learned_q[test] = per_query([records[i] for i in test], [[items[i].doc_id] for i in test], ranker)
        fold_of[test] = k
    return Folds(hand_q, learned_q, fold_of)


def group_rows(items: Sequence[KnownItem], f: Folds) -> list[dict[str, Any]]:
    """Per (query -> corpus) and ``all``: n, hand and learned means of ``METRICS``, Wilcoxon p."""
    names = sorted({i.group for i in items})
    rows = []
    for g in [*names, "all"]:
        m = np.array([g in ("all", i.group) for i in items], dtype=bool)
        rows.append(
            {
                "group": g,
                "n": int(m.sum()),
                "hand": dict(zip(METRICS, (round(float(v), 4) for v in f.hand[m].mean(axis=0)), strict=True)),
                "learned": dict(zip(METRICS, (round(float(v), 4) for v in f.learned[m].mean(axis=0)), strict=True)),
                "wilcoxon_p": wilcoxon_p(f.hand[m, 1], f.learned[m, 1]),
            }
        )
    return rows


def fold_rows(items: Sequence[KnownItem], f: Folds) -> list[dict[str, Any]]:
    """MRR hand / learned per fold and (query -> corpus)."""
    names = [*sorted({i.group for i in items}), "all"]
    rows = []
    for k in range(int(f.fold_of.max()) + 1 if len(f.fold_of) else 0):
        row: dict[str, Any] = {"fold": k + 1}
        for g in names:
            m = np.array([g in ("all", i.group) for i in items], dtype=bool) & (f.fold_of == k)
            row[g] = (
                [round(float(f.hand[m, 1].mean()), 4), round(float(f.learned[m, 1].mean()), 4)] if m.any() else None
            )
        rows.append(row)
    return rows


def kind_rows(items: Sequence[KnownItem], f: Folds) -> list[dict[str, Any]]:
    """MRR and recall@5 hand / learned per (query -> corpus, kind)."""
    cells: dict[tuple[str, str], list[int]] = defaultdict(list)
    for n, i in enumerate(items):
        cells[(i.group, i.kind)].append(n)
    return [
        {
            "group": g,
            "kind": kind,
            "n": len(idx),
            "mrr": [round(float(f.hand[idx, 1].mean()), 4), round(float(f.learned[idx, 1].mean()), 4)],
            "recall@5": [round(float(f.hand[idx, 0].mean()), 4), round(float(f.learned[idx, 0].mean()), 4)],
        }
        for (g, kind), idx in sorted(cells.items())
    ]


def suite_rows(suites: Sequence[SuiteRecords], hand: LinearRanker, learned: LinearRanker) -> list[dict[str, Any]]:
    """Per visible suite: recall@5 / MRR / nDCG@10 hand and learned, top-5 cases lost and gained,
    the MRR change in cases (sum of reciprocal-rank changes), hand parity, cases that moved."""
    rows = []
    for s in suites:
        h, lq = per_query(s.records, s.expected, hand), per_query(s.records, s.expected, learned)
        rows.append(
            {
                "suite": s.name,
                "n": len(s.ids),
                "hand": dict(zip(METRICS, (round(float(v), 4) for v in h.mean(axis=0)), strict=True)),
                "learned": dict(zip(METRICS, (round(float(v), 4) for v in lq.mean(axis=0)), strict=True)),
                "top5_lost": int((h[:, 0] > lq[:, 0]).sum()),
                "top5_gained": int((h[:, 0] < lq[:, 0]).sum()),
                "rr_change": round(float((lq[:, 1] - h[:, 1]).sum()), 4),
                "hand_parity": sum(rank(r, hand) == r.pipeline for r in s.records),
                "moved": [s.ids[i] for i in range(len(s.ids)) if h[i, 1] != lq[i, 1]],
            }
        )
    return rows


def verdict(groups: Sequence[Mapping[str, Any]], suites: Sequence[Mapping[str, Any]], alpha: float = 0.05) -> str:
    """Issue 25's adoption rule: total CV MRR above the hand weights' with Wilcoxon p < ``alpha``,
    and no visible suite worse by more than one case (at most one top-5 case lost and a summed
    reciprocal-rank loss of at most 1, one case falling out entirely)."""
    total = next(g for g in groups if g["group"] == "all")
    p = total["wilcoxon_p"]
    if not (total["learned"]["mrr"] > total["hand"]["mrr"] and p is not None and p < alpha):
        return f"keep hand weights: CV MRR {total['hand']['mrr']:.3f} -> {total['learned']['mrr']:.3f} (p {p})"
    worse = [s["suite"] for s in suites if s["top5_lost"] > 1 or s["rr_change"] < -1.0]
    if worse:
        return f"keep hand weights: CV MRR gain, but visible suite(s) {', '.join(worse)} lose more than one case"
    return f"adopt: CV MRR {total['hand']['mrr']:.3f} -> {total['learned']['mrr']:.3f} (p {p:.2g}), no suite loses"


@dataclass
class CvResult:
    """Everything ``rag eval cv`` reports (:func:`write_report`)."""

    config: CvConfig
    folds: int
    seed: int
    sizes: str
    parity: tuple[int, int]
    groups: list[dict[str, Any]]
    fold_table: list[dict[str, Any]]
    kinds: list[dict[str, Any]]
    hand: LinearRanker
    learned: LinearRanker
    suites: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        return verdict(self.groups, self.suites)

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.__dict__,
            "folds": self.folds,
            "seed": self.seed,
            "hand_parity": list(self.parity),
            "groups": self.groups,
            "per_fold_mrr": self.fold_table,
            "kinds": self.kinds,
            "suites": self.suites,
            "verdict": self.verdict,
            "weights": {"hand": self.hand.to_json(), "learned": self.learned.to_json()},
            "seconds": round(self.seconds, 1),
        }


def run_cv(
    items: Sequence[KnownItem],
    records: Sequence[Record],
    folds: int = 5,
    config: CvConfig = CvConfig(),
    seed: int = SEED,
    suites: Sequence[SuiteRecords] = (),
) -> CvResult:
    """Cross-validate ``config`` against the hand weights and fit it on every item."""
    from rag_core.evaluation.known_items import size_table
    from rag_core.lookup.postprocessor import RerankWeights

    t0 = time.perf_counter()
    hand = RerankWeights().ranker()
    f = cross_validate(records, items, hand, folds, config, seed)
    learned = fit_ranker(records, [i.doc_id for i in items], hand, config)
    return CvResult(
        config=config,
        folds=folds,
        seed=seed,
        sizes=size_table(items),
        parity=(sum(rank(r, hand) == r.pipeline for r in records), len(records)),
        groups=group_rows(items, f),
        fold_table=fold_rows(items, f),
        kinds=kind_rows(items, f),
        hand=hand,
        learned=learned,
        suites=suite_rows(suites, hand, learned),
        seconds=time.perf_counter() - t0,
    )


def _pair(a: float, b: float) -> str:
    return f"{a:.3f} / {b:.3f}"


def markdown(result: CvResult) -> str:
    """The report: CV table and visible suites first, then folds, kinds, weights, data, method."""
    cv = md_table(
        [
            "query -> corpus (n)",
            "recall@5 hand / learned",
            "MRR hand / learned",
            "nDCG@10 hand / learned",
            "MRR ratio",
            "Wilcoxon p (RR)",
        ],
        [
            [
                f"{g['group']} ({g['n']})",
                *(_pair(g["hand"][m], g["learned"][m]) for m in METRICS),
                f"{g['learned']['mrr'] / max(g['hand']['mrr'], 1e-9):.3f}x",
                "—" if g["wilcoxon_p"] is None else f"{g['wilcoxon_p']:.2g}",
            ]
            for g in result.groups
        ],
    )
    parts = [f"# Rerank cross-validation: hand weights vs learned ranker\n\nVerdict: {result.verdict}\n", cv]
    if result.suites:
        parts.append("\nVisible golden suites (a check, never fitted on):\n")
        parts.append(
            md_table(
                [
                    "suite (n)",
                    "recall@5 hand / learned",
                    "MRR hand / learned",
                    "top-5 lost / gained",
                    "RR change (cases)",
                    "hand parity",
                    "cases moved",
                ],
                [
                    [
                        f"{s['suite']} ({s['n']})",
                        _pair(s["hand"]["recall@5"], s["learned"]["recall@5"]),
                        _pair(s["hand"]["mrr"], s["learned"]["mrr"]),
                        f"-{s['top5_lost']} / +{s['top5_gained']}",
                        f"{s['rr_change']:+.2f}",
                        f"{s['hand_parity']}/{s['n']}",
                        ", ".join(s["moved"][:6]) + (" ..." if len(s["moved"]) > 6 else ""),
                    ]
                    for s in result.suites
                ],
            )
        )
    names = [g["group"] for g in result.groups]
    parts.append("\nMRR per fold, hand / learned:\n")
    parts.append(
        md_table(
            ["fold", *names],
            [[str(r["fold"]), *("—" if r[g] is None else _pair(*r[g]) for g in names)] for r in result.fold_table],
        )
    )
    parts.append("\nBy kind:\n")
    parts.append(
        md_table(
            ["query -> corpus", "kind", "n", "MRR hand / learned", "recall@5 hand / learned"],
            [[k["group"], k["kind"], str(k["n"]), _pair(*k["mrr"]), _pair(*k["recall@5"])] for k in result.kinds],
        )
    )
    parts.append("\nWeights fitted on every known item (L1-scaled to the hand weights):\n")
    hand, learned = result.hand, result.learned
    columns = [
        ("same script", hand.same_script, learned.same_script),
        ("cross-lingual", hand.crosslingual, learned.crosslingual),
    ]
    columns += [(f"{s} query", hand.same_script, w) for s, w in sorted(learned.by_script.items())]
    parts.append(
        md_table(
            ["feature", *(f"{name}: hand / learned" for name, _, _ in columns)],
            [[feat, *(_pair(h[j], lw[j]) for _, h, lw in columns)] for j, feat in enumerate(FEATURES)],
        )
    )
    parts.append(f"\nKnown-item queries (seed {result.seed}):\n")
    parts.append(result.sizes)
    parts.append(
        f"\n{result.folds}-fold GroupKFold by document; learned: {result.learned.source}. Offline hand ranking "
        f"equals the pipeline's on {result.parity[0]}/{result.parity[1]} queries. Fits took {result.seconds:.0f} s. "
        "Method: rag_core/evaluation/cv.py.\n"
    )
    return "\n".join(parts)


def write_report(result: CvResult, out: Path, name: str = "rerank_cv") -> tuple[Path, Path]:
    """``out``/``name``.json and ``.md``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{name}.json", out / f"{name}.md"
    write_text_atomic(json_path, json.dumps(result.to_json(), indent=2, ensure_ascii=False) + "\n")
    write_text_atomic(md_path, markdown(result))
    return json_path, md_path


def ranker_file(
    result: CvResult, models: Mapping[str, str], model_keys: Mapping[str, str], items: int
) -> dict[str, Any]:
    """The ranker JSON (``rag_core.lookup.ranker.RANKER_FORMAT``) of ``result.learned``, tied to
    the embedding model fingerprints ``models`` (role -> fingerprint), with how it was fitted."""
    ranker = replace(
        result.learned,
        name="learned-pairwise-v1",
        meta={
            "models": dict(models),
            "model_keys": dict(model_keys),
            "version": 1,
            "fitted": {
                "by": "rag eval cv --fit",
                "date": time.strftime("%Y-%m-%d"),
                "model": "pairwise logistic regression (scikit-learn LogisticRegression, no intercept, "
                f"{result.config.describe()}), {ROUNDS} latent best-chunk rounds from the hand weights, "
                "L1-scaled to the hand weights",
                "data": f"rag_core.evaluation.known_items seed {result.seed}: {items} known-item queries generated "
                "from the runbook corpora (no golden case)",
                "cv": f"{result.folds}-fold GroupKFold by doc id",
                "cv_mrr": {g["group"]: [g["hand"]["mrr"], g["learned"]["mrr"]] for g in result.groups},
            },
        },
    )
    return ranker.to_json()
