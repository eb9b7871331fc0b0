"""Start the Dagster UI on the rag_assets workspace and check what it serves, through GraphQL.

    .venv/bin/python scripts/check_dagster_ui.py [--port N] [--timeout S]
                                                 [--with-run | --dagster-home DIR --data-dir DIR]

Starts ``dagster-webserver -w workspace.yaml`` on 127.0.0.1 (a free port) without the daemon, so
no schedule or sensor fires, and checks through the webserver's GraphQL API:

- the asset lineage equals ``EXPECTED_LINEAGE``;
- every schedule and sensor has a description;
- with runs (``--with-run`` first runs ``python -m rag_assets.run``, i.e. ``make run``, into a
  temporary DAGSTER_HOME and data dir; ``--dagster-home`` reuses an instance that has them):
  each ``make run`` run is in its job's run history (the job page's list), "Re-execute" of the
  refresh run is accepted (the queued re-execution is deleted again), and the report metadata
  (baseline, comparison, history) carries a chart the UI can display (a PNG data URI).

Without runs the DAGSTER_HOME is temporary (the repo's dagster.yaml copied in). Exit status 0
when everything matches, 1 when something differs, 2 when the UI (or the run) did not come up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEBSERVER = Path(sys.executable).parent / "dagster-webserver"

#: asset -> its upstream assets, as the UI must show them.
EXPECTED_LINEAGE: dict[str, list[str]] = {
    "knowledge_documents": [],
    "chunks": ["knowledge_documents"],
    "ingest_plan": ["knowledge_documents", "chunks"],
    "l0_index": ["ingest_plan"],
    "chunk_embeddings": ["ingest_plan"],
    "milvus_collection": ["ingest_plan", "chunk_embeddings", "l0_index"],
    "pgvector_table": ["ingest_plan", "chunk_embeddings"],
    "golden_cases": [],
    "retrieval_fixtures_milvus": ["golden_cases", "milvus_collection"],
    "retrieval_fixtures_pgvector": ["golden_cases", "pgvector_table"],
    "golden_evaluation_milvus": ["golden_cases", "retrieval_fixtures_milvus"],
    "golden_evaluation_pgvector": ["golden_cases", "retrieval_fixtures_pgvector"],
    "baseline_report": ["golden_evaluation_milvus"],
    "comparison_report": [
        "golden_evaluation_milvus",
        "golden_evaluation_pgvector",
        "retrieval_fixtures_milvus",
        "retrieval_fixtures_pgvector",
    ],
    "publish_reports": ["baseline_report", "comparison_report"],
    "retrieval_history": ["golden_evaluation_milvus", "golden_evaluation_pgvector"],
    "tool_invocation": [],
    "trace_tables": ["tool_invocation"],
    "production_signals": ["trace_tables"],
    "mined_cases": ["trace_tables"],
    # One self-contained asset per golden suite (golden/suites.yaml): ingest, record, evaluate.
    "golden_suite_sample": [],
    "golden_suite_runbooks_en": [],
    "golden_suite_runbooks_en_hard": [],
    "golden_suite_runbooks_zh": [],
    "golden_suite_production": [],
    "golden_suite_sample_unanswerable": [],
    "golden_suite_runbooks_en_unanswerable": [],
    "golden_suite_runbooks_zh_unanswerable": [],
}

QUERY = "{ assetNodes { assetKey { path } dependencyKeys { path } groupName } }"
INSTIGATORS = """{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name }
  schedules { name description } sensors { name description } } } } }"""
MAKE_RUN_RUNS = """{ runsOrError(filter: {tags: [{key: "rag/trigger", value: "rag_assets.run"}]}) {
  ... on Runs { results { runId jobName status } } } }"""
JOB_HISTORY = """query($job: String!) { pipelineOrError(params: {pipelineName: $job,
  repositoryName: "__repository__", repositoryLocationName: "rag_assets"}) {
  ... on Pipeline { runs(limit: 100) { runId } } ... on PythonError { message } } }"""
#: Re-execution as the job's launchpad does it (selector + parent run id): runs started with the
#: public ``execute_job`` (``make run``) have no workspace origin, which the run page's
#: parent-id-only re-execution needs.
REEXECUTE = """mutation($parent: String!, $job: String!) { launchPipelineReexecution(executionParams:
  {selector: {repositoryLocationName: "rag_assets", repositoryName: "__repository__", pipelineName: $job},
  executionMetadata: {parentRunId: $parent, rootRunId: $parent}})
  { __typename ... on LaunchRunSuccess { run { runId } }
  ... on PythonError { message } ... on InvalidStepError { invalidStepKey } } }"""
DELETE_RUN = """mutation($id: String!) { deletePipelineRun(runId: $id) { __typename } }"""
LATEST_METADATA = """query($path: [String!]!) { assetOrError(assetKey: {path: $path}) {
  ... on Asset { assetMaterializations(limit: 1) { runId metadataEntries { label
  ... on MarkdownMetadataEntry { mdStr } } } } } }"""
#: asset -> the metadata entries that must show a chart inline.
CHART_METADATA = {
    "baseline_report": ("report", "recall_chart"),
    "comparison_report": ("report", "recall_chart"),
    "retrieval_history": ("history", "trend_chart"),
}
DATA_PNG = "data:image/png;base64,"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str, timeout: float = 30.0, variables: dict | None = None) -> dict:
    """POST ``query`` to the UI's GraphQL endpoint; returns ``data`` (RuntimeError on errors)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = json.loads(response.read())
    if body.get("errors"):
        raise RuntimeError(f"GraphQL errors: {body['errors']}")
    return body["data"]


def wait_for_graph(port: int, server: subprocess.Popen, timeout: float) -> list[dict]:
    """Poll until the code location is loaded and serves asset nodes; [] on timeout/exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            nodes = graphql(port, QUERY)["assetNodes"]
            if nodes:
                return nodes
        except (urllib.error.URLError, ConnectionError, TimeoutError, RuntimeError, KeyError):
            pass
        time.sleep(1.0)
    return []


def lineage(nodes: list[dict]) -> dict[str, list[str]]:
    """``assetNodes`` as asset -> sorted upstream assets (keys joined with '/')."""
    return {"/".join(n["assetKey"]["path"]): sorted("/".join(d["path"]) for d in n["dependencyKeys"]) for n in nodes}


def compare(actual: dict[str, list[str]], expected: dict[str, list[str]]) -> list[str]:
    """Human-readable differences between two lineages ([] when equal)."""
    problems = [f"missing asset {k}" for k in sorted(expected.keys() - actual.keys())]
    problems += [f"unexpected asset {k}" for k in sorted(actual.keys() - expected.keys())]
    problems += [
        f"{k}: upstream {actual[k]} != expected {sorted(expected[k])}"
        for k in sorted(expected.keys() & actual.keys())
        if actual[k] != sorted(expected[k])
    ]
    return problems


def instigator_problems(port: int) -> list[str]:
    """Schedules and sensors served without a description (or none served at all)."""
    repos = graphql(port, INSTIGATORS)["repositoriesOrError"]["nodes"]
    found = [(kind, item) for repo in repos for kind in ("schedules", "sensors") for item in repo[kind]]
    problems = [
        f"{kind[:-1]} {item['name']} has no description"
        for kind, item in found
        if not (item.get("description") or "").strip()
    ]
    for kind in ("schedules", "sensors"):
        if not any(k == kind for k, _ in found):
            problems.append(f"no {kind} served")
    for kind, item in found:
        print(f"  {kind[:-1]} {item['name']}: {(item.get('description') or '(none)')[:90]}")
    return problems


def run_history_problems(port: int) -> list[str]:
    """``make run`` runs missing from their job's history, and a refused re-execution."""
    runs = graphql(port, MAKE_RUN_RUNS)["runsOrError"]["results"]
    if not runs:
        return ["no run of `make run` (tag rag/trigger=rag_assets.run) in the instance"]
    problems = []
    for job in sorted({r["jobName"] for r in runs}):
        history = graphql(port, JOB_HISTORY, variables={"job": job})["pipelineOrError"]
        listed = {r["runId"] for r in history.get("runs") or []}
        ours = [r["runId"] for r in runs if r["jobName"] == job]
        missing = [r for r in ours if r not in listed]
        print(f"  job {job}: {len(ours) - len(missing)} of {len(ours)} `make run` run(s) in its history")
        problems += [f"run {r} of `make run` is not in job {job}'s history" for r in missing]
    parent = next((r for r in runs if r["jobName"] == "refresh_job"), runs[0])
    variables = {"parent": parent["runId"], "job": parent["jobName"]}
    result = graphql(port, REEXECUTE, variables=variables)["launchPipelineReexecution"]
    if result["__typename"] != "LaunchRunSuccess":
        problems.append(f"re-execution of {parent['jobName']} run {parent['runId']} refused: {result}")
    else:
        child = result["run"]["runId"]
        print(
            f"  re-execute {parent['jobName']} run {parent['runId'][:8]}: accepted (run {child[:8]}, "
            "queued; deleted again)"
        )
        graphql(port, DELETE_RUN, variables={"id": child})
    return problems


def chart_problems(port: int) -> list[str]:
    """Report assets whose latest materialization's Markdown metadata has no inline chart."""
    problems = []
    for asset, labels in CHART_METADATA.items():
        node = graphql(port, LATEST_METADATA, variables={"path": [asset]})["assetOrError"]
        materializations = node.get("assetMaterializations") or []
        if not materializations:
            problems.append(f"{asset} has no materialization")
            continue
        entries = {e["label"]: e.get("mdStr") or "" for e in materializations[0]["metadataEntries"]}
        for label in labels:
            ok = DATA_PNG in entries.get(label, "")
            print(f"  {asset}.{label}: {'chart inline' if ok else 'NO CHART'}")
            if not ok:
                problems.append(f"{asset} metadata {label!r} has no chart the UI can display")
    return problems


def make_run(home: Path, data_dir: Path, log) -> int:
    """``python -m rag_assets.run`` (what ``make run`` runs) into ``home`` / ``data_dir``."""
    env = {**os.environ, "DAGSTER_HOME": str(home), "RAG_DATA_DIR": str(data_dir)}
    return subprocess.run(
        [sys.executable, "-m", "rag_assets.run"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=3600
    ).returncode


def stop_embedded_servers(data_dir: Path) -> None:
    """Stop the embedded Milvus and PostgreSQL that ``make_run`` started under ``data_dir``."""
    env = {**os.environ, "RAG_DATA_DIR": str(data_dir)}
    subprocess.run(
        [sys.executable, "-c", "from rag_core.cli import app; app()", "server", "stop"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )


def start_webserver(port: int, home: Path, data_dir: Path, log) -> subprocess.Popen:
    """``dagster-webserver -w workspace.yaml`` in its own process group (so it can be stopped
    with its code-server children). A ``home`` without ``dagster.yaml`` gets the repo's."""
    if not (home / "dagster.yaml").exists():
        shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "RAG_DATA_DIR": str(data_dir)}
    return subprocess.Popen(
        [str(WEBSERVER), "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(server: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM the server's process group, SIGKILL it after ``grace`` seconds."""
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(5)


def _ui_checks(port: int, nodes: list[dict], with_runs: bool) -> list[str]:
    actual = lineage(nodes)
    print(f"asset graph served by the Dagster UI on 127.0.0.1:{port} ({len(actual)} assets):")
    for asset, upstream in sorted(actual.items()):
        print(f"  {asset} <- {', '.join(upstream) or '(root)'}")
    problems = compare(actual, EXPECTED_LINEAGE)
    print("schedules and sensors:")
    problems += instigator_problems(port)
    if with_runs:
        print("runs of `make run`:")
        problems += run_history_problems(port)
        print("report metadata:")
        problems += chart_problems(port)
    return problems


def main(argv: list[str] | None = None) -> int:
    """See the module docstring; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the UI")
    parser.add_argument(
        "--with-run",
        action="store_true",
        help="run `python -m rag_assets.run` into a temporary instance first, then check runs",
    )
    parser.add_argument(
        "--dagster-home", type=Path, default=None, help="check this instance (with its runs) instead of a temporary one"
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="RAG_DATA_DIR of --dagster-home's runs")
    args = parser.parse_args(argv)
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="rag-dagster-ui-") as tmp:
        home = (args.dagster_home or Path(tmp) / "home").resolve()
        data_dir = (args.data_dir or Path(tmp) / "data").resolve()
        log_path = Path(tmp) / "webserver.log"
        home.mkdir(parents=True, exist_ok=True)
        problems: list[str] = []
        nodes: list[dict] = []
        with open(log_path, "w") as log:
            try:
                if args.with_run:
                    print(f"running `python -m rag_assets.run` into {home} (log: {log_path}) ...", file=sys.stderr)
                    code = make_run(home, data_dir, log)
                    print(f"`make run` exited with {code}", file=sys.stderr)
                server = start_webserver(port, home, data_dir, log)
                try:
                    nodes = wait_for_graph(port, server, args.timeout)
                    if nodes:
                        problems = _ui_checks(port, nodes, args.with_run or args.dagster_home is not None)
                finally:
                    stop(server)
            finally:
                if args.with_run:
                    stop_embedded_servers(data_dir)
        if not nodes:
            print(
                f"the UI on 127.0.0.1:{port} served no asset graph within {args.timeout:.0f}s; "
                f"webserver log:\n{log_path.read_text()[-4000:]}",
                file=sys.stderr,
            )
            return 2
    for problem in problems:
        print(f"MISMATCH: {problem}", file=sys.stderr)
    print("the UI serves what is expected" if not problems else "the UI differs", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
