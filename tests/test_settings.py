"""Settings never show a secret: URIs and DSNs with passwords, tokens, keys."""

from rag_core.settings import RagSettings

SECRET = "hunter2-secret"


def test_no_secret_in_repr_or_dump(monkeypatch):
    monkeypatch.setenv("RAG_MILVUS_URI", f"http://rag:{SECRET}@milvus.internal:19530")
    monkeypatch.setenv("RAG_MILVUS_TOKEN", f"rag:{SECRET}")
    monkeypatch.setenv("RAG_PG_DSN", f"postgresql://rag:{SECRET}@pg.internal/rag")
    monkeypatch.setenv("RAG_EMBEDDING_API_KEY", SECRET)
    settings = RagSettings(_env_file=None)
    for text in (repr(settings), str(settings), settings.model_dump_json(), str(settings.model_dump())):
        assert SECRET not in text
    assert settings.milvus_uri_value.endswith("@milvus.internal:19530")
    assert not settings.milvus_embedded


def test_empty_milvus_uri_means_the_embedded_server(monkeypatch):
    monkeypatch.setenv("RAG_MILVUS_URI", "")
    settings = RagSettings(_env_file=None)
    assert settings.milvus_uri_value == "" and settings.milvus_embedded
