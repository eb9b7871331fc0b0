"""The ``lookup_knowledge`` tool's name, description and JSON-schema function definition."""

from __future__ import annotations

from typing import Any

TOOL_NAME = "lookup_knowledge"
TOOL_DESCRIPTION = (
    "Look up evidence in the team's knowledge base (runbooks, how-tos, FAQs, policies). "
    "Call it with the user's question or the alert text. Answer from `contextPack.packedText`, "
    "cite `evidenceBlocks[].docId` (and breadcrumb), and check `relevanceLevel`: PRECISE or "
    "RELEVANT evidence can be relied on, WEAK means the knowledge base may not cover the "
    "question, NONE (`found=false`) means it probably has no answer: say you do not know. "
    "`confidence` (0-1, when given) is the estimated probability that the first evidence block "
    "answers the question; `semanticSupport=false` means only title/keyword "
    "matches were available. `status`: ok, degraded (the knowledge store failed: title/keyword "
    "matches only; or part of the search failed: evidence from what answered; `message` says "
    "which) or error (nothing could be looked up; `message` says why)."
)


def tool_definition() -> dict[str, Any]:
    """The JSON-schema function definition (OpenAI ``tools`` format; the inner ``function``
    object is the shape most other agent frameworks take)."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "The question or alert text to find evidence for."}
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }
