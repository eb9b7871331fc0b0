"""Recorded retrieval fixtures: one directory per store (Milvus main, pgvector sidecar).

Layout::

    <dir>/manifest.json      FixtureManifest: store, corpus hash, model, index params, commit,
                             recording time, cases file, case count, store status
    <dir>/<case_id>.json     CaseFixture: the ranked candidates (chunk level, before
                             post-processing) and evidence blocks (final, one per source doc)
                             of one case on that store

Both carry ``format_version`` (``rag_core.evaluation.formats``: version-1 files, written
before it, load with their old key names mapped). The recorder writes these with
``write_manifest`` / ``write_fixture``; the evaluator reads them with ``load_fixtures``.
Nothing here talks to a vector store.
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

from rag_core.evaluation.formats import LegacyNames, VersionedFile, read_json_model
from rag_core.fileio import write_text_atomic

__all__ = [
    "MANIFEST_NAME",
    "CaseFixture",
    "FixtureCandidate",
    "FixtureEvidenceBlock",
    "FilterProbe",
    "FixtureManifest",
    "FixtureSet",
    "StoreStatus",
    "fixture_filename",
    "load_fixtures",
    "read_manifest",
    "write_fixture",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"


class StoreStatus(BaseModel):
    """Whether a store could be recorded; ``reason`` says why not when unavailable."""

    status: Literal["available", "unavailable"] = "available"
    reason: str | None = None

    @property
    def available(self) -> bool:
        """True when the store was recorded."""
        return self.status == "available"


class FixtureCandidate(LegacyNames):
    """One ranked chunk-level candidate as returned by the vector store (rank 1 = best).

    ``raw_score`` is the store's own number, meaningful only with ``score_label`` (e.g.
    ``milvus_cosine_similarity[-1,1]``, ``pgvector_cosine_distance[0,2]``);
    ``similarity`` is the normalised cosine similarity in [0, 1] that can be compared across
    stores. A missing or empty ``doc_id`` never counts as a hit.
    """

    V1_NAMES = {"normalized_score": "similarity"}
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
    similarity: float | None = None
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


class CaseFixture(VersionedFile):
    """The recorded retrieval output of one golden case on one store.

    ``candidates`` and ``evidence_blocks`` are sorted on load by (rank, doc id);
    ``context_pack_doc_ids`` are the doc ids the context pack kept. ``status="error"`` means
    the lookup failed for this case (``error`` says why); the case is still evaluated on
    whatever was recorded (usually nothing, so a miss). ``relevance_level``, ``confidence`` and
    ``found`` are the result's own (``rag_core.evaluation.abstention`` scores them).
    """

    V1_NAMES = {"path": "store", "context_pack_sources": "context_pack_doc_ids"}
    model_config = ConfigDict(extra="ignore")

    case_id: str = Field(min_length=1)
    store: str
    query: str = ""
    status: Literal["ok", "degraded", "error"] = "ok"
    error: str | None = None
    retrieval_layer: str = "none"
    candidates: list[FixtureCandidate] = Field(default_factory=list)
    evidence_blocks: list[FixtureEvidenceBlock] = Field(default_factory=list)
    context_pack_doc_ids: list[str] = Field(default_factory=list)
    filter_probe: FilterProbe | None = None
    relevance_level: str | None = None
    #: ``LookupResult.confidence`` and ``found`` (None in fixtures recorded before them).
    confidence: float | None = None
    found: bool | None = None
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


class FixtureManifest(VersionedFile):
    """What a fixture directory was recorded from (one per store and recording run).

    ``recorded_at`` is an ISO-8601 UTC timestamp; ``corpus_hash`` is a sha256 of the corpus;
    ``index_params`` are the store's index settings, kept verbatim. Other keys the recorder
    adds are kept too.
    """

    V1_NAMES = {"path": "store", "path_status": "store_status"}
    model_config = ConfigDict(extra="allow")

    store: str
    corpus_hash: str | None = None
    model_id: str | None = None
    ensemble_model_id: str | None = None  # the rerank's second model (None: off, or older fixtures)
    index_params: dict[str, Any] = Field(default_factory=dict)
    git_commit: str | None = None
    recorded_at: str | None = None
    cases_file: str | None = None
    case_count: int | None = None
    store_status: StoreStatus = Field(default_factory=StoreStatus)


class FixtureSet(BaseModel):
    """Fixtures of one store loaded for a list of case ids.

    ``fixtures`` maps case id -> fixture for every usable file; ``not_run`` maps case id ->
    reason for every requested case without a usable fixture (missing file, corrupt JSON,
    invalid content, store unavailable); ``warnings`` are problems that do not stop a case
    (fixtures for unknown cases, a missing manifest, ...).
    """

    directory: str
    store: str | None = None
    manifest: FixtureManifest | None = None
    store_status: StoreStatus = Field(default_factory=StoreStatus)
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


def write_fixture(directory: str | Path, fixture: CaseFixture | dict[str, Any]) -> CaseFixture:
    """Validate ``fixture`` and write it atomically to ``<directory>/<case_id>.json``.

    Returns the fixture model written. Raises ``pydantic.ValidationError`` for an invalid
    fixture (nothing is written then).
    """
    model = CaseFixture.model_validate(fixture)
    write_text_atomic(Path(directory) / fixture_filename(model.case_id), _model_json(model))
    return model


def write_manifest(directory: str | Path, manifest: FixtureManifest | dict[str, Any]) -> FixtureManifest:
    """Validate ``manifest``, write it atomically to ``<directory>/manifest.json`` and return
    the manifest model written (``pydantic.ValidationError`` when invalid)."""
    model = FixtureManifest.model_validate(manifest)
    write_text_atomic(Path(directory) / MANIFEST_NAME, _model_json(model))
    return model


def read_manifest(directory: str | Path) -> FixtureManifest | None:
    """The manifest of a fixture directory, or None when it has none.

    Raises ``FormatVersionError`` / ``pydantic.ValidationError`` for an unusable one.
    """
    file = Path(directory) / MANIFEST_NAME
    return read_json_model(file, FixtureManifest) if file.is_file() else None


M = TypeVar("M", bound=BaseModel)


def _read_model(file: Path, model: type[M]) -> M | str:
    """Parse and validate one JSON file: the model, or the reason it is unusable.

    Raises ``FormatVersionError`` for a format version this code cannot read.
    """
    try:
        # Validating straight from JSON is about twice as fast as json.loads + validate.
        return read_json_model(file, model)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
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
        warnings.append(f"{file.name} missing in {directory}: store and corpus unknown")
        return None
    manifest = _read_model(file, FixtureManifest)
    if isinstance(manifest, str):
        warnings.append(f"{file.name} in {directory} is {manifest}; ignored")
        return None
    return manifest


def _load_case(file: Path, case_id: str, manifest_store: str | None) -> CaseFixture | str:
    """The case's fixture, or why it is unusable."""
    fixture = _read_model(file, CaseFixture)
    if isinstance(fixture, str):
        return f"fixture {file.name} is {fixture}"
    if fixture.case_id != case_id:
        return f"fixture {file.name} is for case {fixture.case_id!r}, not {case_id!r}"
    if manifest_store is not None and fixture.store != manifest_store:
        return (
            f"fixture {file.name} was recorded on store {fixture.store!r}, but the manifest is for {manifest_store!r}"
        )
    return fixture


def load_fixtures(directory: str | Path, case_ids: list[str] | tuple[str, ...]) -> FixtureSet:
    """Load the manifest and the fixture of every case in ``case_ids`` from ``directory``.

    Never raises for bad content: a missing directory or an unavailable store makes every
    case not_run with the reason; a missing, corrupt or invalid case file makes that case
    not_run (reason names the file and what is wrong) and the rest load; a ``*.json`` file
    for a case not in ``case_ids`` is reported in ``warnings`` and ignored. Version-1 files
    load with their old names mapped; a file of a format version this code does not know
    raises ``FormatVersionError`` (its results would be wrong, not missing).
    """
    directory = Path(directory)
    result = FixtureSet(directory=str(directory))
    if not directory.is_dir():
        reason = f"fixtures directory {directory} not found"
        result.store_status = StoreStatus(status="unavailable", reason=reason)
        result.not_run = {cid: reason for cid in case_ids}
        return result

    manifest = _load_manifest(directory, result.warnings)
    result.manifest = manifest
    if manifest is not None:
        result.store = manifest.store
        result.store_status = manifest.store_status
    if not result.store_status.available:
        reason = f"store {result.store!r} unavailable: {result.store_status.reason or 'no reason given'}"
        result.not_run = {cid: reason for cid in case_ids}
        return result

    wanted = set(case_ids)
    for cid in case_ids:
        file = directory / fixture_filename(cid)
        if not file.is_file():
            result.not_run[cid] = f"no fixture {file.name} in {directory}"
            continue
        loaded = _load_case(file, cid, result.store)
        if isinstance(loaded, str):
            result.not_run[cid] = loaded
            result.warnings.append(loaded)
        else:
            result.fixtures[cid] = loaded
    for file in sorted(directory.glob("*.json")):
        if file.name != MANIFEST_NAME and file.stem not in wanted:
            result.warnings.append(f"fixture {file.name} is for unknown case {file.stem!r}; ignored")
    if result.store is None and result.fixtures:
        result.store = next(iter(result.fixtures.values())).store
    return result
