"""The ``rag_assets`` code location: every definition under ``rag_assets/defs/``.

``dg.load_from_defs_folder`` finds the defs module from ``[tool.dg]`` in pyproject.toml and
loads each module's assets, checks, jobs, schedules, sensors and ``Definitions``. Runs use the
in-process executor: the embedded stores (Milvus Lite allows one process per file) and the
embedding model are then opened once per run instead of once per step process.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

defs = dg.Definitions.merge(
    dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
    dg.Definitions(executor=dg.in_process_executor),
)
