"""Recorded retrieval fixtures: one directory per path (Milvus main, pgvector sidecar).

Layout::

    <dir>/manifest.json      FixtureManifest: path, corpus hash, model, index params, commit,
                             recording time, cases file, case count, path status
    <dir>/<case_id>.json     CaseFixture: the ranked candidates (chunk level, before
                             post-processing) and evidence blocks (final, one per source doc)
                             of one case on that path

The recorder writes these with ``write_manifest`` / ``write_fixture``; the evaluator reads
them with ``load_fixtures``. Nothing here talks to a vector store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rag_core.fileio import write_text_atomic

__all__ = [
    "MANIFEST_NAME",
    "CaseFixture",
    "FixtureCandidate",
    "FixtureEvidenceBlock",
    "FilterProbe",
    "FixtureManifest",
    "FixtureSet",
    "PathStatus",
    "fixture_filename",
    "load_fixtures",
    "write_fixture",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"


class PathStatus(BaseModel):
    """Whether a retrieval path could be recorded; ``reason`` says why not when unavailable."""

    status: Literal["available", "unavailable"] = "available"
    reason: str | None = None

    @property
    def available(self) -> bool:
        """True when the path was recorded."""
        return self.status == "available"


class FixtureCandidate(BaseModel):
    """One ranked chunk-level candidate as returned by the vector store (rank 1 = best).

    ``raw_score`` is the store's own number, meaningful only with ``score_label`` (e.g.
    ``milvus_cosine_similarity[-1,1]``, ``pgvector_cosine_distance[0,2]``);
    ``normalized_score`` is the similarity in [0, 1] that can be compared across paths.
    A missing or empty ``doc_id`` never counts as a hit.
    """

    model_config = ConfigDict(extra="ignore")

    rank: int = Field(ge=1)
    doc_id: str | None = None
    chunk_id: str | None = None
    title: str = ""
    breadcrumb: str = ""
    category: str = ""
    content_preview: str = ""
    raw_score: float | None = None
    score_label: str = ""
    normalized_score: float | None = None
    attempts: list[int] = Field(default_factory=list)

    @field_validator("title", "breadcrumb", "category", "content_preview", "score_label", mode="before")
    @classmethod
    def _none_as_empty(cls, value: Any) -> Any:
        # The pipeline leaves labels unset (None) e.g. for L0 fallback blocks.
        return "" if value is None else value


class FixtureEvidenceBlock(FixtureCandidate):
    """One final evidence block (after post-processing and rerank; one per source doc)."""

    content: str = ""
    hit_reasons: list[str] = Field(default_factory=list)
    retrieval_layer: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _no_content(cls, value: Any) -> Any:
        return "" if value is None else value


def _rank_key(item: FixtureCandidate) -> tuple[int, str]:
    # Ties on rank are broken by doc id so that every consumer sees the same order.
    return (item.rank, item.doc_id or "")


class FilterProbe(BaseModel):
    """How the L0 category filter played in one case (for filter cost accounting).

    ``category_filter`` is the filter attempt 1 used (``None``: no filter, nothing to
    account); ``filtered_docs`` are the doc ids the filtered attempt itself returned;
    ``unfiltered_candidates`` / ``unfiltered_evidence_blocks`` are the same lookup run with
    the L0 filter disabled (recorded only when a filter was used).
    """

    model_config = ConfigDict(extra="ignore")

    category_filter: str | None = None
    filtered_docs: list[str] = Field(default_factory=list)
    unfiltered_candidates: list[FixtureCandidate] = Field(default_factory=list)
    unfiltered_evidence_blocks: list[FixtureEvidenceBlock] = Field(default_factory=list)

    @model_validator(mode="after")
    def _sorted(self) -> FilterProbe:
        self.unfiltered_candidates.sort(key=_rank_key)
        self.unfiltered_evidence_blocks.sort(key=_rank_key)
        return self


class CaseFixture(BaseModel):
    """The recorded retrieval output of one golden case on one path.

    ``candidates`` and ``evidence_blocks`` are sorted on load by (rank, doc id).
    ``status="error"`` means the lookup failed for this case (``error`` says why); the case
    is still evaluated on whatever was recorded (usually nothing, so a miss).
    """

    model_config = ConfigDict(extra="ignore")

    case_id: str = Field(min_length=1)
    path: str
    query: str = ""
    status: Literal["ok", "degraded", "error"] = "ok"
    error: str | None = None
    retrieval_layer: str = "none"
    candidates: list[FixtureCandidate] = Field(default_factory=list)
    evidence_blocks: list[FixtureEvidenceBlock] = Field(default_factory=list)
    context_pack_sources: list[str] = Field(default_factory=list)
    filter_probe: FilterProbe | None = None
    relevance_level: str | None = None
    #: Wall time of the recorded lookup in milliseconds (None in fixtures recorded before it).
    latency_ms: float | None = None

    @field_validator("retrieval_layer", mode="before")
    @classmethod
    def _layer_none(cls, value: Any) -> Any:
        return "none" if value is None else value

    @model_validator(mode="after")
    def _sorted(self) -> CaseFixture:
        self.candidates.sort(key=_rank_key)
        self.evidence_blocks.sort(key=_rank_key)
        return self


class FixtureManifest(BaseModel):
    """What a fixture directory was recorded from (one per path and recording run).

    ``recorded_at`` is an ISO-8601 UTC timestamp; ``corpus_hash`` is a sha256 of the corpus;
    ``index_params`` are the store's index settings, kept verbatim. Other keys the recorder
    adds are kept too.
    """

    model_config = ConfigDict(extra="allow")

    path: str
    corpus_hash: str | None = None
    model_id: str | None = None
    index_params: dict[str, Any] = Field(default_factory=dict)
    git_commit: str | None = None
    recorded_at: str | None = None
    cases_file: str | None = None
    case_count: int | None = None
    path_status: PathStatus = Field(default_factory=PathStatus)


class FixtureSet(BaseModel):
    """Fixtures of one path loaded for a list of case ids.

    ``fixtures`` maps case id -> fixture for every usable file; ``not_run`` maps case id ->
    reason for every requested case without a usable fixture (missing file, corrupt JSON,
    invalid content, path unavailable); ``warnings`` are problems that do not stop a case
    (fixtures for unknown cases, a missing manifest, ...).
    """

    directory: str
    path: str | None = None
    manifest: FixtureManifest | None = None
    path_status: PathStatus = Field(default_factory=PathStatus)
    fixtures: dict[str, CaseFixture] = Field(default_factory=dict)
    not_run: dict[str, str] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


def fixture_filename(case_id: str) -> str:
    """File name of a case's fixture: ``<case_id>.json``. Rejects ids unusable as names."""
    if not case_id or "/" in case_id or "\\" in case_id or case_id in {".", "..", "manifest"}:
        raise ValueError(f"case id {case_id!r} cannot be used as a fixture file name")
    return f"{case_id}.json"


def _model_json(model: BaseModel) -> str:
    return model.model_dump_json(indent=2) + "\n"


def write_fixture(directory: str | Path, fixture: CaseFixture | dict[str, Any]) -> Path:
    """Validate ``fixture`` and write it atomically to ``<directory>/<case_id>.json``.

    Returns the written path. Raises ``pydantic.ValidationError`` for an invalid fixture.
    """
    model = CaseFixture.model_validate(fixture)
    return write_text_atomic(Path(directory) / fixture_filename(model.case_id), _model_json(model))


def write_manifest(directory: str | Path, manifest: FixtureManifest | dict[str, Any]) -> Path:
    """Validate ``manifest`` and write it atomically to ``<directory>/manifest.json``."""
    model = FixtureManifest.model_validate(manifest)
    return write_text_atomic(Path(directory) / MANIFEST_NAME, _model_json(model))


M = TypeVar("M", bound=BaseModel)


def _read_model(file: Path, model: type[M]) -> M | str:
    """Parse and validate one JSON file: the model, or the reason it is unusable."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    try:
        # Validating straight from JSON is about twice as fast as json.loads + validate.
        return model.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            return f"not valid JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
        field = ".".join(str(p) for p in first["loc"]) or "file"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"invalid: {field}: {first['msg']}{more}"


def _load_manifest(directory: Path, warnings: list[str]) -> FixtureManifest | None:
    file = directory / MANIFEST_NAME
    if not file.is_file():
        warnings.append(f"{file.name} missing in {directory}: path and corpus unknown")
        return None
    manifest = _read_model(file, FixtureManifest)
    if isinstance(manifest, str):
        warnings.append(f"{file.name} in {directory} is {manifest}; ignored")
        return None
    return manifest


def _load_case(file: Path, case_id: str, manifest_path: str | None) -> CaseFixture | str:
    """The case's fixture, or why it is unusable."""
    fixture = _read_model(file, CaseFixture)
    if isinstance(fixture, str):
        return f"fixture {file.name} is {fixture}"
    if fixture.case_id != case_id:
        return f"fixture {file.name} is for case {fixture.case_id!r}, not {case_id!r}"
    if manifest_path is not None and fixture.path != manifest_path:
        return f"fixture {file.name} was recorded on path {fixture.path!r}, but the manifest is for {manifest_path!r}"
    return fixture


def load_fixtures(directory: str | Path, case_ids: list[str] | tuple[str, ...]) -> FixtureSet:
    """Load the manifest and the fixture of every case in ``case_ids`` from ``directory``.

    Never raises for bad content: a missing directory or an unavailable path makes every
    case not_run with the reason; a missing, corrupt or invalid case file makes that case
    not_run (reason names the file and what is wrong) and the rest load; a ``*.json`` file
    for a case not in ``case_ids`` is reported in ``warnings`` and ignored.
    """
    directory = Path(directory)
    result = FixtureSet(directory=str(directory))
    if not directory.is_dir():
        reason = f"fixtures directory {directory} not found"
        result.path_status = PathStatus(status="unavailable", reason=reason)
        result.not_run = {cid: reason for cid in case_ids}
        return result

    manifest = _load_manifest(directory, result.warnings)
    result.manifest = manifest
    if manifest is not None:
        result.path = manifest.path
        result.path_status = manifest.path_status
    if not result.path_status.available:
        reason = f"path {result.path!r} unavailable: {result.path_status.reason or 'no reason given'}"
        result.not_run = {cid: reason for cid in case_ids}
        return result

    wanted = set(case_ids)
    for cid in case_ids:
        file = directory / fixture_filename(cid)
        if not file.is_file():
            result.not_run[cid] = f"no fixture {file.name} in {directory}"
            continue
        loaded = _load_case(file, cid, result.path)
        if isinstance(loaded, str):
            result.not_run[cid] = loaded
            result.warnings.append(loaded)
        else:
            result.fixtures[cid] = loaded
    for file in sorted(directory.glob("*.json")):
        if file.name != MANIFEST_NAME and file.stem not in wanted:
            result.warnings.append(f"fixture {file.name} is for unknown case {file.stem!r}; ignored")
    if result.path is None and result.fixtures:
        result.path = next(iter(result.fixtures.values())).path
    return result
