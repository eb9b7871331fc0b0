"""One Dagster refresh's ingest work, old lineage vs new, on the English runbook corpus.

Counts, per refresh: document scans, chunkings, L0 index writes, passages sent to the model,
rows per store, and wall seconds. Two refreshes per path, each in its own fresh data dir
(embedded Milvus + embedded PostgreSQL, the configured model): ``first`` (empty index) and
``unchanged`` (nothing edited).

- **old**: what the previous assets did: ``knowledge_documents`` scanned, ``chunks`` chunked and
  wrote Parquet, ``l0_index`` wrote L0, then ``milvus_collection`` and ``pgvector_table`` each
  called the whole ``ingest()`` for their one store (scan, chunk, L0 write and embed again).
  Run with the previous ``rag_core/ingest/pipeline.py`` loaded from git (no cache existed).
- **new**: the stage functions the assets call now: scan once, chunk once (Parquet written and
  read back), plan, one L0 write, embed once through the cache, apply per store.

Usage: ``python -m bench.refresh_counts [--knowledge-dir DIR] [--out bench/results/refresh_counts.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.common import PROJECT_ROOT, RESULTS_DIR, RUNBOOKS, make_settings
from rag_core.markdown import md_table


@dataclass
class Counts:
    """Work done by one refresh."""

    scans: int = 0
    chunkings: int = 0
    l0_writes: int = 0
    passages_embedded: int = 0
    model_calls: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


class CountingEmbedder:
    """Wraps the real embedder; counts passages and calls."""

    def __init__(self, inner: Any, counts: Counts) -> None:
        self.inner, self.counts = inner, counts

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def embed_passages(self, texts: Any, ids: Any = None) -> Any:
        self.counts.passages_embedded += len(texts)
        self.counts.model_calls += 1
        return self.inner.embed_passages(texts, ids)


def old_pipeline() -> ModuleType:
    """``rag_core/ingest/pipeline.py`` as of the commit before the ingest split (from git)."""
    removal = subprocess.run(
        ["git", "log", "-S", "def _embed_missing", "--format=%H", "--", "rag_core/ingest/pipeline.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not removal:
        raise SystemExit("cannot find the pre-split pipeline.py in git history")
    source = subprocess.run(
        ["git", "show", f"{removal[0]}^:rag_core/ingest/pipeline.py"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = importlib.util.spec_from_loader("bench_old_pipeline", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    exec(compile(source, "old rag_core/ingest/pipeline.py", "exec"), module.__dict__)  # noqa: S102
    return module


@contextlib.contextmanager
def counting(counts: Counts, old: ModuleType) -> Iterator[None]:
    """Count document scans, chunkings and L0 saves wherever they are called from."""
    import rag_core.ingest.documents as documents
    import rag_core.ingest.plan as plan
    from rag_core.l0 import L0Index

    def counted(fn: Callable[..., Any], attr: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            setattr(counts, attr, getattr(counts, attr) + 1)
            return fn(*args, **kwargs)

        return wrapper

    patches = [
        (documents, "scan_documents", counted(documents.scan_documents, "scans")),
        (old, "scan_documents", counted(old.scan_documents, "scans")),
        (plan, "chunk_scan", counted(plan.chunk_scan, "chunkings")),
        (L0Index, "save", counted(L0Index.save, "l0_writes")),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def _stores(settings: Any) -> list[Any]:
    from rag_core.components import make_main_store, make_sidecar_store

    return [make_main_store(settings), make_sidecar_store(settings)]


def old_refresh(settings: Any, embedder: Any, old: ModuleType, counts: Counts) -> None:
    """The previous assets, in order: documents, chunks (+Parquet), l0_index, then one whole
    ``ingest()`` per store."""
    from rag_assets.defs.ingest import chunk_frame
    from rag_assets.files import write_parquet_atomic
    from rag_core.ingest.documents import scan_documents
    from rag_core.l0 import L0Index

    docs, _ = scan_documents(settings.knowledge_dir)
    report = old.IngestReport(knowledge_dir=str(settings.knowledge_dir))
    counts.chunkings += 1
    _, chunks = old.chunk_documents(docs, settings, report, embedder)
    write_parquet_atomic(chunk_frame(chunks, embedder.count_tokens), settings.data_dir / "tables" / "chunks.parquet")
    L0Index.build(docs).save(settings.l0_index_path)
    for store in _stores(settings):
        counts.chunkings += 1  # ingest() chunks again
        try:
            old.ingest(settings, embedder, [store], progress=False)
            counts.rows[store.name] = store.count()
        finally:
            store.close()


def new_refresh(settings: Any, embedder: Any, counts: Counts) -> None:
    """The new assets' functions, in order (what ``ingest_job`` runs)."""
    from rag_assets.defs.ingest import ChunkTable, chunk_frame, read_chunks
    from rag_assets.files import write_parquet_atomic
    from rag_core.ingest import plan as stages
    from rag_core.ingest.apply import apply_plan
    from rag_core.ingest.embed import embed_plan
    from rag_core.ingest.embed_cache import EmbeddingCache
    from rag_core.ingest.pipeline import chunk_token_limit, save_l0_index

    scan = stages.scan_knowledge(settings.knowledge_dir, settings.max_document_bytes)
    chunked = stages.chunk_scan(scan.documents, embedder.count_tokens, chunk_token_limit(settings, embedder))
    path = write_parquet_atomic(
        chunk_frame(list(chunked.chunks), embedder.count_tokens), settings.data_dir / "tables" / "chunks.parquet"
    )
    table = ChunkTable(str(path), len(chunked.chunks), tuple(d.doc_id for d in chunked.documents), chunked.issues)
    chunked = stages.ChunkedDocuments(chunked.documents, tuple(read_chunks(table)), chunked.issues)
    stores = _stores(settings)
    try:
        plan = stages.plan_ingest(
            scan,
            chunked,
            [stages.read_store_state(s) for s in stores],
            embedder.identity(),
            max_remove_share=settings.ingest_max_remove_share,
        )
        save_l0_index(plan, settings.l0_index_path)
        embeddings = embed_plan(
            plan, embedder, EmbeddingCache.under(settings.data_dir), batch_size=settings.embedding_batch_size
        )
        for store in stores:
            apply_plan(store, plan, embeddings)
            counts.rows[store.name] = store.count()
    finally:
        for store in stores:
            store.close()


def measure(path: str, root: Path, knowledge: Path, embedder: Any, old: ModuleType) -> dict[str, Counts]:
    """Two refreshes (first, unchanged) of ``path`` (``old`` / ``new``) in a fresh data dir."""
    settings = make_settings(root / path, knowledge, sidecar_enabled=True)
    out = {}
    for step in ("first", "unchanged"):
        counts = Counts()
        wrapped = CountingEmbedder(embedder, counts)
        with counting(counts, old):
            t0 = time.perf_counter()
            if path == "old":
                old_refresh(settings, wrapped, old, counts)
            else:
                new_refresh(settings, wrapped, counts)
            counts.seconds = round(time.perf_counter() - t0, 2)
        out[step] = counts
        print(f"{path:>3} {step:<9} {json.dumps(asdict(counts))}", file=sys.stderr, flush=True)
    return out


def _stop_servers(data_dir: Path) -> None:
    from rag_core.stores.milvus_server import stop_server
    from rag_core.stores.pgserver import stop_embedded

    with contextlib.suppress(Exception):
        stop_embedded(data_dir / "pgdata", mode="immediate")
    with contextlib.suppress(Exception):
        stop_server(data_dir)


def table(results: dict[str, dict[str, Counts]]) -> str:
    """Markdown table: one row per (path, refresh)."""
    headers = ["path", "refresh", "scans", "chunkings", "L0 writes", "passages embedded", "model calls"]
    headers += ["milvus rows", "pgvector rows", "wall s"]
    rows = [
        [path, step, c.scans, c.chunkings, c.l0_writes, c.passages_embedded, c.model_calls]
        + [c.rows.get("milvus", "-"), c.rows.get("pgvector", "-"), c.seconds]
        for path, steps in results.items()
        for step, c in steps.items()
    ]
    return md_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--knowledge-dir", type=Path, default=RUNBOOKS)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "refresh_counts.json")
    args = parser.parse_args(argv)
    if not args.knowledge_dir.is_dir():
        print(f"knowledge dir {args.knowledge_dir} not found (the shared runbook corpus)", file=sys.stderr)
        return 2
    from rag_core.embedding import make_embedder

    old = old_pipeline()
    root = Path(tempfile.mkdtemp(prefix="rag-refresh-counts-"))  # /tmp: the embedded PostgreSQL user reads it
    try:
        embedder = make_embedder(make_settings(root / "model", args.knowledge_dir))
        results = {}
        for path in ("old", "new"):
            try:
                results[path] = measure(path, root, args.knowledge_dir, embedder, old)
            finally:
                _stop_servers(root / path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"One refresh of {args.knowledge_dir} (model {embedder.identity().describe()}):\n")
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({p: {s: asdict(c) for s, c in steps.items()} for p, steps in results.items()}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
