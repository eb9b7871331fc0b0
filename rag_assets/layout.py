"""Where the Dagster assets keep their files (all under the RAG data dir unless configured).

Values travel between assets as files, not pickles: the code location's one IO manager
(``rag_assets.io_manager``) writes each asset's output at ``AssetFiles.output_path`` (pydantic
JSON or Parquet) and downstream assets and checks take it as an input. One place decides the
layout so the IO manager, assets, ``run.py`` and tests agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rag_core.settings import PROJECT_ROOT

#: The stores evaluated: the main store first, then the sidecar (``VectorStore.name``).
STORES = ("milvus", "pgvector")
#: The baseline kept in the repository (``rag eval run ... --out golden/reports``).
REPO_BASELINE = PROJECT_ROOT / "golden" / "reports" / "baseline.json"
#: Default DAGSTER_HOME of ``python -m rag_assets.run`` and ``make ui``.
DEFAULT_DAGSTER_HOME = PROJECT_ROOT / ".dagster_home"
#: Instance config copied into a DAGSTER_HOME that has none.
LOCAL_INSTANCE_YAML = PROJECT_ROOT / "dagster.local.yaml"


@dataclass(frozen=True)
class AssetFiles:
    """File layout of one data dir (absolute paths).

    ``reports_dir`` and ``published_dir`` default to ``<data_dir>/reports`` and
    ``<data_dir>/published``.
    """

    data_dir: Path
    reports_dir: Path
    published_dir: Path

    @classmethod
    def under(cls, data_dir: Path, reports_dir: Path | None = None, published_dir: Path | None = None) -> AssetFiles:
        """The layout of ``data_dir`` (resolved to an absolute path)."""
        root = Path(data_dir).expanduser().resolve()
        return cls(
            root,
            Path(reports_dir).expanduser().resolve() if reports_dir else root / "reports",
            Path(published_dir).expanduser().resolve() if published_dir else root / "published",
        )

    @property
    def chunks_parquet(self) -> Path:
        """One row per chunk of the last ``chunks`` materialization."""
        return self.data_dir / "tables" / "chunks.parquet"

    def fixtures_dir(self, store: str) -> Path:
        """Recorded retrieval fixtures of ``store`` (``milvus`` or ``pgvector``)."""
        return self.data_dir / "fixtures" / store

    def evaluation_json(self, store: str) -> Path:
        """The ``EvaluationReport`` JSON of ``store``'s golden evaluation."""
        return self.data_dir / "evaluation" / f"golden_evaluation_{store}.json"

    @property
    def baseline_json(self) -> Path:
        """The main store's current baseline report (``write_baseline_report`` name ``baseline``)."""
        return self.reports_dir / "baseline.json"

    @property
    def comparison_json(self) -> Path:
        """The main-vs-sidecar comparison report JSON."""
        return self.reports_dir / "comparison.json"

    def trace_parquet(self, day: str) -> Path:
        """The ``tool_invocation`` export of one UTC day (``YYYY-MM-DD``), hive-style layout."""
        return self.data_dir / "traces" / "tool_invocation" / f"day={day}" / "part-0.parquet"

    @property
    def outputs_dir(self) -> Path:
        """Outputs that have no file of their own elsewhere (the scan, the plan, ...)."""
        return self.data_dir / "dagster"

    def output_path(self, asset: str, partition: str | None = None) -> Path:
        """The file of ``asset``'s output (``partition``: its partition key, if partitioned).

        The evaluations, fixture manifests, reports and trace exports keep the files they had
        before the IO manager existed; other assets' outputs are ``<data_dir>/dagster/<asset>.json``.
        Raises ValueError for a partitioned asset without a partition key.
        """
        for store in STORES:
            if asset == f"golden_evaluation_{store}":
                return self.evaluation_json(store)
            if asset == f"retrieval_fixtures_{store}":
                return self.fixtures_dir(store) / "manifest.json"
        if asset == "baseline_report":
            return self.baseline_json
        if asset == "comparison_report":
            return self.comparison_json
        if asset == "chunks":
            return self.data_dir / "tables" / "chunks.json"
        if asset == "trace_tables":
            if partition is None:
                raise ValueError("trace_tables is partitioned by UTC day: a partition key is needed")
            return self.trace_parquet(partition)
        return self.outputs_dir / f"{asset}.json"

    def step_output_path(self, run_id: str, step_key: str, output: str, mapping_key: str | None = None) -> Path:
        """The file of an op output inside a graph-backed asset (one run's intermediate)."""
        name = f"{step_key}.{output}" + (f".{mapping_key}" if mapping_key else "")
        return self.outputs_dir / "steps" / run_id / f"{name}.json"

    @property
    def sensor_state(self) -> Path:
        """The knowledge sensor's per-file state (size, mtime, content hash per doc id)."""
        return self.data_dir / "sensor" / "knowledge_files.json"

    def lock_file(self, store: str) -> Path:
        """The inter-process lock file guarding ``store`` (``milvus``, ``pgvector``)."""
        return self.data_dir / "locks" / f"{store}.lock"
