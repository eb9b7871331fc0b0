"""Builders for small hand-made fixture sets (tests, demos, Dagster asset tests).

They produce the same files the recorder writes, through ``write_fixture`` /
``write_manifest``, so a test exercises the real reader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rag_core.evaluation.fixtures import (
    CaseFixture,
    FixtureManifest,
    StoreStatus,
    write_fixture,
    write_manifest,
)

__all__ = ["SCORE_LABELS", "make_fixture", "make_manifest", "write_fixture_dir"]

#: What each store's raw score means (DESIGN.md "Scores").
SCORE_LABELS = {
    "milvus": "milvus_cosine_similarity[-1,1]",
    "pgvector": "pgvector_cosine_distance[0,2]",
}


def _raw(store: str, similarity: float) -> float:
    # pgvector reports a cosine distance; Milvus the similarity itself.
    return round(1.0 - similarity, 4) if store == "pgvector" else similarity


def _entry(store: str, rank: int, doc_id: str | None, breadcrumb: str) -> dict[str, Any]:
    similarity = round(max(0.9 - 0.05 * (rank - 1), 0.05), 4)
    category = doc_id.split("/", 1)[0] if doc_id and "/" in doc_id else ""
    return {
        "rank": rank,
        "doc_id": doc_id,
        "chunk_id": f"{doc_id}#0" if doc_id else None,
        "title": Path(doc_id).stem if doc_id else "",
        "breadcrumb": breadcrumb,
        "category": category,
        "raw_score": _raw(store, similarity),
        "score_label": SCORE_LABELS.get(store, f"{store}_score"),
        "similarity": similarity,
    }


def make_fixture(
    case_id: str,
    docs: Sequence[str | None],
    *,
    store: str = "milvus",
    content: str | Mapping[str, str] = "",
    breadcrumbs: Mapping[str, str] | None = None,
    extra_candidates: Sequence[str | None] = (),
    packed: Sequence[str] | None = None,
    status: str = "ok",
    error: str | None = None,
) -> CaseFixture:
    """A fixture whose evidence blocks are ``docs`` in order (rank 1 first).

    Candidates are the same docs followed by ``extra_candidates`` (docs that did not become
    evidence blocks). ``content`` is one text for every block or a doc -> text mapping;
    breadcrumbs default to ``"<doc stem> > Meaning"``; ``packed`` (the doc ids the context
    pack kept) defaults to every evidence doc. Scores fall by 0.05 per rank from 0.9.
    """
    breadcrumbs = breadcrumbs or {}

    def crumb(doc: str | None) -> str:
        return breadcrumbs.get(doc or "", f"{Path(doc).stem} > Meaning" if doc else "")

    def text(doc: str | None) -> str:
        return content if isinstance(content, str) else content.get(doc or "", "")

    blocks = [
        {
            **_entry(store, rank, doc, crumb(doc)),
            "content": text(doc),
            "content_preview": text(doc)[:300],
            "hit_reasons": ["vector_similarity"],
            "retrieval_layer": "L1",
        }
        for rank, doc in enumerate(docs, start=1)
    ]
    candidates = [
        {**_entry(store, rank, doc, crumb(doc)), "content_preview": text(doc)[:300]}
        for rank, doc in enumerate([*docs, *extra_candidates], start=1)
    ]
    return CaseFixture.model_validate(
        {
            "case_id": case_id,
            "store": store,
            "query": f"query of {case_id}",
            "status": status,
            "error": error,
            "retrieval_layer": "L1" if docs else "none",
            "candidates": candidates,
            "evidence_blocks": blocks,
            "context_pack_doc_ids": [d for d in docs if d] if packed is None else list(packed),
        }
    )


def make_manifest(
    store: str = "milvus", *, available: bool = True, reason: str | None = None, case_count: int = 0
) -> FixtureManifest:
    """A manifest for ``store``; ``available=False`` marks the store unavailable with ``reason``."""
    return FixtureManifest(
        store=store,
        corpus_hash="sha256:" + "ab" * 32,
        model_id="all-MiniLM-L6-v2",
        index_params={"metric": "COSINE"},
        git_commit="abc1234",
        recorded_at="2026-11-29T02:00:00Z",
        cases_file="golden/cases.yaml",
        case_count=case_count,
        store_status=StoreStatus(
            status="available" if available else "unavailable",
            reason=None if available else (reason or "not reachable"),
        ),
    )


def write_fixture_dir(
    directory: str | Path,
    fixtures: Iterable[CaseFixture],
    manifest: FixtureManifest | None = None,
) -> Path:
    """Write a manifest (default: available, store taken from the fixtures) and the fixtures."""
    directory = Path(directory)
    fixtures = list(fixtures)
    if manifest is None:
        store = fixtures[0].store if fixtures else "milvus"
        manifest = make_manifest(store, case_count=len(fixtures))
    write_manifest(directory, manifest)
    for fixture in fixtures:
        write_fixture(directory, fixture)
    return directory
