"""Benchmarks for rag_core: ``python -m bench.run`` (``make bench``) -> ``bench/results/``.

One module per benchmark (latency, scale, ingestion, evaluation, memory, concurrency, engine,
embedding backends), one measuring harness (targets, timing loop, goals) in
``bench.harness``, the shared plumbing in ``bench.common`` and the Markdown/JSON/PNG report in
``bench.report``.
"""
