"""Dagster code location of the knowledge-retrieval project (``rag_assets.definitions``).

rag_core stays free of Dagster: everything Dagster-specific lives here.
"""
