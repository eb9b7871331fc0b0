"""Format versions of the files the evaluation writes: fixtures, manifests, reports, history.

Every such file written now carries ``"format_version": 2``. Version 1 is what was written
before it (no ``format_version``; reports had ``"schema_version": 1``), with older names:
``normalized_score`` -> ``similarity`` (fixture candidates and evidence blocks, comparison
entries), ``path`` -> ``store`` and ``path_status`` -> ``store_status`` (fixtures, manifests,
reports), ``context_pack_sources`` -> ``context_pack_doc_ids`` (fixtures), ``main_path`` /
``sidecar_path`` -> ``main_store`` / ``sidecar_store`` (comparison reports), ``paths`` ->
``stores`` (``history.jsonl`` lines).

Read files with ``read_json_model`` / ``parse_json_model``: they pass the file name as the
validation context, so a version-1 file (or one without a version) is mapped to the new
names, and a version this code does not know fails with one ``FormatVersionError`` line
naming the file and the version. Each model lists its own old names (``V1_NAMES``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, TypeVar

from pydantic import BaseModel, ValidationError, ValidationInfo, model_validator

__all__ = [
    "FORMAT_VERSION",
    "FormatVersionError",
    "LegacyNames",
    "VersionedFile",
    "parse_json_model",
    "read_json_model",
]

FORMAT_VERSION: Final = 2
READABLE_VERSIONS = (1, 2)
_FILE = "file"  # validation context: where the data comes from
_VERSION = "format_version"  # validation context: the version of the file being read


class FormatVersionError(ValueError):
    """A file has a ``format_version`` this code cannot read (one line: file and version)."""


def _context(info: ValidationInfo) -> dict[str, Any] | None:
    return info.context if isinstance(info.context, dict) else None


def _renamed(data: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    return {names.get(key, key): value for key, value in data.items()}


class LegacyNames(BaseModel):
    """Base of a model some of whose keys had other names in format version 1.

    ``V1_NAMES`` maps old key -> new key; they are renamed when the file being read (the
    validation context set by ``VersionedFile``) is version 1, never otherwise.
    """

    V1_NAMES: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any, info: ValidationInfo) -> Any:
        context = _context(info)
        if isinstance(data, Mapping) and context is not None and context.get(_VERSION) == 1:
            return _renamed(data, cls.V1_NAMES)
        return data


class VersionedFile(LegacyNames):
    """Base of a model written as a file of its own (it carries ``format_version``).

    Data without a version is version 1 when read from a file (validation context with the
    file name) and current otherwise (built in code). A version-1 mapping built in code must
    be read through ``parse_json_model`` too: its nested models need the context.
    """

    format_version: Literal[2] = FORMAT_VERSION

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, Mapping):
            return data
        context = _context(info)
        where = context.get(_FILE, "data") if context else "data"
        version = data.get("format_version", data.get("schema_version"))
        if version is None:
            version = 1 if context is not None and _FILE in context else FORMAT_VERSION
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise FormatVersionError(
                f"{where}: format_version {version!r} is not one this rag_core reads "
                f"({', '.join(map(str, READABLE_VERSIONS))}): upgrade rag_core or write the file again"
            )
        if version == 1 and context is None:
            raise FormatVersionError(f"{where}: format_version 1 data must be read with parse_json_model")
        if context is not None:
            context[_VERSION] = version
        current = {k: v for k, v in data.items() if k != "schema_version"}
        if version == 1:
            current = _renamed(current, cls.V1_NAMES)
        return {**current, "format_version": FORMAT_VERSION}


M = TypeVar("M", bound=BaseModel)


def parse_json_model(data: str | bytes, model: type[M], where: str) -> M:
    """Validate JSON ``data`` (read from ``where``, a file name) into ``model``, mapping a
    version-1 file to the current names.

    Raises ``FormatVersionError`` (one line naming ``where`` and the version) for a version
    this code cannot read, ``pydantic.ValidationError`` for anything else that is invalid.
    """
    try:
        return model.model_validate_json(data, context={_FILE: where})
    except ValidationError as exc:
        for error in exc.errors():
            cause = (error.get("ctx") or {}).get("error")
            if isinstance(cause, FormatVersionError):
                raise cause from None
        raise


def read_json_model(file: str | Path, model: type[M]) -> M:
    """``parse_json_model`` of the file's bytes; also raises ``OSError`` when it cannot be read."""
    return parse_json_model(Path(file).read_bytes(), model, str(file))
