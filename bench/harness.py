"""The benchmarks' one measuring harness: :class:`Target` is one thing to time, :func:`measure`
times targets interleaved input by input (so all see the same machine load), :class:`Goal` is one
performance target of the report as data (:meth:`Goal.row` gives its row of the report)."""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, Literal, TypeVar

import numpy as np

H = TypeVar("H")  # an opened target: a client, a tool, an embedder (None when the query closes over it)
In = TypeVar("In")  # one input: a query vector, a query string, a batch matrix
R = TypeVar("R")  # what one call returns

Results = dict[str, Any]  # a benchmark run's results.json


@dataclass(frozen=True)
class Stats:
    """Summary of ``n`` measurements in their own unit (ms unless said otherwise): linear-interpolated
    p50/p95/p99, mean, min and max, rounded to ``digits``; all None when ``n == 0``."""

    n: int
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float], digits: int = 3) -> Stats:
        if len(values) == 0:
            return cls(0)
        a = np.asarray(values, dtype=float)
        figures = (*np.percentile(a, [50, 95, 99]), a.mean(), a.min(), a.max())  # in field order
        return cls(int(a.size), *(round(float(v), digits) for v in figures))

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)  # the results.json shape


@dataclass(frozen=True)
class Target(Generic[H, In, R]):
    """One measured thing: ``query(handle, input)`` is the timed call. Untimed: ``open()`` builds the
    handle (default None), ``after(handle, result)`` runs after each call (its value kept per call),
    ``close(handle)`` runs once when :func:`measure` ends."""

    name: str
    query: Callable[[H, In], R]
    open: Callable[[], H] = lambda: None  # type: ignore[assignment]
    close: Callable[[H], object] = lambda _handle: None
    after: Callable[[H, R], Any] | None = None


@dataclass
class Timing(Generic[R]):
    """One target's calls in input order: wall ``ms``, process ``cpu_s`` (all threads), ``results``,
    ``notes`` (``after``'s values); ``error``: why it stopped early (only with ``keep_going``)."""

    name: str
    ms: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    results: list[R] = field(default_factory=list)
    notes: list[Any] = field(default_factory=list)
    error: str | None = None

    @property
    def stats(self) -> Stats:
        return Stats.of(self.ms)

    @property
    def seconds(self) -> float:
        return sum(self.ms) / 1000


def _call(target: Target[Any, Any, Any], handle: Any, x: Any, into: Timing[Any] | None = None) -> None:
    """One call of ``target``, recorded ``into`` a timing (a warm-up call is not recorded)."""
    c0 = time.process_time()  # outside the wall-clock window
    t0 = time.perf_counter()
    result = target.query(handle, x)
    ms = (time.perf_counter() - t0) * 1000
    cpu_s = time.process_time() - c0
    note = target.after(handle, result) if target.after is not None else None
    if into is not None:
        into.ms.append(ms)
        into.cpu_s.append(cpu_s)
        into.results.append(result)
        into.notes.append(note)


def call_ms(fn: Callable[[In], Any], inputs: Sequence[In], warmup: Sequence[In] = ()) -> dict[str, Any]:
    """Latency (ms: p50, p95, ...) of ``fn`` called once per input, after the untimed ``warmup`` calls."""
    return measure([Target("call", lambda _h, x: fn(x))], inputs, warmup=warmup)["call"].stats.to_dict()


def error_text(exc: BaseException, limit: int = 500) -> str:
    """``"Type: message"`` of ``exc``, at most ``limit`` characters (a results entry's ``error``)."""
    return f"{type(exc).__name__}: {exc}"[:limit]


def ok(entry: Any) -> bool:
    """Whether a results entry is a dict without an ``error``."""
    return isinstance(entry, dict) and "error" not in entry


def measure(
    targets: Sequence[Target[Any, In, Any]],
    inputs: Sequence[In],
    *,
    warmup: Sequence[In] = (),
    keep_going: bool = False,
    tick: Callable[[], object] | None = None,
) -> dict[str, Timing[Any]]:
    """Time every target on every input, interleaved input by input (see the module doc).

    ``warmup`` inputs run through each target right after it opens, untimed. ``keep_going``: a
    target that raises (opening, warming up or timed) is dropped with its ``error`` recorded and
    the others go on; otherwise the exception propagates. Handles are closed in every case.
    ``tick`` is called after each timed call (a progress bar). Returns ``{target.name: Timing}``.
    """
    timings: dict[str, Timing[Any]] = {t.name: Timing(t.name) for t in targets}
    live: list[tuple[Target[Any, In, Any], Any]] = []
    with ExitStack() as stack:
        for t in targets:
            try:
                handle = t.open()
                stack.callback(t.close, handle)
                for x in warmup:
                    _call(t, handle, x)
            except Exception as exc:  # one target failing must not lose the others' numbers
                if not keep_going:
                    raise
                timings[t.name].error = error_text(exc)
                continue
            live.append((t, handle))
        for x in inputs:
            for t, handle in list(live):
                try:
                    _call(t, handle, x, timings[t.name])
                except Exception as exc:
                    if not keep_going:
                        raise
                    timings[t.name].error = error_text(exc)
                    live.remove((t, handle))
                    continue
                if tick is not None:
                    tick()
    return timings


@dataclass(frozen=True)
class Reading:
    """What a goal read from the results: the compared ``value`` (None: no figure), the side-by-side
    figures as text, and ``also``: further conditions of the goal (e.g. recall) that must hold."""

    measured: str
    value: float | None
    also: bool = True


@dataclass(frozen=True)
class Missing:
    """The goal could not be read: ``note`` says why; ``met`` None = not run, False = ran and failed."""

    note: str = "not run"
    met: bool | None = None


def as_times(v: float) -> str:
    """``v`` as a ratio, ``1.23x``."""
    return f"{v:.2f}x"


def as_percent(v: float) -> str:
    """``v`` (a fraction) as a percentage, ``12.3 %``."""
    return f"{100 * v:.1f} %"


@dataclass(frozen=True)
class Goal:
    """One performance target of the report: ``read`` turns the results section at the key path
    ``source`` (missing or failed: "not run" with its error) into a :class:`Reading` or a
    :class:`Missing`; met when ``value op limit_value`` and ``also`` hold. ``show`` formats the value;
    ``borderline``: a value near the limit is flagged; the row appears only when ``when`` is present."""

    id: str
    target: str
    limit: str
    op: Literal["<=", ">="]
    limit_value: float
    source: tuple[str, ...]
    read: Callable[[dict[str, Any]], Reading | Missing]
    show: Callable[[float], str]
    borderline: bool = True
    when: tuple[str, ...] = ()

    def row(self, results: Results) -> dict[str, Any]:
        """The report's row: ``id, target, limit, measured, ratio, met`` (+ ``value``, ``limit_value``)."""
        row: dict[str, Any] = {"id": self.id, "target": self.target, "limit": self.limit}
        data = section(results, *self.source)
        got = Missing(data.get("error", "not run")) if not data or "error" in data else self.read(data)
        if isinstance(got, Missing):
            return row | {"measured": got.note, "ratio": "–", "met": got.met}
        compare = operator.le if self.op == "<=" else operator.ge
        met = got.value is not None and compare(got.value, self.limit_value) and got.also
        shown = "–" if got.value is None else self.show(got.value)
        row |= {"value": got.value, "measured": got.measured, "met": met, "ratio": shown}
        return row | ({"limit_value": self.limit_value} if self.borderline else {})


def section(results: Results, *path: str) -> dict[str, Any]:
    """``results[path[0]][path[1]]...``, ``{}`` where a level is missing or not a dict."""
    node: Any = results
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}
