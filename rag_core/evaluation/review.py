"""Review of mined candidate cases: a person's decision per case becomes a production golden case.

Decisions: ``accept`` with the doc id(s) that answer the query (checked against the index),
``unanswerable`` (the knowledge base has no document for it) or ``reject``. Accepted and
unanswerable cases are written to the production suite file (``golden/production.yaml``, a
suite of ``golden/suites.yaml``) with their provenance; every decision is appended to the
decision log (JSONL beside it: who, when, why). A candidate with a logged decision is not
offered again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field

from rag_core.evaluation.cases import GoldenCase, load_cases
from rag_core.evaluation.mining import CandidateCase
from rag_core.fileio import write_text_atomic
from rag_core.settings import PROJECT_ROOT

__all__ = [
    "DEFAULT_DECISION_LOG",
    "DEFAULT_SUITE_FILE",
    "Decision",
    "ReviewError",
    "decide",
    "decided_ids",
    "pending",
    "record_decision",
]

DEFAULT_SUITE_FILE = PROJECT_ROOT / "golden" / "production.yaml"
DEFAULT_DECISION_LOG = PROJECT_ROOT / "golden" / "production-decisions.jsonl"

Verdict = Literal["accept", "unanswerable", "reject"]


class ReviewError(ValueError):
    """A decision that cannot be taken (message: the case id and the field or doc id at fault)."""


class Decision(BaseModel):
    """One review decision, as the decision log keeps it (one JSON object per line)."""

    case_id: str
    decision: Verdict
    doc_ids: list[str] = Field(default_factory=list)
    reviewer: str
    reason: str = ""
    decided_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    query: str
    trace_ids: list[str] = Field(default_factory=list)


def decided_ids(log_path: Path) -> set[str]:
    """Ids of the candidates the log at ``log_path`` has a decision for (none when it is absent).
    Raises ReviewError naming the file and line of a line that is not a decision."""
    if not log_path.exists():
        return set()
    ids = set()
    for number, line in enumerate(log_path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                ids.add(Decision.model_validate_json(line).case_id)
            except ValueError:
                raise ReviewError(f"{log_path}:{number}: not a review decision") from None
    return ids


def pending(candidates: Sequence[CandidateCase], log_path: Path) -> list[CandidateCase]:
    """``candidates`` without a decision in the log, in their order."""
    done = decided_ids(log_path)
    return [c for c in candidates if c.id not in done]


def decide(
    candidate: CandidateCase,
    verdict: Verdict,
    *,
    doc_ids: Sequence[str] = (),
    known_doc_ids: Collection[str],
    reviewer: str,
    reason: str = "",
) -> Decision:
    """The decision ``verdict`` on ``candidate``. ``accept`` needs ``doc_ids``, each in
    ``known_doc_ids`` (the doc ids of the index); the others take none. Raises ReviewError."""
    docs = list(dict.fromkeys(d.strip() for d in doc_ids if d.strip()))
    if verdict == "accept":
        if not docs:
            raise ReviewError(f"{candidate.id}: accept needs --doc (the doc id(s) that answer the query)")
        unknown = [d for d in docs if d not in known_doc_ids]
        if unknown:
            raise ReviewError(f"{candidate.id}: --doc {', '.join(unknown)} is not in the index (doc ids are paths)")
    elif docs:
        raise ReviewError(f"{candidate.id}: --doc is only for accept, not {verdict}")
    return Decision(
        case_id=candidate.id,
        decision=verdict,
        doc_ids=docs,
        reviewer=reviewer,
        reason=reason,
        query=candidate.query,
        trace_ids=candidate.provenance.trace_ids,
    )


def record_decision(
    decision: Decision,
    candidate: CandidateCase,
    suite_path: Path = DEFAULT_SUITE_FILE,
    log_path: Path = DEFAULT_DECISION_LOG,
) -> None:
    """Append ``decision`` to the log and, for ``accept`` / ``unanswerable``, put the case in the
    suite file (a case with the same id is replaced). Raises ReviewError when the suite file is
    not a case file (``CaseFileError``'s message) and OSError when a file cannot be written."""
    if decision.decision != "reject":
        cases = _suite_cases(suite_path)
        cases[candidate.id] = _golden(decision, candidate)
        GoldenCase.model_validate(cases[candidate.id])  # the suite never gets a case it cannot load
        text = yaml.safe_dump({"cases": list(cases.values())}, sort_keys=False, allow_unicode=True, width=120)
        write_text_atomic(suite_path, _SUITE_HEADER + text)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(decision.model_dump_json() + "\n")


_SUITE_HEADER = (
    "# Production suite: cases mined from agents' lookups and decided with `rag eval review`\n"
    "# (decision log: production-decisions.jsonl). Written by the review; edit with care.\n"
)


def _suite_cases(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    try:
        load_cases(path)  # validates the file, naming it and the case at fault
    except ValueError as exc:
        raise ReviewError(str(exc)) from None
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {str(c["id"]): c for c in (raw["cases"] if isinstance(raw, dict) else raw)}


def _golden(decision: Decision, candidate: CandidateCase) -> dict[str, Any]:
    case: dict[str, Any] = {"id": candidate.id, "scenario": candidate.scenario, "query": candidate.query}
    if decision.decision == "unanswerable":
        case["unanswerable"] = True
    else:
        case["expected_docs"] = decision.doc_ids
    case["provenance"] = {
        **candidate.provenance.model_dump(mode="json"),
        "tool_answer": candidate.tool_answer.model_dump(mode="json"),
        "reviewed_by": decision.reviewer,
        "reviewed_at": decision.decided_at.isoformat(timespec="seconds"),
        "reason": decision.reason,
    }
    return case
