"""`rag serve` bounds in-flight work (issue 45): past RAG_SERVE_MAX_IN_FLIGHT, HTTP answers 429 with
Retry-After and MCP a tool error, at once and untraced; the call in flight is answered as usual.
Small fakes: a hash embedder that holds a query until released, an in-memory store."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
from conftest import make_settings
from fakes import HashEmbedder

pytest.importorskip("mcp", reason="the serve extra (mcp, fastapi) is not installed")

from fastapi.testclient import TestClient  # noqa: E402
from mcp import Client  # noqa: E402

from rag_core.ingest.pipeline import ingest  # noqa: E402
from rag_core.lookup.tool import LookupKnowledgeTool  # noqa: E402
from rag_core.serve.http_app import served_app  # noqa: E402
from rag_core.serve.mcp_server import build_mcp_server  # noqa: E402
from rag_core.serve.service import LookupService  # noqa: E402
from rag_core.stores.memory import InMemoryStore  # noqa: E402
from rag_core.traces.recorder import MemoryRecorder  # noqa: E402


class HoldingEmbedder(HashEmbedder):
    """Query embeddings of a text starting with ``hold`` wait until ``release`` is set."""

    def __init__(self, dimension: int) -> None:
        super().__init__(dimension)
        self.release = threading.Event()

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        if texts[0].startswith("hold"):
            assert self.release.wait(30)
        return super().embed_queries(texts)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_queries([text])[0]


def test_past_the_in_flight_limit_http_says_429_with_retry_after_and_mcp_a_tool_error(tmp_path, kb_copy):
    settings = make_settings(tmp_path / "data", kb_copy, ensemble_backend="none")
    embedder = HoldingEmbedder(16)
    store = InMemoryStore()
    ingest(settings, embedder, [store], progress=False)
    settings = settings.model_copy(update={"trace_enabled": True, "serve_max_in_flight": 1, "serve_retry_after_s": 3})
    recorder = MemoryRecorder()
    service = LookupService(LookupKnowledgeTool(settings, embedder=embedder, store=store, recorder=recorder))
    held: dict[str, int] = {}
    with TestClient(served_app(service)) as http:
        first = threading.Thread(
            target=lambda: held.update(status=http.post("/v1/lookup", json={"query": "hold redis memory"}).status_code)
        )
        first.start()
        deadline = time.monotonic() + 30
        while service.in_flight < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        refused = http.post("/v1/lookup", json={"query": "redis memory high"})

        async def over_mcp():
            async with Client(build_mcp_server(service)) as client:
                return await client.call_tool("lookup_knowledge", {"query": "redis memory high"})

        mcp_answer = asyncio.run(over_mcp())
        embedder.release.set()
        first.join(30)
        after = http.post("/v1/lookup", json={"query": "redis memory high"})
    assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
    assert "RAG_SERVE_MAX_IN_FLIGHT" in refused.json()["error"]
    assert mcp_answer.is_error and "retry after 3 s" in mcp_answer.content[0].text
    assert held["status"] == 200 and after.status_code == 200
    assert len(recorder.rows) == 2  # the answered calls; refusals cost no lookup and no row
