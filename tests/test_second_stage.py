"""The optional second-stage reranker (issue 25 item 3): a Reranker protocol, an HTTP /rerank
client tested against a real local HTTP server (scores, slow -> timeout, HTTP 500, malformed
JSON), the stage in the lookup pipeline (off by default; a failing reranker leaves the
first-stage order and the trace says why) and the cross-encoder's lazy import."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fakes import HashEmbedder, five_doc_store
from pydantic import SecretStr, ValidationError

from rag_core.lookup.rerankers import (
    CrossEncoderReranker,
    HttpReranker,
    Reranker,
    RerankerError,
    make_reranker,
    parse_scores,
)
from rag_core.lookup.second_stage import HIT_REASON
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.settings import RagSettings
from rag_core.stores.memory import InMemoryStore

DIM = 16
KEY = "sk-test-secret-key-123"


class FakeRerankServer:
    """A real HTTP server on a free local port answering POST /rerank by ``mode``: ``tei``
    (a list of {index, score}), ``cohere`` ({"results": [{index, relevance_score}]}), ``slow``
    (answers after ``delay`` s), ``500`` or ``malformed`` (not JSON). Scores: 1.0 for a text
    containing ``favourite``, else 0.1 (the query is ignored). Keeps every request."""

    def __init__(self) -> None:
        self.mode = "tei"
        self.favourite = "text 3"
        self.delay = 3.0
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((dict(self.headers), body))
                scores = [1.0 if server.favourite in t else 0.1 for t in body["documents"]]
                if server.mode == "slow":
                    time.sleep(server.delay)
                if server.mode == "500":
                    self._send(500, b"model crashed")
                elif server.mode == "malformed":
                    self._send(200, b'{"results": [{"index": 0, "relev')
                elif server.mode == "cohere":
                    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
                    results = [{"index": i, "relevance_score": scores[i]} for i in ranked]
                    self._send(200, json.dumps({"results": results}).encode())
                else:
                    self._send(200, json.dumps([{"index": i, "score": s} for i, s in enumerate(scores)]).encode())

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/rerank"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def endpoint() -> Iterator[FakeRerankServer]:
    server = FakeRerankServer()
    yield server
    server.close()


class Recorder:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def record(self, row: Any) -> None:
        self.rows.append(row.model_dump(mode="json"))

    def close(self) -> None:
        pass


def _store() -> InMemoryStore:
    return five_doc_store(DIM)


def _tool(tmp_path: Any, **settings: Any) -> tuple[LookupKnowledgeTool, Recorder]:
    s = RagSettings(
        data_dir=tmp_path,
        ensemble_backend="none",
        min_block_similarity=0.0,
        _env_file=None,
        **settings,
    )
    recorder = Recorder()
    return LookupKnowledgeTool(s, embedder=HashEmbedder(DIM), store=_store(), recorder=recorder), recorder  # type: ignore[arg-type]


def _docs(result: Any) -> list[str]:
    return [b.doc_id for b in result.evidence_blocks]


def test_the_http_reranker_sends_the_rerank_request_shape_and_reads_both_answer_shapes(endpoint):
    reranker = HttpReranker(endpoint.url, "bge-reranker", SecretStr(KEY), timeout_s=5)
    assert isinstance(reranker, Reranker)
    texts = ["a text 3", "b", "c text 3 too"]
    assert reranker.rerank("q", texts) == [1.0, 0.1, 1.0]
    endpoint.mode = "cohere"
    assert reranker.rerank("q", texts) == [1.0, 0.1, 1.0]  # results sorted by score, read back by index
    headers, body = endpoint.requests[-1]
    assert body == {
        "query": "q",
        "documents": texts,
        "texts": texts,
        "top_n": 3,
        "return_documents": False,
        "model": "bge-reranker",
    }
    assert headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in reranker.name
    reranker.close()


@pytest.mark.parametrize(
    "answer",
    [
        [{"index": 0, "score": 1.0}],  # one score for two texts
        [{"index": 0, "score": 1.0}, {"index": 0, "score": 2.0}],  # index repeated
        [{"index": 0, "score": 1.0}, {"index": 5, "score": 2.0}],  # out of range
        {"results": [{"index": 0}, {"index": 1, "relevance_score": 0.2}]},  # no score
        {"data": []},
        "scores",
    ],
)
def test_an_answer_that_does_not_score_every_text_once_is_refused(answer):
    with pytest.raises((ValueError, ValidationError)):
        parse_scores(answer, 2)


@pytest.mark.parametrize(
    ("mode", "status", "reason", "timeout_s"),
    [
        ("500", "failed", "HTTP 500", 30.0),
        ("malformed", "failed", "malformed answer", 30.0),
        ("slow", "timeout", "RAG_RERANKER_TIMEOUT_S", 0.5),  # the server answers after 10 s
    ],
)
def test_a_failing_reranker_leaves_the_first_stage_order_and_the_trace_says_why(
    tmp_path, endpoint, mode, status, reason, timeout_s
):
    plain, _ = _tool(tmp_path / "off")
    first_stage = plain.lookup("redis memory text 1")
    endpoint.mode, endpoint.delay = mode, 10.0
    tool, recorder = _tool(
        tmp_path / "on",
        reranker="http",
        reranker_url=endpoint.url,
        reranker_api_key=SecretStr(KEY),
        reranker_timeout_s=timeout_s,
    )
    result = tool.lookup("redis memory text 1")
    assert result.status == "ok", result.message
    assert _docs(result) == _docs(first_stage)
    assert not any(HIT_REASON in b.hit_reasons for b in result.evidence_blocks)
    second = recorder.rows[-1]["retrieval_details"]["second_stage"]
    assert second["status"] == status and reason in second["reason"]
    assert KEY not in json.dumps(recorder.rows[-1])
    tool.close()
    plain.close()


def test_the_second_stage_reorders_the_top_blocks_by_the_rerankers_scores(tmp_path, endpoint):
    plain, plain_rows = _tool(tmp_path / "off", trace_enabled=True)
    first_stage = plain.lookup("redis memory text 1")
    head = _docs(first_stage)[:3]
    favourite = head[2]  # the third first-stage block: the endpoint scores it best
    endpoint.favourite = f"text {favourite.removeprefix('d').removesuffix('.md')}"
    tool, recorder = _tool(
        tmp_path / "on", reranker="http", reranker_url=endpoint.url, reranker_top_n=3, reranker_timeout_s=30
    )
    result = tool.lookup("redis memory text 1")
    # The favourite moves to the top, the rest of the top 3 keep their order, the tail too.
    assert _docs(result) == [favourite, head[0], head[1], *_docs(first_stage)[3:]]
    assert [b.rank for b in result.evidence_blocks] == list(range(1, len(result.evidence_blocks) + 1))
    assert [e.rank_after for e in result.rerank_trace] == [b.rank for b in result.evidence_blocks]
    assert all(HIT_REASON in b.hit_reasons for b in result.evidence_blocks[:3])
    assert len(endpoint.requests[-1][1]["documents"]) == 3  # top-N bounded
    second = recorder.rows[-1]["retrieval_details"]["second_stage"]
    assert second["status"] == "reranked" and second["top_n"] == 3 and set(second["scores"]) == set(head)
    assert "second_stage_ms" in recorder.rows[-1]["retrieval_details"]["stage_ms"]
    # Off (the default): no second_stage key in the trace, no stage time.
    assert "second_stage" not in plain_rows.rows[-1]["retrieval_details"]
    assert "second_stage_ms" not in plain_rows.rows[-1]["retrieval_details"]["stage_ms"]
    tool.close()
    plain.close()


def test_an_unreachable_endpoint_fails_the_stage_not_the_lookup(tmp_path):
    tool, recorder = _tool(tmp_path, reranker="http", reranker_url="http://127.0.0.1:9/rerank")
    result = tool.lookup("redis memory text 2")
    assert result.found and result.status == "ok"
    second = recorder.rows[-1]["retrieval_details"]["second_stage"]
    assert second["status"] in ("failed", "timeout") and second["reason"]
    tool.close()


def test_the_reranker_settings_name_what_is_missing(tmp_path):
    assert RagSettings(data_dir=tmp_path, _env_file=None).reranker == "none"
    assert make_reranker(RagSettings(data_dir=tmp_path, _env_file=None)) is None
    with pytest.raises(ValidationError, match="RAG_RERANKER_URL"):
        RagSettings(data_dir=tmp_path, reranker="http", _env_file=None)
    with pytest.raises(ValidationError, match="RAG_RERANKER_MODEL"):
        RagSettings(data_dir=tmp_path, reranker="cross-encoder", _env_file=None)
    with pytest.raises(ValidationError, match="reranker_top_n"):
        RagSettings(data_dir=tmp_path, reranker_top_n=0, _env_file=None)


def test_the_cross_encoder_imports_sentence_transformers_only_when_it_scores(tmp_path):
    reranker = make_reranker(
        RagSettings(data_dir=tmp_path, reranker="cross-encoder", reranker_model=str(tmp_path / "none"), _env_file=None)
    )
    assert isinstance(reranker, CrossEncoderReranker) and isinstance(reranker, Reranker)
    loaded = "sentence_transformers" in sys.modules
    assert reranker.rerank("q", []) == []
    assert ("sentence_transformers" in sys.modules) == loaded
    with pytest.raises(RerankerError, match="sentence-transformers|RAG_RERANKER_MODEL"):
        reranker.rerank("q", ["a"])  # no extra, or no model at that path: one clear error


def test_a_cross_encoder_that_cannot_load_leaves_the_first_stage_order(tmp_path):
    plain, _ = _tool(tmp_path / "off")
    tool, recorder = _tool(
        tmp_path / "on", reranker="cross-encoder", reranker_model=str(tmp_path / "missing"), reranker_timeout_s=60
    )
    result = tool.lookup("redis memory text 4")
    assert _docs(result) == _docs(plain.lookup("redis memory text 4"))
    assert recorder.rows[-1]["retrieval_details"]["second_stage"]["status"] == "failed"
    tool.close()
    plain.close()
