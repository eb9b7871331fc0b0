"""Main store: Milvus (the embedded server of the data dir, a production server URI, or a
Milvus Lite file) with dense + BM25 search.

The collection has an explicit schema, a COSINE dense index (type and search parameters from
settings) and a BM25 sparse function over a pre-tokenised ``lexical`` column (see
``rag_core.text.lexical_string``). The embedded server (``rag_core.stores.milvus_server``) is
reached by URI like a production server; when it dies between two calls it is started again
once and the call retried (calls are idempotent: upserts by id, deletes, reads).

Document centroids (``rag_core.ingest.centroids``) live in a side collection of the serving
collection, ``<collection>__centroids`` (doc id and vector), read by primary key: one row per
candidate document, whatever the document's size. The key is a hash of the doc id: milvus-lite
2.5.1 builds an unescaped filter from the primary keys of an upsert (a doc id holding ``"`` or a
line break as the key fails it: "syntax error near ','"), and hex keys need no quoting.

A rebuild (``MilvusStore.rebuild``) fills a new collection and switches to it atomically, so a
lookup in another process sees the old index or the new one, whole. The switch is a row of a
side collection (``<collection>__live``) naming the collection that serves: a collection
alias would do it on a Milvus server, but milvus-lite 2.5.1's server answers UNIMPLEMENTED to
create_alias / alter_alias / describe_alias / list_aliases (checked on this machine).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from rag_core.dependency_logs import route_dependency_logs
from rag_core.embedding.base import ModelIdentity
from rag_core.models import Chunk, StoreHit
from rag_core.settings import RagSettings, redact_dsn
from rag_core.stores import milvus_server
from rag_core.stores.base import (
    BulkLoad,
    DimensionMismatchError,
    MissingCentroidsError,
    StoredChunk,
    StoreError,
    check_vectors,
    cosine_to_similarity,
)
from rag_core.stores.vectors import check_query_vector, finite_score
from rag_core.text import lexical_string

log = logging.getLogger(__name__)

T = TypeVar("T")

# milvus-lite 2.5's server returns no MVCC timestamp to query iterators; pymilvus then warns on
# every scan and uses a client-side timestamp, which is right for one local server.
_QUIET_LOGGERS = ("pymilvus.client.iterator.query_iterator",)


def _quiet_pymilvus() -> None:
    # Again after importing pymilvus: its logging set-up (dictConfig) resets levels and handlers.
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    route_dependency_logs()


_quiet_pymilvus()

SCORE_LABEL = "milvus_cosine_similarity[-1,1]"
# VARCHAR max_length in Milvus counts UTF-8 bytes, not characters.
VARCHAR_LIMITS = {
    "chunk_id": 64,
    "doc_id": 1024,
    "title": 1024,
    "breadcrumb": 4096,
    "category": 512,
    "text": 65535,
    "content_hash": 64,
    "lexical": 65535,
}
MODEL_SUFFIX = "__model"
CENTROID_SUFFIX = "__centroids"
#: Side collection naming the collection that serves the index (see ``MilvusStore.rebuild``).
POINTER_SUFFIX = "__live"
#: Collections built by ``MilvusStore.rebuild``: ``<collection>__build_<unix time>_<hex>``.
BUILD_MARK = "__build_"
#: A reader re-reads the pointer when its copy is older than this (seconds) ...
POINTER_TTL_S = 1.0
#: ... and a rebuild drops the replaced collection this long after the switch, so readers move
#: to the new one before the old one goes (a reader that still hits it retries on the new one).
SWITCH_GRACE_S = 3.0
_OUTPUT = ["chunk_id", "doc_id", "title", "breadcrumb", "category", "text"]
# Rows per insert call: milvus-lite 2.5's insert cost grows faster than linearly with the batch
# (measured on this machine: 5,000 rows take 1.9 s in 500-row calls, 27.5 s in one 5,000-row call).
UPSERT_ROWS = 256


def escape_filter_value(value: str) -> str:
    """A Milvus filter string literal for ``value``: double-quoted, with ``\\``, ``"`` and line
    breaks escaped by a backslash. ValueError when ``value`` holds a carriage return not
    followed by a line feed, which no literal can hold.

    What the embedded engine (milvus-lite 2.5.1) reads, checked on this machine: its grammar
    (``Plan.g4``) refuses a raw line break inside a literal but accepts a backslash before a line
    feed or a CR LF pair, and it takes ``\\`` and ``\\"`` as the character; escapes such as
    ``\\n``, ``\\x0a`` or ``\\u000a`` stay as written (match nothing), while tabs, ESC, other
    controls and any other code point match as they are. Expression templates
    (``filter_params``) would need no quoting, but its server answers them "Unexpected error in
    RPC handling"; a Milvus server's Go parser unquotes literals differently (``\\n``).
    """
    if "\r" in value.replace("\r\n", ""):
        raise ValueError(f"{value!r} holds a carriage return without a line feed: Milvus filters cannot express it")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\\n").replace("\r\\\n", "\\\r\n")
    return f'"{escaped}"'


def check_chunk_fits(chunk: Chunk) -> None:
    """ValueError naming the chunk and field when a value (the lexical column included) exceeds
    its Milvus VARCHAR limit in UTF-8 bytes, or when its doc id or category cannot be written in
    a filter (``escape_filter_value``)."""
    varchar_row(chunk)
    for field in ("doc_id", "category"):
        try:
            escape_filter_value(getattr(chunk, field))
        except ValueError as exc:
            raise ValueError(f"chunk {chunk.chunk_id}: field {field}: {exc}") from None


def varchar_row(chunk: Chunk, lexical: str | None = None) -> dict[str, str]:
    """The VARCHAR columns of ``chunk``'s row (``lexical``: its lexical string when already
    computed); ValueError naming the chunk and field when a value exceeds its VARCHAR limit in
    UTF-8 bytes."""
    row = {
        "chunk_id": chunk.chunk_id,
        "doc_id": chunk.doc_id,
        "title": chunk.title,
        "breadcrumb": chunk.breadcrumb,
        "category": chunk.category,
        "text": chunk.text,
        "content_hash": chunk.content_hash,
        "lexical": lexical_string(chunk.embed_text) if lexical is None else lexical,
    }
    for field, value in row.items():
        size = len(value.encode("utf-8"))
        if size > VARCHAR_LIMITS[field]:
            raise ValueError(
                f"chunk {chunk.chunk_id} ({chunk.doc_id}): field {field} is {size} UTF-8 bytes, "
                f"over the Milvus VARCHAR limit of {VARCHAR_LIMITS[field]}"
            )
    return row


@dataclass(frozen=True)
class IndexSettings:
    """Dense index type with its build and search parameters.

    ``hnsw_ef`` (HNSW search list size, raised to top_k) and ``ivf_nprobe`` (IVF clusters
    probed) trade recall for speed; FLAT is exact. Defaults: see ``RagSettings``.
    """

    index_type: str = "FLAT"
    hnsw_m: int = 16
    hnsw_ef_construction: int = 200
    hnsw_ef: int = 128
    ivf_nlist: int = 1024
    ivf_nprobe: int = 32

    def build_params(self) -> dict[str, int]:
        if self.index_type == "HNSW":
            return {"M": self.hnsw_m, "efConstruction": self.hnsw_ef_construction}
        if self.index_type == "IVF_FLAT":
            return {"nlist": self.ivf_nlist}
        return {}

    def search_params(self, top_k: int) -> dict[str, object]:
        params: dict[str, int] = {}
        if self.index_type == "HNSW":
            params = {"ef": max(self.hnsw_ef, top_k)}
        elif self.index_type == "IVF_FLAT":
            params = {"nprobe": self.ivf_nprobe}
        return {"metric_type": "COSINE", "params": params}


class MilvusStore:
    """Chunks in one Milvus collection. Thread-safe (pymilvus clients are).

    ``uri`` is a Milvus Lite file path or ``http(s)://host:port``; ``token`` is optional.
    ``embedded_dir`` instead names a data dir whose embedded Milvus server
    (``rag_core.stores.milvus_server``) is started or found on first use; ``uri`` is then
    that server's. Raises StoreError (with the URI's password redacted) when Milvus cannot be
    reached, ForeignFormatError when the embedded data is another engine's.
    """

    name = "milvus"
    score_label = SCORE_LABEL

    def __init__(
        self,
        uri: str,
        collection: str,
        token: str | None = None,
        index_type: str = "FLAT",
        timeout: float = 10.0,
        *,
        index: IndexSettings | None = None,
        embedded_dir: Path | None = None,
        idle_stop_seconds: float = 0.0,
    ):
        self.uri = uri
        self.collection = collection
        self.index = index or IndexSettings(index_type=index_type)
        self.index_type = self.index.index_type
        self._token = token
        self._timeout = timeout
        self._live: str | None = None  # the collection serving ``collection`` (resolved on first use)
        self._live_at = float("-inf")  # time.monotonic() of that resolution (inf: fixed, a build)
        self._client: Any | None = None  # a pymilvus MilvusClient (untyped)
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._reconnect_lock = threading.Lock()
        self._loaded = False
        self._centroids_loaded: str | None = None  # the collection whose centroids were loaded
        self._embedded_dir = Path(embedded_dir).resolve() if embedded_dir is not None else None
        self._idle_stop = idle_stop_seconds
        self._server_pid: int | None = None
        self.pending_rows = 0  # rows upserted/deleted since the last flush (0 = all sealed)
        if self._embedded_dir is not None and not uri:
            self.uri = f"embedded Milvus of {self._embedded_dir}"

    @classmethod
    def from_settings(cls, settings: RagSettings) -> MilvusStore:
        token = settings.milvus_token.get_secret_value() if settings.milvus_token else None
        index = IndexSettings(
            index_type=settings.milvus_index,
            hnsw_ef=settings.milvus_hnsw_ef,
            ivf_nlist=settings.milvus_ivf_nlist,
            ivf_nprobe=settings.milvus_ivf_nprobe,
        )
        if settings.milvus_embedded:
            return cls(
                "",
                settings.collection,
                token,
                index=index,
                embedded_dir=settings.data_dir,
                idle_stop_seconds=settings.embedded_idle_stop_seconds,
            )
        return cls(settings.milvus_target, settings.collection, token, index=index)

    @property
    def is_lite(self) -> bool:
        """True for the in-process file mode (a path, not a server URI)."""
        return self._embedded_dir is None and not self.uri.startswith(("http://", "https://", "tcp://", "grpc://"))

    @property
    def server_pid(self) -> int | None:
        """Pid of the embedded server this store is connected to (None otherwise)."""
        return self._server_pid

    def _connect(self) -> Any:
        with self._lock:
            if self._client is not None:
                return self._client
            from pymilvus import MilvusClient

            _quiet_pymilvus()
            if self._embedded_dir is not None:
                state = milvus_server.ensure_server(self._embedded_dir, self._idle_stop)
                self.uri, self._server_pid = state.uri, state.pid
            elif self.is_lite:
                Path(self.uri).parent.mkdir(parents=True, exist_ok=True)
                milvus_server.check_format(Path(self.uri))
            try:
                # A dedicated channel without client keepalive pings: Milvus Lite's embedded
                # server drops connections that ping while idle ("too_many_pings"), and the
                # shared per-URI channel would then fail every later call of the process.
                kwargs = {
                    "uri": self.uri,
                    "timeout": self._timeout,
                    "dedicated": True,
                    "grpc_options": {"grpc.keepalive_permit_without_calls": False, "grpc.keepalive_time_ms": 2**31 - 1},
                }
                if self._token:
                    kwargs["token"] = self._token
                self._client = MilvusClient(**kwargs)
            except Exception as exc:  # pymilvus raises many types; all mean "unreachable"
                raise StoreError(f"cannot connect to Milvus at {redact_dsn(self.uri)}: {_brief(exc)}") from None
            return self._client

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        client = self._connect()
        used_pid, used_name = self._server_pid, self._live
        try:
            return fn(client, *args, **kwargs)
        except StoreError:
            raise
        except Exception as exc:
            first = exc
        if self._switched(used_name):
            again = "after a rebuild switched the index to a new collection"
        elif self._recovered_server(used_pid):
            again = "after restarting the embedded server"
        else:
            raise StoreError(f"Milvus {what} failed on {self.collection!r}: {_brief(first)}") from None
        # The collection was replaced by a rebuild, or the embedded server had died and runs
        # again: retry once (on the new collection / a fresh connection).
        try:
            return fn(self._connect(), *args, **kwargs)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"Milvus {what} failed on {self.collection!r} {again}: {_brief(exc)}") from None

    # --- which collection serves the index (switched atomically by ``rebuild``) ------------

    @property
    def pointer_collection(self) -> str:
        """The side collection whose newest row names the collection serving the index."""
        return f"{self.collection}{POINTER_SUFFIX}"

    @property
    def _name(self) -> str:
        """The collection serving ``collection``: resolved once, again after a switch."""
        name = self._live
        if name is None:
            name = self._live = self._call("resolve", self._read_pointer)
            self._live_at = time.monotonic()
        return name

    def _follow_switch(self) -> None:
        """Re-read the pointer when this store's copy is older than ``POINTER_TTL_S``."""
        if self._live is not None and time.monotonic() - self._live_at > POINTER_TTL_S:
            used = self._live
            self._live_at = time.monotonic()
            self._switched(used)

    def _read_pointer(self, client: Any) -> str:
        """The collection the newest pointer row names; ``collection`` itself without a pointer
        (an index never rebuilt since switching was introduced)."""
        if not client.has_collection(self.pointer_collection):
            return self.collection
        rows = client.query(self.pointer_collection, filter="gen >= 0", output_fields=["gen", "target"])
        return str(max(rows, key=lambda r: int(r["gen"]))["target"]) if rows else self.collection

    def _switched(self, used_name: str | None) -> bool:
        """After a call on ``used_name`` failed (or found it missing): True when another
        collection serves the index now (a rebuild switched and dropped the old one); later
        calls then use it. False when nothing changed or the pointer cannot be read."""
        if used_name is None:
            return False
        try:
            name = self._read_pointer(self._connect())
        except Exception:  # unreachable: the caller reports the original error
            log.debug("reading the Milvus index pointer failed", exc_info=True)
            return False
        if name == used_name:
            return False
        log.info("Milvus index %r is now served by %r (was %r)", self.collection, name, used_name)
        self._live, self._live_at, self._loaded = name, time.monotonic(), False
        return True

    def _recovered_server(self, used_pid: int | None) -> bool:
        """After a call on the embedded server ``used_pid`` failed: True when that server had
        died and a live one (restarted here, by another thread or by another process) is now
        connected with the collection loaded; False when ``used_pid`` still serves."""
        if self._embedded_dir is None or used_pid is None:
            return False
        state = milvus_server.restart_if_dead(self._embedded_dir, used_pid, self._idle_stop)
        if state is None:
            return False  # the server is alive: the error was real
        with self._reconnect_lock:  # several threads may fail at once: one reconnects
            if self._server_pid == state.pid and self._client is not None:
                return True
            log.warning(
                "the embedded Milvus (pid %s) was gone; reconnecting to pid %d at %s", used_pid, state.pid, state.uri
            )
            self._drop_client()
            self._centroids_loaded = None  # a new server: loaded again on next use
            client = self._connect()
            try:
                if self._loaded and client.has_collection(self._name):
                    client.load_collection(self._name)
            except Exception as exc:
                raise StoreError(
                    f"Milvus load_collection failed on {self.collection!r} after restarting "
                    f"the embedded server: {_brief(exc)}"
                ) from None
        return True

    def _drop_client(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # the old channel points at a dead server
                log.debug("closing the stale Milvus client failed", exc_info=True)

    # --- schema -----------------------------------------------------------------------------

    def exists(self) -> bool:
        """True when the collection serving the index exists (it may have just been switched)."""
        used = self._name
        if self._call("has_collection", lambda c: c.has_collection(used)):
            return True
        return self._switched(used) and bool(self._call("has_collection", lambda c: c.has_collection(self._name)))

    def ensure_schema(self, dim: int) -> None:
        """Create the collection if missing, else check its dimension; then load it.

        Raises DimensionMismatchError before any write when the stored dimension differs.
        """
        if self.exists():
            stored = self.dimension()
            if stored != dim:
                raise DimensionMismatchError(f"Milvus collection {self.collection!r}", stored, dim)
        else:
            self._call("create_collection", self._create, dim)
        self._ensure_loaded()
        if not self._call("has_collection", partial(_has, self.centroid_collection)):
            self._call("create_collection", self._create_centroids, dim)

    def dimension(self) -> int | None:
        """Dimension of the stored vector field, or None when the collection does not exist."""
        if not self.exists():
            return None
        info = self._call("describe_collection", lambda c: c.describe_collection(self._name))
        for field in info["fields"]:
            if field["name"] == "vector":
                return int(field["params"]["dim"])
        return None

    def _create(self, client: Any, dim: int) -> None:
        from pymilvus import DataType, Function, FunctionType

        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("chunk_id", DataType.VARCHAR, is_primary=True, max_length=VARCHAR_LIMITS["chunk_id"])
        for name in ("doc_id", "title", "breadcrumb", "category", "text", "content_hash"):
            schema.add_field(name, DataType.VARCHAR, max_length=VARCHAR_LIMITS[name])
        schema.add_field(
            "lexical",
            DataType.VARCHAR,
            max_length=VARCHAR_LIMITS["lexical"],
            enable_analyzer=True,
            analyzer_params={"tokenizer": "standard"},
        )
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        schema.add_function(
            Function(
                name="bm25",
                function_type=FunctionType.BM25,
                input_field_names=["lexical"],
                output_field_names=["sparse"],
            )
        )
        index = client.prepare_index_params()
        index.add_index(
            "vector", index_type=self.index.index_type, metric_type="COSINE", params=self.index.build_params()
        )
        index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        index.add_index("doc_id", index_type="INVERTED")
        index.add_index("category", index_type="INVERTED")
        client.create_collection(self._name, schema=schema, index_params=index)

    def _create_centroids(self, client: Any, dim: int) -> None:
        from pymilvus import DataType

        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=32)
        schema.add_field("doc_id", DataType.VARCHAR, max_length=VARCHAR_LIMITS["doc_id"])
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        index = client.prepare_index_params()
        index.add_index("vector", index_type="FLAT", metric_type="COSINE")  # never searched; Milvus needs one
        client.create_collection(self.centroid_collection, schema=schema, index_params=index)

    def _centroids_ready(self) -> bool:
        """Load the centroid collection once per serving collection; False when it is missing."""
        name = self.centroid_collection
        if self._centroids_loaded == name:
            return True
        if not self._call("has_collection", partial(_has, name)):
            return False
        self._call("load_collection", lambda c: c.load_collection(name))
        self._centroids_loaded = name
        return True

    def _ensure_loaded(self) -> None:
        # A collection reopened from a Milvus Lite file is "released" until loaded.
        if self._loaded:
            return
        with self._load_lock:  # concurrent first searches must not race the load
            if self._loaded:
                return
            state = self._call("get_load_state", lambda c: c.get_load_state(self._name))
            if "Loaded" not in str(state.get("state")):
                self._call("load_collection", lambda c: c.load_collection(self._name))
            self._loaded = True

    def _ready(self) -> None:
        self._follow_switch()
        if not self._loaded:
            if not self.exists():
                raise StoreError(
                    f"Milvus collection {self.collection!r} does not exist at "
                    f"{redact_dsn(self.uri)}: run `rag ingest` first"
                )
            self._ensure_loaded()

    # --- writes -----------------------------------------------------------------------------

    def check_chunk(self, chunk: Chunk) -> None:
        """ValueError when a field exceeds its VARCHAR limit (``check_chunk_fits``)."""
        check_chunk_fits(chunk)

    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        """Insert or replace ``chunks`` by chunk id. ValueError names a bad chunk before any write."""
        if not chunks:
            return
        check_vectors([c.chunk_id for c in chunks], vectors, vectors.shape[1])
        rows = [
            {**varchar_row(chunk), "vector": vector.tolist()} for chunk, vector in zip(chunks, vectors, strict=True)
        ]
        self._ready()
        for i in range(0, len(rows), UPSERT_ROWS):
            part = rows[i : i + UPSERT_ROWS]
            self._call("upsert", lambda c, part=part: c.upsert(self._name, part))
            self.pending_rows += len(part)

    def bulk_load(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> BulkLoad:
        """Insert ``chunks`` into the empty collection in ``UPSERT_ROWS`` batches, then flush
        (``VectorStore.bulk_load``). Chunks sharing an embed text share one lexical string.
        ValueError names a bad chunk or vector and StoreError reports a non-empty collection,
        both before any write."""
        check_vectors([c.chunk_id for c in chunks], vectors, vectors.shape[1])
        if self.count():
            raise StoreError(f"bulk_load needs an empty collection; {self.collection!r} holds {self.count()} chunks")
        lexical: dict[str, str] = {}
        t0 = time.perf_counter()
        for i in range(0, len(chunks), UPSERT_ROWS):
            part = [
                {**varchar_row(c, lexical.get(c.embed_text)), "vector": v.tolist()}
                for c, v in zip(chunks[i : i + UPSERT_ROWS], vectors[i : i + UPSERT_ROWS], strict=True)
            ]
            for c, row in zip(chunks[i : i + UPSERT_ROWS], part, strict=True):
                lexical.setdefault(c.embed_text, row["lexical"])
            self._call("insert", lambda cl, part=part: cl.insert(self._name, part))
        write_s = time.perf_counter() - t0
        self.flush()
        return BulkLoad(len(chunks), write_s, time.perf_counter() - t0 - write_s)

    def flush(self) -> None:
        """Seal written rows into persisted segments (call after each ingest write stage).

        Unflushed rows stay in the engine's growing segment: Milvus Lite 3 re-processes them in
        Python on every search, and the embedded server keeps them only in its write buffer.
        """
        if self.exists():
            self._call("flush", lambda c: c.flush(self._name))
            if self._call("has_collection", partial(_has, self.centroid_collection)):
                self._call("flush", lambda c: c.flush(self.centroid_collection))
        self.pending_rows = 0

    def delete_documents(self, doc_ids: Sequence[str]) -> None:
        if not doc_ids:
            return
        self._ready()
        expr = "doc_id in [" + ", ".join(escape_filter_value(d) for d in doc_ids) + "]"
        self._call("delete", lambda c: c.delete(self._name, filter=expr))
        self.pending_rows += len(doc_ids)

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        if not chunk_ids:
            return
        self._ready()
        self._call("delete", lambda c: c.delete(self._name, ids=list(chunk_ids)))
        self.pending_rows += len(chunk_ids)

    def drop(self) -> None:
        """Drop the index: its serving collection, the pointer, the model records and any
        leftover build. Embedded data in another engine's on-disk format is first moved aside
        (``milvus.db.foreign-<time>``), never deleted."""
        self._set_aside_foreign()
        names = set(self._call("list_collections", lambda c: c.list_collections()))
        if self.pointer_collection in names:
            self._drop_collection(self.pointer_collection)
        for name in sorted(n for n in names if self._owns(n)):
            self._drop_collection(name)
        self._live, self._loaded, self._centroids_loaded = None, False, None

    def _set_aside_foreign(self) -> None:
        if self._embedded_dir is not None and self._client is None:
            milvus_server.set_aside_foreign(self._embedded_dir)
        elif self.is_lite and self._client is None:
            _set_aside_foreign_file(Path(self.uri))

    def _owns(self, name: str) -> bool:
        """True for ``collection``, its builds and their model records and centroids."""
        base = _base(name)
        build = re.escape(self.collection + BUILD_MARK) + r"\d+_[0-9a-f]+"
        return base == self.collection or re.fullmatch(build, base) is not None

    def _drop_collection(self, name: str) -> None:
        self._call("drop_collection", lambda c: c.drop_collection(name))

    @contextmanager
    def rebuild(self) -> Iterator[MilvusStore]:
        """A new, empty collection (``<collection>__build_<unix time>_<hex>``) to fill whole;
        on a normal exit the index switches to it atomically and the old collection (with its
        model record) is dropped, so a lookup sees the old index or the new one, never a part.

        On an exception the partial build is dropped and the old index stays served. Builds
        left by a killed run are dropped when the next rebuild starts. StoreError when another
        rebuild switched the index meanwhile (this build is then discarded).
        """
        self._set_aside_foreign()
        old = self._call("resolve", self._read_pointer)
        for name in self._call("list_collections", lambda c: c.list_collections()):
            if self._owns(name) and _base(name) != old:
                log.warning("dropping %r, left by an interrupted rebuild of %r", name, self.collection)
                self._drop_collection(name)
        build = self._sibling(f"{self.collection}{BUILD_MARK}{int(time.time())}_{secrets.token_hex(3)}")
        try:
            yield build
            self._switch(old, build._name)
        except BaseException:
            build._discard(self)
            raise
        finally:
            build.close()
        self._live, self._live_at, self._loaded = build._name, time.monotonic(), False
        try:
            sides = (old, f"{old}{MODEL_SUFFIX}", f"{old}{CENTROID_SUFFIX}")
            replaced = [n for n in sides if self._call("has_collection", partial(_has, n))]
            if replaced:
                time.sleep(SWITCH_GRACE_S)
            for name in replaced:
                self._drop_collection(name)
        except StoreError as exc:  # the switch is done; the next rebuild drops it
            log.warning("could not drop the replaced collection %r: %s", old, exc)

    def _sibling(self, name: str) -> MilvusStore:
        """A store on the same server for collection ``name`` exactly (no pointer)."""
        other = MilvusStore(
            "" if self._embedded_dir is not None else self.uri,
            name,
            self._token,
            timeout=self._timeout,
            index=self.index,
            embedded_dir=self._embedded_dir,
            idle_stop_seconds=self._idle_stop,
        )
        other._live, other._live_at = name, float("inf")
        return other

    def _discard(self, index: MilvusStore) -> None:
        """Drop this unfinished build of ``index`` unless the index already switched to it."""
        try:
            if index._call("resolve", index._read_pointer) == self._name:
                return
            for name in (self._name, self.model_collection, self.centroid_collection):
                if self._call("has_collection", lambda c, name=name: c.has_collection(name)):
                    self._drop_collection(name)
        except StoreError as exc:  # the next rebuild drops it
            log.warning("could not drop the unfinished build %r: %s", self._name, exc)

    def _switch(self, old: str, new: str) -> None:
        """Point the index at ``new`` in one row insert (readers take the newest row)."""
        try:
            self._write_pointer(self._connect(), old, new)
        except StoreError:
            raise
        except Exception as exc:
            raise StoreError(f"Milvus switch of {self.collection!r} to {new!r} failed: {_brief(exc)}") from None

    def _write_pointer(self, client: Any, old: str, new: str) -> None:
        from pymilvus import DataType

        now = self._read_pointer(client)
        if now != old:
            raise StoreError(
                f"another rebuild switched Milvus index {self.collection!r} to {now!r} meanwhile: "
                f"this build ({new!r}) is discarded; the index serves {now!r}"
            )
        pointer = self.pointer_collection
        if not client.has_collection(pointer):
            schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("gen", DataType.INT64, is_primary=True)
            schema.add_field("target", DataType.VARCHAR, max_length=255)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=2)  # Milvus requires one
            index = client.prepare_index_params()
            index.add_index("vector", index_type="FLAT", metric_type="L2")
            client.create_collection(pointer, schema=schema, index_params=index, consistency_level="Strong")
        client.load_collection(pointer)
        gen = time.time_ns()
        client.insert(pointer, [{"gen": gen, "target": new, "vector": [0.0, 1.0]}])
        client.flush(pointer)
        client.delete(pointer, filter=f"gen < {gen}")

    # --- reads ------------------------------------------------------------------------------

    def chunk_hashes(self) -> dict[str, tuple[str, str]]:
        if not self.exists():
            return {}
        self._ready()

        def scan(client: Any) -> dict[str, tuple[str, str]]:
            out: dict[str, tuple[str, str]] = {}
            it = client.query_iterator(
                self._name,
                batch_size=1000,
                filter='chunk_id != ""',
                output_fields=["chunk_id", "doc_id", "content_hash"],
            )
            while batch := it.next():
                for row in batch:
                    out[row["chunk_id"]] = (row["doc_id"], row["content_hash"])
            it.close()
            return out

        return self._call("query", scan)

    def fetch(self, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The stored rows of ``chunk_ids`` by primary key (absent ids are left out)."""
        if not chunk_ids or not self.exists():
            return {}
        self._ready()
        rows = self._call(
            "get",
            lambda c: c.get(self._name, ids=list(chunk_ids), output_fields=[*_OUTPUT, "content_hash", "vector"]),
        )
        return {
            r["chunk_id"]: StoredChunk(
                chunk_id=r["chunk_id"],
                doc_id=r["doc_id"],
                title=r["title"],
                breadcrumb=r["breadcrumb"],
                category=r["category"],
                text=r["text"],
                content_hash=r["content_hash"],
                vector=np.asarray(r["vector"], dtype=np.float32),
            )
            for r in rows
        }

    @property
    def centroid_collection(self) -> str:
        """The side collection of the serving collection holding one centroid per document."""
        return f"{self._name}{CENTROID_SUFFIX}"

    def document_centroids(self, doc_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Doc id -> stored centroid, one row per document (absent docs left out); MissingCentroidsError
        for a collection built before centroids were stored."""
        # Asked once per lookup: the existence round trips only until the collections are loaded.
        if not doc_ids or (not self._loaded and not self.exists()):
            return {}
        self._ready()
        if not self._centroids_ready():
            raise MissingCentroidsError(f"Milvus collection {self.collection!r}")
        keys = sorted({_centroid_key(d) for d in doc_ids})
        rows = self._call(
            "get", lambda c: c.get(self.centroid_collection, ids=keys, output_fields=["doc_id", "vector"])
        )
        return {r["doc_id"]: np.asarray(r["vector"], dtype=np.float32) for r in rows}

    def centroid_doc_ids(self) -> set[str]:
        """Doc ids with a stored centroid (empty without a collection or centroids)."""
        if not self.exists() or not self._centroids_ready():
            return set()

        def scan(client: Any) -> set[str]:
            out: set[str] = set()
            it = client.query_iterator(
                self.centroid_collection, batch_size=1000, filter='key != ""', output_fields=["doc_id"]
            )
            while batch := it.next():
                out.update(row["doc_id"] for row in batch)
            it.close()
            return out

        return self._call("query", scan)

    def put_centroids(self, centroids: Mapping[str, np.ndarray]) -> None:
        """Insert or replace document centroids (after ``ensure_schema``)."""
        rows = [
            {"key": _centroid_key(d), "doc_id": d, "vector": np.asarray(v, dtype=np.float32).tolist()}
            for d, v in centroids.items()
        ]
        if not rows:
            return
        self._ready()
        self._centroids_ready()
        for i in range(0, len(rows), UPSERT_ROWS):
            part = rows[i : i + UPSERT_ROWS]
            self._call("upsert", lambda c, part=part: c.upsert(self.centroid_collection, part))

    def delete_centroids(self, doc_ids: Sequence[str]) -> None:
        """Remove the centroids of ``doc_ids``."""
        if doc_ids and self.exists() and self._centroids_ready():
            keys = [_centroid_key(d) for d in doc_ids]
            self._call("delete", lambda c: c.delete(self.centroid_collection, ids=keys))

    def count(self) -> int:
        if not self.exists():
            return 0
        self._ready()
        rows = self._call("count", lambda c: c.query(self._name, filter="", output_fields=["count(*)"]))
        return int(rows[0]["count(*)"])

    def search(self, vector: np.ndarray, top_k: int, category: str | None = None) -> list[StoreHit]:
        """Top-k by COSINE similarity (raw score in [-1, 1]); ``category`` filters exactly."""
        q = check_query_vector(vector)
        self._ready()
        res = self._call(
            "search",
            lambda c: c.search(
                self._name,
                data=[q.tolist()],
                anns_field="vector",
                limit=top_k,
                filter=_category_filter(category),
                output_fields=_OUTPUT,
                search_params=self.index.search_params(top_k),
            ),
        )
        return [_hit(h, finite_score(h["distance"]), "dense") for h in res[0]]

    def search_lexical(
        self, terms: Sequence[str], vector: np.ndarray, top_k: int, category: str | None = None
    ) -> list[StoreHit]:
        """Top-k by BM25 over the lexical column; each hit's cosine to ``vector`` is computed
        from the stored vector so both channels share one similarity scale."""
        if not terms:
            return []
        vector = check_query_vector(vector)
        self._ready()
        res = self._call(
            "search",
            lambda c: c.search(
                self._name,
                data=[" ".join(terms)],
                anns_field="sparse",
                limit=top_k,
                filter=_category_filter(category),
                output_fields=[*_OUTPUT, "vector"],
                search_params={"metric_type": "BM25"},
            ),
        )
        hits = []
        for h in res[0]:
            cosine = float(np.dot(np.asarray(h["entity"]["vector"], dtype=np.float32), vector))
            hits.append(_hit(h, cosine, "lexical", lexical_score=abs(finite_score(h["distance"]))))
        return hits

    def close(self) -> None:
        self._drop_client()
        self._loaded, self._centroids_loaded = False, None

    # --- the model the collection was built with (a one-row side collection) -------------

    @property
    def model_collection(self) -> str:
        """The side collection holding the model record: collection properties cannot be
        altered on every engine (milvus-lite 2.5 answers UNIMPLEMENTED), a row can."""
        return f"{self._name}{MODEL_SUFFIX}"

    def recorded_model(self) -> ModelIdentity | None:
        """The embedding model recorded for the collection; None when the collection is missing
        or unrecorded (built before models were recorded). StoreError when unreachable."""
        if not self.exists() or not self._call("has_collection", lambda c: c.has_collection(self.model_collection)):
            return None
        rows = self._call(
            "query", lambda c: c.query(self.model_collection, filter='key == "model"', output_fields=["identity"])
        )
        if not rows:
            return None
        try:
            return ModelIdentity.from_dict(json.loads(rows[0]["identity"]))
        except (ValueError, KeyError, TypeError):
            log.warning("%r holds an unreadable model record: treating it as unrecorded", self.model_collection)
            return None

    def record_model(self, identity: ModelIdentity) -> None:
        """Record ``identity`` as the collection's model (one row of ``model_collection``)."""
        self._call("record model", self._record_model, json.dumps(identity.to_dict(), sort_keys=True))

    def _record_model(self, client: Any, value: str) -> None:
        from pymilvus import DataType

        if not client.has_collection(self.model_collection):
            schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=64)
            schema.add_field("identity", DataType.VARCHAR, max_length=4096)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=2)  # Milvus requires one
            index = client.prepare_index_params()
            index.add_index("vector", index_type="FLAT", metric_type="L2")
            client.create_collection(self.model_collection, schema=schema, index_params=index)
        client.load_collection(self.model_collection)
        client.upsert(self.model_collection, [{"key": "model", "identity": value, "vector": [0.0, 1.0]}])
        client.flush(self.model_collection)


def _base(name: str) -> str:
    """The collection a side collection belongs to (``name`` itself for a chunk collection)."""
    return name.removesuffix(MODEL_SUFFIX).removesuffix(CENTROID_SUFFIX)


def _has(name: str, client: Any) -> bool:
    return bool(client.has_collection(name))


def _centroid_key(doc_id: str) -> str:
    """The centroid row's primary key: 32 hex digits of ``doc_id``'s BLAKE2b hash."""
    return hashlib.blake2b(doc_id.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _category_filter(category: str | None) -> str:
    return f"category == {escape_filter_value(category)}" if category else ""


def _hit(h: dict[str, Any], cosine: float, channel: str, lexical_score: float | None = None) -> StoreHit:
    e = h["entity"]
    return StoreHit(
        chunk_id=e.get("chunk_id", h.get("chunk_id", h.get("id"))),
        doc_id=e["doc_id"],
        title=e["title"],
        breadcrumb=e["breadcrumb"],
        category=e["category"],
        text=e["text"],
        raw_score=finite_score(cosine),
        score_label=SCORE_LABEL,
        similarity=cosine_to_similarity(cosine),
        channel=channel,
        lexical_score=lexical_score,
    )


def _brief(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return redact_dsn(text)[:300]


def _set_aside_foreign_file(db: Path) -> None:
    try:
        milvus_server.check_format(db)
    except milvus_server.ForeignFormatError:
        target = db.with_name(f"{db.name}.foreign-{int(time.time())}")
        db.rename(target)
        log.warning("moved the foreign-format Milvus data %s aside to %s", db, target)
