"""Store search at scale: Milvus (the embedded server of a scratch data dir, reached by URI like
the product's default), pgvector and an exact NumPy top-k over the same vectors.

Vectors: the real runbook chunk embeddings, scaled up to each size by copying random chunks
with a small Gaussian perturbation (``sigma`` per dimension) and renormalising; the real
chunks themselves are the first rows. Every row keeps its source chunk's payload (doc id,
title, breadcrumb, text, BM25 text), so a collection is a usable knowledge base; a random
``rare_fraction`` (3 %) of the rows get the category ``bench_rare`` for the filtered searches.
Queries: the benchmark queries' real embeddings.

Per size and store configuration: single-query latency (one query per call), batched
throughput (all queries in one call: a NumPy matrix product, one Milvus ``search`` with many
vectors, a psycopg pipeline for PostgreSQL) and recall@10 against the exact NumPy result,
unfiltered and filtered. Recall is tie-tolerant: a returned row counts when its exact score
is at least the exact 10th-best score (minus 1e-5), so equal-scoring rows are not misses.

Index choice by measurement: Milvus FLAT vs HNSW (M, efConstruction as below) at several
``ef``; pgvector HNSW (pgvector's defaults m=16, ef_construction=64, as the product creates it)
at several ``hnsw.ef_search`` and an exact scan. The best configuration of a store is the
fastest (single-query p50) with recall@10 >= 0.95. Expensive steps are skipped when their
estimate (from the sizes measured before) does not fit the run's remaining time budget; every
skip is recorded with its reason.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    Budget,
    log,
    milvus_lite_engine_collection,
    milvus_lite_settle,
    profile_top,
    progress,
    ratio,
    summarize,
)

RARE = "bench_rare"
COLLECTION = "bench_chunks"
MIN_RECALL = 0.95
TARGET_PG_VS_NUMPY = 2.0
TARGET_MILVUS_VS_NUMPY = 5.0  # issue 14 (was 10x for Milvus Lite 3 in-process)
TARGET_SIZE = 100_000


@dataclass
class ScaleOptions:
    sizes: tuple[int, ...] = (10_000, 100_000, 300_000)
    stores: tuple[str, ...] = ("numpy", "milvus", "pgvector")
    k: int = 10
    sigma: float = 0.05
    rare_fraction: float = 0.03
    seed: int = 13
    milvus_ef: tuple[int, ...] = (32, 64, 128, 256, 512)
    pg_ef: tuple[int, ...] = (40, 100, 200, 400, 1000)
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64
    milvus_hnsw_max_size: int = 0  # the embedded engine (milvus-lite 2.5) has no HNSW
    milvus_max_size: int = 300_000
    pg_max_size: int = 100_000
    pg_parallel_workers: int = 1
    single_queries: int = 20
    single_queries_large: int = 8  # Milvus Lite at >= 50k rows: each query can take ~1 s
    insert_batch: int = 256  # milvus-lite 2.5 inserts cost superlinear in the batch (see MilvusStore)
    keep_milvus_size: int | None = TARGET_SIZE  # kept (FLAT, released) for the memory benchmark
    overlap_pg_build: bool = True
    budget: Budget | None = None
    reserve_s: float = 0.0
    show_progress: bool = True
    workdir: Path | None = None
    pg_dsn: Callable[[], str] | None = None


@dataclass
class BaseData:
    """Source rows: vectors (n, dim) float32 unit rows and one payload dict per row."""

    vectors: np.ndarray
    meta: list[dict[str, str]]

    @classmethod
    def from_corpus(cls, chunks: Sequence[Any], vectors: np.ndarray) -> BaseData:
        from rag_core.text import lexical_string

        meta = [
            {
                "doc_id": c.doc_id,
                "title": c.title,
                "breadcrumb": c.breadcrumb,
                "category": c.category,
                "text": c.text,
                "lexical": lexical_string(c.embed_text),
            }
            for c in chunks
        ]
        return cls(np.asarray(vectors, dtype=np.float32), meta)

    @classmethod
    def synthetic(cls, n: int = 300, dim: int = 384, seed: int = 0) -> BaseData:
        rng = np.random.default_rng(seed)
        v = rng.standard_normal((n, dim)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        meta = [
            {
                "doc_id": f"synthetic/doc{i % 50}.md",
                "title": f"Doc {i % 50}",
                "breadcrumb": f"Doc {i % 50} > Part",
                "category": ("alpha", "beta", "gamma")[i % 3],
                "text": f"synthetic chunk {i}",
                "lexical": f"synthetic chunk {i}",
            }
            for i in range(n)
        ]
        return cls(v, meta)


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
    extras: dict[str, Any] = field(default_factory=dict)


def synthesize(
    base: BaseData, n: int, sigma: float, rare_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def recall_at_k(found: Sequence[Sequence[int]], ds: Dataset, filtered: bool, k: int) -> float:
    """Tie-tolerant recall@k of ``found`` ids per query against the exact result."""
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
    return round(total / len(found), 4) if found else 0.0


def build_dataset(base: BaseData, Q: np.ndarray, n: int, opts: ScaleOptions) -> Dataset:
    X, source, rare = synthesize(base, n, opts.sigma, opts.rare_fraction, opts.seed + n)
    rare_rows = np.flatnonzero(rare)
    S = Q @ X.T
    gt = topk(S, opts.k)
    gt_kth = np.take_along_axis(S, gt[:, -1:], axis=1)[:, 0]
    Sf = S[:, rare_rows]
    loc = topk(Sf, opts.k)
    gt_f = rare_rows[loc]
    gt_f_kth = np.take_along_axis(Sf, loc[:, -1:], axis=1)[:, 0]
    return Dataset(X, source, rare, rare_rows, Q, gt, gt_kth, gt_f, gt_f_kth)


def _config(
    name: str,
    single: list[float],
    batch_s: float | None,
    nq: int,
    recall: float | None,
    single_f: list[float],
    batch_f_s: float | None,
    recall_f: float | None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "config": name,
        "single_ms": summarize(single),
        "batch_qps": round(nq / batch_s, 1) if batch_s else None,
        "batch_s": round(batch_s, 4) if batch_s else None,
        "recall@10": recall,
        "filtered_single_ms": summarize(single_f),
        "filtered_batch_qps": round(nq / batch_f_s, 1) if batch_f_s else None,
        "filtered_recall@10": recall_f,
        **extra,
    }


def best_config(configs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Fastest (single-query p50) configuration with recall@10 >= MIN_RECALL."""
    ok = [
        c
        for c in configs
        if c.get("recall@10") is not None and c["recall@10"] >= MIN_RECALL and c["single_ms"]["p50"] is not None
    ]
    return min(ok, key=lambda c: c["single_ms"]["p50"]) if ok else None


# --- NumPy ------------------------------------------------------------------------------------------


def numpy_exact(ds: Dataset, k: int, name: str = "exact matrix product") -> dict[str, Any]:
    X, Q = ds.X, ds.Q
    Xr = X[ds.rare_rows]  # the category's rows as their own matrix (gather not timed)
    single, single_f, found, found_f = [], [], [], []
    for q in Q[:2]:  # warm-up
        topk(X @ q, k)
    for q in Q:
        t0 = time.perf_counter()
        ids = topk(X @ q, k)
        single.append((time.perf_counter() - t0) * 1000)
        found.append(ids.tolist())
        t0 = time.perf_counter()
        ids_f = ds.rare_rows[topk(Xr @ q, k)]
        single_f.append((time.perf_counter() - t0) * 1000)
        found_f.append(ids_f.tolist())
    t0 = time.perf_counter()
    topk(Q @ X.T, k)
    batch_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    topk(Q @ Xr.T, k)
    batch_f_s = time.perf_counter() - t0
    return _config(
        name,
        single,
        batch_s,
        len(Q),
        recall_at_k(found, ds, False, k),
        single_f,
        batch_f_s,
        recall_at_k(found_f, ds, True, k),
    )


def numpy_configs(ds: Dataset, k: int) -> list[dict[str, Any]]:
    """Exact top-k with the BLAS library's default threads and with one thread: on a busy 2-core
    machine multi-threaded BLAS can be much slower (spinning threads), so both are measured."""
    configs = [numpy_exact(ds, k, "exact matrix product (BLAS default threads)")]
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return configs
    with threadpool_limits(1):
        configs.append(numpy_exact(ds, k, "exact matrix product (1 BLAS thread)"))
    return configs


# --- Milvus Lite ----------------------------------------------------------------------------------------


def _milvus_rows(ds: Dataset, base: BaseData, start: int, end: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(start, end):
        m = base.meta[ds.source[i]]
        rows.append(
            {
                "chunk_id": f"r{i}",
                "doc_id": m["doc_id"],
                "title": m["title"],
                "breadcrumb": m["breadcrumb"],
                "category": RARE if ds.rare[i] else m["category"],
                "text": m["text"],
                "content_hash": "",
                "lexical": m["lexical"],
                "vector": ds.X[i].tolist(),
            }
        )
    return rows


def milvus_load(uri: str, ds: Dataset, base: BaseData, opts: ScaleOptions) -> dict[str, Any]:
    """Create the product schema (MilvusStore, FLAT) and insert every row with raw pymilvus."""
    from pymilvus import MilvusClient

    from rag_core.stores.milvus import MilvusStore

    store = MilvusStore(uri, COLLECTION, index_type="FLAT")
    store.ensure_schema(ds.X.shape[1])
    store.close()
    client = MilvusClient(uri)
    n = len(ds.X)
    t0 = time.perf_counter()
    with progress(total=n, enabled=opts.show_progress, desc=f"milvus insert {n:,}", unit="row") as bar:
        for start in range(0, n, opts.insert_batch):
            end = min(n, start + opts.insert_batch)
            client.insert(COLLECTION, _milvus_rows(ds, base, start, end))
            bar.update(end - start)
    insert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    client.flush(COLLECTION)
    milvus_lite_settle(uri, COLLECTION)
    flush_s = time.perf_counter() - t0
    return {
        "client": client,
        "insert_s": round(insert_s, 2),
        "insert_rows_per_s": round(n / insert_s, 1),
        "flush_s": round(flush_s, 2),
    }


def milvus_set_index(client, uri: str, index_type: str, params: dict[str, Any]) -> float:
    """Replace the dense index (release, drop, create, load, wait for the build); seconds."""
    t0 = time.perf_counter()
    client.release_collection(COLLECTION)
    client.drop_index(COLLECTION, "vector_idx")  # Milvus Lite names indexes "<field>_idx"
    index = client.prepare_index_params()
    index.add_index("vector", index_type=index_type, metric_type="COSINE", params=params)
    client.create_index(COLLECTION, index)
    client.load_collection(COLLECTION)
    milvus_lite_settle(uri, COLLECTION)
    described = client.describe_index(COLLECTION, "vector")
    if not described or described.get("index_type") != index_type:
        raise RuntimeError(f"Milvus index is {described!r}, expected {index_type}")
    return time.perf_counter() - t0


def milvus_measure(
    client, ds: Dataset, k: int, params: dict[str, Any], n_single: int, name: str, **extra: Any
) -> dict[str, Any]:
    sp = {"metric_type": "COSINE", "params": params}

    def search(vectors: np.ndarray, flt: str = "") -> list[list[int]]:
        res = client.search(
            COLLECTION,
            data=[v.tolist() for v in vectors],
            limit=k,
            anns_field="vector",
            output_fields=["chunk_id"],
            filter=flt,
            search_params=sp,
        )
        return [[int(str(h["entity"].get("chunk_id", h.get("id")))[1:]) for h in hits] for hits in res]

    flt = f'category == "{RARE}"'
    search(ds.Q[:1])  # warm-up
    single, single_f = [], []
    for q in ds.Q[:n_single]:
        t0 = time.perf_counter()
        search(q[None, :])
        single.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        search(q[None, :], flt)
        single_f.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    found = search(ds.Q)
    batch_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    found_f = search(ds.Q, flt)
    batch_f_s = time.perf_counter() - t0
    return _config(
        name,
        single,
        batch_s,
        len(ds.Q),
        recall_at_k(found, ds, False, k),
        single_f,
        batch_f_s,
        recall_at_k(found_f, ds, True, k),
        **extra,
    )


def milvus_bm25(client, base: BaseData, ds: Dataset, k: int, n: int) -> dict[str, Any]:
    """Single-query BM25 search latency (the product's sparse call) with three terms taken from
    a real chunk's lexical text per query (deterministic)."""
    rng = np.random.default_rng(7)
    times = []
    for i in range(n + 1):
        words = base.meta[int(rng.integers(0, len(base.meta)))]["lexical"].split() or ["pod"]
        terms = " ".join(rng.choice(words, size=min(3, len(words)), replace=False))
        t0 = time.perf_counter()
        client.search(
            COLLECTION,
            data=[terms],
            anns_field="sparse",
            limit=k,
            output_fields=["chunk_id"],
            search_params={"metric_type": "BM25"},
        )
        if i:
            times.append((time.perf_counter() - t0) * 1000)
    return summarize(times)


def _subset(ds: Dataset, n: int) -> Dataset:
    """The dataset restricted to its first ``n`` queries (for recall over a query subset)."""
    return Dataset(
        ds.X, ds.source, ds.rare, ds.rare_rows, ds.Q[:n], ds.gt[:n], ds.gt_kth[:n], ds.gt_f[:n], ds.gt_f_kth[:n]
    )


def _time_product_search(store, ds: Dataset, k: int, n: int) -> dict[str, Any]:
    """Single-query latency and recall@k of a product store's ``search``, unfiltered and
    filtered, on the first ``n`` queries; closes the store."""
    store.search(ds.Q[0], k)
    single, single_f, found, found_f = [], [], [], []
    for q in ds.Q[:n]:
        t0 = time.perf_counter()
        found.append([int(h.chunk_id[1:]) for h in store.search(q, k)])
        single.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        found_f.append([int(h.chunk_id[1:]) for h in store.search(q, k, RARE)])
        single_f.append((time.perf_counter() - t0) * 1000)
    store.close()
    sub = _subset(ds, n)
    return {
        "single_ms": summarize(single),
        "recall@10": recall_at_k(found, sub, False, k),
        "filtered_single_ms": summarize(single_f),
        "filtered_recall@10": recall_at_k(found_f, sub, True, k),
    }


def milvus_store_api(uri: str, ds: Dataset, k: int, n: int) -> dict[str, Any]:
    """The product call (MilvusStore.search: output fields incl. text) on the same collection,
    with its recall on the ``n`` queries timed."""
    from rag_core.stores.milvus import MilvusStore

    store = MilvusStore(uri, COLLECTION)
    return _time_product_search(store, ds, k, n)


def milvus_profile(uri: str, client, ds: Dataset, k: int, params: dict[str, Any]) -> dict[str, Any]:
    """Where a Milvus Lite search spends its time: client round trip vs the in-process engine,
    and the engine's top functions (cProfile of the engine's own search call)."""
    col = milvus_lite_engine_collection(uri, COLLECTION)
    if col is None:
        return {"error": "Milvus Lite engine not reachable in-process"}
    qs = ds.Q[:3]
    client_ms, engine_ms = [], []
    for q in qs:
        t0 = time.perf_counter()
        client.search(
            COLLECTION,
            data=[q.tolist()],
            limit=k,
            anns_field="vector",
            output_fields=["chunk_id"],
            search_params={"metric_type": "COSINE", "params": params},
        )
        client_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        col.search([q.tolist()], top_k=k, anns_field="vector", output_fields=["chunk_id"], search_params=params)
        engine_ms.append((time.perf_counter() - t0) * 1000)

    def run():
        for q in qs:
            col.search([q.tolist()], top_k=k, anns_field="vector", output_fields=["chunk_id"], search_params=params)

    return {
        "client_ms_p50": round(float(np.median(client_ms)), 2),
        "engine_ms_p50": round(float(np.median(engine_ms)), 2),
        "engine_top_functions": profile_top(run, sort="tottime", top=10, per=len(qs)),
    }


# --- pgvector ----------------------------------------------------------------------------------------


def pg_load(dsn: str, table: str, ds: Dataset, base: BaseData, opts: ScaleOptions) -> dict[str, Any]:
    """Product table (PgVectorStore.ensure_schema), bulk COPY (binary) with the HNSW and full-text
    indexes dropped, then the HNSW index built as the product builds it (pgvector defaults)."""
    import psycopg
    from pgvector.psycopg import register_vector

    from rag_core.stores.pgvector import PgVectorStore

    store = PgVectorStore(dsn, table)
    store.drop()
    store.ensure_schema(ds.X.shape[1])
    store.close()
    n = len(ds.X)
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(f"DROP INDEX IF EXISTS {table}_embedding_hnsw")
        conn.execute(f"DROP INDEX IF EXISTS {table}_lexical_gin")
        t0 = time.perf_counter()
        with (
            conn.cursor() as cur,
            cur.copy(
                f"COPY {table} (chunk_id, doc_id, title, breadcrumb, category, text, content_hash, lexical, "
                "embedding) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy,
        ):
            copy.set_types(["text"] * 8 + ["vector"])
            for i in range(n):
                m = base.meta[ds.source[i]]
                copy.write_row(
                    (
                        f"r{i}",
                        m["doc_id"],
                        m["title"],
                        m["breadcrumb"],
                        RARE if ds.rare[i] else m["category"],
                        m["text"].replace("\x00", ""),
                        "",
                        m["lexical"],
                        ds.X[i],
                    )
                )
        conn.execute(f"ANALYZE {table}")
        copy_s = time.perf_counter() - t0
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute(f"SET max_parallel_maintenance_workers = {int(opts.pg_parallel_workers)}")
        t0 = time.perf_counter()
        conn.execute(
            f"CREATE INDEX {table}_embedding_hnsw ON {table} USING hnsw (embedding vector_cosine_ops) "
            f"WITH (m = {opts.hnsw_m}, ef_construction = {opts.hnsw_ef_construction})"
        )
        build_s = time.perf_counter() - t0
        size = conn.execute(f"SELECT pg_relation_size('{table}_embedding_hnsw')").fetchone()[0]
    return {
        "copy_s": round(copy_s, 2),
        "copy_rows_per_s": round(n / copy_s, 1),
        "hnsw_build_s": round(build_s, 2),
        "hnsw_index_mb": round(size / 2**20, 1),
    }


def pg_measure(dsn: str, table: str, ds: Dataset, k: int, mode: str, ef: int | None) -> dict[str, Any]:
    import psycopg
    from pgvector.psycopg import register_vector

    dense = f"SELECT chunk_id FROM {table} ORDER BY embedding <=> %s LIMIT {k}"
    # relaxed_order iterative scans may return rows slightly out of order: re-sort outside.
    filtered = (
        f"WITH c AS MATERIALIZED (SELECT chunk_id, embedding <=> %s AS d FROM {table} WHERE category = %s "
        f"ORDER BY embedding <=> %s LIMIT {k}) SELECT chunk_id FROM c ORDER BY d"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        register_vector(conn)
        if mode == "hnsw":
            conn.execute(f"SET hnsw.ef_search = {int(ef)}")
            conn.execute("SET hnsw.iterative_scan = relaxed_order")
        else:
            conn.execute("SET enable_indexscan = off")
        plan = conn.execute("EXPLAIN " + dense, (ds.Q[0],)).fetchall()
        uses_index = any("hnsw" in r[0] for r in plan)

        def ids(rows) -> list[int]:
            return [int(r[0][1:]) for r in rows]

        for q in ds.Q[:3]:  # warm-up (and psycopg's statement preparation)
            conn.execute(dense, (q,)).fetchall()
            conn.execute(filtered, (q, RARE, q)).fetchall()
        single, single_f, found, found_f = [], [], [], []
        for q in ds.Q:
            t0 = time.perf_counter()
            found.append(ids(conn.execute(dense, (q,)).fetchall()))
            single.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            found_f.append(ids(conn.execute(filtered, (q, RARE, q)).fetchall()))
            single_f.append((time.perf_counter() - t0) * 1000)

        def batch(sql: str, args: Callable[[np.ndarray], tuple]) -> float:
            t0 = time.perf_counter()
            with conn.pipeline():
                curs = [conn.execute(sql, args(q)) for q in ds.Q]
            for c in curs:
                c.fetchall()
            return time.perf_counter() - t0

        batch_s = batch(dense, lambda q: (q,))
        batch_f_s = batch(filtered, lambda q: (q, RARE, q))
    name = f"HNSW ef_search={ef}" if mode == "hnsw" else "exact scan (no index)"
    return _config(
        name,
        single,
        batch_s,
        len(ds.Q),
        recall_at_k(found, ds, False, k),
        single_f,
        batch_f_s,
        recall_at_k(found_f, ds, True, k),
        plan_uses_hnsw=uses_index,
    )


def pg_store_api(dsn: str, table: str, ds: Dataset, k: int, n: int) -> dict[str, Any]:
    """The product call (PgVectorStore.search: exact below 20k candidate rows, else HNSW ef_search=100
    with iterative scans) on the same table, with its recall."""
    from rag_core.stores.pgvector import PgVectorStore

    store = PgVectorStore(dsn, table)
    return _time_product_search(store, ds, k, n)


# --- the benchmark ------------------------------------------------------------------------------------


def _pg_store_plan() -> dict[str, Any]:
    """PgVectorStore's dense-search plan constants (exact scan below a row count, else HNSW)."""
    try:
        from rag_core.stores import pgvector

        return {
            "exact_scan_max_rows": getattr(pgvector, "EXACT_SCAN_MAX_ROWS", None),
            "ef_search": getattr(pgvector, "EF_SEARCH", None),
        }
    except Exception:
        return {}


def _pg_job(result: dict[str, Any], dsn: str, table: str, ds: Dataset, base: BaseData, opts: ScaleOptions) -> None:
    try:
        result["load"] = pg_load(dsn, table, ds, base, opts)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]


class _Estimates:
    """Seconds per row (or per row-log) learned from the sizes already run."""

    def __init__(self) -> None:
        self.per_row: dict[str, tuple[int, float]] = {}

    def learn(self, key: str, n: int, seconds: float) -> None:
        self.per_row[key] = (n, seconds)

    def estimate(self, key: str, n: int, nlogn: bool = False) -> float | None:
        if key not in self.per_row:
            return None
        n0, s0 = self.per_row[key]
        factor = n / n0 * (math.log(n) / math.log(n0) if nlogn and n0 > 1 else 1.0)
        return s0 * factor


def run(base: BaseData, Q: np.ndarray, opts: ScaleOptions) -> dict[str, Any]:
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="rag-bench-scale-", dir=opts.workdir))
    work.chmod(0o755)
    est = _Estimates()
    out: dict[str, Any] = {
        "method": {
            "base_rows": int(len(base.vectors)),
            "dim": int(base.vectors.shape[1]),
            "queries": int(len(Q)),
            "k": opts.k,
            "sigma_per_dim": opts.sigma,
            "expected_cosine_to_source": round(1 / math.sqrt(1 + base.vectors.shape[1] * opts.sigma**2), 3),
            "rare_category": RARE,
            "rare_fraction": opts.rare_fraction,
            "synthetic_note": (
                "real chunk embeddings scaled up: each extra row is a random real chunk's vector "
                f"+ N(0, {opts.sigma}^2) per dimension, renormalised; payload copied from that chunk"
            ),
            "hnsw": {"M": opts.hnsw_m, "efConstruction": opts.hnsw_ef_construction},
            "min_recall": MIN_RECALL,
            "pg_store_plan": _pg_store_plan(),
            "milvus_ef": list(opts.milvus_ef),
            "pg_ef_search": list(opts.pg_ef),
        },
        "sizes": {},
        "skipped": [],
        "memory_collection": None,
    }

    def fits(what: str, n: int, seconds: float | None) -> bool:
        if seconds is None or opts.budget is None:
            return True
        left = opts.budget.remaining() - opts.reserve_s
        if seconds <= left:
            return True
        out["skipped"].append(
            {
                "size": n,
                "what": what,
                "reason": f"estimated {seconds:.0f} s (from the smaller size) > {max(0.0, left):.0f} s left "
                "in the run's time budget",
            }
        )
        log(f"scale {n:,}: skipping {what} (estimated {seconds:.0f} s, {max(0.0, left):.0f} s left)")
        return False

    milvus_choice: dict[str, Any] | None = None
    try:
        for n in opts.sizes:
            log(f"scale: {n:,} vectors")
            res: dict[str, Any] = {"rows": n, "setup": {}, "stores": {}}
            t0 = time.perf_counter()
            ds = build_dataset(base, Q, n, opts)
            res["setup"]["generate_and_exact_gt_s"] = round(time.perf_counter() - t0, 2)
            res["rare_rows"] = int(len(ds.rare_rows))
            large = n >= 50_000
            n_single = opts.single_queries_large if large else opts.single_queries

            if "numpy" in opts.stores:
                configs = numpy_configs(ds, opts.k)
                res["stores"]["numpy"] = {"configs": configs, "best": best_config(configs)}

            # Start the pgvector load + index build in the background (PostgreSQL does the work in
            # its own processes) while Milvus inserts; nothing is searched until both are done.
            pg_future: dict[str, Any] = {}
            pg_thread = None
            want_pg = "pgvector" in opts.stores and opts.pg_dsn is not None and n <= opts.pg_max_size
            if "pgvector" in opts.stores and n > opts.pg_max_size:
                out["skipped"].append(
                    {
                        "size": n,
                        "what": "pgvector",
                        "reason": f"above --pg-max-size {opts.pg_max_size:,} (HNSW build time)",
                    }
                )
            if want_pg:
                pg_est = (est.estimate("pg_copy", n) or 0) + (est.estimate("pg_build", n, nlogn=True) or 0)
                want_pg = fits("pgvector (COPY + HNSW build)", n, pg_est or None)
            table = f"bench_scale_{n}"
            if want_pg:
                dsn = opts.pg_dsn()

                pg_thread = threading.Thread(
                    target=_pg_job, args=(pg_future, dsn, table, ds, base, opts), name="pg-load", daemon=True
                )
                pg_thread.start()
                if not opts.overlap_pg_build:
                    pg_thread.join()

            want_milvus = "milvus" in opts.stores and n <= opts.milvus_max_size
            if "milvus" in opts.stores and n > opts.milvus_max_size:
                out["skipped"].append(
                    {"size": n, "what": "milvus", "reason": f"above --milvus-max-size {opts.milvus_max_size:,}"}
                )
            if want_milvus:
                m_est = est.estimate("milvus_insert", n)
                flat_q = est.estimate("milvus_flat_query", n)
                if m_est is not None and flat_q is not None:
                    m_est += flat_q * (2 * n_single + 2 * len(Q) / 10)
                want_milvus = fits("milvus (insert + FLAT searches)", n, m_est)
            mdir = work / f"milvus-{n}"
            uri = ""
            client = None
            if want_milvus:
                try:
                    from rag_core.stores.milvus_server import ensure_server

                    uri = ensure_server(mdir).uri
                    loaded = milvus_load(uri, ds, base, opts)
                    client = loaded.pop("client")
                    res["setup"]["milvus"] = loaded
                    est.learn("milvus_insert", n, loaded["insert_s"] + loaded["flush_s"])
                except Exception as exc:
                    res["stores"]["milvus"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                    want_milvus = False

            if pg_thread is not None:
                pg_thread.join()
                if "error" in pg_future:
                    res["stores"]["pgvector"] = {"error": pg_future["error"]}
                else:
                    load = pg_future["load"]
                    load["overlapped_with_milvus_insert"] = bool(opts.overlap_pg_build and want_milvus)
                    res["setup"]["pgvector"] = load
                    est.learn("pg_copy", n, load["copy_s"])
                    est.learn("pg_build", n, load["hnsw_build_s"])
                    configs = []
                    for ef in progress(opts.pg_ef, enabled=opts.show_progress, desc=f"pgvector {n:,}"):
                        configs.append(pg_measure(dsn, table, ds, opts.k, "hnsw", ef))
                    configs.append(pg_measure(dsn, table, ds, opts.k, "exact", None))
                    hnsw_only = [c for c in configs if c["config"].startswith("HNSW")]
                    res["stores"]["pgvector"] = {
                        "configs": configs,
                        "best": best_config(configs),
                        "best_hnsw": best_config(hnsw_only),
                        "store_api": pg_store_api(dsn, table, ds, opts.k, min(len(Q), 20)),
                    }
                    try:
                        import psycopg

                        with psycopg.connect(dsn, autocommit=True) as conn:
                            conn.execute(f"DROP TABLE IF EXISTS {table}")
                    except Exception:
                        pass

            if want_milvus and client is not None:
                try:
                    configs = []
                    t0 = time.perf_counter()
                    configs.append(milvus_measure(client, ds, opts.k, {}, n_single, "FLAT"))
                    bm25_ms = milvus_bm25(client, base, ds, opts.k, n_single)
                    est.learn("milvus_flat_query", n, (time.perf_counter() - t0) / (2 * n_single + 2 * len(Q) / 10))
                    try_hnsw = n <= opts.milvus_hnsw_max_size or (milvus_choice or {}).get("config", "").startswith(
                        "HNSW"
                    )
                    if n > opts.milvus_hnsw_max_size and try_hnsw is False:
                        out["skipped"].append(
                            {
                                "size": n,
                                "what": "milvus HNSW",
                                "reason": f"above --milvus-hnsw-max-size {opts.milvus_hnsw_max_size:,} and FLAT "
                                "was the best Milvus index at the smaller size",
                            }
                        )
                    if try_hnsw and fits("milvus HNSW build + searches", n, est.estimate("milvus_hnsw", n, nlogn=True)):
                        t0 = time.perf_counter()
                        build_s = milvus_set_index(
                            client, uri, "HNSW", {"M": opts.hnsw_m, "efConstruction": opts.hnsw_ef_construction}
                        )
                        res["setup"]["milvus"]["hnsw_build_s"] = round(build_s, 2)
                        efs = (
                            opts.milvus_ef
                            if n <= opts.milvus_hnsw_max_size
                            else ([int(milvus_choice["config"].split("=")[1])] if milvus_choice else opts.milvus_ef)
                        )
                        for ef in progress(efs, enabled=opts.show_progress, desc=f"milvus HNSW {n:,}"):
                            configs.append(milvus_measure(client, ds, opts.k, {"ef": ef}, n_single, f"HNSW ef={ef}"))
                        est.learn("milvus_hnsw", n, time.perf_counter() - t0)
                    best = best_config(configs)
                    res["stores"]["milvus"] = {"configs": configs, "best": best, "bm25_ms": bm25_ms}
                    if n <= opts.milvus_hnsw_max_size:
                        milvus_choice = best
                    current = "HNSW" if any(c["config"].startswith("HNSW") for c in configs) else "FLAT"
                    if current == "HNSW" and (best is None or best["config"] == "FLAT"):
                        milvus_set_index(client, uri, "FLAT", {})
                        current = "FLAT"
                    if best and n == TARGET_SIZE:  # where a Milvus Lite search spends its time
                        params = {"ef": int(best["config"].split("=")[1])} if current == "HNSW" else {}
                        res["stores"]["milvus"]["profile"] = milvus_profile(uri, client, ds, opts.k, params)
                    api = milvus_store_api(uri, ds, opts.k, min(n_single, 5))
                    api["index"] = current
                    res["stores"]["milvus"]["store_api"] = api
                    if opts.keep_milvus_size == n:
                        if current != "FLAT":  # the product's default index, for the memory benchmark
                            milvus_set_index(client, uri, "FLAT", {})
                        out["memory_collection"] = {
                            "uri": uri,
                            "data_dir": str(mdir),
                            "collection": COLLECTION,
                            "rows": n,
                            "index": "FLAT",
                        }
                except Exception as exc:
                    log(f"scale {n:,}: milvus failed: {exc}")
                    res["stores"]["milvus"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                finally:
                    client.close()
                    if out["memory_collection"] is None or out["memory_collection"]["uri"] != uri:
                        from rag_core.stores.milvus_server import stop_server

                        stop_server(mdir)
                        shutil.rmtree(mdir, ignore_errors=True)

            numpy_best = res["stores"].get("numpy", {}).get("best")
            for name, store in res["stores"].items():
                if name != "numpy" and isinstance(store, dict) and store.get("best") and numpy_best:
                    store["best_vs_numpy_p50"] = ratio(
                        store["best"]["single_ms"]["p50"], numpy_best["single_ms"]["p50"], 2
                    )
            out["sizes"][str(n)] = res
            del ds
    finally:
        if out["memory_collection"] is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            out["workdir"] = str(work)
    out["targets"] = targets(out)
    return out


def targets(out: dict[str, Any]) -> dict[str, Any]:
    """The 100k targets: pgvector HNSW within 2x of exact NumPy, Milvus Lite within 10x."""
    res = out["sizes"].get(str(TARGET_SIZE))
    t: dict[str, Any] = {"size": TARGET_SIZE}
    if res is None:
        t["note"] = f"{TARGET_SIZE:,} was not run"
        return t
    numpy_p50 = res["stores"].get("numpy", {}).get("best", {}).get("single_ms", {}).get("p50")
    for store, key, limit in (
        ("pgvector", "best_hnsw", TARGET_PG_VS_NUMPY),
        ("milvus", "best", TARGET_MILVUS_VS_NUMPY),
    ):
        s = res["stores"].get(store) or {}
        best = s.get(key)
        entry: dict[str, Any] = {"limit_x": limit, "numpy_p50_ms": numpy_p50}
        if best is None:
            entry["met"] = False
            entry["note"] = s.get("error") or ("not run" if not s else "no configuration reached recall@10 >= 0.95")
        else:
            r = ratio(best["single_ms"]["p50"], numpy_p50, 2)
            entry.update(
                {
                    "config": best["config"],
                    "p50_ms": best["single_ms"]["p50"],
                    "recall@10": best["recall@10"],
                    "ratio_x": r,
                    "met": r is not None and r <= limit,
                }
            )
        t[store] = entry
    return t
