"""A rebuild under a live lookup loop (issue 26 item 7), for ``test_ingest_while_serving`` and the
``faults`` tests (row 8): lookups loop on the stores while another process runs
``rag ingest --rebuild`` of the same corpus; every lookup must find what it found before. The
other process is started by ``bench.serving.cli_while`` (the ingest-while-serving benchmark's)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.serving import cli_while, rebuild_env
from rag_core.settings import RagSettings


@dataclass
class RebuildRun:
    """Outcome of one rebuild-while-serving run: ``bad`` lists the lookups that were degraded
    (status not ok, or an attempt error) or lacked the document they found before the rebuild."""

    store: str
    lookups: int = 0
    bad: list[str] = field(default_factory=list)
    lookups_during_rebuild: int = 0
    rows_before: int = 0
    rows_after: int = 0
    lost_chunk_ids: int = 0
    rebuild_returncode: int | None = None
    rebuild_seconds: float = 0.0
    rebuild_output: str = ""

    def summary(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "lookups": self.lookups,
            "lookups_during_rebuild": self.lookups_during_rebuild,
            "bad": len(self.bad),
            "bad_examples": self.bad[:3],
            "rows_before": self.rows_before,
            "rows_after": self.rows_after,
            "chunk_ids_lost": self.lost_chunk_ids,
            "rebuild_returncode": self.rebuild_returncode,
            "rebuild_s": round(self.rebuild_seconds, 2),
        }


def expected_docs(tool: Any, queries: list[str]) -> dict[str, tuple[str, str | None]]:
    """Query -> (the top evidence block's doc id, the sidecar's top doc id or None) now;
    queries without an answer are left out."""
    out = {}
    for q in queries:
        result = tool.lookup(q)
        sidecar = result.retrieval_trace.sidecar
        if result.evidence_blocks:
            top = sidecar.top_doc_ids[0] if sidecar is not None and sidecar.top_doc_ids else None
            out[q] = (result.evidence_blocks[0].doc_id, top)
    return out


def bad_answer(result: Any, want: tuple[str, str | None]) -> str | None:
    """Why ``result`` is not a whole answer holding the documents of ``want`` (None when it is)."""
    errors = [a.error for a in result.retrieval_trace.attempts if a.error]
    if result.status != "ok" or errors:
        return f"degraded: {result.message if result.status != 'ok' else errors[0]}"
    if result.retrieval_trace.layer == "L0":
        return "degraded: L0 fallback"
    if want[0] not in [b.doc_id for b in result.evidence_blocks]:
        return f"missing {want[0]}"
    sidecar = result.retrieval_trace.sidecar
    if want[1] is not None and (sidecar is None or want[1] not in sidecar.top_doc_ids):
        why = sidecar.reason or sidecar.status if sidecar is not None else "no sidecar status"
        return f"sidecar missing {want[1]} ({why})"
    return None


def run_rebuild(
    settings: RagSettings,
    embedder: Any,
    queries: list[str],
    stores: Sequence[Any],
    *,
    pg_dsn: str | None = None,
    threads: int = 1,
    timeout_s: float = 600.0,
) -> RebuildRun:
    """Loop lookups on ``stores`` (main store, optional sidecar; already filled from
    ``settings.knowledge_dir``) in ``threads`` threads while another process runs
    ``rag ingest --rebuild`` of the same corpus (with the pgvector sidecar at ``pg_dsn`` when
    given); every lookup must find what it found before. The tool closes ``stores`` at the end."""
    from rag_core.lookup.tool import LookupKnowledgeTool

    settings = settings.model_copy(update={"sidecar_enabled": len(stores) > 1, "trace_enabled": False})
    sidecar = stores[1] if len(stores) > 1 else None
    tool = LookupKnowledgeTool(settings, embedder=embedder, store=stores[0], sidecar=sidecar)
    want = expected_docs(tool, queries)
    before = [set(s.chunk_hashes()) for s in stores]
    out = RebuildRun(store="+".join(s.name for s in stores), rows_before=sum(map(len, before)))
    lock, rebuilding = threading.Lock(), threading.Event()
    rebuilding.set()

    def one(q: str, n: int) -> None:
        try:
            problem = bad_answer(tool.lookup(q, session_id=f"rebuild-{n}"), want[q])
        except Exception as exc:  # lookup() never raises; count it anyway
            problem = f"raised {type(exc).__name__}: {exc}"
        with lock:
            out.lookups += 1
            out.lookups_during_rebuild += rebuilding.is_set()
            if problem:
                out.bad.append(f"{q[:40]!r}: {problem}"[:300])

    args = ["ingest", "--rebuild", "--json", *(["--sidecar"] if pg_dsn else [])]
    cli = cli_while(args, rebuild_env(settings, pg_dsn), one, list(want), threads, rebuilding, timeout_s)
    out.rebuild_output, out.rebuild_returncode, out.rebuild_seconds = cli
    after = [set(s.chunk_hashes()) for s in stores]
    out.rows_after = sum(map(len, after))
    out.lost_chunk_ids = sum(len(b - a) for b, a in zip(before, after, strict=True))
    tool.close()  # closes ``stores`` too
    return out
