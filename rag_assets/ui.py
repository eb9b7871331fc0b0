"""``python -m rag_assets.ui [dagster dev options]`` (``make ui``): the Dagster UI and daemon.

Runs ``dagster dev -w workspace.yaml`` (or the options given) on the local instance of
``rag_assets.run.prepare_dagster_home`` and stops it on SIGINT or SIGTERM, also when started in
the background: a shell starts background jobs with SIGINT ignored, and ``dagster dev`` ignores
SIGTERM, so it would outlive a ``kill``. Here both signals become the SIGINT that ``dagster dev``
shuts down on (webserver, daemon, code server); after ``STOP_TIMEOUT_S`` its process group is
killed. Its temporary files (the code server's socket) go to ``$DAGSTER_HOME/tmp``, not the
system temp dir. Exit status: ``dagster dev``'s, 0 after a requested stop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from types import FrameType

from rag_assets.run import prepare_dagster_home

#: Seconds ``dagster dev`` gets to stop its services after SIGINT (it waits up to 10 s per service).
STOP_TIMEOUT_S = 45.0
# `dagster dev` is superseded by `dg dev` (dagster-dg-cli, not installed here); same services.
_QUIET = "ignore:Function `dev_command` is superseded"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python then turns SIGINT into KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run ``dagster dev`` until it exits or this process gets SIGINT/SIGTERM; its exit status."""
    home = prepare_dagster_home()
    tmp = home / "tmp"
    tmp.mkdir(exist_ok=True)
    warnings = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), _QUIET) if w)
    env = os.environ | {"TMPDIR": str(tmp), "PYTHONWARNINGS": warnings}
    args = sys.argv[1:] if argv is None else argv
    cmd = [sys.executable, "-m", "dagster", "dev", *(args or ["-w", "workspace.yaml"])]
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_default_sigint, start_new_session=True)
    deadline: list[float] = []  # set when a stop was asked

    def stop(signum: int, frame: FrameType | None) -> None:
        if not deadline:
            deadline.append(time.monotonic() + STOP_TIMEOUT_S)
        proc.send_signal(signal.SIGINT)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while True:
        try:
            code = proc.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if deadline and time.monotonic() > deadline[0]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # services that did not stop in time
    return 0 if deadline else code


if __name__ == "__main__":
    sys.exit(main())
