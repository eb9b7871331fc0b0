"""Offline golden retrieval evaluation: cases, fixtures, metrics, evaluator, reports, gate.

Kept import-free on purpose: importing the evaluator must not pull in the vector stores or
the embedding model (pymilvus, psycopg, torch). Import the submodules directly.
"""
