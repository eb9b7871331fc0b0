"""Start the Dagster UI on the rag_assets workspace and check the asset graph it serves.

    .venv/bin/python scripts/check_dagster_ui.py [--port N] [--timeout S]

Starts ``dagster-webserver -w workspace.yaml`` on 127.0.0.1 (a free port) with a temporary
DAGSTER_HOME (the repo's dagster.yaml copied in) and a temporary RAG_DATA_DIR, without the
daemon, so no schedule or sensor fires. Asks the GraphQL API for every asset node's key and
upstream keys, prints the lineage, compares it with ``EXPECTED_LINEAGE`` and shuts the server
down. Exit status 0 when the graph matches, 1 when it differs, 2 when the UI did not come up.
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
    "l0_index": ["knowledge_documents"],
    "milvus_collection": ["chunks", "l0_index"],
    "pgvector_table": ["chunks"],
    "golden_cases": [],
    "retrieval_fixtures_milvus": ["golden_cases", "milvus_collection"],
    "retrieval_fixtures_pgvector": ["golden_cases", "pgvector_table"],
    "golden_evaluation_milvus": ["golden_cases", "retrieval_fixtures_milvus"],
    "golden_evaluation_pgvector": ["golden_cases", "retrieval_fixtures_pgvector"],
    "baseline_report": ["golden_evaluation_milvus"],
    "comparison_report": ["golden_evaluation_milvus", "golden_evaluation_pgvector",
                          "retrieval_fixtures_milvus", "retrieval_fixtures_pgvector"],
    "publish_reports": ["baseline_report", "comparison_report"],
    "retrieval_history": ["golden_evaluation_milvus", "golden_evaluation_pgvector"],
    "tool_invocation": [],
    "trace_tables": ["tool_invocation"],
    # One self-contained asset per golden suite (golden/suites.yaml): ingest, record, evaluate.
    "golden_suite_sample": [],
    "golden_suite_runbooks_en": [],
    "golden_suite_runbooks_en_hard": [],
    "golden_suite_runbooks_zh": [],
}

QUERY = "{ assetNodes { assetKey { path } dependencyKeys { path } groupName } }"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str, timeout: float = 10.0) -> dict:
    """POST ``query`` to the UI's GraphQL endpoint; returns ``data`` (RuntimeError on errors)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql",
                                     data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
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
    return {"/".join(n["assetKey"]["path"]): sorted("/".join(d["path"]) for d in n["dependencyKeys"])
            for n in nodes}


def compare(actual: dict[str, list[str]], expected: dict[str, list[str]]) -> list[str]:
    """Human-readable differences between two lineages ([] when equal)."""
    problems = [f"missing asset {k}" for k in sorted(expected.keys() - actual.keys())]
    problems += [f"unexpected asset {k}" for k in sorted(actual.keys() - expected.keys())]
    problems += [f"{k}: upstream {actual[k]} != expected {sorted(expected[k])}"
                 for k in sorted(expected.keys() & actual.keys()) if actual[k] != sorted(expected[k])]
    return problems


def start_webserver(port: int, home: Path, data_dir: Path, log) -> subprocess.Popen:
    """``dagster-webserver -w workspace.yaml`` in its own process group (so it can be stopped
    with its code-server children)."""
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "RAG_DATA_DIR": str(data_dir)}
    return subprocess.Popen([str(WEBSERVER), "-w", str(ROOT / "workspace.yaml"),
                             "-h", "127.0.0.1", "-p", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


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


def main(argv: list[str] | None = None) -> int:
    """See the module docstring; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the UI")
    args = parser.parse_args(argv)
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="rag-dagster-ui-") as tmp:
        home, log_path = Path(tmp) / "home", Path(tmp) / "webserver.log"
        home.mkdir()
        with open(log_path, "w") as log:
            server = start_webserver(port, home, Path(tmp) / "data", log)
            try:
                nodes = wait_for_graph(port, server, args.timeout)
            finally:
                stop(server)
        if not nodes:
            print(f"the UI on 127.0.0.1:{port} served no asset graph within {args.timeout:.0f}s; "
                  f"webserver log:\n{log_path.read_text()[-4000:]}", file=sys.stderr)
            return 2
    actual = lineage(nodes)
    print(f"asset graph served by the Dagster UI on 127.0.0.1:{port} ({len(actual)} assets):")
    for asset, upstream in sorted(actual.items()):
        print(f"  {asset} <- {', '.join(upstream) or '(root)'}")
    problems = compare(actual, EXPECTED_LINEAGE)
    for problem in problems:
        print(f"MISMATCH: {problem}", file=sys.stderr)
    print("graph matches the expected lineage" if not problems else "graph differs", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
