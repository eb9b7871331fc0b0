"""The code location's one IO manager: every value between assets (and the ops inside a
graph-backed asset) is a file at the layout of ``rag_assets.layout.AssetFiles``.

- a polars ``DataFrame`` is written as Parquet (polars' writer) and read back with polars;
- a pydantic model is written as its JSON (``model_dump_json(indent=2)``) and read back with
  ``parse_json_model`` (so an older format version of a report still loads, a newer one fails
  naming the file);
- any other typed value (the ingest stages' dataclasses, ``list[GoldenCase]``) goes through a
  pydantic ``TypeAdapter`` of the output's or input's annotated type, to the same JSON.

Writes are atomic (a reader never sees half a file). Nothing is pickled, so a file outlives a
code change that renames a class, and a person or another tool can read every value.
"""

from __future__ import annotations

import functools
import json
import typing
from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
from pydantic import BaseModel, TypeAdapter

from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource
from rag_assets.files import write_parquet_atomic, write_text_atomic
from rag_assets.layout import AssetFiles


class OutputFileError(RuntimeError):
    """An input's file is missing or unreadable (names the file and the asset to materialize)."""


@functools.lru_cache(maxsize=64)
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _is_frame(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, pl.DataFrame)


def _declared_type(context: dg.InputContext | dg.OutputContext, value: Any = None) -> Any:
    """The annotated type of the input or output, else the value's own type."""
    kind = getattr(context.dagster_type, "typing_type", Any)
    if kind in (Any, object, type(None)) or kind is typing.Any:
        return type(value) if value is not None else Any
    return kind


def dump(value: Any, kind: Any) -> bytes:
    """``value`` of type ``kind`` as JSON bytes (pydantic: models as their JSON, dataclasses,
    tuples, paths and sets through a ``TypeAdapter``)."""
    if isinstance(value, BaseModel):
        return (value.model_dump_json(indent=2) + "\n").encode()
    return _adapter(kind).dump_json(value, indent=2) + b"\n"


def load(data: bytes, kind: Any, where: str) -> Any:
    """The ``kind`` value in JSON ``data`` read from ``where`` (pydantic ValidationError or
    FormatVersionError naming ``where`` when it does not fit)."""
    if _is_model(kind):
        from rag_core.evaluation.formats import parse_json_model

        return parse_json_model(data, kind, where)
    return _adapter(kind).validate_json(data)


class RagFilesIOManager(dg.ConfigurableIOManager):
    """Stores asset outputs at ``AssetFiles.output_path`` of the RAG data dir (reports in the
    reports dir), op outputs of graph-backed assets under ``<data_dir>/dagster/steps/<run id>``
    (a run's first op output removes the folders of runs older than ``STEP_OUTPUTS_MAX_AGE_S``)."""

    rag: RagSettingsResource
    evaluation: EvaluationConfigResource

    def _files(self) -> AssetFiles:
        return self.evaluation.files(self.rag.get_settings())

    def _path(self, context: dg.OutputContext) -> Path:
        files = self._files()
        if context.has_asset_key:
            partition = context.partition_key if context.has_partition_key else None
            return files.output_path(context.asset_key.to_user_string(), partition)
        return files.step_output_path(context.run_id, context.step_key, context.name, context.mapping_key)

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Write ``obj`` (``None``: nothing to store, e.g. an asset returning only metadata)."""
        if obj is None:
            return
        path = self._path(context)
        if not context.has_asset_key and not path.parent.exists():
            self._files().prune_step_outputs(keep_run=context.run_id)  # a new run: old runs' op outputs go
        if isinstance(obj, pl.DataFrame):
            write_parquet_atomic(obj, path)
        else:
            write_text_atomic(path, dump(obj, _declared_type(context, obj)).decode())
        context.add_output_metadata({"io_path": dg.MetadataValue.path(str(path))})

    def load_input(self, context: dg.InputContext) -> Any:
        """Read the upstream output back as the input's annotated type.

        Raises OutputFileError naming the file and the upstream asset when it was never written.
        """
        upstream = context.upstream_output
        if context.has_asset_key:
            partition = context.asset_partition_key if context.has_asset_partitions else None
            name = context.asset_key.to_user_string()
            path = self._files().output_path(name, partition)
        else:
            assert upstream is not None  # an op input always has an upstream output
            name = upstream.step_key
            path = self._files().step_output_path(
                upstream.run_id, upstream.step_key, upstream.name, upstream.mapping_key
            )
        if not path.is_file():
            raise OutputFileError(f"{path}: no stored output of {name}; materialize {name} first")
        kind = _declared_type(context)
        if not context.has_asset_key and typing.get_origin(kind) is list and not path.read_bytes().lstrip()[:1] == b"[":
            # a fan-in (``.collect()``): Dagster loads each mapped output alone, as one element
            (kind,) = typing.get_args(kind)
        if _is_frame(kind):
            return pl.read_parquet(path)
        if kind is Any:
            return json.loads(path.read_bytes())
        return load(path.read_bytes(), kind, str(path))
