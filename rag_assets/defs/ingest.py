"""Ingest group: the knowledge documents and their chunks.

``knowledge_documents`` is the first asset of every ingest; a missing or empty knowledge
directory fails it with a clear message, so nothing downstream runs on an empty corpus.
"""

from collections import Counter

import dagster as dg
import polars as pl

from rag_assets.defs.resources import RagSettingsResource
from rag_assets.files import write_parquet_atomic
from rag_assets.layout import AssetFiles
from rag_assets.metadata import issues_table, md_table, table_schema
from rag_core.models import Chunk, KnowledgeDocument

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


@dg.asset(group_name="ingest", kinds={"markdown"})
def knowledge_documents(context: dg.AssetExecutionContext,
                        rag: RagSettingsResource) -> dg.Output[list[KnowledgeDocument]]:
    """Every loadable Markdown document under the knowledge directory (frontmatter parsed).

    Bad documents are skipped and listed with path, line and reason. Fails (dg.Failure) when
    the directory is missing, not a directory, or holds no loadable document.
    """
    from rag_core.ingest.documents import scan_documents

    root = rag.get_settings().knowledge_dir
    try:
        docs, issues = scan_documents(root)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise dg.Failure(
            description=f"knowledge directory unusable: {exc}. Set RAG_KNOWLEDGE_DIR "
                        "(or the rag resource's knowledge_dir) to a directory of Markdown files.",
            metadata={"knowledge_dir": str(root)}, allow_retries=False,
        ) from None
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
    return dg.Output(docs, metadata={
        "dagster/row_count": len(docs),
        "document_count": len(docs),
        "skipped_count": len(issues),
        "skipped_documents": issues_table(issues),
        "categories": dg.MetadataValue.md(md_table(["category", "documents"],
                                                   sorted(categories.items()))),
        "knowledge_dir": dg.MetadataValue.path(str(root.resolve())),
    })


def chunk_frame(chunks: list[Chunk], count_tokens) -> pl.DataFrame:
    """One row per chunk with the columns of ``CHUNK_COLUMNS`` (typed even when empty)."""
    schema = {"chunk_id": pl.Utf8, "doc_id": pl.Utf8, "title": pl.Utf8, "breadcrumb": pl.Utf8,
              "category": pl.Utf8, "ordinal": pl.Int64, "start": pl.Int64, "end": pl.Int64,
              "chars": pl.Int64, "tokens": pl.Int64, "content_hash": pl.Utf8, "text": pl.Utf8}
    rows = [{"chunk_id": c.chunk_id, "doc_id": c.doc_id, "title": c.title,
             "breadcrumb": c.breadcrumb, "category": c.category, "ordinal": c.ordinal,
             "start": c.start, "end": c.end, "chars": len(c.text),
             "tokens": count_tokens(c.embed_text), "content_hash": c.content_hash, "text": c.text}
            for c in chunks]
    return pl.DataFrame(rows, schema=schema)


@dg.asset(group_name="ingest", kinds={"polars", "parquet"})
def chunks(context: dg.AssetExecutionContext, rag: RagSettingsResource,
           knowledge_documents: list[KnowledgeDocument]) -> dg.MaterializeResult:
    """Heading-delimited chunks of the documents, written to ``<data_dir>/tables/chunks.parquet``.

    A document that cannot be chunked is skipped and listed; the rest are written.
    """
    from rag_core.embedding import make_embedder
    from rag_core.ingest.pipeline import IngestReport, chunk_documents

    settings = rag.get_settings()
    embedder = make_embedder(settings)  # its tokenizer and window size the chunks
    report = IngestReport(knowledge_dir=str(settings.knowledge_dir))
    kept, chunk_list = chunk_documents(knowledge_documents, settings, report, embedder)
    for issue in report.skipped:
        context.log.warning("not chunked: %s", issue)
    frame = chunk_frame(chunk_list, embedder.count_tokens)
    path = write_parquet_atomic(frame, AssetFiles.under(settings.data_dir).chunks_parquet)
    tokens = frame["tokens"]
    return dg.MaterializeResult(metadata={
        "dagster/row_count": frame.height,
        "dagster/column_schema": table_schema(frame, CHUNK_COLUMNS),
        "documents_chunked": len(kept),
        "skipped_documents": issues_table(report.skipped),
        "max_tokens": int(tokens.max() or 0),
        "mean_tokens": float(tokens.mean() or 0.0),
        "path": dg.MetadataValue.path(str(path)),
    })
