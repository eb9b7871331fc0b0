"""The index state: what the last ingest left in each vector store, written by ingest.

``rag ingest`` (and each Dagster store asset) ends by writing ``<data_dir>/index_state.json``:
per store the row count, the embedding model and a deterministic sample of chunk ids with their
content hashes. ``rag_core.health`` reads it back to verify the stores.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
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
) -> None:
    """Record each of ``stores``' row count, model and a sample of ``chunks`` (those written, i.e.
    not in ``rejected``) after an ingest; other stores' entries are kept, so the Dagster assets
    that write one store each leave the same state as ``rag ingest``. Written atomically under a
    file lock; a failure to write is logged, not raised (the ingest itself succeeded)."""
    sample = sample_chunks([c for c in chunks if c.chunk_id not in rejected])
    fresh = {s.name: asdict(StoreState(rows=s.count(), model=identity.to_dict(), sample=sample)) for s in stores}
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
