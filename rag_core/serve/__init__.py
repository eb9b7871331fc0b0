"""`rag serve`: the ``lookup_knowledge`` tool for agents that do not import Python.

One process serves one ``LookupKnowledgeTool`` over the Model Context Protocol (the official
``mcp`` SDK; stdio, and streamable HTTP at ``/mcp``) and a plain HTTP/JSON endpoint
(``POST /v1/lookup``, ``GET /healthz``, ``GET /readyz``; OpenAPI at ``/openapi.json``). The
transports are thin: they validate the arguments (``service.LookupService``) and hand them to
the tool, whose ``LookupResult`` JSON they return unchanged and whose trace row names the
transport. Needs the ``serve`` extra (``mcp``, ``fastapi``, ``uvicorn``).
"""
