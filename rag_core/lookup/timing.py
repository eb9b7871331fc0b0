"""Stage timing of one lookup: :class:`StageTimings` holds the wall milliseconds of each stage (the
trace's ``RetrievalDetails.stage_ms``); ``with timed(timings, "search_ms"): ...`` adds the block's
time (rounded to 3 decimals) to that stage, also when the block raises."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

Stage = Literal[
    "l0_ms", "embed_ms", "search_ms", "documents_ms", "ensemble_ms", "postprocess_ms", "second_stage_ms", "pack_ms"
]


class StageTimings(BaseModel):
    """Wall milliseconds per lookup stage, in pipeline order: ``l0_ms`` (query transform and L0),
    ``embed_ms`` (query embedding), ``search_ms`` (L1 retrieval: attempts, store calls, fusion),
    ``documents_ms`` (document similarity), ``ensemble_ms`` (the rerank's second model),
    ``postprocess_ms`` (post-processing and rerank), ``second_stage_ms`` (the optional second-stage
    reranker), ``pack_ms`` (context packing). None for a stage that did not run; the JSON leaves
    those out, so it is the ``{stage: ms}`` object of the stages that ran."""

    model_config = ConfigDict(extra="ignore")

    l0_ms: float | None = None
    embed_ms: float | None = None
    search_ms: float | None = None
    documents_ms: float | None = None
    ensemble_ms: float | None = None
    postprocess_ms: float | None = None
    second_stage_ms: float | None = None
    pack_ms: float | None = None

    @model_serializer(mode="wrap")
    def _stages_that_ran(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}

    def add(self, stage: Stage, ms: float) -> None:
        """Add ``ms`` to ``stage`` (rounded to 3 decimals)."""
        setattr(self, stage, round((getattr(self, stage) or 0.0) + ms, 3))


@contextmanager
def timed(timings: StageTimings, stage: Stage) -> Iterator[None]:
    """Add the ``with`` block's duration in ms to ``timings``' ``stage``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings.add(stage, (time.perf_counter() - t0) * 1000)
