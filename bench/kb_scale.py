"""Knowledge-base scale benchmark (issue 23): our own ingest overhead, peak memory and L0 lookup
cost at 10k documents (100k with ``--docs 100000``), generated from the real corpora.

``python -m bench.kb_scale [--docs 10000] [--batch-docs 1000] [--real-docs 100] [--no-l0]``
(``make bench`` runs it as ``kb_scale``). The knowledge base is generated at run time in a
scratch dir, never committed: every document recombines sections of the runbooks in
``../shared/corpora`` (English and Chinese), under a varied name (a service name joined to the
source alert name), folder (team / category), frontmatter (title, category or none, keywords,
entities, aliases) and a service line; document ``i`` depends only on the seed and ``i``, so the
1k knowledge base is the first 1k documents of the 10k one. Skipped with a clear message when
the corpora are absent.

Ingest: the real ``rag_core.ingest.pipeline.ingest`` with a fast fake embedder (hash-seeded unit
vectors, whitespace token count) and a store that keeps only chunk ids and hashes in a SQLite
file (a real store's rows live in its server), so the figures are listing, parsing, chunking,
planning, the L0 build, the embedding cache and the store calls, not the model. Each ingest
runs in its own process (peak RSS is that process's ``ru_maxrss``). At every size: a first
ingest streamed in ``--batch-docs`` batches and (up to ``--whole-max`` documents) one of the
whole tree in one batch, the memory profile before streaming; peak RSS ratios against 1k and
10k. At ``--reingest-docs``: an unchanged re-ingest, one with 1 % of the documents changed, and
an ingest interrupted (KeyboardInterrupt, as Ctrl-C) half way through its embeddings then run
again: passages re-embedded on resume (0 expected).

Real model (``--real-docs``, default 100 documents: a real 10k ingest takes most of an hour on
this machine): the default settings' embedder on the first documents, raw encode of their chunk
texts (length-sorted, 256 per call, as the embed stage), a full ingest, raw encode again, in one
process; chunks/s of each, the ratio, and the 10k time extrapolated from it (said as such).

Known limit: the two real corpora share relative doc ids (``node/X.md`` in both languages), so
the "real corpora" L0 row indexes the 111 distinct ids, not all 157 documents.

L0: ``L0Index.analyze_query`` (indexed) against the pre-issue-23 scan over every entry
(``bench/l0_linear.py``) on the same queries (document titles, keywords, entities, typo'd
names, free text drawn from the first 1k documents) at the real corpus, 1k, 10k (and 100k)
documents, interleaved, p50/p95 in ms; every answer of the two is compared (must be equal).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import SHARED, log, ratio, summarize

CORPORA = SHARED / "corpora"
SOURCES = {
    "en": CORPORA / "prometheus-runbooks" / "content" / "runbooks",
    "zh": CORPORA / "kubesphere-runbooks-zh" / "content.zh" / "runbooks",
}
SEED = 23
DIM = 384
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
    for lang, root in SOURCES.items():
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
    """Hash-seeded unit vectors (``DIM``-d) and a whitespace token count: costs microseconds
    per chunk, so an ingest's time is the pipeline's own."""

    backend, model_id, dimension, max_tokens, fingerprint = "bench-fake", "hash", DIM, 512, "kbscale00000000"

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2

    def identity(self) -> Any:
        from rag_core.embedding.base import ModelIdentity

        return ModelIdentity(self.backend, self.model_id, DIM, self.fingerprint)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_passages([text])[0]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_passages(texts)

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for row, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            out[row] = np.random.default_rng(seed).standard_normal(DIM, dtype=np.float32)
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out


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


class InterruptingEmbedder(FastFakeEmbedder):
    """``FastFakeEmbedder`` that raises KeyboardInterrupt (Ctrl-C) once ``limit`` chunk passages
    were embedded; ``passages`` counts them (document titles not counted)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit, self.passages = limit, 0

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
        from rag_core.lookup.title_similarity import TITLE_LABEL

        chunks = sum(1 for label in ids or [""] * len(texts) if not label.startswith(TITLE_LABEL))
        if self.limit is not None and self.passages + chunks > self.limit:
            raise KeyboardInterrupt
        self.passages += chunks
        return super().embed_passages(texts, ids)


# --- one ingest, in its own process ---------------------------------------------------------------


def _child_ingest(kb: Path, data_dir: Path, batch_docs: int, interrupt_after: int | None = None) -> dict[str, Any]:
    """One ingest (``batch_docs`` 0: the whole tree in one batch, as before streaming)."""
    from bench.common import make_settings
    from rag_core.ingest.pipeline import IngestInterrupted, ingest

    settings = make_settings(data_dir, kb, ingest_max_remove_share=1.0)
    store = ThinStore(data_dir / "thin_store.sqlite3")
    embedder = InterruptingEmbedder(interrupt_after)
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


def run_ingest(kb: Path, data_dir: Path, batch_docs: int, interrupt_after: int | None = None) -> dict[str, Any]:
    """One ``ingest`` of ``kb`` into ``data_dir`` in a fresh process; its figures."""
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.kb_scale", "--child", str(kb), str(data_dir), str(batch_docs)]
    if interrupt_after is not None:
        cmd.append(str(interrupt_after))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if proc.returncode != 0:
        raise RuntimeError(f"ingest child failed: {proc.stderr.strip()[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --- the real model: ingest vs raw encode ---------------------------------------------------------


def _child_real(kb: Path, data_dir: Path, batch_docs: int) -> dict[str, Any]:
    """The default model (``make_embedder`` of default settings) on one sample knowledge base:
    raw encode of its chunks' texts (length-sorted, in the embed stage's 256-chunk steps), a
    full ingest into an empty data dir (thin store), raw encode again; one process, one model."""
    from bench.common import make_settings
    from rag_core.embedding import make_embedder
    from rag_core.ingest.documents import scan_documents
    from rag_core.ingest.embed import MIN_STEP
    from rag_core.ingest.pipeline import IngestReport, chunk_documents, ingest

    settings = make_settings(data_dir, kb)
    embedder = make_embedder(settings)
    docs, _ = scan_documents(kb)
    _docs, chunks = chunk_documents(docs, settings, IngestReport(str(kb)), embedder)
    texts = sorted((c.embed_text for c in chunks), key=len)
    embedder.embed_passages(texts[:8])  # load the model outside the timings

    def raw() -> float:
        t0 = time.perf_counter()
        for i in range(0, len(texts), MIN_STEP):
            embedder.embed_passages(texts[i : i + MIN_STEP])
        return time.perf_counter() - t0

    raw_before = raw()
    store = ThinStore(data_dir / "thin_store.sqlite3")
    t0 = time.perf_counter()
    report = ingest(settings, embedder, [store], progress=False, batch_docs=batch_docs)
    ingest_s = time.perf_counter() - t0
    store.close()
    raw_after = raw()
    return {
        "backend": settings.embedding_backend,
        "model": embedder.identity().describe(),
        "documents": len(docs),
        "chunks": len(texts),
        "ingest_chunks": report.chunks_total,
        "passages_embedded": report.passages_embedded,
        "cache_hits": report.embedding_cache_hits,
        "raw_s": [round(raw_before, 2), round(raw_after, 2)],
        "ingest_s": round(ingest_s, 2),
        "stage_seconds": report.stage_seconds,
    }


def run_real(kb: Path, data_dir: Path, batch_docs: int) -> dict[str, Any]:
    """``_child_real`` in a fresh process; its figures with chunks/s and the ratio."""
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.kb_scale", "--child-real", str(kb), str(data_dir), str(batch_docs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if proc.returncode != 0:
        raise RuntimeError(f"real-model child failed: {proc.stderr.strip()[-2000:]}")
    out = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    raw_s = sum(out["raw_s"]) / len(out["raw_s"])
    out["raw_chunks_per_s"] = round(out["chunks"] / raw_s, 2)
    out["ingest_chunks_per_s"] = round(out["ingest_chunks"] / out["ingest_s"], 2)
    out["ingest_vs_raw"] = ratio(out["ingest_chunks_per_s"], out["raw_chunks_per_s"], 3)
    return out


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
    """Indexed vs linear ``analyze_query`` on one document set: ms p50/p95, build seconds,
    and whether every answer was equal."""
    from bench.l0_linear import LinearL0Index
    from rag_core.l0 import L0Index

    t0 = time.perf_counter()
    new = L0Index.build(index_docs)
    build_s = time.perf_counter() - t0
    old = LinearL0Index(new.entries.values())
    old._linear_choices()
    times: dict[str, list[float]] = {"linear": [], "indexed": []}
    mismatches = []
    for q in queries[:3]:  # warm-up (caches of the tokenizer)
        new.analyze_query(q), old.analyze_query(q)
    for _ in range(rounds):
        for q in queries:
            a = time.perf_counter()
            h_new = new.analyze_query(q)
            b = time.perf_counter()
            h_old = old.analyze_query(q)
            c = time.perf_counter()
            times["indexed"].append((b - a) * 1000)
            times["linear"].append((c - b) * 1000)
            if h_new.to_dict() != h_old.to_dict():
                mismatches.append(q)
    stats = {k: summarize(v) for k, v in times.items()}
    return {
        "documents": len(new),
        "build_s": round(build_s, 3),
        "linear_ms": {"p50": stats["linear"]["p50"], "p95": stats["linear"]["p95"]},
        "indexed_ms": {"p50": stats["indexed"]["p50"], "p95": stats["indexed"]["p95"]},
        "equal": not mismatches,
        "mismatched_queries": sorted(set(mismatches))[:5],
    }


def _real_documents() -> list[Any]:
    from rag_core.ingest.documents import scan_documents

    docs: list[Any] = []
    for root in SOURCES.values():
        docs.extend(scan_documents(root)[0])
    return docs


# --- the run ---------------------------------------------------------------------------------------


def run(
    docs: int = 10_000,
    batch_docs: int = 1000,
    rounds: int = 3,
    workdir: Path | None = None,
    *,
    real_docs: int = 100,
    whole_max: int = 10_000,
    reingest_docs: int = 10_000,
    l0: bool = True,
) -> dict[str, Any]:
    """The whole benchmark (module docstring); ``{"skipped": reason}`` without the corpora."""
    sources = load_sources()
    if isinstance(sources, str):
        log(f"kb_scale skipped: {sources}")
        return {"skipped": sources}
    from bench.common import load_average
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
        if l0:
            real = _real_documents()
            log(f"kb_scale: L0 on the real corpora ({len(real)} documents)")
            out["l0"].append({"kb": "real corpora", **l0_compare(real, queries, rounds)})
        made = 0
        for size in sizes:
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
            sample = scratch / "kb-real"
            generate(sample, real_docs, sources)
            log(f"kb_scale: the default model on {real_docs} documents (raw encode, ingest, raw encode)")
            out["real_model"] = run_real(sample, scratch / "real", batch_docs)
        out["load_average_end"] = load_average()
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
    lines = [f"load average: start {out.get('load_average_start')}, end {out.get('load_average_end')}", ""]
    if out["l0"]:
        lines += _l0_table(out["l0"])
    lines += _first_table(out["first"], out["batch_docs"])
    runs = out.get("ingest", {})
    if runs:
        stages = sorted({s for r in runs.values() for s in r["stage_seconds"]})
        lines += [
            "",
            "## Re-ingests (fake embedder, thin store; one process each, streamed)",
            "",
            "| run | wall s | docs/s | chunks | embedded | peak RSS MB | "
            + " | ".join(f"{s} s" for s in stages)
            + " |",
            "|---|---:|---:|---:|---:|---:|" + "---:|" * len(stages),
        ]
        for name, r in runs.items():
            cells = " | ".join(str(r["stage_seconds"].get(s, "")) for s in stages)
            lines.append(
                f"| {name} | {r['wall_s']} | {round(r['documents'] / r['wall_s'])} | {r['chunks']} "
                f"| {r['passages_embedded']} | {r['peak_rss_mb']} | {cells} |"
            )
    if "resume" in out:
        r = out["resume"]
        lines += [
            "",
            f"Interrupted (Ctrl-C) after {r['interrupted']['passages_embedded']} passages "
            f"({r['interrupted']['wall_s']} s), resumed: {r['resumed']['passages_embedded']} embedded, "
            f"{r['resumed']['cache_hits']} from the cache, re-embedded on resume: {r['re_embedded']}, "
            f"same chunks as an uninterrupted run: {r['same_chunks']}",
        ]
    if "real_model" in out:
        lines += _real_lines(out["real_model"], out["first"])
    return "\n".join(lines)


def _l0_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        f"## L0 lookup (analyze_query), {len(rows)} sizes, same queries",
        "",
        "| knowledge base | docs | build s | linear p50 ms | linear p95 ms | indexed p50 ms | indexed p95 ms "
        "| speed-up p50 | indexed p50 vs real corpora | equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    base = rows[0]["indexed_ms"]["p50"]
    for r in rows:
        lines.append(
            f"| {r['kb']} | {r['documents']} | {r['build_s']} | {r['linear_ms']['p50']} | {r['linear_ms']['p95']} "
            f"| {r['indexed_ms']['p50']} | {r['indexed_ms']['p95']} "
            f"| {ratio(r['linear_ms']['p50'], r['indexed_ms']['p50'], 1)}x "
            f"| {ratio(r['indexed_ms']['p50'], base, 2)}x | {r['equal']} |"
        )
    return lines


def _first_table(first: dict[str, Any], batch_docs: int) -> list[str]:
    lines = [
        "",
        f"## First ingest: streamed ({batch_docs} documents per batch) vs one batch "
        "(the whole tree at once, as before streaming); fake embedder, thin store, one process each",
        "",
        "| docs | mode | wall s | chunks | chunks/s | peak RSS MB | RSS vs 1k docs | RSS vs 10k docs | L0 MB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, runs in first.items():
        for mode, r in runs.items():
            base1 = first.get("1000", {}).get(mode, {}).get("peak_rss_mb")
            base10 = first.get("10000", {}).get(mode, {}).get("peak_rss_mb")
            lines.append(
                f"| {size} | {mode} | {r['wall_s']} | {r['chunks']} | {round(r['chunks'] / r['wall_s'])} "
                f"| {r['peak_rss_mb']} | {ratio(r['peak_rss_mb'], base1, 2)}x | {ratio(r['peak_rss_mb'], base10, 2)}x "
                f"| {round(r['l0_bytes'] / 1e6, 1)} |"
            )
    return lines


def _real_lines(r: dict[str, Any], first: dict[str, Any]) -> list[str]:
    chunks_10k = first.get("10000", {}).get("streamed", {}).get("chunks")
    lines = [
        "",
        f"## The default model ({r['model']}) on {r['documents']} documents, {r['chunks']} chunks, one process",
        "",
        "| | seconds | chunks/s |",
        "|---|---:|---:|",
        f"| raw encode (before, after the ingest) | {r['raw_s'][0]}, {r['raw_s'][1]} | {r['raw_chunks_per_s']} |",
        f"| ingest (empty data dir: scan, chunk, embed, titles, write, L0) | {r['ingest_s']} "
        f"| {r['ingest_chunks_per_s']} |",
        "",
        f"ingest / raw encode chunks/s: {r['ingest_vs_raw']} (goal >= 0.85); ingest stages: {r['stage_seconds']}",
    ]
    if chunks_10k:
        minutes = chunks_10k / r["ingest_chunks_per_s"] / 60
        lines.append(
            f"10k documents ({chunks_10k} chunks) at this rate: about {minutes:.0f} min (extrapolated, not measured)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        cut = int(argv[4]) if len(argv) > 4 else None
        print(json.dumps(_child_ingest(Path(argv[1]), Path(argv[2]), int(argv[3]), cut)))
        return 0
    if argv[:1] == ["--child-real"]:
        print(json.dumps(_child_real(Path(argv[1]), Path(argv[2]), int(argv[3]))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.kb_scale", description=__doc__)
    parser.add_argument("--docs", type=int, default=10_000, help="documents (default 10000; 100000 for the large run)")
    parser.add_argument("--batch-docs", type=int, default=1000, help="documents per ingest batch (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the L0 queries (default 3)")
    parser.add_argument(
        "--real-docs", type=int, default=100, help="documents for the default-model ingest vs raw encode (0: skip)"
    )
    parser.add_argument(
        "--whole-max", type=int, default=10_000, help="largest size also ingested in one batch (default 10000)"
    )
    parser.add_argument(
        "--reingest-docs", type=int, default=10_000, help="size of the re-ingest and resume runs (default 10000)"
    )
    parser.add_argument("--no-l0", action="store_true", help="skip the L0 lookup comparison")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    out = run(
        args.docs,
        args.batch_docs,
        args.rounds,
        real_docs=args.real_docs,
        whole_max=args.whole_max,
        reingest_docs=args.reingest_docs,
        l0=not args.no_l0,
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    print(print_tables(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
