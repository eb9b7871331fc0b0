"""lookup_knowledge scenarios on real Milvus Lite and the real model (sample knowledge base).

Faults are injected by wrapping the real store (the store is real; only its failure is made).
"""

import threading

import numpy as np
import pytest
from pydantic import SecretStr

from rag_core.l0 import L0Index
from rag_core.lookup.contracts import RelevanceLevel
from rag_core.lookup.packer import KnowledgeContextPacker
from rag_core.lookup.ranker import INDEX
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.stores.base import StoreError
from rag_core.stores.milvus import MilvusStore
from rag_core.traces.recorder import MemoryRecorder

pytestmark = pytest.mark.integration  # the sample knowledge base in Milvus Lite, the real model


class Faulty:
    """A real store with a switchable failure mode: ``down`` raises, ``empty_filtered``
    returns nothing when a category filter is used."""

    def __init__(self, inner, mode):
        self.inner, self.mode = inner, mode
        self.name, self.score_label = inner.name, inner.score_label
        self.calls = []

    def _maybe_fail(self, category):
        self.calls.append(category)
        if self.mode == "down":
            raise StoreError("Milvus search failed: connection refused")
        return self.mode == "empty_filtered" and category is not None

    def search(self, vector, top_k, category=None):
        return [] if self._maybe_fail(category) else self.inner.search(vector, top_k, category)

    def search_lexical(self, terms, vector, top_k, category=None):
        if self.mode == "lexical_down":
            raise StoreError("Milvus full-text search failed: timed out")
        return [] if self._maybe_fail(category) else self.inner.search_lexical(terms, vector, top_k, category)

    def document_centroids(self, doc_ids):
        self.calls.append(("document_centroids", tuple(doc_ids)))
        if self.mode == "documents_down":
            raise StoreError("Milvus query failed: Invalid expr")
        return self.inner.document_centroids(doc_ids)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


@pytest.fixture(scope="module")
def store(sample_kb):
    s = MilvusStore.from_settings(sample_kb)
    yield s
    s.close()


@pytest.fixture
def make_tool(sample_kb, embedder, store):
    tools = []

    def make(store_override=None, **overrides):
        settings = sample_kb.model_copy(update={"trace_enabled": True, **overrides})
        rec = MemoryRecorder()
        tool = LookupKnowledgeTool(settings, embedder=embedder, store=store_override or store, recorder=rec)
        tool.recorded = rec.rows
        tools.append(tool)
        return tool

    yield make
    for t in tools:
        t.sidecar_search.close()


def sources(result):
    return [b.doc_id for b in result.evidence_blocks]


def hints(result) -> dict:
    """The result's L0 hints as a snake_case dict (a plain dict, or a model dumped by field name)."""
    h = result.retrieval_trace.l0_hints
    return h if isinstance(h, dict) else h.model_dump(mode="json", by_alias=False)


def test_l0_hints_are_structured(make_tool):
    r = make_tool().lookup("RedisMemoryHigh fired on redis-main")
    h = hints(r)
    assert "cache/RedisMemoryHigh.md" in h["matched_doc_ids"]
    assert h["domains"] == ["cache"] and h["matched_titles"]
    assert isinstance(h["matched_keywords"], list) and isinstance(h["entities"], list)


def test_single_l0_match_still_runs_l1(make_tool):
    r = make_tool().lookup("RedisMemoryHigh")
    assert len(r.retrieval_trace.attempts) >= 1 and r.retrieval_trace.layer == "L0+L1"
    assert r.evidence_blocks[0].doc_id == "cache/RedisMemoryHigh.md"
    assert r.evidence_blocks[0].retrieval_layer == "L0+L1" and r.semantic_support


def test_l1_disabled_answers_from_l0_only(make_tool):
    r = make_tool(l1_enabled=False).lookup("RedisMemoryHigh")
    assert r.retrieval_trace.attempts == [] and r.retrieval_trace.layer == "L0"
    assert r.evidence_blocks[0].hit_reasons[0] == "l0_fallback" and not r.semantic_support


def test_exactly_one_domain_becomes_the_filter(make_tool):
    r = make_tool().lookup("RedisMemoryHigh on the cache cluster")
    assert r.retrieval_trace.attempts[0].filter == "cache"
    filtered = [b for b in r.evidence_blocks if "filtered_attempt" in b.hit_reasons]
    assert filtered and all(b.category == "cache" for b in filtered)


def test_zero_or_several_domains_mean_no_filter(make_tool):
    tool = make_tool()
    none = tool.lookup("the website feels slow today")
    assert hints(none)["domains"] == []  # no alert name, keyword or domain in the query
    assert none.retrieval_trace.attempts[0].filter is None
    several = tool.lookup("RedisMemoryHigh and KafkaConsumerLagHigh at the same time")
    assert len(hints(several)["domains"]) >= 2
    assert several.retrieval_trace.attempts[0].filter is None


def test_low_quality_filtered_attempt_retries_unfiltered(make_tool, store):
    faulty = Faulty(store, "empty_filtered")
    tool = make_tool(store_override=faulty)
    r = tool.lookup("RedisMemoryHigh: what should I check first?")
    first, second = r.retrieval_trace.attempts
    assert first.filter == "cache" and first.candidate_count == 0 and first.low_quality_reason == "no_candidates"
    assert second.filter is None and second.candidate_count > 0 and second.duration_ms >= 0
    assert r.retrieval_trace.fallback_reason == "no_candidates"
    assert r.evidence_blocks[0].doc_id == "cache/RedisMemoryHigh.md"
    details = tool.recorded[-1]["retrieval_details"]
    assert [a["attempt"] for a in details["attempts"]] == [1, 2] and details["fallback_reason"] == "no_candidates"


def test_low_similarity_threshold_triggers_retry(make_tool):
    r = make_tool(reference_threshold=0.99).lookup("RedisMemoryHigh")
    assert len(r.retrieval_trace.attempts) == 2
    assert r.retrieval_trace.attempts[0].low_quality_reason.startswith("top_similarity_below_reference_threshold")


def test_store_down_with_l0_match_gives_l0_fallback(make_tool, store):
    tool = make_tool(store_override=Faulty(store, "down"))
    r = tool.lookup("KafkaConsumerLagHigh is firing")
    assert r.found and r.retrieval_trace.layer == "L0" and not r.semantic_support
    assert r.status == "degraded" and r.relevance_level == RelevanceLevel.WEAK
    assert r.evidence_blocks[0].doc_id == "queues/KafkaConsumerLagHigh.md"
    assert r.evidence_blocks[0].retrieval_layer == "L0" and "l0_fallback" in r.evidence_blocks[0].hit_reasons
    assert r.evidence_blocks[0].content  # the document summary
    assert "connection refused" in r.retrieval_trace.error
    row = tool.recorded[-1]
    assert row["retrieval_layer"] == "L0" and "connection refused" in row["error"]
    assert row["retrieval_details"]["l0_hints"]["matched_doc_ids"]


def test_l0_match_is_offered_when_l1_has_nothing_above_the_minimum(make_tool):
    # A keyword match (no whole-name match, which keeps its L1 block): L1 finds only chunks below
    # the minimum, so the L0 match is offered as the labelled fallback.
    tool = make_tool(min_block_similarity=0.999)
    r = tool.lookup("kafka consumer lag keeps growing")
    assert r.status == "ok" and r.found and r.retrieval_trace.layer == "L0"
    assert r.evidence_blocks[0].doc_id == "queues/KafkaConsumerLagHigh.md"
    assert r.relevance_level == RelevanceLevel.WEAK and not r.semantic_support
    assert "minimum block similarity" in (r.retrieval_trace.fallback_reason or "")
    assert r.retrieval_trace.error is None


def test_store_down_without_l0_match_is_a_structured_failure(make_tool, store):
    faulty = Faulty(store, "down")
    tool = make_tool(store_override=faulty)
    r = tool.lookup("why is the sky blue")
    assert faulty.calls  # the store was asked (and failed), not skipped
    assert not r.found and r.status == "error" and r.relevance_level == RelevanceLevel.NONE
    assert r.evidence_blocks == [] and hints(r)["matched_doc_ids"] == []
    assert "failed" in r.message and "connection refused" in r.retrieval_trace.error
    assert tool.recorded[-1]["status"] == "error" and "connection refused" in tool.recorded[-1]["error"]


def test_missing_milvus_file_gives_l0_fallback(sample_kb, embedder, tmp_path):
    settings = sample_kb.model_copy(update={"milvus_uri": SecretStr(str(tmp_path / "gone.db")), "trace_enabled": True})
    rec = MemoryRecorder()
    tool = LookupKnowledgeTool(settings, embedder=embedder, recorder=rec)
    r = tool.lookup("OrdersDBReplicationLag")
    tool.close()
    assert r.retrieval_trace.layer == "L0" and r.evidence_blocks[0].retrieval_layer == "L0"
    assert r.evidence_blocks[0].doc_id.endswith("/OrdersDBReplicationLag.md")
    assert "l0_fallback" in r.evidence_blocks[0].hit_reasons and not r.semantic_support
    assert r.retrieval_trace.error and rec.rows[-1]["error"] == r.retrieval_trace.error
    assert rec.rows[-1]["retrieval_layer"] == "L0"


def test_evidence_block_fields_and_layer(make_tool):
    r = make_tool().lookup("customers are asking how to get their money back")
    b = r.evidence_blocks[0]
    assert b.doc_id.endswith("RefundPolicy.md")
    assert b.title and b.breadcrumb.startswith(b.title) and b.category == "policy"
    assert 0 <= b.similarity <= 1 and b.score_label == "milvus_cosine_similarity[-1,1]"
    assert b.raw_score == pytest.approx(b.similarity, abs=1e-3) and b.hit_reasons
    payload = r.to_json()
    assert {
        "found",
        "evidenceBlocks",
        "contextPack",
        "retrievalTrace",
        "rerankTrace",
        "relevanceLevel",
        "completenessHint",
        "retrievedDomainsThisSession",
        "message",
        "primary",
        "supplement",
    } <= set(payload)
    assert payload["evidenceBlocks"][0]["scoreLabel"] and payload["contextPack"]["charBudget"] == 4000


def test_duplicate_sources_collapse_with_merged_reasons(make_tool):
    tool = make_tool()
    r, candidates = tool.lookup_with_candidates("redis memory eviction maxmemory policy")
    assert len(sources(r)) == len(set(sources(r)))
    assert len(candidates) > len(r.evidence_blocks)
    top = r.evidence_blocks[0]
    assert {"vector_similarity", "bm25_match"} <= set(top.hit_reasons)
    details = tool.recorded[-1]["retrieval_details"]
    assert details["candidate_count"] == len(candidates) and details["final_block_count"] == len(r.evidence_blocks)


def test_primary_and_supplement_views(make_tool):
    tool = make_tool()
    r = tool.lookup("kafka consumers are falling behind")
    assert r.primary is not None and r.primary.doc_id == "queues/KafkaConsumerLagHigh.md"
    assert r.supplement and r.primary.doc_id not in {b.doc_id for b in r.supplement}
    payload = r.to_json()  # the views are serialised beside the blocks they are taken from
    assert payload["primary"] == payload["evidenceBlocks"][0]
    assert payload["supplement"] == payload["evidenceBlocks"][1:]
    empty = tool.lookup("   ")
    assert empty.primary is None and empty.supplement == []


def test_rerank_trace_explains_each_block(make_tool):
    r = make_tool().lookup("RedisMemoryHigh")
    assert len(r.rerank_trace) == len(r.evidence_blocks)
    for entry, block in zip(r.rerank_trace, r.evidence_blocks, strict=True):
        assert entry.doc_id == block.doc_id and entry.rank_after == block.rank
        assert entry.final_score == pytest.approx(entry.base_score + sum(entry.contributions.values()), abs=1e-3)
    assert "title_match" in r.rerank_trace[0].contributions
    assert "titleMatch" in r.to_json()["rerankTrace"][0]["contributions"]


def test_document_similarity_uses_the_stores_centroids_unless_the_store_failed_this_lookup(make_tool, store):
    query = "the checkout page is slow and customers abandon their carts"
    healthy = Faulty(store, "none")
    tool = make_tool(store_override=healthy)
    r = tool.lookup(query)
    asked = [c for c in healthy.calls if isinstance(c, tuple)]
    assert len(asked) == 1 and {b.doc_id for b in r.evidence_blocks} <= set(asked[0][1])
    weight = tool.ranker.same_script[INDEX["document_similarity"]]  # the best document's full weight
    assert max(e.contributions.get("document_similarity", 0.0) for e in r.rerank_trace) == pytest.approx(
        weight, abs=1e-3
    )
    assert r.status == "ok"
    failing = Faulty(store, "lexical_down")
    tool = make_tool(store_override=failing)
    r = tool.lookup(query)
    assert not [c for c in failing.calls if isinstance(c, tuple)]  # not asked again
    # The dense channel still answered: its evidence, said to be partial (never a silent "ok").
    # (``found`` says whether the answer seems to be there: the calibrated confidence decides it.)
    assert r.evidence_blocks and r.retrieval_trace.layer != "L0" and r.status == "degraded"
    assert "part of the knowledge search failed" in r.message and "lexical: StoreError" in r.message
    assert r.retrieval_trace.error is None and any(a.error for a in r.retrieval_trace.attempts)
    assert tool.recorded[-1]["status"] == "degraded"


def test_a_store_failure_in_the_document_stage_degrades_the_lookup_instead_of_a_silent_ok(make_tool, store):
    tool = make_tool(store_override=Faulty(store, "documents_down"))
    r = tool.lookup("the checkout page is slow and customers abandon their carts")
    assert r.evidence_blocks and r.status == "degraded"  # found follows the confidence (issue 43)
    assert "document centroids skipped: StoreError: Milvus query failed" in r.message
    assert tool.recorded[-1]["status"] == "degraded"


def test_relevance_levels(make_tool):
    tool = make_tool()
    # Calibrated levels (rag_core.lookup.confidence): the named runbook first is claimed, not WEAK.
    named = tool.lookup("RedisMemoryHigh alert: redis memory above 90%")
    assert named.relevance_level in (RelevanceLevel.PRECISE, RelevanceLevel.RELEVANT)
    assert named.evidence_blocks[0].doc_id == "cache/RedisMemoryHigh.md" and named.confidence >= 0.8
    assert tool.lookup("qwzx plorb vvvt").relevance_level in (RelevanceLevel.WEAK, RelevanceLevel.NONE)


def test_context_pack_budget_records_omitted_sources(make_tool):
    r = make_tool(context_char_budget=600).lookup("redis memory is almost full")
    pack = r.context_pack
    assert pack.used_chars <= 600 and pack.included_doc_ids and pack.omitted_doc_ids
    assert "omitted" in r.completeness_hint
    header = f"[1] {r.evidence_blocks[0].title} ({r.evidence_blocks[0].doc_id})"
    assert pack.packed_text.startswith(header)
    assert KnowledgeContextPacker(600).pack(r.evidence_blocks) == pack  # deterministic


def test_session_domains_accumulate_and_seen_doc_ids_are_marked(make_tool):
    tool = make_tool()
    a = tool.lookup("RedisMemoryHigh", session_id="s1")
    b = tool.lookup("KafkaConsumerLagHigh", session_id="s1")
    assert "cache" in b.retrieved_domains_this_session and "queues" in b.retrieved_domains_this_session
    c = tool.lookup("RedisMemoryHigh", session_id="s1")
    assert "seen_earlier_in_session" in c.evidence_blocks[0].hit_reasons
    other = tool.lookup("RedisMemoryHigh", session_id="s2")
    assert "seen_earlier_in_session" not in other.evidence_blocks[0].hit_reasons
    assert "queues" not in other.retrieved_domains_this_session and a.found


def test_session_memory_is_bounded(make_tool):
    tool = make_tool(session_max=3)
    for i in range(10):
        tool.lookup("RedisMemoryHigh", session_id=f"s{i}")
    assert len(tool.sessions) == 3


@pytest.mark.parametrize("query", ["", "   \n\t "])
def test_empty_query_is_answered_not_raised(make_tool, query):
    r = make_tool().lookup(query)
    assert not r.found and "empty" in r.message and r.relevance_level == RelevanceLevel.NONE


@pytest.mark.parametrize(("query", "kind"), [(42, "int"), (b"redis memory", "bytes"), (None, "NoneType")])
def test_non_string_query_is_an_error_naming_its_type(make_tool, query, kind):
    tool = make_tool()
    r = tool.lookup(query)
    assert r.status == "error" and not r.found
    assert r.message == f"query must be a string (got {kind})"
    assert tool.recorded[-1]["status"] == "error" and kind in tool.recorded[-1]["input"]


def test_huge_query_is_truncated_and_noted(make_tool):
    tool = make_tool()
    r = tool.lookup("redis memory high " * 6000)  # ~108,000 characters
    assert r.found and r.retrieval_trace.query_truncated
    assert tool.recorded[-1]["retrieval_details"]["query_truncated"] is True


def test_control_characters_emoji_and_filter_injection(make_tool):
    tool = make_tool()
    assert tool.lookup("redis\x00 memory\x1b[31m 🔥🔥 high").found
    r = tool.lookup('" or category != "')
    assert r.status == "ok"
    r2 = tool.lookup('payment latency" || category != "x')
    assert r2.status == "ok" and r2.retrieval_trace.error is None


def test_quoted_category_from_frontmatter_filters_exactly(make_tool):
    r = make_tool().lookup("PaymentGatewayLatencyHigh")
    assert r.retrieval_trace.attempts[0].filter == 'vendor "acme"'
    assert r.evidence_blocks[0].doc_id == "services/PaymentGatewayLatencyHigh.md"


def test_eight_threads_share_one_tool(make_tool):
    tool = make_tool()
    queries = ["RedisMemoryHigh", "KafkaConsumerLagHigh", "refund policy", "rollback a deployment"]
    results, errors = {}, []

    def worker(i):
        try:
            q = queries[i % 4]
            r = tool.lookup(q, session_id=f"t{i}")
            results[i] = (q, r)
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 8
    for i, (q, r) in results.items():
        assert r.session_id == f"t{i}" and r.query == q and r.found
    assert len(tool.recorded) == 8


def test_async_variant(make_tool):
    import asyncio

    r = asyncio.run(make_tool().alookup("RedisMemoryHigh"))
    assert r.found


def test_l0_index_persisted_by_ingest(sample_kb):
    idx = L0Index.load(sample_kb.l0_index_path)
    assert len(idx) >= 30 and "cache" in idx.domains


def test_query_vector_is_normalised(embedder):
    v = embedder.embed_query("hello")
    assert v.dtype == np.float32 and abs(np.linalg.norm(v) - 1) < 1e-4


def _snake_keys(value: object, where: str = "$") -> list[str]:
    """Every dict key at any depth of ``value`` that is not camelCase (has an underscore)."""
    if isinstance(value, dict):
        bad = [f"{where}.{k}" for k in value if "_" in str(k)]
        return bad + [b for k, v in value.items() for b in _snake_keys(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [b for i, v in enumerate(value) for b in _snake_keys(v, f"{where}[{i}]")]
    return []


@pytest.mark.parametrize(
    "query",
    [
        "RedisMemoryHigh fired on redis-main",  # L0 name match, filtered + unfiltered attempts
        "customers are asking how to get their money back",  # L1 only
        "[FIRING:1] KubePodCrashLooping namespace=shop pod=cart-7d9f6",  # pasted alert
        "磁盘空间不足怎么办",  # Chinese
    ],
)
def test_the_agent_facing_json_has_no_snake_case_key_at_any_depth(make_tool, query):
    payload = make_tool().lookup(query).to_json()
    assert payload["rerankTrace"] and payload["retrievalTrace"]["attempts"]
    assert _snake_keys(payload) == []
