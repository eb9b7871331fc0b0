"""Stage timing of one lookup: ``with timed(timings, "search_ms"): ...`` adds the block's wall
time in milliseconds (rounded to 3 decimals) to ``timings["search_ms"]`` (the trace's
``RetrievalDetails.stage_ms``), also when the block raises."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
    """Add the ``with`` block's duration in ms to ``timings[key]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[key] = round(timings.get(key, 0.0) + (time.perf_counter() - t0) * 1000, 3)
