"""Where the Dagster assets keep their files (all under the RAG data dir unless configured).

Large values travel between assets as files, not pickles: an asset writes under these paths
and puts the path in its metadata; downstream assets read the same path. One place decides the
layout so assets, checks, ``run.py`` and tests agree.
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

    def lock_file(self, store: str) -> Path:
        """The inter-process lock file guarding ``store`` (``milvus``, ``pgvector``)."""
        return self.data_dir / "locks" / f"{store}.lock"
