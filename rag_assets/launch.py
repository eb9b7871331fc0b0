"""Run a job of the code location the way Dagster's own launchers do, from a plain process.

``launch_job`` creates the run on the instance with the code location's origin (the
``rag_assets`` entry of ``workspace.yaml``) and the reconstructable job's Python origin, then
executes it in this process with ``execute_run``, what a run worker does. The run therefore
carries the ``.dagster/repository`` tag and a remote origin: the UI lists it in the job's run
history and timeline, and "Re-execute" works on it, as for a run launched from the UI.

It runs outside the run queue (no daemon needed); the store file locks (``rag_assets.locks``)
keep it from overlapping a queued run on the same stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository
from dagster._core.execution.api import execute_run
from dagster._core.execution.job_execution_result import JobExecutionResult
from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.workspace.load import location_origins_from_yaml_paths

from rag_core.settings import PROJECT_ROOT

WORKSPACE_YAML = PROJECT_ROOT / "workspace.yaml"
LOCATION_NAME = "rag_assets"
#: The repository name of a ``Definitions`` object (what the UI shows as ``__repository__``).
REPOSITORY_NAME = "__repository__"
DEFINITIONS_MODULE = "rag_assets.definitions"


class LaunchError(RuntimeError):
    """The workspace file does not name the code location, or the job does not exist."""


def remote_job_origin(job_name: str, workspace_yaml: Path = WORKSPACE_YAML) -> RemoteJobOrigin:
    """The origin the webserver and daemon give ``job_name`` of the ``rag_assets`` location.

    Raises LaunchError when ``workspace_yaml`` has no ``rag_assets`` location.
    """
    origins = {o.location_name: o for o in location_origins_from_yaml_paths([str(workspace_yaml)])}
    if LOCATION_NAME not in origins:
        raise LaunchError(
            f"{workspace_yaml}: no code location named {LOCATION_NAME!r} "
            f"(found: {', '.join(sorted(origins)) or 'none'})"
        )
    return RemoteJobOrigin(RemoteRepositoryOrigin(origins[LOCATION_NAME], REPOSITORY_NAME), job_name)


def reconstructable_job(job_name: str) -> ReconstructableJob:
    """``job_name`` of ``rag_assets.definitions.defs`` as a job a run worker can rebuild."""
    repo = ReconstructableRepository.for_module(DEFINITIONS_MODULE, "defs", working_directory=str(PROJECT_ROOT))
    return repo.get_reconstructable_job(job_name)


def launch_job(
    instance: dg.DagsterInstance,
    job_name: str,
    *,
    run_config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    partition_key: str | None = None,
) -> JobExecutionResult:
    """Create a run of ``job_name`` on ``instance`` and execute it here; returns its result.

    Step failures do not raise: ``result.success`` is False and the run is marked failed.
    Raises LaunchError for a missing location or job.
    """
    recon = reconstructable_job(job_name)
    try:
        job_def = recon.get_definition()
    except dg.DagsterInvariantViolationError as exc:
        raise LaunchError(f"job {job_name!r} not found in {DEFINITIONS_MODULE}: {exc}") from None
    run_tags = dict(tags or {})
    if partition_key is not None:
        run_tags["dagster/partition"] = partition_key
    run = instance.create_run_for_job(
        job_def=job_def,
        run_config=dict(run_config or {}),
        tags=run_tags,
        remote_job_origin=remote_job_origin(job_name),
        job_code_origin=recon.get_python_origin(),
    )
    return execute_run(recon, run, instance)
