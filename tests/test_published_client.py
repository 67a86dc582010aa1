"""The published idegym-client 0.13.1 (Python 3.12, its own venv) against our control plane."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.cp_helpers import ControlPlaneProcess
from tests.side_venvs import CLIENT_VENV, side_venv

CLIENT_PYTHON = CLIENT_VENV / "bin" / "python"
SCRIPT = Path(__file__).with_name("published_client_lifecycle.py")


def test_published_client_whole_life_cycle(cp_local: ControlPlaneProcess) -> None:
    cp = cp_local
    side_venv(CLIENT_VENV)  # fails (not skips) without it: `make test` installs it
    deps = subprocess.run([str(CLIENT_PYTHON), "-c", "import idegym.client, diff_match_patch"],
                          capture_output=True, text=True)
    assert deps.returncode == 0, deps.stderr
    assert cp.auth is not None, "the control plane requires its token by default"
    credentials = {"IDEGYM_AUTH_USERNAME": cp.auth[0], "IDEGYM_AUTH_PASSWORD": cp.auth[1]}
    proc = subprocess.run([str(CLIENT_PYTHON), str(SCRIPT), cp.address], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **credentials})
    steps = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    names = [s.get("step") for s in steps]
    for expected in ("register", "start", "bash", "files", "upload-download", "sandbox-error", "rewards",
                     "keepalive-list-status-capabilities", "restart", "snapshot", "finish", "reuse-reset", "stop",
                     "second-server", "stop-client"):
        assert expected in names, (expected, names)
    assert steps[-1] == {"done": True, "b64": "b2s="}
    # stop-client tore every server down
    client_id = next(s["client_id"] for s in steps if s.get("step") == "register")
    servers = cp.http.get("/api/idegym-servers", params={"client_id": client_id,
                                                         "include_terminal": "true"}).json()["servers"]
    assert servers and all(s["availability"] in ("STOPPED",) for s in servers), servers
