"""The loop from what agents ask to what the nightly run checks, on the real components: a day
of simulated agent traffic through the real tool (sample knowledge base in Milvus Lite, the
real model) into the real trace store (embedded PostgreSQL), the trace partition materialized
with Dagster (export, production signals, mined cases), two candidates decided with
``rag eval review`` flags, and the production suite evaluated on both stores.

The simulation knows which lookups should be mined (queries the corpus cannot answer, queries
an agent asked again); mined-candidate precision and recall are measured against that.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import yaml
from typer.testing import CliRunner

from rag_assets.defs.mining import mined_cases
from rag_assets.defs.resources import EvaluationConfigResource, RagSettingsResource, build_resources
from rag_assets.defs.traces import production_signals, tool_invocation, trace_tables
from rag_assets.timing import today_key
from rag_core.settings import RagSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
KNOWLEDGE = ROOT / "golden" / "knowledge"

# Fake secrets of the shapes agents paste (none is real).
DB_PASSWORD = "Orders-Pw-7731x"
BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhaW9wcy1hZ2VudC1zaW0ifQ.c2ltdWxhdGVkLXNpZ25hdHVyZQ"
GITHUB = "ghp_" + "SimulatedTokenAbCdEf0123456789xyz"
API_KEY = "sim-api-key-5f4e3d2c1b0a99887766"
EMAIL = "oncall.lead@shop.example.com"
SECRETS = [DB_PASSWORD, BEARER, GITHUB, API_KEY, EMAIL]

ALERT_REPLICATION = (
    '{"status":"firing","labels":{"alertname":"OrdersDBReplicationLag","severity":"critical"},'
    f'"annotations":{{"summary":"replica 40s behind","dsn":"postgresql://orders:{DB_PASSWORD}@db-replica-2:5432/orders"}},'
    f'"headers":{{"Authorization":"Bearer {BEARER}"}},"owner":"{EMAIL}"}}'
)
ALERT_OOM = f"alertname=CheckoutPodOOMKilled namespace=shop pod=checkout-5c7 api_key={API_KEY} contact={EMAIL}"
ALERT_UNKNOWN = (
    f'alertname=GpuNodeThermalThrottling node=gpu-07 temp=97C token={GITHUB} "Authorization: Bearer {BEARER}"'
)

# query -> the document that answers it (the sample knowledge base has it).
ANSWERABLE = {
    "customers are asking how to get their money back": "policy/RefundPolicy.md",
    "how do I add a new payment method to my account": "howto/AddPaymentMethod.md",
    "kafka consumer lag keeps growing on the orders topic": "queues/KafkaConsumerLagHigh.md",
    "how do I roll back a bad deployment": "howto/RollbackDeployment.md",
    "TLS certificate on the ingress expires in 3 days": "infra/IngressTLSCertExpiring.md",
    "node is NotReady in the cluster": "infra/NodeNotReady.md",
    ALERT_REPLICATION: "databases/OrdersDBReplicationLag.md",
    ALERT_OOM: "services/CheckoutPodOOMKilled.md",
}
UNANSWERABLE = [
    "how do I set up the office printer on the third floor",
    "what is the menu in the staff canteen this week",
    "when is the company summer party",
    ALERT_UNKNOWN,
]
REASKED = "redis memory is high what should I do"


def simulated_day() -> list[tuple[str, str, str, str | None]]:
    """(session, transport, query, the doc that answers it or None) in the order agents ask;
    REASKED is asked twice in one session (the first answer did not serve the agent)."""
    transports = ["python", "http", "mcp-http"]
    day = [(f"agent-{i}", transports[i % 3], q, doc) for i, (q, doc) in enumerate(ANSWERABLE.items())]
    day += [(f"lost-{i}", "http", q, None) for i, q in enumerate(UNANSWERABLE)]
    day += [("lost-0", "http", UNANSWERABLE[0], None), ("lost-9", "python", UNANSWERABLE[1], None)]
    day += [
        ("redis-1", "python", REASKED, "cache/RedisMemoryHigh.md"),
        ("redis-1", "python", REASKED + "?", "cache/RedisMemoryHigh.md"),
    ]
    day += [("eval-milvus-20261201", "evaluation", UNANSWERABLE[2] + " (evaluation)", None)]
    return day


def truly_weak(session: str, query: str, doc: str | None, top_doc: str | None) -> bool:
    """The simulation's ground truth for a production lookup: it failed the agent when the
    corpus cannot answer it, the agent asked it again, or the answering doc is not ranked first."""
    return doc is None or query == REASKED or top_doc != doc


@pytest.fixture(scope="module")
def data_dir():
    # Not tmp_path: the embedded PostgreSQL runs as another user when root (see conftest_pg.py).
    root = Path(tempfile.mkdtemp(prefix="rag-loop-it-"))
    yield root
    from rag_core.stores.milvus_server import stop_server
    from rag_core.stores.pgserver import stop_embedded

    with contextlib.suppress(Exception):
        stop_embedded(root / "pgdata", mode="immediate")
    with contextlib.suppress(Exception):
        stop_server(root)
    shutil.rmtree(root, ignore_errors=True)


def test_agents_traffic_becomes_a_reviewed_production_suite(data_dir, embedder, monkeypatch, caplog):
    from rag_core.evaluation.suites import GoldenSuite
    from rag_core.ingest.pipeline import ingest
    from rag_core.lookup.tool import LookupKnowledgeTool
    from rag_core.recording.suites import run_suite
    from rag_core.stores.milvus import MilvusStore
    from rag_core.traces import TraceStore
    from rag_core.traces.recorder import ToolInvocationRecorder

    for var in ("RAG_PG_DSN", "RAG_MILVUS_URI", "RAG_REPORTS_DIR", "RAG_COLLECTION", "RAG_PG_TABLE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAG_DATA_DIR", str(data_dir))
    monkeypatch.setenv("RAG_KNOWLEDGE_DIR", str(KNOWLEDGE))
    settings = RagSettings(data_dir=data_dir, knowledge_dir=KNOWLEDGE, sidecar_enabled=False, _env_file=None)
    store = MilvusStore.from_settings(settings)
    ingest(settings, embedder, [store], progress=False)
    store.close()

    # 1. A day of agent traffic through the real tool into the real trace store.
    recorder = ToolInvocationRecorder.from_settings(settings)
    tool = LookupKnowledgeTool(settings, embedder=embedder, recorder=recorder)
    top_docs = []
    for session, transport, query, _ in simulated_day():
        blocks = tool.lookup(query, session, transport=transport).evidence_blocks
        top_docs.append(blocks[0].doc_id if blocks else None)
    assert recorder.flush(60.0)
    tool.close()
    traces = TraceStore.from_settings(settings)
    stored = sorted(traces.recent(100), key=lambda r: r.created_at)  # the order they were asked in
    traces.close()
    assert len(stored) == len(simulated_day())
    weak_ids = {
        row.id
        for row, (session, transport, query, doc), top in zip(stored, simulated_day(), top_docs, strict=True)
        if transport != "evaluation" and truly_weak(session, query, doc, top)
    }
    assert {r.origin for r in stored} == {"library", "http", "mcp-http", "evaluation"}

    # 2. The day's partition: export, production signals, mined cases.
    day = today_key()
    result = dg.materialize(
        [tool_invocation, trace_tables, production_signals, mined_cases],
        partition_key=day,
        resources=build_resources(
            RagSettingsResource(data_dir=str(data_dir), sidecar_enabled=False), EvaluationConfigResource()
        ),
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    signals = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    meta = signals["production_signals"]
    assert meta["production_lookups"].value == len(simulated_day()) - 1  # the evaluation's lookup left out
    assert meta["evaluation_lookups_left_out"].value == 1
    assert meta["reasked_share"].value > 0 and meta["weak_share"].value > 0

    candidates_file = data_dir / "reports" / "candidates" / f"{day}.yaml"
    candidates = yaml.safe_load(candidates_file.read_text(encoding="utf-8"))["candidates"]
    mined_ids = {t for c in candidates for t in c["provenance"]["trace_ids"]}
    precision = sum(1 for c in candidates if weak_ids & set(c["provenance"]["trace_ids"])) / len(candidates)
    recall = len(weak_ids & mined_ids) / len(weak_ids)
    print(f"\nmined candidates {len(candidates)}, truly weak lookups {len(weak_ids)}: ", end="")
    print(f"precision {precision:.2f}, recall {recall:.2f}")
    for c in candidates:
        signals, relevance = ",".join(c["provenance"]["signals"]), c["tool_answer"]["relevance"]
        print(f"  {c['score']:>4} {relevance:>8} {signals:<16} {c['query'][:70]}")
    assert precision >= 0.6 and recall >= 0.8
    assert not any("(evaluation)" in c["query"] for c in candidates)

    # 3. Two decisions by flags: the re-asked question accepted, the printer one unanswerable.
    reask = next(c for c in candidates if "redis memory" in c["query"].casefold())
    printer = next(c for c in candidates if "printer" in c["query"])
    suite_file, log_file = data_dir / "golden" / "production.yaml", data_dir / "golden" / "decisions.jsonl"
    from rag_core.cli import app

    common = ["eval", "review", "--candidates", str(candidates_file), "--suite-file", str(suite_file)]
    common += ["--log", str(log_file), "--reviewer", "sre-reviewer"]
    runner = CliRunner()
    bad = runner.invoke(app, [*common, "--case", reask["id"], "--accept", "cache/NoSuchDoc.md"])
    assert bad.exit_code == 2 and "not in the index" in bad.output
    ok = runner.invoke(
        app, [*common, "--case", reask["id"], "--accept", "cache/RedisMemoryHigh.md", "--reason", "runbook"]
    )
    assert ok.exit_code == 0, ok.output
    ok = runner.invoke(app, [*common, "--case", printer["id"], "--unanswerable", "--reason", "not IT ops"])
    assert ok.exit_code == 0, ok.output
    left = runner.invoke(app, [*common, "--list", "--json"])
    assert reask["id"] not in left.output and printer["id"] not in left.output
    assert len(log_file.read_text().splitlines()) == 2

    # 4. The next evaluation runs the production suite on both stores.
    suite = GoldenSuite(name="production", cases=suite_file, knowledge_dir=KNOWLEDGE)
    outcome = run_suite(settings.model_copy(update={"sidecar_enabled": True}), suite, embedder, data_dir / "suites-out")
    assert outcome.status == "ok", outcome.reason
    assert set(outcome.reports) == {"milvus", "pgvector"}
    for report in outcome.reports.values():
        assert report.store_status.status == "available"
        assert {c.case_id for c in report.cases} == {reask["id"], printer["id"]}
        accepted = next(c for c in report.cases if c.case_id == reask["id"])
        assert accepted.expected_docs == ["cache/RedisMemoryHigh.md"] and accepted.first_hit_rank is not None
    gaps = Path(outcome.gaps_file).read_text(encoding="utf-8")
    assert "printer" in gaps.split("## Answers")[0]  # the unanswerable decision is a gap for runbook authors

    # No pasted secret in any file written (the trace store is checked through its rows), nor in logs.
    leaks = []
    for path in data_dir.rglob("*"):
        if path.is_file() and "pgdata" not in path.parts:
            data = path.read_bytes()
            leaks += [f"{path}: {s}" for s in SECRETS if s.encode() in data]
    traces = TraceStore.from_settings(settings)
    rows_text = "".join(r.model_dump_json() for r in traces.recent(100))
    traces.close()
    leaks += [f"trace table: {s}" for s in SECRETS if s in rows_text]
    leaks += [f"metadata: {s}" for s in SECRETS if s in repr(signals)]
    leaks += [f"log: {s}" for s in SECRETS if s in caplog.text]
    assert leaks == []
