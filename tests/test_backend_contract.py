"""The contract between the control plane and its backends is explicit (``backends/base.py``):
capabilities declared once, optional operations on the ABC, helpers that take what they use,
and a typed configuration that builds its backend."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from control_plane.backends.base import Backend, BackendError, Capabilities
from control_plane.backends.local import LocalBackend

CONTROL_PLANE = Path(__file__).resolve().parents[1] / "control_plane"
BACKENDS = CONTROL_PLANE / "backends"


def _mentions_backend(node: ast.expr) -> bool:
    text = ast.unparse(node).lower()
    return "backend" in text or "builder" in text


def _contract_breaches() -> list[str]:
    """Reflection on a backend (or its builder) and reads of a backend's private attributes."""
    found = []
    for path in sorted(CONTROL_PLANE.rglob("*.py")):
        where = path.relative_to(CONTROL_PLANE.parent)
        in_backend = BACKENDS in path.parents
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("hasattr", "getattr") and node.args):
                target = node.args[0]
                if _mentions_backend(target) or (in_backend and ast.unparse(target) in ("self", "cls")):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                  and _mentions_backend(node.value)):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_probes_a_backend_or_reads_its_private_parts() -> None:
    """Can fail: the service asked ``hasattr(backend, "reserve_nodes")``, ``getattr(backend,
    "warm_pool", True)``…; Kubernetes' fork read ``backend._pods``."""
    assert _contract_breaches() == [], "declare it on Backend (base.py) or in Capabilities instead"


def test_the_abc_says_not_supported_for_what_a_backend_lacks(tmp_path: Path) -> None:
    import asyncio

    backend = LocalBackend(tmp_path / "state", isolation="none")
    assert isinstance(backend, Backend)
    caps = backend.capabilities
    assert caps == Capabilities(snapshots=True, fork=False)  # plain processes: nothing to stack for a fork
    assert caps.warm_pool and not caps.restart_in_place and not caps.node_reservation
    with pytest.raises(BackendError) as err:
        asyncio.run(backend.reserve_nodes("trainer", 2))
    assert err.value.status == 400 and "does not reserve nodes" in err.value.message
    asyncio.run(backend.release_nodes("trainer"))  # nothing reserved: nothing to release
    assert LocalBackend(tmp_path / "bwrap", isolation="bwrap").capabilities.fork
