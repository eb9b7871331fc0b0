"""The ``rag`` console script: the command line, or one line naming the ``cli`` extra when the
core was installed without it."""

from __future__ import annotations

import sys

_CLI_PACKAGES = ("typer", "rich", "click")


def main() -> None:
    """Run ``rag_core.cli.app``; exit 2 with one line when its packages are not installed."""
    try:
        from rag_core.cli import app
    except ModuleNotFoundError as exc:
        if exc.name not in _CLI_PACKAGES:
            raise
        print(f"rag: the command line needs the cli extra: pip install 'rag-retrieval[cli]' ({exc})", file=sys.stderr)
        raise SystemExit(2) from None
    app()
