"""Where the Dagster assets keep their files (all under the RAG data dir unless configured).

Values travel between assets as files, not pickles: the code location's one IO manager
(``rag_assets.io_manager``) writes each asset's output at ``AssetFiles.output_path`` (pydantic
JSON or Parquet) and downstream assets and checks take it as an input. One place decides the
layout so the IO manager, assets, ``run.py`` and tests agree.
"""

from __future__ import annotations

import shutil
import time
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
#: How long a run's op outputs are kept for a re-execution from failure (7 days, in seconds).
STEP_OUTPUTS_MAX_AGE_S = 7 * 24 * 3600.0


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
    def signals_dir(self) -> Path:
        """One ``<day>.json`` of production signals per trace partition (``production_signals``)."""
        return self.reports_dir / "signals"

    @property
    def candidates_dir(self) -> Path:
        """One ``<day>.yaml`` of mined candidate cases per trace partition (``mined_cases``)."""
        return self.reports_dir / "candidates"

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
        return self.steps_dir / run_id / f"{name}.json"

    @property
    def steps_dir(self) -> Path:
        """``<outputs>/steps``: one folder of op outputs per run (pruned by :meth:`prune_step_outputs`)."""
        return self.outputs_dir / "steps"

    def prune_step_outputs(self, keep_run: str, max_age_s: float = STEP_OUTPUTS_MAX_AGE_S) -> list[str]:
        """Remove the op-output folders of runs other than ``keep_run`` last written more than
        ``max_age_s`` seconds ago; returns the run ids removed. A run re-executed from failure
        reads its parent run's folder, so young folders stay; the age bound keeps the folder
        count at about the runs of that many days. A folder that cannot be removed is left."""
        removed: list[str] = []
        if not self.steps_dir.is_dir():
            return removed
        cutoff = time.time() - max_age_s
        for run_dir in self.steps_dir.iterdir():
            try:
                if run_dir.name == keep_run or not run_dir.is_dir() or run_dir.stat().st_mtime > cutoff:
                    continue
                shutil.rmtree(run_dir)
            except OSError:
                continue  # another process removed it, or it is not ours to remove
            removed.append(run_dir.name)
        return removed

    @property
    def sensor_state(self) -> Path:
        """The knowledge sensor's per-file state (size, mtime, content hash per doc id)."""
        return self.data_dir / "sensor" / "knowledge_files.json"

    def lock_file(self, store: str) -> Path:
        """The inter-process lock file guarding ``store`` (``milvus``, ``pgvector``)."""
        return self.data_dir / "locks" / f"{store}.lock"
