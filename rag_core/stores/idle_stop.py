"""Idle stop for the embedded servers (Milvus and PostgreSQL of a data dir).

Whoever starts an embedded server also starts this watchdog, a small detached process::

    python -m rag_core.stores.idle_stop_main {milvus|postgres} DATA_DIR PID SECONDS

It stops the server ``PID`` once no client has been connected for ``SECONDS`` (the setting
``RAG_EMBEDDED_IDLE_STOP_SECONDS``) and exits when the server is gone. "Connected" is read
from the server side: established TCP connections of the Milvus process, client backend
processes of the PostgreSQL postmaster (one per connection, titled ``... [local] ...`` or with
the client's ``host(port)``). So a long-lived agent service holding a connection keeps its
server, while servers left behind by finished CLI or Dagster runs go away.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

_TCP_CLIENT = re.compile(r"\d\(\d+\)")
KINDS = ("milvus", "postgres")


def spawn_watchdog(kind: str, data_dir: Path, pid: int, seconds: float) -> None:
    """Start the detached watchdog for server ``pid`` of ``kind`` in ``data_dir``."""
    if kind not in KINDS:
        raise ValueError(f"unknown server kind {kind!r}")
    subprocess.Popen(
        [sys.executable, "-m", "rag_core.stores.idle_stop_main", kind, str(data_dir), str(pid), repr(float(seconds))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def client_connections(kind: str, pid: int) -> int:
    """Number of clients connected to server ``pid`` (raises psutil.NoSuchProcess when gone)."""
    proc = psutil.Process(pid)
    if kind == "milvus":
        return sum(1 for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_ESTABLISHED)
    count = 0
    for child in proc.children():
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "[local]" in title or _TCP_CLIENT.search(title):
            count += 1
    return count


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def watch(kind: str, pid: int, seconds: float, stop: Callable[[], None], poll: float | None = None) -> str:
    """Block until server ``pid`` is gone (``"gone"``) or was stopped with ``stop()`` after
    ``seconds`` idle (``"stopped"``). ``poll`` defaults to a quarter of ``seconds`` within
    [0.2, 15] s. The caller gives ``stop`` (``idle_stop_main``), so this module needs neither server's."""
    poll = poll if poll is not None else min(max(seconds / 4, 0.2), 15.0)
    last_busy = time.monotonic()
    while True:
        time.sleep(poll)
        if not _alive(pid):
            return "gone"
        try:
            busy = client_connections(kind, pid) > 0
        except psutil.Error:
            return "gone"
        now = time.monotonic()
        if busy:
            last_busy = now
        elif now - last_busy >= seconds:
            stop()
            return "stopped"
