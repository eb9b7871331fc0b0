"""Admission (issue 45): a query is cut to the embedding model's token window and flagged, no text
stage sees more than twice RAG_MAX_QUERY_CHARS, BM25 terms are bounded, and the shared encode gate
lets a short query pass heavy ones waiting (a slow fake model) and gives up past its deadline."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from conftest import make_settings
from fakes import HashEmbedder

import rag_core.lookup.query_transformer as query_transformer
from rag_core.embedding._common import BaseEmbedder, EmbedDeadlineError, EncodeGate
from rag_core.ingest.pipeline import ingest
from rag_core.lookup.admission import MAX_LEXICAL_TERMS, QueryWindow
from rag_core.lookup.query_transformer import KnowledgeQueryTransformer
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.stores.memory import InMemoryStore
from rag_core.traces.recorder import MemoryRecorder

DIM = 16


def test_an_emoji_query_within_the_character_limit_is_cut_to_the_models_window(embedder):
    query = "etcd no leader " + "🔥" * 1500  # 1,515 characters: inside RAG_MAX_QUERY_CHARS (2,000)
    assert embedder.count_tokens(query) > embedder.max_tokens
    tq = KnowledgeQueryTransformer(None, 2000, QueryWindow(embedder.max_tokens, embedder.count_tokens)).transform(query)
    assert tq.truncated and tq.rewritten.startswith("etcd no leader")
    assert embedder.count_tokens(tq.rewritten) <= embedder.max_tokens
    assert all(embedder.count_tokens(v) <= embedder.max_tokens for v in tq.views)


def test_window_fit_keeps_a_fitting_text_whole_and_cuts_at_a_space():
    window = QueryWindow(5, lambda text: len(text.split()))
    assert window.fit("one two three") == ("one two three", False)
    assert window.fit("one two three four five six seven") == ("one two three four five", True)


def test_no_text_stage_sees_more_than_twice_the_character_limit(monkeypatch):
    seen: list[int] = []
    real = query_transformer.normalize

    def spy(text: str) -> str:
        seen.append(len(text))
        return real(text)

    monkeypatch.setattr(query_transformer, "normalize", spy)
    tq = KnowledgeQueryTransformer(None, 500).transform("disk full on node-1 " * 50_000)  # 1 MB
    assert seen and max(seen) <= 1000 and tq.truncated


def test_bm25_terms_of_one_query_are_bounded():
    query = " ".join(f"term{i}" for i in range(400))  # 400 distinct words, under the character limit
    tq = KnowledgeQueryTransformer(None, 4000).transform(query)
    assert len(tq.lexical_terms) == MAX_LEXICAL_TERMS and tq.lexical_terms == sorted(tq.lexical_terms)
    assert "term0" in tq.lexical_terms and "term399" not in tq.lexical_terms  # the first ones kept


def test_a_long_query_is_flagged_in_the_result_json_and_the_trace(tmp_path, kb_copy):
    settings = make_settings(tmp_path / "data", kb_copy, ensemble_backend="none")
    settings = settings.model_copy(update={"trace_enabled": True})
    store, embedder = InMemoryStore(), HashEmbedder(DIM)  # 1 token per word, 512-token window
    ingest(settings, embedder, [store], progress=False)
    recorder = MemoryRecorder()
    tool = LookupKnowledgeTool(settings, embedder=embedder, store=store, recorder=recorder)
    long, short = tool.lookup("redis memory high " + "a " * 700), tool.lookup("redis memory high")
    assert long.query_truncated and long.to_json()["queryTruncated"] and long.retrieval_trace.query_truncated
    assert not short.query_truncated and short.to_json()["queryTruncated"] is False
    assert [r["retrieval_details"]["query_truncated"] for r in recorder.rows] == [True, False]


class SlowModel(BaseEmbedder):
    """A fake in-process backend: records the order of its encodes; a text starting with
    ``hold`` blocks until ``release`` is set."""

    backend, model_id, dimension, max_tokens = "slow-fake", "slow", DIM, 512

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []
        self.release = threading.Event()

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def _settings(self) -> dict[str, Any]:
        return {}

    def _encode(self, texts: list[str], is_query: bool) -> Any:
        self.order.append(texts[0][:8])
        if texts[0].startswith("hold"):
            assert self.release.wait(30)
        return np.ones((len(texts), DIM), dtype=np.float32)


def _wait_until(condition: Any) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_short_query_goes_before_the_heavy_ones_that_waited_longer():
    model = SlowModel()
    heavy = "heavy" + " x" * 1000
    threads = [threading.Thread(target=model.embed_query, args=("hold" + " x" * 1000,))]
    threads[0].start()
    _wait_until(lambda: model.order == ["hold x x"])
    for text in (heavy, heavy, heavy, "short question"):  # arriving in this order while the model is busy
        threads.append(threading.Thread(target=model.embed_query, args=(text,)))
        threads[-1].start()
        _wait_until(lambda n=len(threads) - 1: len(model._gate._waiting) == n)
    model.release.set()
    for t in threads:
        t.join(30)
    assert model.order == ["hold x x", "short qu", "heavy x ", "heavy x ", "heavy x "]


def test_a_query_past_its_wait_deadline_gets_an_honest_result_not_a_hang(tmp_path, kb_copy):
    settings = make_settings(tmp_path / "data", kb_copy, ensemble_backend="none")
    store = InMemoryStore()
    ingest(settings, HashEmbedder(DIM), [store], progress=False)
    model = SlowModel()
    model.query_wait_s = 0.2
    with pytest.raises(EmbedDeadlineError):
        busy = threading.Thread(target=model.embed_query, args=("hold on",))
        busy.start()
        _wait_until(lambda: model.order == ["hold on"])
        model.embed_query("redis memory high")
    tool = LookupKnowledgeTool(settings, embedder=model, store=store, recorder=MemoryRecorder())
    result = tool.lookup("RedisMemoryHigh fired")
    model.release.set()
    busy.join(30)
    assert result.status in ("degraded", "error") and "busy for 0.2 s" in (result.retrieval_trace.error or "")
    assert model.order == ["hold on"]  # neither waiting query ran the model


def test_with_two_slots_a_short_query_runs_beside_a_heavy_one_and_a_second_heavy_one_waits():
    gate = EncodeGate(slots=2, heavy_slots=1)
    release, events = threading.Event(), []

    def encode(name: str, heavy: bool) -> None:
        with gate.turn(0.0, heavy=heavy):
            events.append(f"{name} runs")
            if name == "heavy 1":
                assert release.wait(30)
        events.append(f"{name} done")

    first = threading.Thread(target=encode, args=("heavy 1", True))
    first.start()
    _wait_until(lambda: events == ["heavy 1 runs"])
    second = threading.Thread(target=encode, args=("heavy 2", True))
    second.start()
    _wait_until(lambda: len(gate._waiting) == 1)
    encode("short", False)  # in this thread: returns while heavy 1 still holds its slot
    release.set()
    first.join(30)
    second.join(30)
    assert events[:3] == ["heavy 1 runs", "short runs", "short done"]
    assert events.index("heavy 2 runs") > events.index("heavy 1 done")
