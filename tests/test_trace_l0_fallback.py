"""An L0-fallback lookup (Milvus unreachable) recorded by the real recorder into the embedded
PostgreSQL trace table, and read back from it."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from conftest import make_settings

from rag_core.ingest.plan import scan_knowledge
from rag_core.l0 import L0Index
from rag_core.lookup.contracts import RelevanceLevel
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.settings import SAMPLE_KNOWLEDGE_DIR
from rag_core.stores.milvus import MilvusStore
from rag_core.traces import ToolInvocationRecorder, TraceStore
from rag_core.traces.recorder import JsonlSpool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]  # the session's embedded PostgreSQL


class HashEmbedder:
    """A deterministic unit query vector per text (no model: the store never answers anyway)."""

    dimension = 32

    def embed_query(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(self.dimension).astype(np.float32)
        return v / np.linalg.norm(v)

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.embed_query(t) for t in texts])

    def identity(self):
        return None


def test_l0_fallback_lookup_is_written_to_postgres_and_read_back(pg_dsn, pg_table, tmp_path):
    settings = make_settings(tmp_path / "data").model_copy(update={"trace_enabled": True})
    l0 = L0Index.build(scan_knowledge(SAMPLE_KNOWLEDGE_DIR, settings.max_document_bytes).documents)
    down = MilvusStore("http://127.0.0.1:9", "chunks", timeout=2)  # nothing listens on the discard port
    trace_store = TraceStore(pg_dsn, pg_table)
    spool = tmp_path / "spool.jsonl"
    recorder = ToolInvocationRecorder(lambda: TraceStore(pg_dsn, pg_table), spool)
    tool = LookupKnowledgeTool(settings, embedder=HashEmbedder(), store=down, l0=l0, recorder=recorder)
    query = "KafkaConsumerLagHigh is firing on the orders topic"
    try:
        result = tool.lookup(query, session_id="s-l0")
        assert recorder.flush(30)
    finally:
        tool.close()  # closes the recorder: every row is in the table or the spool

    # The lookup itself: answered from L0, labelled so, the store failure in the trace.
    block = result.evidence_blocks[0]
    assert result.found and result.status == "degraded" and result.relevance_level == RelevanceLevel.WEAK
    assert result.retrieval_trace.layer == "L0" and block.retrieval_layer == "L0"
    assert block.doc_id == "queues/KafkaConsumerLagHigh.md" and "l0_fallback" in block.hit_reasons
    assert result.retrieval_trace.error

    # The row read back from PostgreSQL.
    try:
        rows = trace_store.recent(10)
    finally:
        trace_store.close()
    assert len(rows) == 1 and JsonlSpool(spool).rows() == []  # written to the table, nothing left spooled
    row = rows[0]
    assert row.tool_name == "lookup_knowledge" and row.session_id == "s-l0"
    assert row.input == query
    assert row.retrieval_layer == "L0" and row.status == "degraded"
    assert row.error and "127.0.0.1:9" in row.error
    assert row.latency_ms is not None and row.latency_ms >= 0
    assert row.created_at.tzinfo is not None  # timestamptz read back as an aware datetime
    details = row.retrieval_details  # jsonb, decoded
    assert details is not None
    hints = details["l0_hints"]
    assert "queues/KafkaConsumerLagHigh.md" in hints["matched_doc_ids"]
    assert hints["domains"] == ["queues"] and hints["matched_titles"]
    assert hints["matches"][0]["doc_id"] == "queues/KafkaConsumerLagHigh.md" and hints["matches"][0]["reasons"]
    looked_up = result.retrieval_trace.l0_hints
    if not isinstance(looked_up, dict):
        looked_up = looked_up.model_dump(mode="json", by_alias=False)
    assert hints == looked_up  # the row holds the lookup's own hints, not a summary
    assert details["final_block_count"] == len(result.evidence_blocks)
