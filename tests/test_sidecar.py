"""pgvector sidecar wiring in lookup_knowledge: real Milvus Lite, embedded PostgreSQL, real model."""

import pytest
from conftest import make_settings

from rag_core.ingest.pipeline import ingest
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.stores.errors import StoreError
from rag_core.stores.milvus import MilvusStore
from rag_core.stores.pgvector import PgVectorStore

pytestmark = pytest.mark.integration


class Untouchable:
    """A sidecar that fails the test if the tool touches it at all."""

    name = "pgvector"

    def __getattr__(self, attr):
        raise AssertionError(f"sidecar touched ({attr}) while disabled")


@pytest.fixture
def both(tmp_path, kb_copy, embedder, pg_dsn, pg_table):
    settings = make_settings(tmp_path / "data", kb_copy, sidecar_enabled=True)
    main, side = MilvusStore.from_settings(settings), PgVectorStore(pg_dsn, pg_table)
    report = ingest(settings, embedder, [main, side], progress=False)
    assert report.stores["pgvector"].added == report.stores["milvus"].added == side.count()
    assert report.chunks_embedded == report.chunks_total  # embedded once for both stores
    yield settings, main, side
    main.close()
    side.close()


def test_disabled_sidecar_is_never_touched(both, embedder):
    settings, main, _ = both
    off = settings.model_copy(update={"sidecar_enabled": False})
    r = LookupKnowledgeTool(off, embedder=embedder, store=main, sidecar=Untouchable()).lookup("RedisMemoryHigh")
    assert r.found and r.retrieval_trace.sidecar.status == "disabled"


def test_enabled_sidecar_reports_beside_an_unchanged_main_result(both, embedder):
    settings, main, side = both
    off = settings.model_copy(update={"sidecar_enabled": False})
    q = "redis is evicting keys and shoppers get logged out"
    plain = LookupKnowledgeTool(off, embedder=embedder, store=main).lookup(q)
    with_side = LookupKnowledgeTool(settings, embedder=embedder, store=main, sidecar=side).lookup(q)
    assert [b.doc_id for b in with_side.evidence_blocks] == [b.doc_id for b in plain.evidence_blocks]
    status = with_side.retrieval_trace.sidecar
    assert status.status == "available" and status.top_doc_ids
    assert status.top_doc_ids[0] == plain.evidence_blocks[0].doc_id


def test_sidecar_failure_leaves_the_main_store_answering(both, embedder):
    settings, main, _ = both
    broken = PgVectorStore("postgresql://rag:topsecret@127.0.0.1:9/nowhere", "t", connect_timeout=2)
    r = LookupKnowledgeTool(settings, embedder=embedder, store=main, sidecar=broken).lookup("RedisMemoryHigh")
    assert r.found and r.status == "ok" and r.evidence_blocks[0].doc_id == "cache/RedisMemoryHigh.md"
    assert r.retrieval_trace.sidecar.status in ("error", "unavailable")
    assert "topsecret" not in r.model_dump_json()


class LexicalDown:
    """The real pgvector store whose BM25 search fails (its dense search answers)."""

    def __init__(self, inner):
        self.inner = inner

    def search_lexical(self, *args, **kwargs):
        raise StoreError("pgvector full-text search failed: timed out")

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def test_sidecar_that_fails_in_part_says_degraded(both, embedder):
    settings, main, side = both
    tool = LookupKnowledgeTool(settings, embedder=embedder, store=main, sidecar=LexicalDown(side))
    r = tool.lookup("RedisMemoryHigh")
    assert r.status == "ok" and r.evidence_blocks[0].doc_id == "cache/RedisMemoryHigh.md"
    status = r.retrieval_trace.sidecar
    assert status.status == "degraded" and status.top_doc_ids  # the dense channel answered
    assert "lexical: StoreError" in status.reason


def test_stores_agree_on_exact_search(both, embedder):
    _, main, side = both
    v = embedder.embed_query("kafka consumer lag is growing")
    m = [h.chunk_id for h in main.search(v, 5)]
    p = [h.chunk_id for h in side.search(v, 5)]
    assert m == p  # FLAT in Milvus and an exact scan in pgvector on a small table
    hm, hp = main.search(v, 1)[0], side.search(v, 1)[0]
    assert hm.similarity == pytest.approx(hp.similarity, abs=1e-4)
    assert hm.score_label != hp.score_label and hp.raw_score == pytest.approx(1 - hm.raw_score, abs=1e-4)


def test_compare_stores_side_by_side(both, pg_dsn, pg_table):
    from pydantic import SecretStr

    from rag_core.compare import compare_stores

    settings, main, _ = both
    main.close()  # compare opens its own stores from the settings
    cfg = settings.model_copy(update={"pg_dsn": SecretStr(pg_dsn), "pg_table": pg_table})
    out = compare_stores(cfg, "kafka consumer lag keeps growing")
    assert out.sidecar_status == "available" and out.rows
    first = out.rows[0]
    assert first.main is not None and first.sidecar is not None and first.same_doc
    assert first.main.doc_id == "queues/KafkaConsumerLagHigh.md"
    assert first.main.score_label.startswith("milvus") and first.sidecar.score_label.startswith("pgvector")
    assert 0 < out.overlap_at_5 <= 1
    down = compare_stores(
        settings.model_copy(update={"pg_dsn": SecretStr("postgresql://u:pw9@127.0.0.1:9/x")}), "kafka consumer lag"
    )
    assert down.sidecar_status in ("unavailable", "error") and down.rows[0].main
    assert "pw9" not in str(down)


def test_rag_compare_json_and_narrow_table_keep_sources_whole(both, pg_dsn, pg_table, monkeypatch):
    import io
    import json

    from pydantic import SecretStr
    from rich.console import Console
    from typer.testing import CliRunner

    import rag_core.cli.commands as cli

    settings, main, _ = both
    main.close()
    cfg = settings.model_copy(update={"pg_dsn": SecretStr(pg_dsn), "pg_table": pg_table})
    monkeypatch.setattr(cli, "settings_or_exit", lambda **_: cfg)
    res = CliRunner().invoke(cli.app, ["compare", "--json", "kafka consumer lag keeps growing"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["rows"][0]["main"]["doc_id"] == "queues/KafkaConsumerLagHigh.md"
    # piped output is narrow: cells wrap, and no doc id or breadcrumb is cut with an ellipsis
    narrow = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=narrow, width=70))
    res = CliRunner().invoke(cli.app, ["compare", "kafka consumer lag keeps growing"])
    assert res.exit_code == 0, res.output
    text = narrow.getvalue()
    assert "…" not in text
    column = "".join(line.split("│")[2].strip() for line in text.splitlines() if line.count("│") > 2)
    assert "queues/KafkaConsumerLagHigh.md" in column  # the milvus source column, folded lines joined
