"""What every ``rag`` command shares: the console, settings and the embedder, each failing with
one line and exit code 2 (shared by the command modules of ``rag_core.cli``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from rag_core.settings import RagSettings

if TYPE_CHECKING:
    from rag_core.embedding import Embedder

__all__ = ["console", "embedder_or_exit", "settings_or_exit"]

console = Console()


def settings_or_exit(**overrides: Any) -> RagSettings:
    """Settings from the environment; an invalid value exits 2 with the setting named."""
    try:
        return RagSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            console.print(f"[red]invalid setting RAG_{field.upper()}: {err['msg']}[/red]")
        raise typer.Exit(2) from None


def embedder_or_exit(settings: RagSettings) -> Embedder:
    """The configured embedder; a model that cannot load exits 2 with one line naming the setting."""
    from rag_core.components import make_embedder
    from rag_core.embedding import EmbedderLoadError

    try:
        return make_embedder(settings)
    except EmbedderLoadError as exc:
        console.print(f"[red]embedding model unavailable: {exc}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
