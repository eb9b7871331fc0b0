"""The ``mined_cases`` asset: candidate golden cases from one day of production lookups
(``rag_core.evaluation.mining``), for a person to review with ``rag eval review``."""

import dagster as dg
import polars as pl

from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource
from rag_assets.defs.traces import frame_rows
from rag_assets.metadata import md_table
from rag_assets.timing import DAILY_PARTITIONS, NIGHTLY_FRESHNESS
from rag_core.evaluation.mining import mine_candidates, write_candidates
from rag_core.evaluation.signals import flag_lookups

_SHOWN = 20


@dg.asset(
    group_name="traces",
    partitions_def=DAILY_PARTITIONS,
    kinds={"yaml", "markdown"},
    freshness_policy=NIGHTLY_FRESHNESS,
)
def mined_cases(
    context: dg.AssetExecutionContext,
    rag: RagSettingsResource,
    evaluation: EvaluationConfigResource,
    trace_tables: pl.DataFrame,
) -> dg.MaterializeResult:
    """Weak, re-asked, retried and store-disagreeing production lookups of one UTC day as
    candidate cases (deduplicated, secrets scrubbed, ranked by how often and how badly they
    occurred), written to ``<reports>/candidates/<day>.yaml`` (re-materializing rewrites it).
    Review them with ``rag eval review``."""
    settings = rag.get_settings()
    flagged = flag_lookups(frame_rows(trace_tables), settings.trace_slow_ms, settings.trace_reask_window_s)
    candidates = mine_candidates(flagged, scrub_ips=settings.trace_scrub_ips)
    path = write_candidates(evaluation.files(settings).candidates_dir / f"{context.partition_key}.yaml", candidates)
    rows = [
        [
            c.id,
            c.query[:120],
            c.provenance.count,
            f"{c.score:g}",
            ", ".join(c.provenance.signals),
            c.tool_answer.relevance,
        ]
        for c in candidates[:_SHOWN]
    ]
    return dg.MaterializeResult(
        metadata={
            "candidates": len(candidates),
            "lookups_mined": sum(c.provenance.count for c in candidates),
            "top_candidates": dg.MetadataValue.md(
                md_table(["id", "query", "lookups", "score", "signals", "relevance"], rows) if rows else "none"
            ),
            "path": dg.MetadataValue.path(str(path)),
            "review": f"rag eval review --candidates {path}",
        }
    )
