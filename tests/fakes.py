"""Fakes shared by the tests: an embedder without a model (deterministic hash vectors) and a wrapper
that counts the chunk passages a real embedder embeds, and a switchable TCP front for PostgreSQL
(a trace-store outage without touching the server); store wrappers that hold the first write
(two ingests at once) or fail a write mid-batch with ENOSPC (a full disk). Rows labelled
``title: `` (the document titles ingest embeds for the rerank) are counted apart from chunk passages."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from rag_core.embedding.base import ModelIdentity, check_vectors
from rag_core.ingest.title_similarity import TITLE_LABEL

POISON = "POISON"  # a text holding it gets a NaN vector from HashEmbedder


def title_rows(ids: Sequence[str] | None) -> int:
    """How many of a batch's row labels are document titles (``title: ...``)."""
    return sum(1 for label in ids or () if label.startswith(TITLE_LABEL))


class HashEmbedder:
    """The Embedder protocol without a model: a ``dimension``-d float32 unit vector per text, drawn from a
    generator seeded with the text's sha256, so a text always gets the same vector.

    A text holding ``POISON`` gets a NaN row: ``checked=True`` behaves like the real backends (the shared
    check raises ``BadVectorError`` for the batch), ``checked=False`` returns the row as is. ``calls``
    counts ``embed_passages`` calls, ``texts`` the chunk passages embedded, ``titles`` the title rows.
    """

    backend, model_id, max_tokens = "fake", "fake-hash", 512

    def __init__(self, dimension: int, fingerprint: str = "f" * 16, checked: bool = True) -> None:
        self.dimension, self.fingerprint, self.checked = dimension, fingerprint, checked
        self.texts, self.calls, self.titles = 0, 0, 0

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def identity(self) -> ModelIdentity:
        return ModelIdentity(self.backend, self.model_id, self.dimension, self.fingerprint)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_passages([text])[0]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_passages(texts)

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
        self.calls += 1
        titles = title_rows(ids)
        self.texts, self.titles = self.texts + len(texts) - titles, self.titles + titles
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
            v = np.random.default_rng(seed).normal(size=self.dimension).astype(np.float32)
            rows.append(np.full(self.dimension, np.nan, np.float32) if POISON in text else v / np.linalg.norm(v))
        out = np.stack(rows)
        labels = list(ids) if ids is not None else [f"text #{i}" for i in range(len(texts))]
        return check_vectors(out, labels, self.dimension) if self.checked else out


class CountingEmbedder:
    """Wraps an embedder (the real model) and counts in ``count`` the chunk passages it embeds."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.count = inner, 0

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
        self.count += len(texts) - title_rows(ids)
        return self.inner.embed_passages(texts, ids)


class SwitchableProxy:
    """A TCP front for a PostgreSQL unix socket that can be switched off (connection refused,
    open connections cut) and on again: a trace-store outage without touching the server."""

    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener: socket.socket | None = None
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        if self._listener is not None:
            shut_sockets(self._listener)  # wakes the thread blocked in accept(); close() alone leaves it listening
            self._listener.close()
            self._listener = None
        with self._lock:
            for pair in self._pairs:
                shut_sockets(*pair)
                for s in pair:
                    s.close()
            self._pairs.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX)
            try:
                server.connect(self.unix_path)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            shut_sockets(src, dst)


def shut_sockets(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


class HoldingStore:
    """A real store whose first write (upsert or delete) waits (up to ``timeout`` s) until
    ``release`` is set: the ingest that writes it is mid-apply while another one starts."""

    def __init__(self, inner: Any, timeout: float = 120.0) -> None:
        self.inner, self.timeout = inner, timeout
        self.name, self.score_label = inner.name, inner.score_label
        self.writing, self.release = threading.Event(), threading.Event()

    def _hold(self) -> None:
        self.writing.set()
        self.release.wait(self.timeout)

    def upsert(self, chunks: Any, vectors: np.ndarray) -> None:
        self._hold()
        self.inner.upsert(chunks, vectors)

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        self._hold()
        self.inner.delete_chunks(chunk_ids)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


class DiskFullAfter:
    """A real store whose upsert call number ``ok + 1`` writes the first half of its chunks and
    then raises OSError(ENOSPC), as a disk filling mid-batch does."""

    def __init__(self, inner: Any, ok: int) -> None:
        self.inner, self.ok = inner, ok
        self.name, self.score_label = inner.name, inner.score_label

    def upsert(self, chunks: Any, vectors: np.ndarray) -> None:
        if self.ok == 0:
            half = max(1, len(chunks) // 2)
            self.inner.upsert(chunks[:half], vectors[:half])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/milvus.db/segment")
        self.ok -= 1
        self.inner.upsert(chunks, vectors)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


#: Doc ids / categories with a character of every class a filter or a terminal treats specially:
#: line breaks (LF, CR LF), tab, ESC (a CSI sequence), BEL, DEL, C1 controls, quotes, backslashes
#: (also trailing), bidi and zero-width format characters, NBSP, the line separator, private use,
#: an astral format character, emoji, CJK, and the filter grammar's own brackets and operators.
HOSTILE_NAMES = [
    "plain.md",
    "new\nline.md",
    "crlf\r\nline.md",
    "tab\there.md",
    "esc\x1b[2J\x1b[31mred.md",
    "bell\x07.md",
    "del\x7f.md",
    "c1\x85\x9b.md",
    "quote\"d'.md",
    "back\\slash.md",
    "trailing\\",
    "bidi\u202eevil\u200b.md",
    "nbsp\u00a0ls\u2028.md",
    "pua\ue000.md",
    "tag\U000e0001.md",
    "emoji😀.md",
    "中文文档.md",
    'ops ] ) || doc_id != "" && [x, y] {p} %_.md',
]


def five_doc_store(dim: int) -> Any:
    """An ``InMemoryStore`` holding five one-chunk documents ``d0.md``..``d4.md`` (text
    ``redis memory text <i>``, ``HashEmbedder(dim)`` vectors) and their centroids, as an ingest
    leaves them."""
    from rag_core.ingest.centroids import centroid
    from rag_core.models import Chunk
    from rag_core.stores.memory import InMemoryStore

    store = InMemoryStore()
    store.ensure_schema(dim)
    emb = HashEmbedder(dim)
    chunks = [
        Chunk(
            chunk_id=f"c{i}",
            doc_id=f"d{i}.md",
            title=f"Doc {i}",
            breadcrumb=f"Doc {i}",
            category="ops",
            text=f"redis memory text {i}",
            start=0,
            end=1,
            ordinal=0,
            content_hash=f"h{i}",
        )
        for i in range(5)
    ]
    vectors = np.stack([emb.embed_query(c.text) for c in chunks])
    store.upsert(chunks, vectors)
    # One chunk per document: its centroid is its vector.
    store.put_centroids({c.doc_id: centroid(v[None, :]) for c, v in zip(chunks, vectors, strict=True)})
    return store
