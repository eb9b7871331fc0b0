"""Ingest while the agent serves: ``threads`` lookup threads here while another process runs `rag ingest`.

A scratch copy of the runbook corpus in its old state (some documents held back) is ingested and
served; the files switch to the new state (those added, one changed, one deleted) and `rag ingest`
runs. Checks (the integration test asserts them, the benchmark reports them): no lookup fails, the
ingest exits 0, every candidate is a chunk of the old or new index (same id and text), traces =
lookups, and after the ingest lookups see the new index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import chunk_dir, summarize
from rag_core.settings import RagSettings
from rag_core.traces.recorder import MemoryRecorder

RAG_CLI = "from rag_core.cli import main; main()"  # the `rag` console script, as a child: python -c RAG_CLI ARGS


@dataclass
class ServingRun:
    """Outcome of one ingest-while-serving run."""

    lookups: int = 0
    failures: list[str] = field(default_factory=list)
    foreign_hits: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    traces: int = 0
    ingest_returncode: int | None = None
    ingest_seconds: float = 0.0
    ingest_output: str = ""
    new_doc_found_after: bool = False
    lookups_during_ingest: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "lookups": self.lookups,
            "lookups_during_ingest": self.lookups_during_ingest,
            "failures": len(self.failures),
            "failure_examples": self.failures[:3],
            "hits_outside_old_and_new_index": len(self.foreign_hits),
            "latency_ms": summarize(self.latencies_ms),
            "traces": self.traces,
            "traces_equal_lookups": self.traces == self.lookups,
            "ingest_returncode": self.ingest_returncode,
            "ingest_s": round(self.ingest_seconds, 2),
            "new_index_visible_after_ingest": self.new_doc_found_after,
        }


def prepare_states(corpus: Path, work: Path, hold_every: int = 4) -> tuple[Path, Path, str]:
    """Copy ``corpus`` to ``work/kb`` (old state) and ``work/new`` (new state: every ``hold_every``-th
    document added, one changed, one deleted). Returns (kb, new, the doc id of one added document)."""
    kb, new = work / "kb", work / "new"
    shutil.copytree(corpus, new)
    docs = sorted(p for p in new.rglob("*.md") if p.name != "_index.md")
    changed, deleted = docs[1], docs[2]
    held = [d for i, d in enumerate(docs) if i % hold_every == 0 and d not in (changed, deleted)]
    shutil.copytree(new, kb)
    for doc in held:
        (kb / doc.relative_to(new)).unlink()
    note = "\n\n## Ingest-while-serving note\n\nA paragraph added by the benchmark.\n"
    changed.write_text(changed.read_text(encoding="utf-8") + note, encoding="utf-8")
    deleted.unlink()
    return kb, new, held[0].relative_to(new).as_posix()


def cli_while(
    args: list[str],
    env: dict[str, str],
    lookup: Callable[[str, int], object],
    queries: list[str],
    threads: int,
    running: threading.Event,
    timeout_s: float,
) -> tuple[str, int | None, float]:
    """Run `rag ARGS` in another process while ``threads`` threads call ``lookup(query, thread)`` on
    ``queries`` in turn (while ``running`` is set; cleared when the process ends). (output tail, exit code, s)."""

    def worker(n: int) -> None:
        i = 0
        while running.is_set():
            lookup(queries[(n + i * threads) % len(queries)], n)
            i += 1

    pool = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(threads)]
    t0 = time.perf_counter()
    cmd = [sys.executable, "-c", RAG_CLI, *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for t in pool:
        t.start()
    try:
        output = proc.communicate(timeout=timeout_s)[0][-2000:]
    except subprocess.TimeoutExpired:
        proc.kill()
        output = "timed out"
    seconds = time.perf_counter() - t0
    running.clear()
    for t in pool:
        t.join(60)
    return output, proc.returncode, seconds


def ingested_tool(settings: RagSettings, embedder: Any, recorder: Any, queries: list[str]) -> Any:
    """``latency.build_tool`` on ``settings``' Milvus store after ingesting its knowledge dir, warmed
    on the first 4 ``queries`` (model, L0, collection, trace store)."""
    from bench.latency import build_tool
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore

    store = MilvusStore.from_settings(settings)
    ingest(settings, embedder, [store], progress=False)  # ingest writes no traces
    return build_tool(settings, store, embedder, recorder, warm=queries[:4])


def run(
    settings: RagSettings,
    embedder: Any,
    queries: list[str],
    corpus: Path,
    work: Path,
    threads: int = 8,
    timeout_s: float = 600.0,
    after_lookups: int = 16,
) -> ServingRun:
    """One ingest-while-serving run in ``work`` (data dir ``settings.data_dir``); see the module doc."""
    kb, new, added = prepare_states(corpus, work)
    settings = settings.model_copy(update={"knowledge_dir": kb, "sidecar_enabled": False, "trace_enabled": True})
    # {chunk_id: text} of either state, as ingestion chunks it
    old_chunks, new_chunks = ({c.chunk_id: c.text for c in chunk_dir(root, settings)} for root in (kb, new))
    recorder = MemoryRecorder()
    tool = ingested_tool(settings, embedder, recorder, queries)
    recorder.rows.clear()

    # The switch to the new state: what a sync of the knowledge repository does on disk.
    shutil.rmtree(kb)
    shutil.copytree(new, kb)

    out, lock = ServingRun(), threading.Lock()
    ingesting = threading.Event()
    ingesting.set()

    def one(q: str, n: int | str) -> None:
        t0 = time.perf_counter()
        try:
            result, cands = tool.lookup_with_candidates(q, session_id=f"serve-{n}")
            errors = [a.error for a in result.retrieval_trace.attempts if a.error]
            problem = result.message if result.status != "ok" else (errors[0] if errors else None)
            foreign = [
                c.hit.chunk_id
                for c in cands
                if c.hit.text not in (old_chunks.get(c.hit.chunk_id), new_chunks.get(c.hit.chunk_id))
            ]
        except Exception as exc:  # lookup() never raises; count it anyway
            problem, foreign = f"{type(exc).__name__}: {exc}", []
        ms = (time.perf_counter() - t0) * 1000
        with lock:
            out.lookups += 1
            out.latencies_ms.append(ms)
            out.lookups_during_ingest += ingesting.is_set()
            if problem:
                out.failures.append(f"{q[:40]!r}: {problem}"[:300])
            out.foreign_hits.extend(foreign)

    cli = cli_while(["ingest", "--json"], rebuild_env(settings), one, queries, threads, ingesting, timeout_s)
    out.ingest_output, out.ingest_returncode, out.ingest_seconds = cli
    for i in range(after_lookups):
        one(queries[i % len(queries)], "after")
    result = tool.lookup(Path(added).stem)  # a held-back document, by its alert name: only in the new index
    out.lookups += 1
    out.new_doc_found_after = added in [b.doc_id for b in result.evidence_blocks]
    tool.close()
    out.traces = len(recorder.rows)
    return out


def rebuild_env(settings: RagSettings, pg_dsn: str | None = None) -> dict[str, str]:
    """Environment of a `rag` child process on the same data dir, corpus and model as ``settings``
    (and the pgvector sidecar at ``pg_dsn`` when given)."""
    env = dict(
        os.environ,
        RAG_DATA_DIR=str(settings.data_dir),
        RAG_KNOWLEDGE_DIR=str(settings.knowledge_dir),
        HF_HUB_OFFLINE="1",
        RAG_EMBEDDING_MODEL=settings.embedding_model,
        RAG_COLLECTION=settings.collection,
        RAG_PG_TABLE=settings.pg_table,
    )
    if pg_dsn:
        env |= {"RAG_PG_DSN": pg_dsn, "RAG_SIDECAR_ENABLED": "true"}
    return env
