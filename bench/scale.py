"""Store search at scale (ms, queries/s, recall@10): Milvus (the embedded server of a scratch data
dir), pgvector and an exact NumPy top-k over the same vectors, filled by the stores' ``bulk_load``.

Vectors: the real chunk embeddings scaled up by perturbed copies (:func:`synthesize`); 3 % of the
rows get the category ``bench_rare`` for the filtered searches. Per size and configuration
(:func:`measure_config`): Milvus FLAT (IVF_FLAT where asked; the embedded engine has no HNSW),
pgvector HNSW at several ``hnsw.ef_search`` and an exact scan, then the product store calls. Steps
whose estimate does not fit the run's budget are skipped, with the reason recorded.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import closing, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import guarded, log, progress, ratio, server_memory, timed
from bench.harness import Target, call_ms, measure, section
from rag_core.ingest.centroids import centroid
from rag_core.models import Chunk
from rag_core.text import lexical_string

RARE = "bench_rare"
COLLECTION = "bench_chunks"
MIN_RECALL = 0.95
TARGET_PG_VS_NUMPY = 2.0
TARGET_MILVUS_VS_NUMPY = 5.0  # issue 14 (was 10x for Milvus Lite 3 in-process)
TARGET_SIZE = 100_000


@dataclass
class ScaleOptions:
    """Sizes (rows), search settings and the run's limits."""

    sizes: tuple[int, ...] = (10_000, 100_000, 300_000)
    k: int = 10
    sigma: float = 0.05
    rare_fraction: float = 0.03
    seed: int = 13
    pg_ef: tuple[int, ...] = (40, 100, 200, 400, 1000)
    milvus_ivf: tuple[tuple[int, int], ...] = ()  # IVF_FLAT (nlist, nprobe) configurations swept
    milvus_max_size: int = 300_000
    pg_max_size: int = 100_000
    single_queries: int = 20
    single_queries_large: int = 8  # Milvus Lite at >= 50k rows: each query can take ~1 s
    keep_milvus_size: int | None = TARGET_SIZE  # kept (FLAT, released) for the memory benchmark
    overlap_pg_build: bool = True
    deadline: float | None = None  # time.perf_counter() by which the run's time budget ends
    reserve_s: float = 0.0
    show_progress: bool = True
    workdir: Path | None = None
    pg_dsn: Callable[[], str] | None = None


@dataclass
class BaseData:
    """Source rows: vectors (n, dim) float32 unit rows and the chunk of each row (its payload)."""

    vectors: np.ndarray
    chunks: list[Chunk]


@dataclass
class Dataset:
    X: np.ndarray
    source: np.ndarray  # base row of each row
    rare: np.ndarray  # bool mask
    rare_rows: np.ndarray
    Q: np.ndarray
    gt: np.ndarray  # (nq, k) exact ids
    gt_kth: np.ndarray  # (nq,) exact k-th score
    gt_f: np.ndarray
    gt_f_kth: np.ndarray


def synthesize(
    base: BaseData, n: int, sigma: float, rare_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` rows: the base vectors, then random base rows + N(0, sigma^2) per dimension, renormalised;
    (vectors (n, dim), each row's base row, the rare mask)."""
    rng = np.random.default_rng(seed)
    nb, dim = base.vectors.shape
    source = np.concatenate([np.arange(min(nb, n)), rng.integers(0, nb, max(0, n - nb))])
    X = base.vectors[source].copy()
    for start in range(nb, n, 50_000):  # in blocks: keeps the temporary noise small
        end = min(n, start + 50_000)
        X[start:end] += sigma * rng.standard_normal((end - start, dim), dtype=np.float32)
        X[start:end] /= np.linalg.norm(X[start:end], axis=1, keepdims=True)
    rare = rng.random(n) < rare_fraction
    return X, source, rare


def topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Row-wise indices of the k largest scores, best first (scores: (nq, n) or (n,))."""
    k = min(k, scores.shape[-1])
    part = np.argpartition(-scores, k - 1, axis=-1)[..., :k]
    order = np.take_along_axis(scores, part, axis=-1).argsort(axis=-1)[..., ::-1]
    return np.take_along_axis(part, order, axis=-1)


def recall_at_k(found: Sequence[Sequence[int]] | np.ndarray, ds: Dataset, filtered: bool, k: int) -> float:
    """Tie-tolerant recall@k of ``found`` ids per query: a hit counts when its score is >= the exact
    k-th best minus 1e-5."""
    kth = ds.gt_f_kth if filtered else ds.gt_kth
    total = 0.0
    for qi, ids in enumerate(found):
        ids = [i for i in dict.fromkeys(ids) if 0 <= i < len(ds.X)][:k]
        if filtered:
            ids = [i for i in ids if ds.rare[i]]
        if not ids:
            continue
        scores = ds.X[ids] @ ds.Q[qi]
        total += min(k, int((scores >= kth[qi] - 1e-5).sum())) / k
    return round(total / len(found), 4) if len(found) else 0.0


def _exact(S: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Column ids of each row's top k of scores ``S`` (nq, n) and the row's k-th best score."""
    ids = topk(S, k)
    return ids, np.take_along_axis(S, ids[:, -1:], axis=1)[:, 0]


def build_dataset(base: BaseData, Q: np.ndarray, n: int, opts: ScaleOptions) -> Dataset:
    X, source, rare = synthesize(base, n, opts.sigma, opts.rare_fraction, opts.seed + n)
    rare_rows = np.flatnonzero(rare)
    S = Q @ X.T
    gt, gt_kth = _exact(S, opts.k)
    loc, gt_f_kth = _exact(S[:, rare_rows], opts.k)
    return Dataset(X, source, rare, rare_rows, Q, gt, gt_kth, rare_rows[loc], gt_f_kth)


# --- one configuration, measured through the harness -------------------------------------------------

Search = Callable[[np.ndarray, bool], Any]  # (query vector(s), filtered) -> row ids of the top k, best first


def measure_config(
    name: str,
    search: Search,
    ds: Dataset,
    k: int,
    batch: Search | None = None,
    warmup: int = 1,
    single_queries: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Time one store configuration and score its tie-tolerant recall@k: ``search(q, filtered)`` one
    query at a time (the first ``single_queries``, after ``warmup`` untimed), then ``batch(Q, filtered)``
    (all queries in one call) when given. The results.json row (``single_ms``, ``batch_qps``,
    ``recall@10``, ``filtered_*``, ``extra``)."""
    nq = len(ds.Q)
    n = nq if single_queries is None else min(single_queries, nq)

    def both(fn: Search) -> list[Target[None, np.ndarray, Any]]:  # timed interleaved, query by query
        return [Target("all", lambda _h, q: fn(q, False)), Target("filtered", lambda _h, q: fn(q, True))]

    single = measure(both(search), list(ds.Q[:n]), warmup=list(ds.Q[:warmup]))
    timed_batch = measure(both(batch), [ds.Q]) if batch is not None else None
    # Recall over every query: from the single calls when they covered them all, else from the
    # batch call; a store without a batch call is scored on the queries it was timed on.
    if timed_batch is None or n == nq:
        found = {key: t.results for key, t in single.items()}
    else:
        found = {key: t.results[0] for key, t in timed_batch.items()}
    seconds = {key: t.seconds for key, t in (timed_batch or {}).items() if t.seconds}
    qps = {key: round(nq / s, 1) for key, s in seconds.items()}
    return {
        "config": name,
        "single_ms": single["all"].stats.to_dict(),
        "batch_qps": qps.get("all"),
        "batch_s": round(seconds["all"], 4) if "all" in seconds else None,
        "recall@10": recall_at_k(found["all"], ds, False, k),
        "filtered_single_ms": single["filtered"].stats.to_dict(),
        "filtered_batch_qps": qps.get("filtered"),
        "filtered_recall@10": recall_at_k(found["filtered"], ds, True, k),
        **extra,
    }


def best_config(configs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Fastest (single-query p50) configuration with recall@10 >= MIN_RECALL."""
    ok = [c for c in configs if (c["recall@10"] or 0) >= MIN_RECALL and c["single_ms"]["p50"] is not None]
    return min(ok, key=lambda c: c["single_ms"]["p50"], default=None)


def store_entry(configs: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    """A store's results entry: every configuration, the best one, and ``more``."""
    return {"configs": configs, "best": best_config(configs), **more}


def product_search(store: Any, ds: Dataset, k: int, n: int, terms: Sequence[str]) -> dict[str, Any]:
    """The product calls on the first ``n`` queries, closing the store: ``store.search`` (latency,
    recall, unfiltered and filtered), ``document_centroids`` of the top hits' documents (``centroid_ms``)
    and ``search_lexical`` with ``terms`` (words per query; ``lexical_ms``, and ``lexical_scores``: each
    query's top-k BM25 scores, for ``_bm25_vs_milvus``)."""
    docs: list[list[str]] = []

    def search(q: np.ndarray, filtered: bool) -> list[int]:
        hits = store.search(q, k, RARE if filtered else None)
        docs.append(list(dict.fromkeys(h.doc_id for h in hits)))
        return [int(h.chunk_id[1:]) for h in hits]

    with closing(store):
        out = measure_config("store.search", search, ds, k, single_queries=n)
        out["centroid_ms"] = call_ms(store.document_centroids, docs[2::2], docs[:1])
        pairs = list(zip(terms, ds.Q, strict=False))[:n]
        lexical = Target("lexical", lambda _h, x: store.search_lexical(x[0].split(), x[1], k))
        timing = measure([lexical], pairs, warmup=pairs[:1])["lexical"]  # the timed calls' hits are the scores'
        out["lexical_ms"] = timing.stats.to_dict()
        out["lexical_scores"] = [[h.lexical_score or 0.0 for h in hits] for hits in timing.results]
        return out


# --- NumPy --------------------------------------------------------------------------------------------


def numpy_configs(ds: Dataset, k: int) -> list[dict[str, Any]]:
    """Exact top-k by a matrix product, filtered = the category's rows as their own matrix (gathered
    once, not timed); with the BLAS library's default threads and with one thread: on a busy 2-core
    machine multi-threaded BLAS can be much slower (spinning threads), so both are measured."""
    from threadpoolctl import threadpool_limits

    X, rows = ds.X, ds.rare_rows
    Xr = X[rows]

    def search(Q: np.ndarray, filtered: bool) -> np.ndarray:  # one query (dim,) or all (nq, dim)
        return rows[topk(Q @ Xr.T, k)] if filtered else topk(Q @ X.T, k)

    configs = [measure_config("exact matrix product (BLAS default threads)", search, ds, k, search, warmup=2)]
    with threadpool_limits(1):
        configs.append(measure_config("exact matrix product (1 BLAS thread)", search, ds, k, search, warmup=2))
    return configs


# --- the rows as the stores hold them ------------------------------------------------------------------


def rows_as_chunks(ds: Dataset, base: BaseData) -> list[Chunk]:
    """Row ``i`` as a chunk: id ``r{i}``, its source chunk's payload, category ``RARE`` when rare;
    rows past the base are documents of their own per copy block (doc id ``<source doc>~<block>``),
    so a document keeps about its source's chunk count at every size (the centroid query)."""
    nb = len(base.chunks)
    return [
        replace(
            base.chunks[src],
            chunk_id=f"r{i}",
            doc_id=base.chunks[src].doc_id + (f"~{i // nb}" if i >= nb else ""),
            category=RARE if rare else base.chunks[src].category,
        )
        for i, (src, rare) in enumerate(zip(ds.source.tolist(), ds.rare.tolist(), strict=True))
    ]


def centroids_of(chunks: Sequence[Chunk], X: np.ndarray) -> dict[str, np.ndarray]:
    """Doc id -> the centroid of its rows of ``X`` (chunk-id order), as ingest computes it."""
    rows: dict[str, list[tuple[str, int]]] = {}
    for i, c in enumerate(chunks):
        rows.setdefault(c.doc_id, []).append((c.chunk_id, i))
    found = {d: centroid(X[[i for _, i in sorted(pairs)]]) for d, pairs in rows.items()}
    return {d: c for d, c in found.items() if c is not None}


def bulk_load(store: Any, run: ScaleRun, sr: SizeRun, write: str, index: str, drop: bool = False) -> dict[str, float]:
    """Fill ``store`` (product schema; dropped first when ``drop``) by ``store.bulk_load``, closing it;
    the setup figures ``<write>_s``, ``<write>_rows_per_s`` and ``<index>_s``."""
    with closing(store):
        if drop:
            store.drop()  # a table left by an interrupted run
        store.ensure_schema(sr.ds.X.shape[1])
        chunks = rows_as_chunks(sr.ds, run.base)
        done = store.bulk_load(chunks, sr.ds.X)
        store.put_centroids(centroids_of(chunks, sr.ds.X))  # as ingest stores them (not timed)
    return {
        f"{write}_s": round(done.write_s, 2),
        f"{write}_rows_per_s": round(done.rows / done.write_s, 1),
        f"{index}_s": round(done.index_s, 2),
    }


# --- Milvus (the embedded server of a scratch data dir: FLAT, IVF_FLAT, AUTOINDEX; no HNSW) ------------


def milvus_set_index(client: Any, index_type: str, params: dict[str, Any]) -> float:
    """Replace the dense index (release, drop, create, load); seconds."""
    t0 = time.perf_counter()
    client.release_collection(COLLECTION)
    for name in client.list_indexes(COLLECTION, field_name="vector"):  # the product names it "vector"
        client.drop_index(COLLECTION, name)
    index = client.prepare_index_params()
    index.add_index("vector", index_type=index_type, metric_type="COSINE", params=params)
    client.create_index(COLLECTION, index)
    client.load_collection(COLLECTION)
    described = client.describe_index(COLLECTION, "vector")
    if not described or described.get("index_type") != index_type:
        raise RuntimeError(f"Milvus index is {described!r}, expected {index_type}")
    return time.perf_counter() - t0


def milvus_measure(client: Any, ds: Dataset, k: int, name: str, n_single: int, **params: Any) -> dict[str, Any]:
    """Raw pymilvus dense search (chunk ids only) with search ``params``; one query = a batch of one."""
    sp = {"metric_type": "COSINE", "params": params}

    def batch(Q: np.ndarray, filtered: bool) -> list[list[int]]:
        data, where = [v.tolist() for v in Q], f'category == "{RARE}"' if filtered else ""
        res = client.search(
            COLLECTION, data, filter=where, limit=k, output_fields=["chunk_id"], search_params=sp, anns_field="vector"
        )
        return [[int(str(h["entity"].get("chunk_id", h.get("id")))[1:]) for h in hits] for hits in res]

    return measure_config(name, lambda q, f: batch(q[None, :], f)[0], ds, k, batch, single_queries=n_single)


def bm25_terms(base: BaseData, n: int) -> list[str]:
    """``n`` queries of three distinct words each from a real chunk's lexical text
    (deterministic; distinct as the lookup sends them: Milvus would count a repeated word twice)."""
    rng = np.random.default_rng(7)
    terms = []
    for _ in range(n):
        text = lexical_string(base.chunks[int(rng.integers(0, len(base.chunks)))].embed_text)
        words = list(dict.fromkeys(text.split())) or ["pod"]
        terms.append(" ".join(rng.choice(words, size=min(3, len(words)), replace=False)))
    return terms


def _flat_calls(n_single: int, nq: int) -> float:
    """Search calls of a FLAT measurement in units of single queries (a batch ~ nq / 10 singles)."""
    return 2 * n_single + 2 * nq / 10


def milvus_load(run: ScaleRun, sr: SizeRun) -> tuple[tuple[str, Path, Any], dict[str, Any]]:
    """The product schema (FLAT) on a fresh embedded server, filled by ``MilvusStore.bulk_load``;
    (uri, data dir, a raw client for the index sweeps) and the setup seconds and rows/s."""
    from pymilvus import MilvusClient

    from rag_core.stores.milvus import MilvusStore
    from rag_core.stores.milvus_server import ensure_server, stop_server

    data_dir = run.work / f"milvus-{sr.n}"
    uri = ensure_server(data_dir).uri
    try:
        setup = bulk_load(MilvusStore(uri, COLLECTION, index_type="FLAT"), run, sr, "insert", "flush")
        client = MilvusClient(uri)
    except Exception:
        stop_server(data_dir)
        raise
    run.per_row["milvus_insert"] = (setup["insert_s"] + setup["flush_s"]) / sr.n
    return (uri, data_dir, client), setup


def milvus_entry(run: ScaleRun, sr: SizeRun, m: tuple[str, Path, Any]) -> dict[str, Any]:
    """FLAT and BM25 (raw calls), the ``milvus_ivf`` IVF_FLAT configurations ((nlist, nprobe)
    pairs: one index build per nlist), then back on FLAT: the product calls and server memory.
    Then closes the client, and stops the server and deletes its data unless it is the collection kept."""
    from rag_core.stores.milvus import MilvusStore
    from rag_core.stores.milvus_server import stop_server

    opts, ds, k = run.opts, sr.ds, run.opts.k
    uri, data_dir, client = m
    try:
        t0 = time.perf_counter()
        configs = [milvus_measure(client, ds, k, "FLAT", sr.n_single)]
        bm25 = dict(limit=k, output_fields=["chunk_id"], search_params={"metric_type": "BM25"}, anns_field="sparse")
        terms = run.terms[: sr.n_single + 1]  # single-query BM25 latency (the raw sparse call); the first warms up
        bm25_ms = call_ms(lambda text: client.search(COLLECTION, [text], **bm25), terms[1:], terms[:1])
        run.per_row["milvus_flat_query"] = (time.perf_counter() - t0) / _flat_calls(sr.n_single, len(run.Q)) / sr.n
        for nlist in dict.fromkeys(nl for nl, _ in opts.milvus_ivf):
            build_s = milvus_set_index(client, "IVF_FLAT", {"nlist": nlist})
            sr.res["setup"]["milvus"][f"ivf_nlist_{nlist}_build_s"] = round(build_s, 2)
            for nprobe in [p for nl, p in opts.milvus_ivf if nl == nlist]:
                name = f"IVF_FLAT {nlist}/{nprobe}"
                configs.append(milvus_measure(client, ds, k, name, sr.n_single, nprobe=nprobe))
        if opts.milvus_ivf:  # back to the product's index for its own calls and the memory benchmark
            milvus_set_index(client, "FLAT", {})
        # the product calls (output fields incl. text) on the same collection
        store_api = product_search(MilvusStore(uri, COLLECTION), ds, k, sr.n_single, run.terms) | {"index": "FLAT"}
        if opts.keep_milvus_size == sr.n:
            kept = {"uri": uri, "data_dir": str(data_dir), "collection": COLLECTION, "rows": sr.n, "index": "FLAT"}
            run.out["memory_collection"] = kept
        return store_entry(configs, bm25_ms=bm25_ms, store_api=store_api, memory=server_memory(data_dir))
    finally:
        client.close()
        if (run.out["memory_collection"] or {}).get("uri") != uri:
            stop_server(data_dir)
            shutil.rmtree(data_dir, ignore_errors=True)


# --- pgvector ----------------------------------------------------------------------------------------


def pg_load(run: ScaleRun, sr: SizeRun) -> tuple[tuple[str, str], dict[str, Any]]:
    """The product table filled by ``PgVectorStore.bulk_load`` (COPY, then the HNSW and full-text
    index builds); (dsn, table) and the setup seconds, rows/s and HNSW index size."""
    import psycopg

    from rag_core.stores.pgvector import PgVectorStore

    assert run.opts.pg_dsn is not None
    dsn, table = run.opts.pg_dsn(), f"bench_scale_{sr.n}"
    setup = bulk_load(PgVectorStore(dsn, table), run, sr, "copy", "hnsw_build", drop=True)
    with psycopg.connect(dsn) as conn:
        size = conn.execute("SELECT pg_relation_size(%s::regclass)", (f"{table}_embedding_hnsw",)).fetchone()
    setup["hnsw_index_mb"] = round((size[0] if size else 0) / 2**20, 1)
    run.per_row |= {"pg_copy": setup["copy_s"] / sr.n, "pg_build": setup["hnsw_build_s"] / (sr.n * math.log(sr.n))}
    return (dsn, table), setup


def pg_measure(dsn: str, table: str, ds: Dataset, k: int, ef: int | None) -> dict[str, Any]:
    """One pgvector configuration on its own connection: HNSW (``hnsw.ef_search = ef``, relaxed-order
    iterative scans) or, with ``ef`` None, the exact scan (index scans off); batch = a psycopg pipeline."""
    import psycopg
    from pgvector.psycopg import register_vector

    dense = f"SELECT chunk_id FROM {table} ORDER BY embedding <=> %s LIMIT {k}"
    # relaxed_order iterative scans may return rows slightly out of order: re-sort outside.
    filtered = (
        f"WITH c AS MATERIALIZED (SELECT chunk_id, embedding <=> %s AS d FROM {table} WHERE category = %s "
        f"ORDER BY embedding <=> %s LIMIT {k}) SELECT chunk_id FROM c ORDER BY d"
    )
    settings = (
        {"hnsw.ef_search": int(ef), "hnsw.iterative_scan": "relaxed_order"} if ef else {"enable_indexscan": "off"}
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        for setting, value in settings.items():
            conn.execute(f"SET {setting} = {value}")
        plan = conn.execute("EXPLAIN " + dense, (ds.Q[0],)).fetchall()

        def send(q: np.ndarray, only_rare: bool) -> Any:
            return conn.execute(filtered, (q, RARE, q)) if only_rare else conn.execute(dense, (q,))

        def ids(cur: Any) -> list[int]:
            return [int(r[0][1:]) for r in cur.fetchall()]

        def batch(Q: np.ndarray, only_rare: bool) -> list[list[int]]:
            with conn.pipeline():
                curs = [send(q, only_rare) for q in Q]
            return [ids(c) for c in curs]

        name = f"HNSW ef_search={ef}" if ef else "exact scan (no index)"
        uses_hnsw = any("hnsw" in r[0] for r in plan)
        # warm-up 3: psycopg's statement preparation, the index pages
        return measure_config(name, lambda q, f: ids(send(q, f)), ds, k, batch, 3, plan_uses_hnsw=uses_hnsw)


def pg_entry(run: ScaleRun, sr: SizeRun, pg: tuple[str, str]) -> dict[str, Any]:
    """HNSW at each ``pg_ef``, the exact scan, the best HNSW, the product calls and server memory;
    then drops the table."""
    from rag_core.stores.pgvector import PgVectorStore

    opts, (dsn, table) = run.opts, pg
    sr.res["setup"]["pgvector"]["overlapped_with_milvus_insert"] = opts.overlap_pg_build and sr.milvus_loaded
    try:
        sweep = progress(opts.pg_ef, enabled=opts.show_progress, desc=f"pgvector {sr.n:,}")
        configs = [pg_measure(dsn, table, sr.ds, opts.k, ef) for ef in (*sweep, None)]  # None: the exact scan
        return store_entry(
            configs,
            best_hnsw=best_config([c for c in configs if c["config"].startswith("HNSW")]),
            store_api=product_search(PgVectorStore(dsn, table), sr.ds, opts.k, min(len(run.Q), 20), run.terms),
            memory=server_memory(pg_dsn=dsn),
        )
    finally:
        with closing(PgVectorStore(dsn, table)) as store, suppress(Exception):  # a leftover table must not fail
            store.drop()


# --- the run: sizes x stores -------------------------------------------------------------------------


@dataclass
class SizeRun:
    """One size being measured: its dataset, its results entry (``rows``, ``setup``, ``stores``,
    ``rare_rows``), the single-query count of the slow stores and whether Milvus loaded."""

    n: int
    ds: Dataset
    res: dict[str, Any]
    n_single: int
    milvus_loaded: bool = False


class ScaleRun:
    """The whole scale benchmark: options, scratch dir, time estimates and the results being filled."""

    def __init__(self, base: BaseData, Q: np.ndarray, opts: ScaleOptions) -> None:
        import tempfile

        self.base, self.Q, self.opts = base, Q, opts
        self.work = Path(tempfile.mkdtemp(prefix="rag-bench-scale-", dir=opts.workdir))
        self.work.chmod(0o755)  # PostgreSQL runs as another user
        self.per_row: dict[str, float] = {}  # step -> seconds per row at the last size (per n log n: HNSW build)
        # the lexical calls: the product's one per query, Milvus BM25's single queries
        self.terms = bm25_terms(base, max(len(Q), opts.single_queries, opts.single_queries_large) + 1)
        self.out: dict[str, Any] = {"method": method(base, Q, opts), "sizes": {}, "skipped": []}
        self.out["memory_collection"] = None

    def wanted(self, n: int, store: str, cap: int, above: str, what: str, seconds: float | None) -> bool:
        """Whether ``store`` runs at ``n`` rows: at most ``cap`` and its estimated ``seconds`` (None:
        unknown) within the budget left; when not, the skip is recorded (``above``, or as ``what``)."""
        opts = self.opts
        left = math.inf if opts.deadline is None else opts.deadline - time.perf_counter() - opts.reserve_s
        if n > cap:
            what, reason = store, above
        elif seconds is not None and seconds > left:
            log(f"scale {n:,}: skipping {what} (estimated {seconds:.0f} s, {max(0.0, left):.0f} s left)")
            reason = f"estimated {seconds:.0f} s (from the smaller size) > {max(0.0, left):.0f} s left in the run's "
            reason += "time budget"
        else:
            return True
        self.out["skipped"].append({"size": n, "what": what, "reason": reason})
        return False

    def run_size(self, n: int) -> None:
        """Every store at ``n`` rows: NumPy first, alone; then pgvector's load and Milvus' insert, at the
        same time unless --no-overlap (each in a thread; the servers work in their own processes); then
        pgvector's searches, then Milvus's, once both loads are done (nothing is timed while a load runs)."""
        log(f"scale: {n:,} vectors")
        opts, rate = self.opts, self.per_row.get
        ds, generate_s = timed(lambda: build_dataset(self.base, self.Q, n, opts))
        res: dict[str, Any] = {"rows": n, "setup": {"generate_and_exact_gt_s": round(generate_s, 2)}}
        res |= {"stores": {}, "rare_rows": int(len(ds.rare_rows))}
        sr = SizeRun(n, ds, res, opts.single_queries_large if n >= 50_000 else opts.single_queries)
        pg_s = n * (rate("pg_copy", 0) + rate("pg_build", 0) * math.log(n)) if opts.pg_dsn else 0.0  # 0: unknown
        above = f"above --pg-max-size {opts.pg_max_size:,} (HNSW build time)"
        want_pg = self.wanted(n, "pgvector", opts.pg_max_size, above, "pgvector (COPY + HNSW build)", pg_s or None)
        want_pg = want_pg and opts.pg_dsn is not None
        flat_s = rate("milvus_flat_query", 0) * _flat_calls(sr.n_single, len(self.Q))
        milvus_s = None if (insert := rate("milvus_insert")) is None else n * (insert + flat_s)
        above = f"above --milvus-max-size {opts.milvus_max_size:,}"
        want_milvus = self.wanted(n, "milvus", opts.milvus_max_size, above, "milvus (insert + FLAT searches)", milvus_s)
        res["stores"]["numpy"] = guarded(f"scale {n:,}: numpy", lambda: store_entry(numpy_configs(ds, opts.k)))
        with ThreadPoolExecutor(2, thread_name_prefix="store-load") as pool:
            pg = pool.submit(pg_load, self, sr) if want_pg else None
            if pg is not None and not opts.overlap_pg_build:
                wait([pg])
            milvus = pool.submit(milvus_load, self, sr) if want_milvus else None
            sr.milvus_loaded = milvus is not None and milvus.exception() is None
            if pg is not None:
                self._finish(sr, "pgvector", pg, pg_entry)
        if milvus is not None:
            self._finish(sr, "milvus", milvus, milvus_entry)
        _vs_numpy(res["stores"])
        _bm25_vs_milvus(res["stores"])
        self.out["sizes"][str(n)] = res

    def _finish(self, sr: SizeRun, name: str, load: Future[Any], entry: Callable[..., dict[str, Any]]) -> None:
        """Wait for the load ((handle, setup figures)), then ``entry``: the store's results entry (it
        closes the store); a failed load or measurement becomes the store's error entry."""

        def measured() -> Any:
            handle, sr.res["setup"][name] = load.result()
            return entry(self, sr, handle)

        sr.res["stores"][name] = guarded(f"scale {sr.n:,}: {name}", measured)


def _vs_numpy(stores: dict[str, Any]) -> None:
    """Each store's best single-query p50 over NumPy's best, measured at the same size."""
    numpy_best = (stores.get("numpy") or {}).get("best")
    for name, store in stores.items():
        if name != "numpy" and isinstance(store, dict) and store.get("best") and numpy_best:
            store["best_vs_numpy_p50"] = ratio(store["best"]["single_ms"]["p50"], numpy_best["single_ms"]["p50"], 2)


def _bm25_vs_milvus(stores: dict[str, Any]) -> None:
    """pgvector's ``bm25_vs_milvus``: the share of its BM25 top-k scoring at least Milvus' k-th
    score, over the queries both ran (the same list; Milvus ranks every match; scores, not ids,
    so ties of copied rows count alike). Drops the ``lexical_scores`` it compares."""
    apis = {name: (e.get("store_api") or {}) for name, e in stores.items() if isinstance(e, dict)}
    pg, milvus = (apis.get(name, {}).pop("lexical_scores", None) for name in ("pgvector", "milvus"))
    if not pg or not milvus:
        return
    held = [sum(x >= m[-1] * (1 - 1e-4) for x in p) / len(m) for p, m in zip(pg, milvus, strict=False) if m]
    apis["pgvector"]["bm25_vs_milvus"] = round(float(np.mean(held)), 3) if held else None


def method(base: BaseData, Q: np.ndarray, opts: ScaleOptions) -> dict[str, Any]:
    """The run's method figures (written first in the results, rendered above the tables);
    ``pg_store_plan``: PgVectorStore's dense-search plan constants (exact scan up to a row count, else HNSW)."""
    from rag_core.stores import pgvector

    dim = int(base.vectors.shape[1])
    return {
        "base_rows": int(len(base.vectors)),
        "dim": dim,
        "queries": int(len(Q)),
        "k": opts.k,
        "sigma_per_dim": opts.sigma,
        "expected_cosine_to_source": round(1 / math.sqrt(1 + dim * opts.sigma**2), 3),
        "rare_category": RARE,
        "rare_fraction": opts.rare_fraction,
        "synthetic_note": (
            "real chunk embeddings scaled up: each extra row is a random real chunk's vector "
            f"+ N(0, {opts.sigma}^2) per dimension, renormalised; payload copied from that chunk"
        ),
        "min_recall": MIN_RECALL,
        "pg_store_plan": {"exact_scan_max_rows": pgvector.EXACT_SCAN_MAX_ROWS, "ef_search": pgvector.EF_SEARCH},
        "pg_ef_search": list(opts.pg_ef),
    }


def run(base: BaseData, Q: np.ndarray, opts: ScaleOptions) -> dict[str, Any]:
    """Every size of ``opts.sizes`` against NumPy, pgvector and Milvus; the results dict (``method``,
    ``sizes``, ``skipped``, ``memory_collection``, ``targets``; ``workdir`` when a collection is kept)."""
    scale = ScaleRun(base, Q, opts)
    try:
        for n in opts.sizes:
            scale.run_size(n)
    finally:
        if scale.out["memory_collection"] is None:
            shutil.rmtree(scale.work, ignore_errors=True)
        else:
            scale.out["workdir"] = str(scale.work)
    scale.out["targets"] = targets(scale.out)
    return scale.out


def targets(out: dict[str, Any]) -> dict[str, Any]:
    """The 100k targets: pgvector HNSW within 2x of exact NumPy, Milvus within 5x."""
    t: dict[str, Any] = {"size": TARGET_SIZE}
    if (res := out["sizes"].get(str(TARGET_SIZE))) is None:
        return t | {"note": f"{TARGET_SIZE:,} was not run"}
    numpy_p50 = section(res, "stores", "numpy", "best", "single_ms").get("p50")
    for store, key, limit in (
        ("pgvector", "best_hnsw", TARGET_PG_VS_NUMPY),
        ("milvus", "best", TARGET_MILVUS_VS_NUMPY),
    ):
        s = res["stores"].get(store) or {}
        entry = t[store] = {"limit_x": limit, "numpy_p50_ms": numpy_p50}
        if (best := s.get(key)) is None:
            note = s.get("error") or ("not run" if not s else f"no configuration reached recall@10 >= {MIN_RECALL}")
            entry |= {"met": False, "note": note}
            continue
        p50, r = best["single_ms"]["p50"], ratio(best["single_ms"]["p50"], numpy_p50, 2)
        entry |= {"config": best["config"], "p50_ms": p50, "recall@10": best["recall@10"], "ratio_x": r}
        entry["met"] = r is not None and r <= limit
    return t
