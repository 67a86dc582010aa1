"""A control plane as on another machine, for the tests that drive one from outside."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from benchmarks._servers import private_view, task_data_dirs
from tests.cp_helpers import ControlPlaneProcess

STATE_PARENT = Path("/var/tmp")  # not under /tmp: the control plane's /tmp is its own


def remote_control_plane(name: str, extra: list[str] = ()) -> ControlPlaneProcess:
    """A control plane as on another machine; its URL carries its credentials."""
    state = Path(tempfile.mkdtemp(prefix=f"idegym-{name}-", dir=STATE_PARENT)) / "state"
    password = os.urandom(16).hex()
    cp = ControlPlaneProcess(state, ["--auth", f"idegym:{password}", "--ephemeral", "--remove-state", *extra],
                             build_roots=[], wrap=lambda argv: private_view(argv, task_data_dirs()))
    cp.auth = ("idegym", password)
    cp.http.auth = cp.auth
    cp.url = f"http://idegym:{password}@127.0.0.1:{cp.port}"
    return cp


def stop_remote(cp: ControlPlaneProcess) -> None:
    cp.stop()
    shutil.rmtree(cp.state_dir.parent, ignore_errors=True)


def uploaded_bytes(cp: ControlPlaneProcess) -> int:
    """Bytes the control plane received as uploads, from its /metrics."""
    text = cp.http.get("/metrics").text
    return sum(int(float(v)) for v in re.findall(r"^idegym_client_upload_bytes_total\{[^}]*\} (\S+)$", text, re.M))
