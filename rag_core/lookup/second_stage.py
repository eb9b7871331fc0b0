"""SecondStageRerank: the optional second-stage reranker's stage (``RAG_RERANKER``, off by default).

After the post-processor, the top ``RAG_RERANKER_TOP_N`` evidence blocks (title and content)
are scored by a :class:`rag_core.lookup.rerankers.Reranker` and reordered by that score (ties:
first-stage order); blocks past the top N keep their first-stage order behind them, and the
result keeps ``max_evidence_blocks`` (a document the query names by its whole name keeps its
place, as in the first stage: :func:`rag_core.lookup.postprocessor.keep_named`). The first-stage
scores stay on the blocks and in ``rerankTrace``; the second-stage scores go into the trace row
(``RetrievalDetails.second_stage``) and the blocks get the hit reason ``second_stage_rerank``.

One call has ``RAG_RERANKER_TIMEOUT_S`` in all (waiting for a free slot included); at most
``SLOTS`` calls run at once and a lookup finding them all busy skips the stage. A reranker that
fails, times out or is skipped leaves the first-stage order, and the trace says why.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Literal

from pydantic import BaseModel, Field

from rag_core.l0 import L0Hints
from rag_core.lookup.contracts import EvidenceBlock, RerankEntry
from rag_core.lookup.postprocessor import keep_named
from rag_core.lookup.rerankers import Reranker
from rag_core.secrets import scrub_secrets
from rag_core.settings import RagSettings

SLOTS = 2
HIT_REASON = "second_stage_rerank"
Status = Literal["reranked", "failed", "timeout", "skipped"]


class SecondStageOutcome(BaseModel):
    """What the second stage did in one lookup: ``status`` ``reranked``, ``failed`` (the
    reranker raised), ``timeout`` (no answer within ``timeout_s``) or ``skipped`` (every slot
    busy); ``reason`` says why when not reranked (secrets scrubbed). ``top_n``: blocks sent;
    ``scores``: doc id -> the reranker's score (reranked only); ``duration_ms`` in ms."""

    reranker: str
    status: Status
    reason: str | None = None
    top_n: int
    timeout_s: float
    duration_ms: float
    scores: dict[str, float] = Field(default_factory=dict)


class SecondStageRerank:
    """``apply(query, blocks, rerank, hints) -> (blocks, rerank, outcome)``; ``outcome`` None
    when the stage is off (``reranker`` None) or there was nothing to rerank. Thread-safe."""

    def __init__(self, reranker: Reranker | None, settings: RagSettings) -> None:
        self.reranker = reranker
        self.top_n = settings.reranker_top_n
        self.timeout_s = settings.reranker_timeout_s
        self.max_blocks = settings.max_evidence_blocks
        self._pool: ThreadPoolExecutor | None = None
        self._slots = threading.BoundedSemaphore(SLOTS)
        self._lock = threading.Lock()

    @property
    def first_stage_blocks(self) -> int:
        """How many blocks the post-processor should keep: ``max_evidence_blocks``, or the top N
        when that is larger and the stage is on."""
        return self.max_blocks if self.reranker is None else max(self.max_blocks, self.top_n)

    def apply(
        self, query: str, blocks: list[EvidenceBlock], rerank: list[RerankEntry], hints: L0Hints
    ) -> tuple[list[EvidenceBlock], list[RerankEntry], SecondStageOutcome | None]:
        """``blocks`` and their aligned ``rerank`` entries (the post-processor's, best first),
        reordered by the reranker and cut to ``max_evidence_blocks`` (module docstring)."""
        if self.reranker is None or not blocks:
            return blocks[: self.max_blocks], rerank[: self.max_blocks], None
        head = blocks[: self.top_n]
        t0 = time.perf_counter()
        scores, status, reason = self._scores(query, [f"{b.title}\n{b.content}" for b in head])
        ms = round((time.perf_counter() - t0) * 1000, 2)
        name = self.reranker.name
        if scores is None:
            failed = SecondStageOutcome(
                reranker=name, status=status, reason=reason, top_n=len(head), timeout_s=self.timeout_s, duration_ms=ms
            )
            return blocks[: self.max_blocks], rerank[: self.max_blocks], failed
        order = sorted(range(len(head)), key=lambda i: (-scores[i], i)) + list(range(len(head), len(blocks)))
        named = {m.doc_id for m in hints.matches if m.strong_name}
        kept = keep_named(order, named, self.max_blocks, key=lambda i: blocks[i].doc_id)
        new_blocks, new_rerank = [], []
        for after, i in enumerate(kept, start=1):
            reasons = blocks[i].hit_reasons + ([HIT_REASON] if i < len(head) else [])
            new_blocks.append(blocks[i].model_copy(update={"rank": after, "hit_reasons": reasons}))
            new_rerank.append(rerank[i].model_copy(update={"rank_after": after}))
        by_doc = {head[i].doc_id: round(scores[i], 4) for i in range(len(head))}
        done = SecondStageOutcome(
            reranker=name, status="reranked", top_n=len(head), timeout_s=self.timeout_s, duration_ms=ms, scores=by_doc
        )
        return new_blocks, new_rerank, done

    def _scores(self, query: str, texts: list[str]) -> tuple[list[float] | None, Status, str | None]:
        """(scores, status, reason): the reranker's scores, or None and why not."""
        assert self.reranker is not None
        if not self._slots.acquire(blocking=False):
            return None, "skipped", f"{SLOTS} rerank calls already in flight"
        try:
            future = self._executor().submit(self.reranker.rerank, query, texts)
        except RuntimeError as exc:  # pool shut down (tool closed)
            self._slots.release()
            return None, "failed", str(exc)[:300]
        future.add_done_callback(lambda _f: self._slots.release())
        try:
            return future.result(timeout=self.timeout_s), "reranked", None
        except FutureTimeout:
            return None, "timeout", f"no answer within {self.timeout_s} s (RAG_RERANKER_TIMEOUT_S)"
        except Exception as exc:
            return None, "failed", scrub_secrets(f"{type(exc).__name__}: {exc}")[:300]

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=SLOTS, thread_name_prefix="reranker")
            return self._pool

    def close(self) -> None:
        """Abandon calls still running (not waited for); close the reranker's client."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.reranker, "close", None)
        if close is not None:
            close()
