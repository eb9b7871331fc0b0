"""The one tool every transport shares: argument checks, the call, readiness and draining.

No transport library is imported here (the MCP and HTTP modules are thin layers over it).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio.to_thread

from rag_core.lookup.definition import tool_definition

if TYPE_CHECKING:
    from rag_core.health import HealthReport
    from rag_core.lookup.contracts import LookupResult
    from rag_core.lookup.tool import LookupKnowledgeTool

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest accepted ``sessionId`` (characters); the trace column holds it whole.
MAX_SESSION_ID_CHARS: Final = 200
ARGUMENTS: Final = ("query", "sessionId")
#: Longest a served answer waits for its trace row to reach the trace store or the spool
#: (seconds): a process killed after answering then loses no row. Past it (a trace store that
#: hangs on connect) the answer goes out anyway; the row is still queued.
TRACE_ACK_TIMEOUT_S: Final = 2.0
#: Longest a call waits for the background warm-up (model, L0 index, stores) before it answers
#: the structured "still starting" error (seconds; the cold start measured 3.7 s quiet, 8-14 s
#: under load, issue 45).
READY_WAIT_S: Final = 60.0
#: What no UTF-8 text can carry (lone surrogates, from a JSON escape such as "\ud800" or raw
#: bytes) or a C string ends at (NUL: the embedding engine reads up to it).
UNCARRIABLE: Final = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT_NOTE: Final = (
    "; characters the query could not carry (lone surrogates, NUL, undecodable bytes) were read as U+FFFD"
)


def carriable(text: str) -> str:
    """``text`` with every lone surrogate and NUL replaced by U+FFFD: the one rule every door of
    `rag serve` applies to client text at admission, so answers and trace rows always encode."""
    return UNCARRIABLE.sub("\ufffd", text)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost`` (a bind no other machine reaches)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def served_input_schema() -> dict[str, Any]:
    """The JSON schema of the served tool's arguments: ``tool_definition()``'s parameters
    (``query``) plus an optional ``sessionId`` (services without an MCP session pass their
    conversation id; an MCP client's session is used when it passes none)."""
    schema: dict[str, Any] = dict(tool_definition()["function"]["parameters"])
    properties = dict(schema["properties"])
    properties["sessionId"] = {
        # Nullable: a strict-schema client (every property required) then passes null, not an
        # invented id that would mix conversations.
        "type": ["string", "null"],
        "maxLength": MAX_SESSION_ID_CHARS,
        "description": "Conversation id: retrievedDomainsThisSession and seen-earlier marks accumulate per id.",
    }
    schema["properties"] = properties
    return schema


@dataclass(frozen=True)
class CallArguments:
    """Checked arguments of one call: ``query`` (non-empty, within the limit) and the session."""

    query: str
    session_id: str | None


@dataclass(frozen=True)
class Rejection:
    """Arguments refused before any lookup: ``error`` is one line naming the argument;
    ``query`` / ``session_id`` what can be echoed back (the query cut to the limit)."""

    error: str
    query: str
    session_id: str | None


def check_arguments(arguments: object, max_query_chars: int) -> CallArguments | Rejection:
    """``arguments`` (the MCP tool-call arguments or the HTTP body: ``{"query": ..., "sessionId": ...}``)
    checked: a missing, non-string, blank or longer-than-``max_query_chars`` query, a bad
    ``sessionId`` or an unknown argument gives a Rejection naming the argument. Both strings
    are ``carriable`` (lone surrogates and NUL read as U+FFFD)."""
    if not isinstance(arguments, Mapping):
        return Rejection(f"arguments: expected an object with 'query' (got {type(arguments).__name__})", "", None)
    session = arguments.get("sessionId")
    session_id = carriable(session) if isinstance(session, str) and len(session) <= MAX_SESSION_ID_CHARS else None
    raw = arguments.get("query")
    raw = carriable(raw) if isinstance(raw, str) else raw
    echo = raw[:max_query_chars] if isinstance(raw, str) else ("" if raw is None else f"<{type(raw).__name__}>")

    def reject(error: str) -> Rejection:
        return Rejection(error, echo, session_id)

    unknown = sorted(str(k) for k in arguments if k not in ARGUMENTS)
    if unknown:
        return reject(f"{unknown[0]}: unknown argument (expected {', '.join(ARGUMENTS)})")
    if session is not None and session_id is None:
        return reject(f"sessionId: must be a string of at most {MAX_SESSION_ID_CHARS} characters")
    if raw is None:
        return reject("query: required (the question or alert text to find evidence for)")
    if not isinstance(raw, str):
        return reject(f"query: must be a string (got {type(raw).__name__})")
    if not raw.strip():
        return reject("query: empty; ask with a question or alert text")
    if len(raw) > max_query_chars:
        return reject(f"query: {len(raw)} characters, at most {max_query_chars} (RAG_SERVE_MAX_QUERY_CHARS)")
    return CallArguments(raw, session_id)


IN_FLIGHT_PER_CORE = 8


class Overloaded(Exception):
    """A call refused because ``limit`` lookups are already in flight (``RAG_SERVE_MAX_IN_FLIGHT``);
    the caller should retry after ``retry_after_s`` seconds. Nothing was looked up or traced."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(
            f"overloaded: {limit} lookups already in flight (RAG_SERVE_MAX_IN_FLIGHT); retry after {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


def in_flight_limit(configured: int) -> int:
    """``RAG_SERVE_MAX_IN_FLIGHT``, 0 meaning ``IN_FLIGHT_PER_CORE`` per CPU core. It bounds the
    queue, not the parallelism (the embedder's gate runs one encode per core): a normal lookup
    takes 50-100 ms of model time, so 8 queued per core wait under about a second, while one per
    core refused the third of four concurrent agents on 2 cores."""
    return configured or IN_FLIGHT_PER_CORE * (os.cpu_count() or 1)


class LookupService:
    """``LookupService(tool)``: the served tool. ``await call(arguments, transport)`` returns the
    tool's ``LookupResult`` (raises only :class:`Overloaded`); ``start()`` loads the model and stores (``ready``
    until then False); ``drain(timeout)`` waits for in-flight calls; ``close()`` closes the tool
    (its recorder flushes the trace queue, spooling what the store cannot take). At most
    ``max_in_flight`` calls run or queue at once: one more raises :class:`Overloaded`."""

    def __init__(self, tool: LookupKnowledgeTool) -> None:
        self.tool = tool
        self.settings = tool.settings
        self.ready = False
        self.started_at: float | None = None
        self.max_in_flight = in_flight_limit(self.settings.serve_max_in_flight)
        self._inflight = 0
        self._idle = threading.Condition()
        self._warmed: threading.Event | None = None

    def start(self) -> HealthReport:
        """Warm the tool up (model, L0 index, stores; ``LookupKnowledgeTool.warm_up``) and mark
        the service ready. Never raises; the health report says what is wrong."""
        report = self.tool.warm_up()
        self.ready, self.started_at = True, time.time()
        log.info("lookup_knowledge ready: %s", report.summary() or "no stores checked")
        return report

    def start_in_background(self) -> None:
        """``start()`` in a daemon thread, so a transport answers at once (MCP ``initialize``,
        ``/healthz``); until it is done every call waits for it, at most ``READY_WAIT_S``."""
        warmed = self._warmed = threading.Event()

        def warm_up() -> None:
            try:
                self.start()
            finally:
                warmed.set()

        threading.Thread(target=warm_up, name="rag-serve-warm-up", daemon=True).start()

    async def _warm(self) -> bool:
        """Wait for a background warm-up under way (at most ``READY_WAIT_S``); False past it."""
        warmed = self._warmed
        if warmed is None or warmed.is_set():
            return True
        return await anyio.to_thread.run_sync(warmed.wait, READY_WAIT_S)

    async def call(self, arguments: object, transport: str, default_session: str | None = None) -> LookupResult:
        """Check ``arguments`` and run the lookup in a worker thread (``anyio.to_thread``; N
        concurrent calls share the one tool, which is thread-safe). ``default_session`` is
        the transport's session (the MCP connection) when the caller passes no ``sessionId``.
        A rejection is the tool's structured error result, recorded like a lookup."""
        return await self.call_rendered(arguments, transport, _same, default_session)

    async def call_rendered(
        self,
        arguments: object,
        transport: str,
        render: Callable[[LookupResult], T],
        default_session: str | None = None,
    ) -> T:
        """``call``, returning ``render(result)`` instead: the transport's encoding of the
        ``LookupResult`` (JSON bytes, the MCP tool result), made in the worker thread while the
        trace row is being written, so it costs the answer no time of its own and the event
        loop none. An exception of ``render`` propagates (the transport's 500). A query holding
        U+FFFD (``carriable``) gets ``REPLACEMENT_NOTE`` appended to its result's message. Raises
        Overloaded, before any work, when ``max_in_flight`` calls are already in flight."""
        checked = check_arguments(arguments, self.settings.serve_max_query_chars)
        self._enter()
        try:
            if not await self._warm():
                error = f"service: still loading the model and stores after {READY_WAIT_S:.0f} s; call again shortly"
                checked = Rejection(error, checked.query, checked.session_id)
            elif isinstance(checked, CallArguments) and "\ufffd" in checked.query:
                render = _noted(render)
            if isinstance(checked, Rejection):
                session = checked.session_id or default_session
                run = functools.partial(self.tool.rejected, checked.query, session, checked.error, transport=transport)
            else:
                session = checked.session_id or default_session
                run = functools.partial(self.tool.lookup, checked.query, session, transport=transport)
            # Not abandoned on cancellation: a client that disconnects mid-call still gets its
            # trace row written (the tool records it in this thread).
            return await anyio.to_thread.run_sync(self._traced, run, render)
        finally:
            self._leave()

    def _traced(self, run: Callable[[], LookupResult], render: Callable[[LookupResult], T]) -> T:
        """``run()`` (the lookup, which queues its trace row) and ``render`` its result, then
        wait until the recorder has put that row in the trace store or the spool (at most
        ``TRACE_ACK_TIMEOUT_S``): an answer is only sent once its row survives a SIGKILL of
        this process. Rendering first overlaps it with the writer thread's insert."""
        result = run()
        rendered = render(result)
        recorder = self.tool.recorder
        if recorder is not None and not recorder.flush(TRACE_ACK_TIMEOUT_S, reconnect=False):
            log.debug("trace row not yet durable after %.1f s; answering anyway", TRACE_ACK_TIMEOUT_S)
        return rendered

    def readiness(self) -> dict[str, Any]:
        """Readiness for ``GET /readyz``: ``ready`` (loaded and the main store passed its
        check), the main store's and the sidecar's verdicts and the trace store's state
        (``up``, ``down`` = rows are spooled for replay, ``disabled``)."""
        tool = self.tool
        health = tool.health
        main, recorder = "milvus", None
        if self.ready:  # the components exist once started (never built by a probe)
            try:
                main, recorder = getattr(tool.store, "name", "milvus"), tool.recorder
            except Exception as exc:
                log.debug("component unavailable: %s", exc)
        main_problems = health.problems_of(main) if health is not None else []
        state_problem = health.state_problem if health is not None else None
        if tool.settings.sidecar_enabled:
            breaker = tool.sidecar_breaker
            sidecar = f"down: {breaker.last_error}" if breaker.is_open else "up"
            if health is not None and health.problems_of("pgvector"):
                sidecar = "problem: " + "; ".join(health.problems_of("pgvector"))
        elif health is not None and any(s.store == "pgvector" for s in health.stores):
            # Written by the last ingest, not queried: its verdict all the same (issue 46).
            problems = health.problems_of("pgvector")
            verdict = "problem: " + "; ".join(problems) if problems else "up"
            sidecar = f"not queried (RAG_SIDECAR_ENABLED=false); {verdict}"
        else:
            sidecar = "disabled"
        if not tool.settings.trace_enabled:
            traces = "disabled"
        elif recorder is None or not getattr(recorder, "breaker", None):
            traces = "up" if recorder is not None else "not started"
        else:
            traces = "down: rows spooled for replay" if recorder.breaker.is_open else "up"
        main_state = "not checked" if health is None else ("up" if not main_problems else "; ".join(main_problems))
        return {
            "ready": self.ready and health is not None and not main_problems,
            "loaded": self.ready,
            "mainStore": main_state,
            "indexState": state_problem or "ok",
            "sidecar": sidecar,
            "traceStore": traces,
            "inFlight": self._inflight,
        }

    def _enter(self) -> None:
        with self._idle:
            if self._inflight >= self.max_in_flight:
                raise Overloaded(self.max_in_flight, self.settings.serve_retry_after_s)
            self._inflight += 1

    def _leave(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    @property
    def in_flight(self) -> int:
        """Calls running now."""
        return self._inflight

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no call is running; True when none is."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)

    def close(self) -> None:
        """Drain (``serve_shutdown_grace_s``), then close the tool: the recorder flushes its
        queue to the trace store or the spool. Never raises."""
        if not self.drain(self.settings.serve_shutdown_grace_s):
            log.warning("shutting down with %d lookups still running", self._inflight)
        try:
            self.tool.close()
        except Exception:
            log.warning("closing the tool failed", exc_info=True)


def _same(result: LookupResult) -> LookupResult:
    return result


def _noted(render: Callable[[LookupResult], T]) -> Callable[[LookupResult], T]:
    def noted(result: LookupResult) -> T:
        return render(result.model_copy(update={"message": result.message + REPLACEMENT_NOTE}))

    return noted
