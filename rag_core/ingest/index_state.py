"""The index state: what the last ingest left in each vector store, written by ingest.

``rag ingest`` (and each Dagster store asset) ends by writing ``<data_dir>/index_state.json``:
per store the row count, the embedding model, a deterministic sample of chunk ids with their
content hashes, and the documents it holds (count and digest of the sorted doc ids), plus the
documents the run skipped (they may be in a store and not in the L0 index, or the reverse).
``rag_core.health`` reads it back to verify the stores.

``<data_dir>/apply_pending.json`` is the write-ahead record of an apply: a store is entered
before an ingest first writes into its served index and removed once the index state is written.
A store still listed when the next ingest starts (under the index lock, so its writer is gone)
was left part-written by a fault (full disk, store error, kill): that ingest rewrites it whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from rag_core.embedding.base import ModelIdentity
from rag_core.fileio import write_text_atomic
from rag_core.models import Chunk
from rag_core.settings import RagSettings
from rag_core.stores.base import VectorStore

log = logging.getLogger(__name__)

STATE_FILE = "index_state.json"
PENDING_FILE = "apply_pending.json"
SAMPLE_SIZE = 64  # chunks whose stored rows are verified


def state_path(settings: RagSettings) -> Path:
    """Where the index state of ``settings.data_dir`` lives."""
    return settings.data_dir / STATE_FILE


@dataclass
class StoreState:
    """What the last ingest left in one store."""

    rows: int
    model: dict[str, Any] | None
    sample: dict[str, str]  # chunk_id -> content_hash
    documents: int | None = None  # None: written before documents were recorded
    documents_digest: str = ""
    skipped: list[str] = field(default_factory=list)  # doc ids the last ingest skipped (failures)


def documents_digest(doc_ids: Iterable[str]) -> str:
    """sha256 of the sorted distinct doc ids: equal digests, same document set."""
    h = hashlib.sha256()
    for doc_id in sorted(set(doc_ids)):
        h.update(doc_id.encode("utf-8", "surrogateescape") + b"\x1e")
    return h.hexdigest()


def sample_chunks(chunks: Sequence[Chunk], size: int = SAMPLE_SIZE) -> dict[str, str]:
    """A deterministic, evenly spread sample ``{chunk_id: content_hash}`` of ``chunks``."""
    ordered = sorted(chunks, key=lambda c: c.chunk_id)
    step = max(1, len(ordered) // size)
    return {c.chunk_id: c.content_hash for c in ordered[::step][:size]}


def write_index_state(
    settings: RagSettings,
    stores: Sequence[VectorStore],
    chunks: Sequence[Chunk],
    identity: ModelIdentity,
    rejected: frozenset[str] = frozenset(),
    skipped: Iterable[str] = (),
) -> None:
    """Record each of ``stores``' row count, model, a sample of ``chunks`` (those written, i.e.
    not in ``rejected``) and the documents it holds (read back from the store: under the index
    lock that is what this ingest left) after an ingest, with the doc ids it ``skipped``; other
    stores' entries are kept, so the Dagster assets that write one store each leave the same state
    as ``rag ingest``. Written atomically under a file lock; a failure to write is logged, not
    raised (the ingest itself succeeded)."""
    sample = sample_chunks([c for c in chunks if c.chunk_id not in rejected])
    fresh = {}
    for s in stores:
        docs = {doc_id for doc_id, _ in s.chunk_hashes().values()}
        state = StoreState(s.count(), identity.to_dict(), sample, len(docs), documents_digest(docs), sorted(skipped))
        fresh[s.name] = asdict(state)
    path = state_path(settings)
    try:
        with FileLock(f"{path}.lock", timeout=60):
            kept = _stored_entries(path)
            data = {"version": 1, "stores": {**kept, **fresh}}
            write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    except (OSError, Timeout) as exc:
        why = getattr(exc, "strerror", None) or exc
        log.warning("could not write the index state %s (%s): `rag doctor` cannot verify this index", path, why)


def _stored_entries(path: Path) -> dict[str, Any]:
    """The ``stores`` mapping of an existing state file; ``{}`` when missing or unreadable."""
    try:
        stores = json.loads(path.read_text())["stores"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return stores if isinstance(stores, dict) else {}


def read_index_state(settings: RagSettings) -> tuple[dict[str, StoreState] | None, str | None]:
    """``({store name: StoreState}, None)``, or ``(None, why)`` when missing or unreadable."""
    path = state_path(settings)
    try:
        raw = json.loads(path.read_text())
        return {name: StoreState(**value) for name, value in raw["stores"].items()}, None
    except FileNotFoundError:
        return None, f"no index state at {path}: run `rag ingest`"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"index state {path} is unreadable ({exc}): run `rag ingest`"


def describe_pending(entry: Any) -> str:
    """``pid N, started <UTC time>, command <cmd>`` of a writer record (``{pid, started, command}``);
    ``an unknown writer`` when it is not one."""
    try:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(entry["started"])))
        return f"pid {entry['pid']}, started {started}, command {entry['command']}"
    except (ValueError, KeyError, TypeError, OverflowError):
        return "an unknown writer"


def _pending_path(settings: RagSettings) -> Path:
    return settings.data_dir / PENDING_FILE


def pending_applies(settings: RagSettings) -> dict[str, dict[str, Any]]:
    """``{store name: {pid, started, command}}`` of applies that began and did not end; ``{}``
    when none (or the record is unreadable: a torn record is never written, it is replaced)."""
    try:
        raw = json.loads(_pending_path(settings).read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def mark_apply_started(settings: RagSettings, store: str, command: str) -> None:
    """Record, before the first write into ``store``'s served index, that an apply is under way.
    Raises OSError when it cannot be recorded (e.g. a full disk): then nothing is written."""
    entries = {**pending_applies(settings), store: {"pid": os.getpid(), "started": time.time(), "command": command}}
    write_text_atomic(_pending_path(settings), json.dumps(entries, sort_keys=True))


def mark_apply_done(settings: RagSettings, stores: Iterable[str]) -> None:
    """Remove ``stores`` from the pending record once their apply and index state are written. A
    failure to remove is logged: the next ingest then rewrites those stores whole (no harm)."""
    entries = pending_applies(settings)
    left = {k: v for k, v in entries.items() if k not in set(stores)}
    if left == entries:
        return
    try:
        if left:
            write_text_atomic(_pending_path(settings), json.dumps(left, sort_keys=True))
        else:
            _pending_path(settings).unlink(missing_ok=True)
    except OSError as exc:
        log.warning("could not clear %s (%s): the next ingest rewrites %s whole", PENDING_FILE, exc, sorted(stores))


def part_written(settings: RagSettings, pid: int | None = None) -> list[str]:
    """The stores an apply of process ``pid`` (default this one) left part-written: it failed
    after writing into their served index. Empty: that process changed no served index."""
    pid = os.getpid() if pid is None else pid
    return sorted(name for name, entry in pending_applies(settings).items() if entry.get("pid") == pid)
