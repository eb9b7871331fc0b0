"""Recording fixtures: the online stack (stores, model, ``LookupKnowledgeTool``) run per golden case.

Kept apart from :mod:`rag_core.evaluation`, which reads cases and fixtures only and imports no
store client or model. ``record.record_fixtures`` writes one store's fixtures;
``suites.run_suite`` ingests a golden suite's corpus, records both stores and evaluates them.
"""
