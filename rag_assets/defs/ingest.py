"""Ingest group: the knowledge documents and their chunks (stages 1a/1b of rag_core's ingest).

``knowledge_documents`` is the first asset of every ingest and the only document scan of a
refresh; a missing or empty knowledge directory fails it with a clear message, so nothing
downstream runs on an empty corpus. ``chunks`` writes ``<data_dir>/tables/chunks.parquet`` and
hands its path on; ``ingest_plan`` (index group) reads the chunks back from that file.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import polars as pl

from rag_assets.defs.resources import EmbedderResource, RagSettingsResource
from rag_assets.files import write_parquet_atomic
from rag_assets.fingerprint import STAT_DIGEST_KEY, stat_digest
from rag_assets.layout import AssetFiles
from rag_assets.metadata import issues_table, md_table, table_schema
from rag_core.ingest.plan import DocumentScan
from rag_core.models import Chunk, DocumentIssue

CHUNK_COLUMNS = {
    "chunk_id": "stable id: sha1(doc id, heading path, ordinal)",
    "doc_id": "path relative to the knowledge root (POSIX)",
    "title": "document title",
    "breadcrumb": "heading path, 'Title > H2 > H3'",
    "category": "frontmatter category or first folder",
    "ordinal": "position of the chunk in its document (0-based)",
    "start": "character offset into the document body",
    "end": "character offset (exclusive)",
    "chars": "characters of chunk text",
    "tokens": "word pieces of the embedded text (header + text)",
    "content_hash": "hash of everything embedded or stored",
    "text": "chunk text",
}


@dataclass(frozen=True)
class ChunkTable:
    """What ``chunks`` hands downstream: the Parquet file (``path``, ``rows`` rows), the doc ids
    it chunked and the documents that could not be chunked."""

    path: str
    rows: int
    doc_ids: tuple[str, ...]
    issues: tuple[DocumentIssue, ...]


@dg.asset(group_name="ingest", kinds={"markdown"})
def knowledge_documents(context: dg.AssetExecutionContext, rag: RagSettingsResource) -> dg.Output[DocumentScan]:
    """Every loadable Markdown document under the knowledge directory (frontmatter parsed), as a
    ``DocumentScan`` (root, documents, issues). Files over RAG_MAX_DOCUMENT_BYTES are skipped.

    Bad documents are skipped and listed with path, line and reason. Fails (dg.Failure) when
    the directory is missing, not a directory, or holds no loadable document.
    """
    from rag_core.ingest.plan import scan_knowledge

    settings = rag.get_settings()
    root = settings.knowledge_dir
    try:
        scan = scan_knowledge(root, settings.max_document_bytes)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise dg.Failure(
            description=f"knowledge directory unusable: {exc}. Set RAG_KNOWLEDGE_DIR "
            "(or the rag resource's knowledge_dir) to a directory of Markdown files.",
            metadata={"knowledge_dir": str(root)},
            allow_retries=False,
        ) from None
    docs, issues = scan.documents, scan.issues
    if not docs:
        raise dg.Failure(
            description=f"no loadable Markdown document (.md, .markdown) under {root} "
            f"({len(issues)} file(s) skipped); nothing to ingest",
            metadata={"knowledge_dir": str(root), "skipped_documents": issues_table(issues)},
            allow_retries=False,
        )
    for issue in issues:
        context.log.warning("skipped %s", issue)
    categories = Counter(d.category or "(none)" for d in docs)
    return dg.Output(
        scan,
        metadata={
            "dagster/row_count": len(docs),
            "document_count": len(docs),
            "skipped_count": len(issues),
            "skipped_documents": issues_table(issues),
            "categories": dg.MetadataValue.md(md_table(["category", "documents"], sorted(categories.items()))),
            "knowledge_dir": dg.MetadataValue.path(str(root.resolve())),
            # what the change sensor compares its first tick with (rag_assets.fingerprint)
            STAT_DIGEST_KEY: stat_digest(root)[0],
        },
    )


def chunk_frame(chunks: list[Chunk], count_tokens: Callable[[str], int]) -> pl.DataFrame:
    """One row per chunk with the columns of ``CHUNK_COLUMNS`` (typed even when empty)."""
    schema = {
        "chunk_id": pl.Utf8,
        "doc_id": pl.Utf8,
        "title": pl.Utf8,
        "breadcrumb": pl.Utf8,
        "category": pl.Utf8,
        "ordinal": pl.Int64,
        "start": pl.Int64,
        "end": pl.Int64,
        "chars": pl.Int64,
        "tokens": pl.Int64,
        "content_hash": pl.Utf8,
        "text": pl.Utf8,
    }
    rows = [
        {
            "chunk_id": c.chunk_id,
            "doc_id": c.doc_id,
            "title": c.title,
            "breadcrumb": c.breadcrumb,
            "category": c.category,
            "ordinal": c.ordinal,
            "start": c.start,
            "end": c.end,
            "chars": len(c.text),
            "tokens": count_tokens(c.embed_text),
            "content_hash": c.content_hash,
            "text": c.text,
        }
        for c in chunks
    ]
    return pl.DataFrame(rows, schema=schema)


CHUNK_FIELDS = (
    "chunk_id",
    "doc_id",
    "title",
    "breadcrumb",
    "category",
    "text",
    "start",
    "end",
    "ordinal",
    "content_hash",
)


def read_chunks(table: ChunkTable) -> list[Chunk]:
    """The chunks of ``table`` read back from its Parquet file, in file order.

    Raises dg.Failure when the file is missing or holds another row count (rewritten by another
    run since): the plan must be made from the chunks this run produced.
    """
    path = Path(table.path)
    if not path.is_file():
        raise dg.Failure(description=f"chunk table {path} is missing: materialize chunks again")
    frame = pl.read_parquet(path, columns=list(CHUNK_FIELDS))
    if frame.height != table.rows:
        raise dg.Failure(
            description=f"chunk table {path} has {frame.height} rows, {table.rows} were written "
            "by the upstream chunks run (rewritten since?): materialize chunks again"
        )
    return [Chunk(**row) for row in frame.iter_rows(named=True)]


@dg.asset(group_name="ingest", kinds={"polars", "parquet"})
def chunks(
    context: dg.AssetExecutionContext,
    rag: RagSettingsResource,
    embedder: EmbedderResource,
    knowledge_documents: DocumentScan,
) -> dg.Output[ChunkTable]:
    """Heading-delimited chunks of the documents, written to ``<data_dir>/tables/chunks.parquet``
    (the ``ChunkTable`` handed on names the file; ``ingest_plan`` reads it back).

    Sized with the embedding model's tokenizer and window. A document that cannot be chunked is
    skipped and listed; the rest are written.
    """
    from rag_core.components import chunk_checks
    from rag_core.ingest.pipeline import chunk_token_limit
    from rag_core.ingest.plan import chunk_scan

    settings = rag.get_settings()
    model = embedder.get()  # its tokenizer and window size the chunks
    limit = chunk_token_limit(settings, model)
    chunked = chunk_scan(knowledge_documents.documents, model.count_tokens, limit, chunk_checks(settings))
    for issue in chunked.issues:
        context.log.warning("not chunked: %s", issue)
    frame = chunk_frame(list(chunked.chunks), model.count_tokens)
    path = write_parquet_atomic(frame, AssetFiles.under(settings.data_dir).chunks_parquet)
    tokens = frame["tokens"]
    table = ChunkTable(str(path), frame.height, tuple(d.doc_id for d in chunked.documents), chunked.issues)
    return dg.Output(
        table,
        metadata={
            "dagster/row_count": frame.height,
            "dagster/column_schema": table_schema(frame, CHUNK_COLUMNS),
            "documents_chunked": len(chunked.documents),
            "skipped_documents": issues_table(list(chunked.issues)),
            "max_tokens": int(tokens.max() or 0),
            "mean_tokens": float(tokens.mean() or 0.0),
            "path": dg.MetadataValue.path(str(path)),
        },
    )
