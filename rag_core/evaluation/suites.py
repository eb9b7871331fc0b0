"""Golden suites: each pairs a case file with the knowledge base its doc ids refer to.

``golden/suites.yaml`` lists them (paths relative to the repository root, so the shared
corpora in ``../shared`` can be named). A suite's index lives in its own data dir
(``<data_dir>/suites/<name>``) and its own Milvus collection / pgvector table
(``<collection>_<name>``), so suites never mix documents, also on a production server.
A suite whose files are missing (e.g. ``../shared`` not mounted) is reported as skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import BaseModel, Field, ValidationError

from rag_core.settings import PROJECT_ROOT, RagSettings

__all__ = ["DEFAULT_SUITES_FILE", "GoldenSuite", "SuiteFileError", "load_suites", "suite_settings"]

DEFAULT_SUITES_FILE = PROJECT_ROOT / "golden" / "suites.yaml"
_NAME = r"^[a-z][a-z0-9-]{0,40}$"


class SuiteFileError(ValueError):
    """The suites file is unreadable or invalid (message names the file and the field)."""


class GoldenSuite(BaseModel):
    """One golden suite: ``name`` (lower-case, dashes), ``cases`` file, ``knowledge_dir``,
    and the stored ``baseline`` report (JSON) the nightly run is gated against."""

    name: str = Field(pattern=_NAME)
    description: str = ""
    cases: Path
    knowledge_dir: Path
    baseline: Path | None = None

    def missing(self) -> str | None:
        """Why the suite cannot run (a missing file or directory), or None."""
        if not self.cases.is_file():
            return f"case file {self.cases} not found"
        if not self.knowledge_dir.is_dir():
            return f"knowledge dir {self.knowledge_dir} not found"
        return None

    @property
    def slug(self) -> str:
        """The name as an identifier part (collection and table suffix, Dagster asset name)."""
        return re.sub(r"[^a-z0-9]", "_", self.name)


class _SuiteFile(BaseModel):
    suites: list[GoldenSuite]


def load_suites(path: Path = DEFAULT_SUITES_FILE, root: Path = PROJECT_ROOT) -> list[GoldenSuite]:
    """The suites of ``path``, their relative paths resolved against ``root``.

    Raises SuiteFileError naming the file and the first invalid field, or a duplicate name.
    """
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        parsed = _SuiteFile.model_validate(raw)
    except OSError as exc:
        raise SuiteFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise SuiteFileError(f"{path}: not valid YAML ({exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SuiteFileError(f"{path}: {where}: {first['msg']}") from None
    names = [s.name for s in parsed.suites]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SuiteFileError(f"{path}: duplicate suite name(s) {', '.join(duplicates)}")
    return [_resolved(s, root) for s in parsed.suites]


def _resolved(suite: GoldenSuite, root: Path) -> GoldenSuite:
    def absolute(p: Path) -> Path:
        return p if p.is_absolute() else (root / p).resolve()

    return suite.model_copy(
        update={
            "cases": absolute(suite.cases),
            "knowledge_dir": absolute(suite.knowledge_dir),
            "baseline": absolute(suite.baseline) if suite.baseline else None,
        }
    )


def suite_settings(base: RagSettings, suite: GoldenSuite) -> RagSettings:
    """``base`` pointed at the suite: its own data dir, knowledge dir, cases, collection, table."""
    table = f"{base.pg_table}_{suite.slug}"[:63]
    return base.model_copy(
        update={
            "data_dir": base.data_dir / "suites" / suite.name,
            "knowledge_dir": suite.knowledge_dir,
            "golden_cases": suite.cases,
            "collection": f"{base.collection}_{suite.slug}",
            "pg_table": table,
        }
    )
