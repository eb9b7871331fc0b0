"""Benchmarks for rag_core: ``python -m bench.run`` (``make bench``) -> ``bench/results/``; one
module per benchmark, the measuring harness in ``bench.harness``, shared plumbing in
``bench.common``, the report in ``bench.report`` (``bench/README.md`` lists them)."""
