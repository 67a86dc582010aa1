"""What the integration tests share: a control plane for the module, the bundled fix, server states."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idegym_env.tasks import load_task
from tests.cp_helpers import ControlPlaneProcess

TASK = "python-roman-numerals"


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneProcess]:
    """One local control plane for a test module (ephemeral: it deletes its sandboxes on exit)."""
    root: Path = tmp_path_factory.mktemp("cp")
    proc = ControlPlaneProcess(root / "state", ["--warm-pool", "0", "--ephemeral"], backend="local")
    yield proc
    proc.stop()


def fix_arguments() -> dict[str, Any]:
    """The arguments of the bundled task's known fix (an edit_file call)."""
    call = load_task(TASK).solution[0]
    assert call.tool == "edit_file"
    return call.arguments.model_dump()


def fix_call_json() -> str:
    return json.dumps({"name": "edit_file", "arguments": fix_arguments()})


def server_counts(cp: ControlPlaneProcess) -> dict[str, int]:
    """How many servers the control plane has in each availability (its /metrics gauge)."""
    counts: dict[str, int] = {}
    for line in cp.http.get("/metrics").text.splitlines():
        if line.startswith("idegym_servers{"):
            label, value = line.rsplit(" ", 1)
            counts[label.split('availability="', 1)[1].split('"', 1)[0]] = int(float(value))
    return counts


def alive(cp: ControlPlaneProcess) -> int:
    """Servers handed out and not given back (ALIVE or REUSED)."""
    counts = server_counts(cp)
    return counts.get("ALIVE", 0) + counts.get("REUSED", 0)
