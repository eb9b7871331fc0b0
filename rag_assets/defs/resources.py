"""Dagster resources wrapping rag_core settings and clients (rag_core itself never imports Dagster).

Every field is optional: an unset field falls back to ``RagSettings`` (``RAG_*`` environment
variables, ``.env``, then the embedded defaults). ``build_resources`` binds the ``RAG_*``
variables that are set as ``dg.EnvVar``, so the UI shows where a URI or secret comes from
without the value ever entering run config.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import dagster as dg
from pydantic import Field

from rag_assets.layout import REPO_BASELINE, AssetFiles
from rag_assets.locks import store_lock
from rag_core.settings import RagSettings

LOCK_TIMEOUT_S = 1800.0


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    return raw in ("1", "true", "yes", "on")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be at least 1")
    return value


class RagSettingsResource(dg.ConfigurableResource):
    """The ``RagSettings`` overrides of this code location (``None`` = use RagSettings' value).

    ``sidecar_enabled`` decides whether the pgvector assets build and evaluate the sidecar;
    the Dagster location does so unless it is set to false (RAG_SIDECAR_ENABLED=false).
    """

    data_dir: str | None = Field(None, description="Local state dir (RAG_DATA_DIR)")
    knowledge_dir: str | None = Field(None, description="Markdown knowledge root (RAG_KNOWLEDGE_DIR)")
    golden_cases: str | None = Field(None, description="Golden case file (RAG_GOLDEN_CASES)")
    milvus_uri: str | None = Field(None, description="Milvus URI; empty = Milvus Lite (RAG_MILVUS_URI)")
    milvus_token: str | None = Field(None, description="Milvus token (RAG_MILVUS_TOKEN)")
    pg_dsn: str | None = Field(None, description="PostgreSQL DSN; empty = embedded (RAG_PG_DSN)")
    sidecar_enabled: bool = Field(True, description="Build and evaluate the pgvector sidecar")
    embed_shards: int = Field(
        1, ge=1, description="Shards of the chunk embedding step, run in parallel by a multiprocess executor"
    )

    def get_settings(self) -> RagSettings:
        """A fresh ``RagSettings`` with the set fields applied (pydantic ValidationError if invalid)."""
        overrides: dict[str, Any] = {
            name: value
            for name in ("data_dir", "knowledge_dir", "golden_cases", "milvus_uri", "milvus_token", "pg_dsn")
            if (value := getattr(self, name)) not in (None, "")
        }
        return RagSettings(sidecar_enabled=self.sidecar_enabled, **overrides)


class EvaluationConfigResource(dg.ConfigurableResource):
    """Where reports go and how the evaluation, the gate and the parity check judge.

    ``reports_dir`` defaults to ``<data_dir>/reports``, ``published_dir`` to
    ``<data_dir>/published``; ``baseline_path`` to ``golden/reports/baseline.json`` in the
    repository. Tolerances are absolute drops (0.02 = two points); ``parity_min_overlap`` is
    the lowest acceptable mean top-5 doc overlap between Milvus and pgvector, in [0, 1].
    """

    reports_dir: str | None = None
    published_dir: str | None = None
    baseline_path: str | None = None
    ks: list[int] = Field(default_factory=lambda: [1, 3, 5, 10])
    strong_k: int = 5
    recall_tolerance: float = 0.02
    mrr_tolerance: float = 0.02
    parity_min_overlap: float = 0.6

    def files(self, settings: RagSettings) -> AssetFiles:
        """The file layout for ``settings.data_dir`` with this resource's report dirs."""
        return AssetFiles.under(
            settings.data_dir,
            _path(self.reports_dir, "RAG_REPORTS_DIR"),
            _path(self.published_dir, "RAG_PUBLISHED_DIR"),
        )

    def baseline(self) -> Path:
        """The stored baseline report JSON (it may not exist yet)."""
        return _path(self.baseline_path, "RAG_BASELINE") or REPO_BASELINE


def _path(value: str | None, env_var: str | None = None) -> Path | None:
    # Unset fields read the variable at run time, as RagSettings does: the definitions may
    # have been loaded before the variable was set.
    value = value or (os.environ.get(env_var, "").strip() if env_var else None)
    return Path(value).expanduser() if value else None


class EmbedderResource(dg.ConfigurableResource):
    """The embedder the settings name (``RAG_EMBEDDING_BACKEND``; loaded once per process)."""

    rag: RagSettingsResource

    def get(self):
        """An ``Embedder`` (``embed_passages(texts, ids) -> (n, dim)``, ``embed_query``, ``identity()``).

        Raises EmbedderLoadError naming the setting when the model cannot load."""
        from rag_core.components import make_embedder

        return make_embedder(self.rag.get_settings())


class _LockedStoreResource(dg.ConfigurableResource):
    rag: RagSettingsResource
    lock_timeout_s: float = LOCK_TIMEOUT_S

    store_name: ClassVar[str] = ""

    @contextmanager
    def lock(self, logger=None) -> Iterator[None]:
        """Hold this store's inter-process lock (waits up to ``lock_timeout_s``; StoreBusyError)."""
        files = AssetFiles.under(self.rag.get_settings().data_dir)
        with store_lock(files.lock_file(self.store_name), self.lock_timeout_s, logger):
            yield


class MilvusStoreResource(_LockedStoreResource):
    """The main-path Milvus store (Milvus Lite in the data dir unless ``milvus_uri`` is set)."""

    store_name: ClassVar[str] = "milvus"

    @contextmanager
    def open(self, logger=None) -> Iterator[Any]:
        """A ``MilvusStore`` under the lock, closed afterwards. StoreError when unreachable."""
        from rag_core.components import make_main_store

        with self.lock(logger):
            store = make_main_store(self.rag.get_settings())
            try:
                yield store
            finally:
                store.close()


class PgVectorStoreResource(_LockedStoreResource):
    """The pgvector sidecar store (``pg_dsn`` or the embedded PostgreSQL under the data dir)."""

    store_name: ClassVar[str] = "pgvector"

    @contextmanager
    def open(self, logger=None) -> Iterator[Any]:
        """A ``PgVectorStore`` under the lock, closed afterwards. StoreError when unreachable
        (the embedded server is started on first use)."""
        from rag_core.components import make_sidecar_store

        with self.lock(logger):
            store = make_sidecar_store(self.rag.get_settings())
            try:
                yield store
            finally:
                store.close()


class TraceStoreResource(dg.ConfigurableResource):
    """The ``tool_invocation`` trace table (same PostgreSQL as the sidecar)."""

    rag: RagSettingsResource

    @contextmanager
    def open(self) -> Iterator[Any]:
        """A ``TraceStore`` with its schema ensured, closed afterwards. StoreError when down."""
        from rag_core.traces.store import TraceStore

        store = TraceStore.from_settings(self.rag.get_settings())
        try:
            store.ensure_schema()
            yield store
        finally:
            store.close()


def _env(name: str) -> dg.EnvVar | None:
    # An EnvVar whose variable is unset fails the run; unset means "use the default" here.
    return dg.EnvVar(name) if os.environ.get(name, "").strip() else None


def settings_resource_from_env() -> RagSettingsResource:
    """``RagSettingsResource`` bound to the ``RAG_*`` variables that are set right now."""
    fields = {
        "data_dir": "RAG_DATA_DIR",
        "knowledge_dir": "RAG_KNOWLEDGE_DIR",
        "golden_cases": "RAG_GOLDEN_CASES",
        "milvus_uri": "RAG_MILVUS_URI",
        "milvus_token": "RAG_MILVUS_TOKEN",
        "pg_dsn": "RAG_PG_DSN",
    }
    return RagSettingsResource(
        **{field: _env(var) for field, var in fields.items()},
        sidecar_enabled=_env_flag("RAG_SIDECAR_ENABLED", True),
        embed_shards=_env_int("RAG_EMBED_SHARDS", 1),
    )


def evaluation_resource_from_env() -> EvaluationConfigResource:
    """``EvaluationConfigResource`` bound to RAG_REPORTS_DIR, RAG_PUBLISHED_DIR, RAG_BASELINE."""
    return EvaluationConfigResource(
        reports_dir=_env("RAG_REPORTS_DIR"), published_dir=_env("RAG_PUBLISHED_DIR"), baseline_path=_env("RAG_BASELINE")
    )


def build_resources(
    rag: RagSettingsResource | None = None, evaluation: EvaluationConfigResource | None = None
) -> dict[str, Any]:
    """Every resource the assets use, keyed by parameter name.

    ``io_manager`` is ``RagFilesIOManager``: every output a file at the data dir's layout
    (pydantic JSON or Parquet), so a later run, a check or a person can read what a run made.
    """
    from rag_assets.io_manager import RagFilesIOManager

    rag = rag or settings_resource_from_env()
    evaluation = evaluation or evaluation_resource_from_env()
    return {
        "rag": rag,
        "evaluation": evaluation,
        "embedder": EmbedderResource(rag=rag),
        "milvus": MilvusStoreResource(rag=rag),
        "pgvector": PgVectorStoreResource(rag=rag),
        "traces": TraceStoreResource(rag=rag),
        "io_manager": RagFilesIOManager(rag=rag, evaluation=evaluation),
    }


@dg.definitions
def resources() -> dg.Definitions:
    """The code location's resources, bound from the environment at load time."""
    return dg.Definitions(resources=build_resources())
