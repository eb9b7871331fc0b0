"""Change detection for the knowledge sensor: size and mtime first, content only on a change.

The files are the ones ingestion reads (``rag_core.ingest.documents.markdown_files``: the same
walker), so a hidden directory or a symlink the ingest skips never triggers a run, and a file
the ingest reads always can. A tick stats every file (cheap); only when a size or mtime moved
does it hash the contents, so a ``touch`` or a checkout that rewrites identical bytes costs one
read and no ingest run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from rag_core.ingest.documents import doc_id_for, markdown_files

#: Metadata key of ``knowledge_documents``: the stat digest of the files that ingest read.
STAT_DIGEST_KEY = "knowledge_stat_sha256"


@dataclass(frozen=True)
class Fingerprint:
    """``stat``: sha256 over (doc id, size, mtime ns) per file; ``content``: over (doc id,
    bytes), or ``None`` when not computed. ``files``: how many files were seen."""

    stat: str
    content: str | None
    files: int

    def cursor(self) -> str:
        """The sensor cursor (JSON) holding both digests."""
        return json.dumps({"stat": self.stat, "content": self.content, "files": self.files})


def parse_cursor(cursor: str | None) -> Fingerprint | None:
    """The fingerprint stored in a cursor; ``None`` for no cursor or an older format."""
    try:
        data = json.loads(cursor or "")
        return Fingerprint(str(data["stat"]), data.get("content"), int(data.get("files", 0)))
    except (ValueError, TypeError, KeyError):
        return None


def _stat_line(path: Path, root: Path) -> bytes:
    # lstat: a symlinked file is judged by the link (ingestion refuses links leading outside
    # the root; an in-root target is walked as a file of its own).
    try:
        st = path.lstat()
        facts = f"{st.st_size}\0{st.st_mtime_ns}"
    except OSError as exc:  # vanished between the walk and the stat: a change
        facts = f"unreadable\0{exc.errno}"
    return f"{doc_id_for(path, root)}\0{facts}\n".encode()


def stat_digest(root: Path) -> tuple[str, list[Path]]:
    """sha256 over (doc id, size, mtime) of the ingested files, and the files."""
    files = markdown_files(root)
    h = hashlib.sha256()
    for path in files:
        h.update(_stat_line(path, root))
    return h.hexdigest(), files


def content_digest(root: Path, files: list[Path]) -> str:
    """sha256 over (doc id, bytes) of ``files`` (an unreadable file counts as its error)."""
    h = hashlib.sha256()
    for path in files:
        try:
            body = path.read_bytes()
        except OSError as exc:
            body = f"unreadable {exc.errno}".encode()
        h.update(doc_id_for(path, root).encode() + b"\0" + body + b"\0")
    return h.hexdigest()


def fingerprint(root: Path, previous: Fingerprint | None) -> Fingerprint:
    """The fingerprint of ``root`` now; contents are hashed only when the stat digest differs
    from ``previous`` (or there is none)."""
    stat, files = stat_digest(root)
    if previous is not None and previous.stat == stat:
        return previous
    return Fingerprint(stat, content_digest(root, files), len(files))
