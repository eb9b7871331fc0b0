"""`make ui` (rag_assets.ui): no first-visit pop-up, a stop on SIGINT/SIGTERM also in the background,
temporary files under DAGSTER_HOME (issue 46.7, 46.8). Starts a real `dagster dev` (slow: ~1 min)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import dagster as dg
import pytest

from rag_assets.layout import LOCAL_INSTANCE_YAML

DEFS = "import dagster as dg\n\n\n@dg.asset\ndef one() -> int:\n    return 1\n\n\ndefs = dg.Definitions(assets=[one])\n"


def test_local_instance_turns_the_onboarding_pop_up_off(tmp_path, monkeypatch):
    with dg.instance_for_test() as fresh:
        assert fresh.nux_enabled  # Dagster's default, which the local instance overrides
    shutil.copyfile(LOCAL_INSTANCE_YAML, tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert not dg.DagsterInstance.from_config(str(tmp_path)).nux_enabled


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a shell does to a background job


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_ui_started_in_the_background_stops_on_signal(tmp_path, signum):
    (tmp_path / "defs.py").write_text(DEFS)
    (tmp_path / "workspace.yaml").write_text("load_from:\n  - python_file: defs.py\n")
    home, system_tmp = tmp_path / "home", tmp_path / "system_tmp"
    system_tmp.mkdir()
    port = _free_port()
    env = os.environ | {"DAGSTER_HOME": str(home), "TMPDIR": str(system_tmp)}
    cmd = [sys.executable, "-m", "rag_assets.ui", "-w", "workspace.yaml", "-p", str(port)]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, preexec_fn=_ignore_sigint, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 240
        while not _listening(port) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert _listening(port), "the UI never listened"
        started = time.monotonic()
        proc.send_signal(signum)
        assert proc.wait(timeout=90) == 0
        assert time.monotonic() - started < 90
        output = proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the wrapper is not a group leader: its child is
            proc.kill()
    assert not _listening(port)
    assert "SupersessionWarning" not in output and "Shutting down Dagster services" in output
    assert not list(system_tmp.iterdir())  # the code server's socket went to DAGSTER_HOME/tmp
