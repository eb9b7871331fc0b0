"""`rag --help` starts without the stacks its commands load when they run (issue 46.5)."""

import json
import subprocess
import sys

# Modules a command loads when it runs (models, stores, L0, evaluation, orchestration), each a
# fraction of a second or more to import; `rag --help` needs none of them.
HEAVY = (
    "jieba",
    "pymilvus",
    "psycopg",
    "dagster",
    "onnxruntime",
    "rag_core.recording.record",
    "rag_core.evaluation.evaluator",
    "rag_core.lookup.tool",
)

PROBE = f"""
import json, sys
sys.argv = ["rag", "--help"]
from rag_core.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)
"""


def test_help_loads_no_heavy_module():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert "lookup" in done.stdout and "eval" in done.stdout  # the help lists the commands
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
