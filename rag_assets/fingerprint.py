"""Change detection for the knowledge sensor: size and mtime per file, contents only of the
files whose size or mtime moved.

The files are the ones ingestion reads (``rag_core.ingest.documents.markdown_files``: the same
walker), so a hidden directory or a symlink the ingest skips never triggers a run, and a file
the ingest reads always can. A tick stats every file (cheap: no file is opened) and compares the
stat digest with the cursor's; only when it moved does it load the per-file state
(``<data_dir>/sensor/knowledge_files.json``: doc id -> size, mtime ns, sha256 of the bytes) and
hash the files that are new or whose size or mtime changed. The content digest is computed from
the per-file hashes, so a tick never re-reads the unchanged files: at 100k files, an edit costs
one read, not 100k (``bench/kb_scale.py``, its sensor table). A ``touch`` or a checkout that
rewrites identical bytes costs one read and no ingest run.

The Dagster cursor holds the two digests only (a cursor is stored with every tick; 100k entries
do not belong there). A lost or foreign state file costs one full hash, never a wrong answer:
each entry carries the stat it was hashed at.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from rag_assets.files import write_text_atomic
from rag_core.ingest.documents import markdown_files

#: Metadata key of ``knowledge_documents``: the stat digest of the files that ingest read.
STAT_DIGEST_KEY = "knowledge_stat_sha256"
#: Cursor format: 2 = content digest over per-file hashes (version 1 hashed the bytes in a row).
CURSOR_VERSION = 2
STATE_VERSION = 1

#: (size in bytes, mtime in ns) of a file, or (-1, errno) when it cannot be stat'ed.
Stat = tuple[int, int]


@dataclass(frozen=True)
class Fingerprint:
    """``stat``: sha256 over (doc id, size, mtime ns) per file; ``content``: over (doc id,
    sha256 of the bytes) per file, or ``None`` when not computed. ``files``: how many files."""

    stat: str
    content: str | None
    files: int

    def cursor(self) -> str:
        """The sensor cursor (JSON) holding both digests."""
        return json.dumps({"v": CURSOR_VERSION, "stat": self.stat, "content": self.content, "files": self.files})


def parse_cursor(cursor: str | None) -> Fingerprint | None:
    """The fingerprint stored in a cursor; ``None`` for no cursor or another format version."""
    try:
        data = json.loads(cursor or "")
        if data.get("v") != CURSOR_VERSION:
            return None
        return Fingerprint(str(data["stat"]), data.get("content"), int(data.get("files", 0)))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _stat(path: Path) -> Stat:
    # lstat: a symlinked file is judged by the link (ingestion refuses links leading outside
    # the root; an in-root target is walked as a file of its own).
    try:
        st = path.lstat()
        return st.st_size, st.st_mtime_ns
    except OSError as exc:  # vanished between the walk and the stat: a change
        return -1, exc.errno or 0


def _stat_line(doc_id: str, stat: Stat) -> bytes:
    size, mtime = stat
    facts = f"unreadable\0{mtime}" if size < 0 else f"{size}\0{mtime}"
    return f"{doc_id}\0{facts}\n".encode()


def stat_files(root: Path) -> tuple[str, dict[str, tuple[Path, Stat]]]:
    """The stat digest of the ingested files under ``root`` and, per doc id (sorted), the
    file and its (size, mtime ns)."""
    h = hashlib.sha256()
    files: dict[str, tuple[Path, Stat]] = {}
    for doc_id, path in markdown_files(root):
        stat = _stat(path)
        files[doc_id] = (path, stat)
        h.update(_stat_line(doc_id, stat))
    return h.hexdigest(), files


def stat_digest(root: Path) -> tuple[str, list[Path]]:
    """sha256 over (doc id, size, mtime) of the ingested files, and the files."""
    digest, files = stat_files(root)
    return digest, [path for path, _ in files.values()]


def file_hash(path: Path) -> str:
    """sha256 of the file's bytes (an unreadable file hashes as its error)."""
    try:
        body = path.read_bytes()
    except OSError as exc:
        body = f"unreadable {exc.errno}".encode()
    return hashlib.sha256(body).hexdigest()


def _load_state(state_path: Path, root: Path) -> dict[str, tuple[int, int, str]]:
    """doc id -> (size, mtime ns, sha256) from the state file; {} when missing, unreadable, of
    another version or of another root (the next tick then hashes every file once)."""
    try:
        data = json.loads(state_path.read_text(encoding="utf-8"))
        if data.get("v") != STATE_VERSION or data.get("root") != str(Path(root).resolve()):
            return {}
        return {k: (int(v[0]), int(v[1]), str(v[2])) for k, v in data["files"].items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError):
        return {}


def _save_state(state_path: Path, root: Path, state: dict[str, tuple[int, int, str]]) -> None:
    payload = {"v": STATE_VERSION, "root": str(Path(root).resolve()), "files": state}
    write_text_atomic(state_path, json.dumps(payload, separators=(",", ":")))


@dataclass(frozen=True)
class Tick:
    """What one evaluation computed: the fingerprint and how many files it read (hashed)."""

    fingerprint: Fingerprint
    hashed: int


def fingerprint(root: Path, previous: Fingerprint | None, state_path: Path) -> Tick:
    """The fingerprint of ``root`` now. When the stat digest equals ``previous``'s nothing is
    read; else only files that are new or whose (size, mtime) differs from ``state_path``'s
    entry are hashed, and the state file is rewritten."""
    stat, files = stat_files(root)
    if previous is not None and previous.stat == stat and previous.content is not None:
        return Tick(previous, 0)
    known = _load_state(state_path, root)
    state: dict[str, tuple[int, int, str]] = {}
    content = hashlib.sha256()
    hashed = 0
    for doc_id, (path, (size, mtime)) in files.items():  # sorted by doc id (markdown_files)
        entry = known.get(doc_id)
        if entry is not None and entry[0] == size and entry[1] == mtime and size >= 0:
            digest = entry[2]
        else:
            digest, hashed = file_hash(path), hashed + 1
        state[doc_id] = (size, mtime, digest)
        content.update(f"{doc_id}\0{digest}\n".encode())
    if state != known:
        _save_state(state_path, root, state)
    return Tick(Fingerprint(stat, content.hexdigest(), len(files)), hashed)
