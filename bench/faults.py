"""Fault injection end to end on the English runbook corpus (issue 12): ``make faults``.

Runs the ``faults``-marked tests (``tests/test_faults.py``: what each fault injects and checks)
and prints one line per fault: what was injected, what the product did, rows lost (must be 0),
lookups failed (must be 0), PASS/FAIL. Exit 1 on any FAIL.

    python -m bench.faults [--knowledge-dir DIR] [--only row1 row6 ...] [--lookups 150]
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RUNBOOKS, log, parse_command_line
from rag_core.settings import PROJECT_ROOT

TESTS = PROJECT_ROOT / "tests" / "test_faults.py"
FAULTS = ("row1", "row2", "row5", "row6", "row7", "row8", "trace", "filters", "row9", "row10")


class FaultRows:
    """pytest plugin: prints each fault test's row (its ``fault_row`` property) as it ends, and a
    FAIL row for a test that raised before making one (the index set-up included)."""

    def __init__(self) -> None:
        self.printed = 0
        self.out = sys.stdout  # pytest's own report goes to stderr (``main``)

    def pytest_runtest_logreport(self, report: Any) -> None:
        row = dict(report.user_properties).get("fault_row")
        if report.failed and not row:
            crash = getattr(report.longrepr, "reprcrash", None)
            reason = (crash.message if crash else str(report.longrepr)).strip().splitlines()[0][:200]
            name = report.nodeid.rsplit("[", 1)[-1].rstrip("]")
            row = f"{name:6} | injected: - | product: bench step raised: {reason} | FAIL"
        elif report.when != "call" or not row:
            return
        print(row, file=self.out, flush=True)
        self.printed += 1


def main(argv: Sequence[str] | None = None) -> int:
    import pytest

    options: dict[str, dict[str, Any]] = {
        "--knowledge-dir": dict(type=Path, default=RUNBOOKS),
        "--only": dict(nargs="*", choices=FAULTS, help="run only these faults"),
        "--lookups": dict(type=int, default=150, help="lookups per latency series (row 6)"),
    }
    args = parse_command_line(__doc__, options, argv, prog="python -m bench.faults")
    if not args.knowledge_dir.is_dir():
        print(f"knowledge dir {args.knowledge_dir} not found (RUNBOOKS corpus)")
        return 2
    os.environ["RAG_FAULTS_KNOWLEDGE_DIR"] = str(args.knowledge_dir)
    os.environ["RAG_FAULTS_LOOKUPS"] = str(args.lookups)
    select = ["-k", " or ".join(f"{name}_" for name in args.only)] if args.only else []  # row1_ is not row10
    rows = FaultRows()
    log(f"running {TESTS.name} (-m faults)")
    with contextlib.redirect_stdout(sys.stderr):  # pytest's own report beside the logs
        code = pytest.main([str(TESTS), "-m", "faults", "-s", "-p", "no:cacheprovider", *select], plugins=[rows])
    return 0 if code == 0 and rows.printed else 1


if __name__ == "__main__":
    raise SystemExit(main())
