"""The embedded Milvus of a data dir: one local Milvus server process shared by every process.

Engine: the C++ server of ``milvus-lite`` 2.5 (``milvus_lite/lib/milvus <db file> <host:port>``),
chosen by measurement over Milvus Lite 3's pure-Python engine (see the issue note of issue 14
and ``bench/scale.py``): at 20k rows dense search 3.7 ms vs 82 ms, BM25 1.0 ms vs 15 ms.
Catches accepted: no HNSW (FLAT is exact and fast enough up to ~100k chunks), IVF ignores
``nprobe``, ``milvus_lite/__init__`` imports ``pkg_resources`` (``setuptools<81``), and its
on-disk format (an SQLite file) differs from Milvus Lite 3's (a directory).

Files in the data dir:

* ``milvus.db`` - the data (SQLite file of the engine; the file mode opens the same file);
* ``milvus_server.json`` - pid, host, port, engine and version, start time of the live server;
* ``milvus_server.lock`` - :class:`filelock.FileLock` serialising start, restart and stop;
* ``milvus_server.log`` - the server's output, its log lines at ``RAG_MILVUS_LOG_LEVEL`` (default ERROR);
* ``milvus_tmp/`` and ``.cache/milvus/`` - the server's temporary files and mmap cache (nothing goes
  to the system temp dir or the home directory).

Every process calls :func:`ensure_server`: under the lock it reuses the server of the state file
when that pid is alive and is the engine on this data dir, else it starts one bound to
127.0.0.1 on a free port, detached (own session), so it outlives the starter. Clients reach it
by URI (``http://127.0.0.1:PORT``), the code path of a production Milvus. A watchdog
(:mod:`rag_core.stores.idle_stop`) stops it after ``idle_stop_seconds`` without client
connections. :func:`stop_server` stops it; :func:`server_status` reports it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

from rag_core.fileio import write_text_atomic
from rag_core.stores.base import StoreError

log = logging.getLogger(__name__)

ENGINE = "milvus-lite"
HOST = "127.0.0.1"
DB_NAME = "milvus.db"
STATE_NAME = "milvus_server.json"
LOCK_NAME = "milvus_server.lock"
LOG_NAME = "milvus_server.log"
TMP_NAME = "milvus_tmp"
_GLOG_LEVELS = {"DEBUG": 0, "INFO": 0, "WARN": 1, "WARNING": 1, "ERROR": 2, "FATAL": 3}
LOCK_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 60.0
START_ATTEMPTS = 3
STOP_TIMEOUT_S = 10.0
_SQLITE_MAGIC = b"SQLite format 3\x00"
# Popen handles of servers this process started: polled so a dead child is reaped, not a zombie.
_children: dict[int, subprocess.Popen[bytes]] = {}


class ForeignFormatError(StoreError):
    """The data dir's Milvus data was written by another engine / on-disk format."""


@dataclass(frozen=True)
class ServerState:
    """One running embedded Milvus server (the content of ``milvus_server.json``)."""

    pid: int
    host: str
    port: int
    engine: str
    engine_version: str
    db_path: str
    started_at: float  # Unix time, seconds
    idle_stop_seconds: float

    @property
    def uri(self) -> str:
        return f"http://{self.host}:{self.port}"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view with ``uri`` and ``uptime_s`` added."""
        return {**asdict(self), "uri": self.uri, "uptime_s": round(time.time() - self.started_at, 1)}


# --- paths, engine, on-disk format -------------------------------------------------------------


def _paths(data_dir: Path) -> tuple[Path, Path, Path, Path]:
    d = Path(data_dir).expanduser().resolve()
    return d / DB_NAME, d / STATE_NAME, d / LOCK_NAME, d / LOG_NAME


def engine_version() -> str:
    """Installed milvus-lite version (``"unknown"`` when not installed)."""
    try:
        return importlib.metadata.version("milvus-lite")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def server_binary() -> Path:
    """The engine's server executable inside the milvus-lite package. StoreError when absent."""
    spec = importlib.util.find_spec("milvus_lite")  # does not run milvus_lite/__init__ (pkg_resources)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        binary = Path(loc) / "lib" / "milvus"
        if binary.is_file():
            return binary
    raise StoreError(
        f"the embedded Milvus server binary is missing (milvus-lite {engine_version()} installed; "
        "the pinned milvus-lite==2.5.1 ships milvus_lite/lib/milvus): reinstall the project, or set "
        "RAG_MILVUS_URI to a Milvus server"
    )


def check_format(db: Path) -> None:
    """ForeignFormatError when ``db`` exists and is not this engine's format (an SQLite file).

    Milvus Lite 3 writes a directory at the same path; anything else unreadable is refused too,
    before a server is started on it, so nothing is overwritten.
    """
    rebuild = (
        "run `rag ingest --rebuild` to rebuild the index from the documents (the old data "
        "is kept beside it), or point RAG_DATA_DIR elsewhere"
    )
    if db.is_dir():
        raise ForeignFormatError(
            f"{db} was written by Milvus Lite 3 (a directory); the embedded engine "
            f"({ENGINE} {engine_version()}) stores an SQLite file: {rebuild}"
        )
    if db.is_file() and db.stat().st_size > 0:
        with db.open("rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
        if head != _SQLITE_MAGIC:
            raise ForeignFormatError(f"{db} is not a {ENGINE} {engine_version()} data file: {rebuild}")


def set_aside_foreign(data_dir: Path) -> Path | None:
    """Rename a foreign-format ``milvus.db`` to ``milvus.db.foreign-<unix time>`` (for --rebuild).

    Returns the new path, or None when the data is in this engine's format (nothing moved).
    Runs under the server lock so no server starts meanwhile.
    """
    db, _, lock, _ = _paths(data_dir)
    db.parent.mkdir(parents=True, exist_ok=True)
    with _locked(lock, data_dir):
        try:
            check_format(db)
            return None
        except ForeignFormatError:
            target = db.with_name(f"{db.name}.foreign-{int(time.time())}")
            db.rename(target)
            log.warning("moved the foreign-format Milvus data %s aside to %s", db, target)
            return target


# --- state --------------------------------------------------------------------------------------


def _read_state(state_path: Path) -> ServerState | None:
    try:
        raw = json.loads(state_path.read_text(encoding="utf-8"))
        return ServerState(**raw)
    except (OSError, ValueError, TypeError):  # absent, half-written or from another version
        return None


def _write_state(state_path: Path, state: ServerState) -> None:
    write_text_atomic(state_path, json.dumps(asdict(state), indent=2))  # a reader never sees half a file


def _is_our_server(state: ServerState) -> bool:
    """True when ``state.pid`` is alive and is the engine serving ``state.db_path``.

    A pid from a killed server may have been reused by another program: the command line
    must name the binary and the data file.
    """
    return _serves(state.pid, state.db_path)


def _serves(pid: int, db_path: str) -> bool:
    """True when ``pid`` is a live (not zombie) engine process on ``db_path``."""
    _reap()
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmd = proc.cmdline()
    except psutil.Error:
        return False
    return len(cmd) >= 2 and Path(cmd[0]).name == "milvus" and cmd[1] == db_path


def _reap() -> None:
    for pid, child in list(_children.items()):
        if child.poll() is not None:
            _children.pop(pid, None)


def _live_state(data_dir: Path, cleanup: bool = True) -> ServerState | None:
    """The state of the live server of ``data_dir``; a stale state file is removed when
    ``cleanup`` (only under the lock: unlocked, a fresh file written meanwhile could go)."""
    db, state_path, _, _ = _paths(data_dir)
    state = _read_state(state_path)
    if state is None:
        return None
    if state.db_path == str(db) and _is_our_server(state):
        return state
    if not cleanup:
        return None
    log.info("removing stale embedded Milvus state %s (pid %s is gone)", state_path, state.pid)
    state_path.unlink(missing_ok=True)
    return None


class _locked:
    """The server lock of a data dir; StoreError (naming the dir) when it cannot be taken in time."""

    def __init__(self, lock_path: Path, data_dir: Path, timeout: float = LOCK_TIMEOUT_S):
        self._lock = FileLock(str(lock_path), timeout=timeout)
        self._data_dir, self._timeout = data_dir, timeout

    def __enter__(self) -> None:
        try:
            self._lock.acquire()
        except Timeout:
            raise StoreError(
                f"timed out after {self._timeout:.0f}s waiting for another process to "
                f"start or stop the embedded Milvus in {self._data_dir}"
            ) from None

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


# --- start / status / stop ----------------------------------------------------------------------


def ensure_server(data_dir: Path, idle_stop_seconds: float = 0.0) -> ServerState:
    """The live embedded Milvus server of ``data_dir``, started when none runs.

    Safe from several processes and threads at once (one wins the lock and starts the server,
    the others then find it). Raises ForeignFormatError when ``milvus.db`` holds another
    engine's data, StoreError when the server cannot start (its log is named).
    """
    db, _, lock, _ = _paths(data_dir)
    db.parent.mkdir(parents=True, exist_ok=True)
    state = _live_state(data_dir, cleanup=False)  # fast path without the lock
    if state is not None:
        return state
    with _locked(lock, data_dir):
        state = _live_state(data_dir)
        if state is not None:
            return state
        return _start(data_dir, idle_stop_seconds)


def restart_if_dead(data_dir: Path, seen_pid: int | None, idle_stop_seconds: float = 0.0) -> ServerState | None:
    """After a failed call: the server to reconnect to, or None when ``seen_pid`` still serves.

    When the server the caller used (``seen_pid``) is dead, another process may already have
    started a new one (it is returned); otherwise one is started here, once.
    """
    state = _live_state(data_dir, cleanup=False)
    if state is not None and state.pid == seen_pid:
        return None
    return ensure_server(data_dir, idle_stop_seconds)


def server_status(data_dir: Path) -> ServerState | None:
    """The live server of ``data_dir`` or None."""
    return _live_state(data_dir, cleanup=False)


def stop_server(data_dir: Path, expect_pid: int | None = None, timeout: float = STOP_TIMEOUT_S) -> ServerState | None:
    """Stop the embedded server of ``data_dir``; returns what was stopped, None when none ran.

    ``expect_pid`` (the idle watchdog) stops only that server, not a newer one. SIGTERM, then
    SIGKILL after ``timeout`` s. Flushed data is on disk (every ingest flushes its writes).
    """
    db, state_path, lock, _ = _paths(data_dir)
    if not Path(data_dir).exists():
        # The data dir was deleted under a running server (no lock file to take): stop the
        # given pid only when it is the engine on that path.
        if expect_pid is not None and _serves(expect_pid, str(db)):
            _terminate(expect_pid, timeout)
        return None
    with _locked(lock, data_dir):
        state = _live_state(data_dir)
        if state is None or (expect_pid is not None and state.pid != expect_pid):
            return None
        _terminate(state.pid, timeout)
        state_path.unlink(missing_ok=True)
        log.info("stopped the embedded Milvus of %s (pid %d)", data_dir, state.pid)
        return state


def _terminate(pid: int, timeout: float) -> None:
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
    except psutil.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    except psutil.NoSuchProcess:
        pass
    _reap()


def _free_port(host: str) -> int:
    # The OS picks an unused port; another program may take it before the server binds, which
    # the start loop detects (the server exits) and retries with a new port.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _start(data_dir: Path, idle_stop_seconds: float) -> ServerState:
    db, state_path, _, log_path = _paths(data_dir)
    check_format(db)
    binary = server_binary()
    reasons = []
    for _ in range(START_ATTEMPTS):
        port = _pick_port(HOST)
        proc = _spawn(binary, db, port, log_path)
        reason = _wait_listening(proc, port)
        if reason is None:
            state = ServerState(
                pid=proc.pid,
                host=HOST,
                port=port,
                engine=ENGINE,
                engine_version=engine_version(),
                db_path=str(db),
                started_at=time.time(),
                idle_stop_seconds=idle_stop_seconds,
            )
            _write_state(state_path, state)
            _children[proc.pid] = proc
            if idle_stop_seconds > 0:
                from rag_core.stores.idle_stop import spawn_watchdog

                spawn_watchdog("milvus", db.parent, proc.pid, idle_stop_seconds)
            log.info(
                "started the embedded Milvus (%s %s) for %s at %s, pid %d%s; `rag server stop` stops it",
                ENGINE,
                state.engine_version,
                db.parent,
                state.uri,
                proc.pid,
                f", stops after {idle_stop_seconds:.0f}s idle" if idle_stop_seconds > 0 else "",
            )
            return state
        reasons.append(f"port {port}: {reason}")
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
    raise StoreError(f"could not start the embedded Milvus for {db.parent} ({'; '.join(reasons)}); see {log_path}")


def _pick_port(host: str) -> int:
    """A free port (indirection so tests can hand out a busy one)."""
    return _free_port(host)


def _spawn(binary: Path, db: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    level = os.environ.get("RAG_MILVUS_LOG_LEVEL", "ERROR")
    tmp = db.parent / TMP_NAME
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(binary.parent), env.get("LD_LIBRARY_PATH")) if p)
    # glog writes one log file per start into the system temp dir unless told otherwise: send its
    # lines to stderr (milvus_server.log) at the server's level. The engine's other temporary files
    # go to <data dir>/milvus_tmp, its mmap cache ($HOME/.cache/milvus) under the data dir.
    env |= {
        "GLOG_logtostderr": "1",
        "GLOG_minloglevel": str(_GLOG_LEVELS.get(level.upper(), _GLOG_LEVELS["ERROR"])),
        "TMPDIR": str(tmp),
        "HOME": str(db.parent),
    }
    with log_path.open("ab") as log_file:
        log_file.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} start on {HOST}:{port}\n".encode())
        log_file.flush()
        # Own session: the server survives the starter and a Ctrl-C in the starter's terminal.
        return subprocess.Popen(
            [str(binary), str(db), f"{HOST}:{port}", level],
            cwd=str(db.parent),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def _wait_listening(proc: subprocess.Popen[bytes], port: int, timeout: float = READY_TIMEOUT_S) -> str | None:
    """None once ``proc`` itself listens on ``port``; else why not (it exited / timed out).

    Checking that the server's own pid holds the listening socket (not merely that something
    answers on the port) tells a port taken by another program from a ready server.
    """
    deadline = time.monotonic() + timeout
    ps = psutil.Process(proc.pid)
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return f"the server exited with code {code} (port in use?)"
        try:
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                for c in ps.net_connections(kind="tcp")
            ):
                return None
        except psutil.Error:
            pass
        time.sleep(0.05)
    return f"not listening after {timeout:.0f}s"


def describe(state: ServerState | None) -> str:
    """One line for humans: where the server runs, or that none does."""
    if state is None:
        return "not running"
    return (
        f"{state.engine} {state.engine_version} at {state.uri}, pid {state.pid}, "
        f"up {time.time() - state.started_at:.0f}s, data {state.db_path}"
    )


if __name__ == "__main__":  # pragma: no cover - manual use: python -m rag_core.stores.milvus_server DIR
    print(describe(ensure_server(Path(sys.argv[1]))))
