"""One refresh does each piece of work once: the refresh job on the real definitions (Milvus Lite,
embedded PostgreSQL with pgvector, the real model), with the document scan, the L0 save and the
embedder instrumented.

Three refreshes of a writable copy of the sample knowledge base: the first embeds every chunk
once for both stores; the second (nothing changed) embeds nothing; the third (one section
edited) embeds only the changed chunks, once. Every refresh scans once and writes L0 once, and
both stores hold exactly the ``chunks`` asset's rows.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import polars as pl
import pytest

from rag_assets.definitions import defs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
KNOWLEDGE = ROOT / "golden" / "knowledge"
CASES = ROOT / "golden" / "cases.yaml"
UNSET = (
    "RAG_PG_DSN",
    "RAG_MILVUS_URI",
    "RAG_MILVUS_TOKEN",
    "RAG_SIDECAR_ENABLED",
    "RAG_REPORTS_DIR",
    "RAG_PUBLISHED_DIR",
    "RAG_COLLECTION",
    "RAG_PG_TABLE",
)


class Counts:
    """What one refresh did, counted at the functions that do the work."""

    def __init__(self) -> None:
        self.scans = 0
        self.l0_writes = 0
        self.embedded: Counter[str] = Counter()  # passage text -> times embedded

    def reset(self) -> None:
        self.__init__()


class CountingEmbedder:
    """The real embedder; every chunk passage it embeds is counted."""

    def __init__(self, inner, counts: Counts) -> None:
        self.inner, self.counts = inner, counts

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def embed_passages(self, texts, ids=None):
        from rag_core.ingest.title_similarity import TITLE_LABEL

        # Lookups of the evaluation embed document titles (the rerank's title similarity): not chunks.
        if not (ids and all(str(i).startswith(TITLE_LABEL) for i in ids)):
            self.counts.embedded.update(texts)
        return self.inner.embed_passages(texts, ids)


@pytest.fixture(scope="module")
def refreshes():
    """Three refreshes (first, unchanged, one section edited) with the counts and metadata of each."""
    import rag_core.components as components
    import rag_core.ingest.documents as documents
    from rag_core.l0 import L0Index

    tmp = Path(tempfile.mkdtemp(prefix="rag-refresh-counts-"))  # not tmp_path: see test_dagster_materialize
    home, data, kb = tmp / "dagster_home", tmp / "data", tmp / "kb"
    home.mkdir()
    shutil.copy(ROOT / "dagster.local.yaml", home / "dagster.yaml")  # the pools config is part of the test
    shutil.copytree(KNOWLEDGE, kb)
    counts = Counts()
    real_scan, real_save, real_make = documents.scan_documents, L0Index.save, components.make_embedder

    def scan(*args, **kwargs):
        counts.scans += 1
        return real_scan(*args, **kwargs)

    def save(self, path):
        counts.l0_writes += 1
        return real_save(self, path)

    embedders: dict[int, CountingEmbedder] = {}

    def make_embedder(settings):
        inner = real_make(settings)
        return embedders.setdefault(id(inner), CountingEmbedder(inner, counts))

    runs = []
    with pytest.MonkeyPatch.context() as mp:
        for var in UNSET:
            mp.delenv(var, raising=False)
        for var, value in {
            "DAGSTER_HOME": home,
            "RAG_DATA_DIR": data,
            "RAG_KNOWLEDGE_DIR": kb,
            "RAG_GOLDEN_CASES": CASES,
            "RAG_BASELINE": tmp / "stored" / "baseline.json",
        }.items():
            mp.setenv(var, str(value))
        mp.setattr(documents, "scan_documents", scan)
        mp.setattr(L0Index, "save", save)
        mp.setattr(components, "make_embedder", make_embedder)
        instance = dg.DagsterInstance.get()
        try:
            for step in ("first", "unchanged", "edited"):
                if step == "edited":
                    doc = kb / "cache" / "RedisMemoryHigh.md"
                    doc.write_text(
                        doc.read_text().replace("## Mitigation", "## Mitigation\n\nFirst, page the cache owner.\n", 1)
                    )
                counts.reset()
                result = defs.resolve_job_def("refresh_job").execute_in_process(instance=instance, raise_on_error=False)
                assert result.success, [e.message for e in result.all_events if e.is_failure]
                meta = {
                    e.asset_key.to_user_string(): {
                        k: getattr(v, "value", v) for k, v in e.materialization.metadata.items()
                    }
                    for e in result.get_asset_materialization_events()
                }
                runs.append(
                    SimpleNamespace(
                        step=step,
                        scans=counts.scans,
                        l0_writes=counts.l0_writes,
                        embedded=Counter(counts.embedded),
                        meta=meta,
                        rows=pl.read_parquet(data / "tables" / "chunks.parquet").height,
                    )
                )
            yield {r.step: r for r in runs}
        finally:
            from rag_core.stores.pgserver import stop_embedded

            with contextlib.suppress(Exception):
                stop_embedded(data / "pgdata", mode="immediate")
            with contextlib.suppress(Exception):
                from rag_core.stores.milvus_server import stop_server

                stop_server(data)
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("step", ["first", "unchanged", "edited"])
def test_one_scan_and_one_l0_write_per_refresh(refreshes, step):
    run = refreshes[step]
    assert run.scans == 1
    assert run.l0_writes == 1


@pytest.mark.parametrize("step", ["first", "unchanged", "edited"])
def test_both_stores_hold_exactly_the_chunks_rows(refreshes, step):
    run = refreshes[step]
    assert run.meta["chunks"]["dagster/row_count"] == run.rows > 0
    for store in ("milvus_collection", "pgvector_table"):
        assert run.meta[store]["status"] == "available"
        assert run.meta[store]["dagster/row_count"] == run.rows


def test_first_refresh_embeds_every_chunk_once_for_both_stores(refreshes):
    run = refreshes["first"]
    assert max(run.embedded.values()) == 1  # no passage embedded twice (two stores, one embedding)
    assert sum(run.embedded.values()) == run.meta["chunk_embeddings"]["passages_embedded"]
    assert run.meta["ingest_plan"]["to_embed"] == run.meta["chunk_embeddings"]["needed"]
    # Chunks with identical content share one vector; every other chunk is embedded.
    assert run.rows - 2 <= sum(run.embedded.values()) <= run.rows
    assert run.meta["milvus_collection"]["added"] == run.meta["pgvector_table"]["added"] == run.rows


def test_unchanged_refresh_embeds_nothing(refreshes):
    run = refreshes["unchanged"]
    assert not run.embedded
    for store in ("milvus_collection", "pgvector_table"):
        meta = run.meta[store]
        assert (meta["added"], meta["updated"], meta["removed"]) == (0, 0, 0)
        assert meta["unchanged"] == run.rows


def test_edited_refresh_embeds_only_the_changed_chunks_once(refreshes):
    run = refreshes["edited"]
    changed = run.meta["milvus_collection"]["added"] + run.meta["milvus_collection"]["updated"]
    assert 0 < changed < run.rows
    assert sum(run.embedded.values()) == changed and max(run.embedded.values()) == 1
    pg = run.meta["pgvector_table"]
    assert pg["added"] + pg["updated"] == changed
