"""Candidate golden cases mined from a day of production lookups.

Weak, re-asked and store-disagreeing lookups (``rag_core.evaluation.signals``; a retry adds weight)
are grouped by their normalised, scrubbed query text, ranked by how often and how badly they
occurred, and written in the golden case shape (without ``expected_docs``: a person decides
those in ``rag eval review``) with their provenance and what the tool answered. Every text is scrubbed
with ``rag_core.secrets.scrub_pasted`` before it is kept, so no file written from a candidate
holds a secret an agent pasted.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from rag_core.evaluation.signals import FlaggedLookup, normalise_query
from rag_core.fileio import write_text_atomic
from rag_core.secrets import scrub_pasted
from rag_core.traces.rows import PRODUCTION_ORIGINS

__all__ = ["MINED_SIGNALS", "CandidateCase", "load_candidates", "mine_candidates", "write_candidates"]

#: The signals that make a lookup a candidate, with how badly each says the lookup went (the
#: rank weight): no support claimed is worst, an agent asking again next, a retry or a store
#: disagreement are hints. A retry alone mines nothing: attempt 2 usually rescues the lookup
#: (on the simulated day of tests/test_production_loop.py 4 of 4 retried-only lookups ended
#: PRECISE); it only adds to the weight of a lookup that is also weak, re-asked or disputed.
MINED_SIGNALS: dict[str, float] = {"weak": 3.0, "reasked": 2.0, "retried": 1.0, "disagreement": 1.0}
_PRIMARY = frozenset({"weak", "reasked", "disagreement"})
_HINT_FIELDS = ("matched_doc_ids", "matched_titles", "alert_names", "metric_names", "domains")


class ToolAnswer(BaseModel):
    """What the tool answered the last time: ``top_doc_ids`` (best first), ``relevance``
    (``relevanceLevel``) and the L0 hints (``_HINT_FIELDS``, non-empty ones)."""

    top_doc_ids: list[str] = Field(default_factory=list)
    relevance: str | None = None
    l0_hints: dict[str, list[str]] = Field(default_factory=dict)


class Provenance(BaseModel):
    """Where a candidate came from: the trace row ids, the UTC days, how many lookups and
    sessions, the origins and the signals raised."""

    trace_ids: list[str]
    dates: list[str]
    count: int
    sessions: int
    origins: list[str]
    signals: list[str]


class CandidateCase(BaseModel):
    """A mined case: the golden case fields a person does not have to choose (``id``,
    ``scenario``, ``query``), ``score`` (sum over its lookups of their ``MINED_SIGNALS``
    weights), ``provenance`` and ``tool_answer``."""

    id: str
    scenario: str
    query: str
    score: float
    provenance: Provenance
    tool_answer: ToolAnswer


def mine_candidates(flagged: Sequence[FlaggedLookup], scrub_ips: bool = False) -> list[CandidateCase]:
    """The candidate cases of ``flagged`` (production origins only), best first (score, then
    count, then query). Lookups whose scrubbed queries normalise alike are one candidate; its
    ``query`` and ``tool_answer`` are those of its latest lookup. ``scrub_ips`` masks IPv4
    addresses too (``RAG_TRACE_SCRUB_IPS``)."""
    groups: dict[str, list[tuple[FlaggedLookup, str]]] = defaultdict(list)
    for f in flagged:
        if not f.flags & _PRIMARY or f.origin not in PRODUCTION_ORIGINS or not (f.row.input or "").strip():
            continue
        query = scrub_pasted(f.row.input or "", ips=scrub_ips).strip()
        groups[normalise_query(query)].append((f, query))
    cases = [_candidate(key, members, scrub_ips) for key, members in groups.items()]
    return sorted(cases, key=lambda c: (-c.score, -c.provenance.count, c.query))


def _candidate(key: str, members: list[tuple[FlaggedLookup, str]], scrub_ips: bool) -> CandidateCase:
    members.sort(key=lambda m: m[0].row.created_at)
    latest, query = members[-1]
    hints = latest.details.l0_hints.model_dump(by_alias=False)
    flags = sorted({s for f, _ in members for s in f.flags & MINED_SIGNALS.keys()})
    return CandidateCase(
        id="prod-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:10],
        scenario="aiops_alert" if latest.details.l0_hints.alert_names else "chat",
        query=query,
        score=sum(MINED_SIGNALS[s] for f, _ in members for s in f.flags & MINED_SIGNALS.keys()),
        provenance=Provenance(
            trace_ids=[f.row.id for f, _ in members],
            dates=sorted({f.row.created_at.date().isoformat() for f, _ in members}),
            count=len(members),
            sessions=len({f.row.session_id for f, _ in members}),
            origins=sorted({f.origin for f, _ in members}),
            signals=flags,
        ),
        tool_answer=ToolAnswer(
            top_doc_ids=latest.top_doc_ids[:5],
            relevance=latest.details.relevance_level.value if latest.details.relevance_level else None,
            l0_hints={k: [scrub_pasted(str(v), ips=scrub_ips) for v in hints[k]] for k in _HINT_FIELDS if hints[k]},
        ),
    )


def write_candidates(path: Path, candidates: Sequence[CandidateCase]) -> Path:
    """Write ``candidates`` as YAML (a top-level ``candidates:`` list) atomically; returns ``path``."""
    data = {"candidates": [c.model_dump(mode="json") for c in candidates]}
    return write_text_atomic(path, yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120))


def load_candidates(paths: Sequence[Path]) -> list[CandidateCase]:
    """The candidates of the files ``paths`` (``write_candidates``' YAML), merged by id: counts,
    scores, trace ids and dates add up over days; the latest file's query and answer win.
    Raises ValueError naming the file for one that is not such YAML."""
    merged: dict[str, CandidateCase] = {}
    for path in sorted(paths):
        try:
            raw: Any = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            cases = [CandidateCase.model_validate(c) for c in raw.get("candidates") or []]
        except (OSError, yaml.YAMLError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path}: not a candidate file ({str(exc).splitlines()[0]})") from None
        for case in cases:
            before = merged.get(case.id)
            merged[case.id] = case if before is None else _merge(before, case)
    return sorted(merged.values(), key=lambda c: (-c.score, -c.provenance.count, c.query))


def _merge(before: CandidateCase, after: CandidateCase) -> CandidateCase:
    a, b = before.provenance, after.provenance
    provenance = Provenance(
        trace_ids=list(dict.fromkeys(a.trace_ids + b.trace_ids)),
        dates=sorted(set(a.dates + b.dates)),
        count=a.count + b.count,
        sessions=a.sessions + b.sessions,
        origins=sorted(set(a.origins + b.origins)),
        signals=sorted(set(a.signals + b.signals)),
    )
    return after.model_copy(update={"score": before.score + after.score, "provenance": provenance})
