"""Per-session memory of what lookups returned: bounded (LRU + TTL), thread-safe."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from cachetools import TTLCache


@dataclass
class SessionMemory:
    domains: list[str] = field(default_factory=list)
    doc_ids: set[str] = field(default_factory=set)


class SessionState:
    """``session_id -> SessionMemory``; at most ``max_sessions`` kept, each for ``ttl_seconds``
    after its last lookup (least recently used evicted first)."""

    def __init__(self, max_sessions: int = 10_000, ttl_seconds: float = 3600):
        self._cache: TTLCache[str, SessionMemory] = TTLCache(max_sessions, ttl_seconds)
        self._lock = threading.Lock()

    def seen_doc_ids(self, session_id: str | None) -> set[str]:
        """The doc ids of every evidence block the session's lookups returned so far."""
        if not session_id:
            return set()
        with self._lock:
            mem = self._cache.get(session_id)
            return set(mem.doc_ids) if mem else set()

    def update(self, session_id: str | None, domains: list[str], doc_ids: list[str]) -> list[str]:
        """Record a lookup's domains and evidence doc ids; returns the session's domains so far (in
        first-seen order). Without a session id, returns ``domains`` alone."""
        if not session_id:
            return sorted(set(domains))
        with self._lock:
            mem = self._cache.get(session_id) or SessionMemory()
            for d in domains:
                if d and d not in mem.domains:
                    mem.domains.append(d)
            mem.doc_ids.update(doc_ids)
            self._cache[session_id] = mem  # re-insert refreshes the TTL
            return list(mem.domains)

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)
