"""Run a job of the code location from a plain process, with Dagster's public API only.

``launch_job`` executes ``job_name`` of ``rag_assets.definitions.defs`` as a reconstructable
job (``dg.build_reconstructable_job`` + ``dg.execute_job``): the run is stored on the instance,
a multiprocess executor could rebuild the job in its step processes, and the run carries the
code location's repository tag (``.dagster/repository``), so the UI lists it in the job's run
history and timeline.

Limit of the public API: such a run has no remote (workspace) origin, so the run page's
"Re-execute all" (re-execution by parent run id) refuses it (Dagster issue 19458); re-execution
from the job's launchpad (selector + parent run id) works.

It runs outside the run queue (no daemon needed); the store file locks (``rag_assets.locks``)
keep it from overlapping a queued run on the same stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from rag_core.settings import PROJECT_ROOT

WORKSPACE_YAML = PROJECT_ROOT / "workspace.yaml"
LOCATION_NAME = "rag_assets"
#: The repository name of a ``Definitions`` object (what the UI shows as ``__repository__``).
REPOSITORY_NAME = "__repository__"
#: The run tag the UI filters a job's run history by (``<repository>@<code location>``).
REPOSITORY_TAG = ".dagster/repository"
DEFINITIONS_MODULE = "rag_assets.definitions"


class LaunchError(RuntimeError):
    """The job does not exist in the code location."""


def job_of(job_name: str) -> dg.JobDefinition:
    """``job_name`` of ``rag_assets.definitions.defs`` (the reconstructor of ``reconstructable_job``).

    Raises LaunchError naming the job when the definitions have none of that name."""
    from rag_assets.definitions import defs

    try:
        return defs.resolve_job_def(job_name)
    except (dg.DagsterInvariantViolationError, ValueError, KeyError) as exc:
        raise LaunchError(f"job {job_name!r} not found in {DEFINITIONS_MODULE}: {exc}") from None


def reconstructable_job(job_name: str):  # -> dagster ReconstructableJob (not exported by name)
    """``job_name`` as a job a run worker (or a step process) can rebuild from this module."""
    job_of(job_name)  # fail here, naming the job, rather than in a step process
    return dg.build_reconstructable_job(
        __name__, "job_of", reconstructable_args=(job_name,), reconstructor_working_directory=str(PROJECT_ROOT)
    )


def launch_job(
    instance: dg.DagsterInstance,
    job_name: str,
    *,
    run_config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    partition_key: str | None = None,
) -> dg.JobExecutionResult:
    """Create a run of ``job_name`` on ``instance`` and execute it here; returns its result.

    Step failures do not raise: ``result.success`` is False and the run is marked failed.
    Raises LaunchError for a missing job.
    """
    run_tags = {REPOSITORY_TAG: f"{REPOSITORY_NAME}@{LOCATION_NAME}", **(tags or {})}
    if partition_key is not None:
        run_tags["dagster/partition"] = partition_key
    return dg.execute_job(
        reconstructable_job(job_name), instance, run_config=dict(run_config or {}), tags=run_tags, raise_on_error=False
    )
