"""Recording fixtures: run the real lookup pipeline per golden case on one store.

This module runs the stores and the model (it is the only evaluation module that does); the
evaluator itself reads the JSON it writes and nothing else.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tqdm.auto import tqdm

from rag_core.compare import candidate_row
from rag_core.evaluation.cases import load_cases
from rag_core.evaluation.fixtures import FixtureManifest, write_fixture, write_manifest
from rag_core.fileio import portable_path
from rag_core.settings import PROJECT_ROOT, RagSettings

if TYPE_CHECKING:
    from rag_core.embedding.base import Embedder
    from rag_core.lookup.contracts import LookupResult
    from rag_core.lookup.retriever import Candidate
    from rag_core.lookup.tool import LookupKnowledgeTool

StoreName = Literal["milvus", "pgvector"]
STORE_NAMES: tuple[StoreName, ...] = ("milvus", "pgvector")


def corpus_hash(root: Path) -> str:
    """sha256 over the sorted (relative path, bytes) of every Markdown file under ``root``."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix.lower() in (".md", ".markdown") and p.is_file() and not p.is_symlink():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def make_tool_for_store(
    settings: RagSettings, store: StoreName, embedder: Embedder | None = None
) -> LookupKnowledgeTool:
    """A LookupKnowledgeTool whose L1 store is ``store`` (no sidecar beside it).

    Raises StoreError (or what the store raises) when that store cannot be opened.
    """
    from rag_core.components import make_main_store, make_sidecar_store
    from rag_core.lookup.tool import LookupKnowledgeTool

    opened = make_main_store(settings) if store == "milvus" else make_sidecar_store(settings)
    quiet = settings.model_copy(update={"sidecar_enabled": False})
    return LookupKnowledgeTool(quiet, store=opened, embedder=embedder)


def record_fixtures(
    settings: RagSettings,
    store: StoreName,
    cases_file: Path,
    out_dir: Path,
    embedder: Embedder | None = None,
    progress: bool = True,
) -> FixtureManifest:
    """Write ``<out_dir>/<case_id>.json`` for every case and ``manifest.json``.

    When the store cannot be opened, only a manifest with ``store_status.status="unavailable"``
    and the reason is written (the evaluator then reports every case not_run). Returns the
    manifest written (its ``session`` and ``embedding_backend`` are extra fields).
    """
    cases = load_cases(cases_file)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.json"):
        old.unlink()
    manifest: dict[str, Any] = {
        "store": store,
        "corpus_hash": corpus_hash(Path(settings.knowledge_dir)),
        "model_id": settings.embedding_model or None,
        "embedding_backend": settings.embedding_backend,
        "index_params": {
            "milvus_index": settings.milvus_index,
            "metric": "COSINE",
            "top_k": settings.top_k,
            "pg_index": "hnsw(vector_cosine_ops)",
            "lexical": "bm25",
        },
        "git_commit": git_commit(),
        "recorded_at": datetime.now(UTC).isoformat(),
        "cases_file": portable_path(cases_file),
        "case_count": len(cases),
        "store_status": {"status": "available", "reason": None},
    }
    try:
        tool = make_tool_for_store(settings, store, embedder)
        tool.store.ensure_schema(tool.embedder.dimension)
        manifest["model"] = tool.embedder.identity().to_dict()
        manifest["model_id"] = tool.embedder.model_id
        manifest["ensemble_model_id"] = tool.ensemble.embedder.model_id if tool.ensemble is not None else None
        if tool.store.count() == 0:
            raise RuntimeError(f"the {store} index is empty: run `rag ingest` first")
    except Exception as exc:
        manifest["store_status"] = {"status": "unavailable", "reason": f"{type(exc).__name__}: {exc}"[:500]}
        return write_manifest(out_dir, manifest)
    session = f"eval-{store}-{datetime.now(UTC):%Y%m%d}"
    try:
        for case in tqdm(cases, desc=f"recording {store}", unit="case", disable=not progress):
            started = time.perf_counter()
            result, candidates = tool.lookup_with_candidates(case.query, session_id=session, transport="evaluation")
            latency_ms = round((time.perf_counter() - started) * 1000, 2)
            write_fixture(
                out_dir,
                {
                    "case_id": case.id,
                    "store": store,
                    "query": case.query,
                    "status": result.status,
                    "error": result.retrieval_trace.error,
                    "retrieval_layer": result.retrieval_trace.layer,
                    "candidates": _candidate_rows(candidates),
                    "evidence_blocks": _block_rows(result),
                    "context_pack_doc_ids": result.context_pack.included_doc_ids,
                    "filter_probe": _filter_probe(tool, case.query, f"{session}-nofilter", result, candidates),
                    "relevance_level": result.relevance_level.value,
                    "confidence": result.confidence,
                    "found": result.found,
                    "latency_ms": latency_ms,
                },
            )
    finally:
        tool.close()
    manifest["session"] = session
    return write_manifest(out_dir, manifest)


def _candidate_rows(candidates: list[Candidate]) -> list[dict[str, Any]]:
    return [candidate_row(i, c).model_dump() for i, c in enumerate(candidates, start=1)]


def _block_rows(result: LookupResult) -> list[dict[str, Any]]:
    return [{**b.model_dump(by_alias=False), "content_preview": b.content[:300]} for b in result.evidence_blocks]


def _filter_probe(
    tool: LookupKnowledgeTool, query: str, session: str, result: LookupResult, candidates: list[Candidate]
) -> dict[str, Any] | None:
    """The same lookup with the L0 category filter disabled, when the lookup used a filter
    (see ``rag_core.evaluation.filter_cost``); None when no filter was used."""
    filtered = {a.attempt: a.filter for a in result.retrieval_trace.attempts if a.filter}
    if not filtered:
        return None
    probe, probe_candidates = tool.lookup_with_candidates(
        query, session_id=session, use_l0_filter=False, transport="evaluation"
    )
    return {
        "category_filter": next(iter(filtered.values())),
        "filtered_docs": list(dict.fromkeys(c.hit.doc_id for c in candidates if c.attempts & filtered.keys())),
        "unfiltered_candidates": _candidate_rows(probe_candidates),
        "unfiltered_evidence_blocks": _block_rows(probe),
    }
