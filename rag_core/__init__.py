"""rag_core: knowledge retrieval for agents (the ``lookup_knowledge`` tool).

Heavy dependencies (torch, pymilvus, psycopg) load only when a component is first used.
"""

from typing import Any

from rag_core.settings import RagSettings

__all__ = ["RagSettings", "LookupKnowledgeTool", "LookupResult", "tool_definition"]


def __getattr__(name: str) -> Any:  # lazy: importing rag_core must stay cheap (e.g. for the evaluator)
    if name in ("LookupKnowledgeTool", "tool_definition"):
        from rag_core.lookup import tool

        return getattr(tool, name)
    if name == "LookupResult":
        from rag_core.lookup.contracts import LookupResult

        return LookupResult
    raise AttributeError(name)
