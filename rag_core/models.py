"""Data shapes shared by ingestion, the stores and the lookup pipeline.

These are plain dataclasses (no I/O) so every stage can be tested with small inputs.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class CamelModel(BaseModel):
    """Base of every model the agent receives: snake_case in Python, camelCase in JSON
    (``model_dump()`` and ``model_dump_json()`` use the aliases; either name is accepted)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)


@dataclass(frozen=True)
class DocumentIssue:
    """A problem with one knowledge document: the document is skipped, the batch goes on.

    ``path`` is the doc id (POSIX path relative to the knowledge root) or the absolute path
    when the file is outside the root; ``line`` is 1-based when known; ``heading`` is the
    breadcrumb of the chunk at fault when the problem is in one chunk (e.g. a bad embedding).
    """

    path: str
    reason: str
    line: int | None = None
    heading: str | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        if self.heading:
            where = f"{where} ({self.heading})"
        return f"{where}: {self.reason}"


@dataclass(frozen=True)
class KnowledgeDocument:
    """One Markdown document after frontmatter parsing.

    ``body`` is the Markdown after the frontmatter block, with ``\\r\\n`` normalised to
    ``\\n`` and any BOM removed; chunk offsets index into it. ``body_line_offset`` is the
    number of source lines before the body (to report 1-based source lines). ``warnings``
    are problems that did not stop the document (e.g. a repeated frontmatter key).
    """

    doc_id: str
    title: str
    category: str
    body: str
    keywords: tuple[str, ...] = ()
    entities: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    h1: str | None = None
    priority: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    body_line_offset: int = 0
    warnings: tuple[DocumentIssue, ...] = ()


def embed_text(breadcrumb: str, text: str) -> str:
    """What a chunk is embedded as: its breadcrumb (which starts with the title) as a header,
    a blank line, then its text."""
    return f"{breadcrumb}\n\n{text}"


def content_hash(title: str, breadcrumb: str, category: str, text: str) -> str:
    """``Chunk.content_hash``: sha256 (hex) of the lexical analyzer version, title, breadcrumb,
    category and text; chunking stores it, ingest diffs on it and ``rag doctor`` recomputes it."""
    # The analyzer version is in the hash because the stores keep the text's lexical tokens too;
    # imported here so the models do not load the analyzer's stemmer and jieba.
    from rag_core.text import LEXICAL_ANALYZER_VERSION

    joined = f"{LEXICAL_ANALYZER_VERSION}\x1f{title}\x1f{breadcrumb}\x1f{category}\x1f{text}"
    return hashlib.sha256(joined.encode()).hexdigest()


@dataclass(frozen=True)
class Chunk:
    """A heading-delimited piece of one document.

    ``start``/``end`` are character offsets into ``KnowledgeDocument.body`` (end exclusive);
    ``text`` is ``body[start:end]``, except for the continuation pieces of a split table, whose
    ``text`` repeats the table's header rows before the slice. ``breadcrumb`` is the heading path joined with
    ``" > "`` and starts with the document title. ``chunk_id`` is stable across runs:
    ``sha1(doc_id, heading path, ordinal)``. ``content_hash`` (:func:`content_hash`) covers everything that is
    embedded or stored, so a change in title, breadcrumb, category or text re-embeds.
    """

    chunk_id: str
    doc_id: str
    title: str
    breadcrumb: str
    category: str
    text: str
    start: int
    end: int
    ordinal: int
    content_hash: str

    @property
    def embed_text(self) -> str:
        """Text given to the embedding model: :func:`embed_text` of its breadcrumb and text."""
        return embed_text(self.breadcrumb, self.text)


@dataclass(frozen=True)
class StoreHit:
    """One chunk returned by a store search.

    ``raw_score`` is the store's own number and ``score_label`` says what it means
    (``"milvus_cosine_similarity[-1,1]"``, ``"pgvector_cosine_distance[0,2]"``). ``similarity``
    is the normalised cosine similarity in [0, 1] (negative cosines clipped to 0), the only
    number thresholds and reports compare across stores. ``channel`` is ``"dense"`` for a
    vector search hit and ``"lexical"`` for a full-text (BM25) hit; ``lexical_score``
    is that channel's own score when it is a lexical hit.
    """

    chunk_id: str
    doc_id: str
    title: str
    breadcrumb: str
    category: str
    text: str
    raw_score: float
    score_label: str
    similarity: float
    channel: str = "dense"
    lexical_score: float | None = None

    def __post_init__(self) -> None:
        # Any non-finite score claims nothing (0): results must always be strict JSON (issue 12).
        for name in ("raw_score", "similarity", "lexical_score"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                object.__setattr__(self, name, 0.0)
