"""The contract between the control plane and its backends is explicit (``backends/base.py``):
capabilities declared once, optional operations on the ABC, helpers that take what they use,
and a typed configuration that builds its backend."""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from control_plane.backends.base import Backend, BackendError, Capabilities
from control_plane.backends.config import BackendConfig, KubernetesBackendConfig, LocalBackendConfig
from control_plane.backends.local import LocalBackend
from control_plane.settings import ControlPlaneSettings

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


# -- the backend's configuration ------------------------------------------------------------------


def _serve_args(argv: list[str]) -> argparse.Namespace:
    from control_plane import cli

    parser = argparse.ArgumentParser()
    cli.add_serve_arguments(parser, ControlPlaneSettings())
    return parser.parse_args(argv)


def test_the_backend_flag_alone_chooses_the_backend_and_its_flags() -> None:
    """Can fail: the --k8s-* flags existed only when $IDEGYM_CONTROL_PLANE_BACKEND or this process's
    own argv said kubernetes, so argv handed to the parser was refused; the settings went to the
    control plane as a dict."""
    from control_plane import cli

    args = _serve_args(["--backend", "kubernetes", "--k8s-namespace", "team", "--k8s-image-pull-secrets", "a, b",
                        "--no-k8s-pod-disruption-budget", "--k8s-build-timeout", "60"])
    config = cli.config_from_args(args, ControlPlaneSettings(kubernetes={"IDEGYM_K8S_INSTANCE": "cp-2"}))
    assert isinstance(config.backend, KubernetesBackendConfig)
    assert (config.backend.namespace, config.backend.image_pull_secrets, config.backend.pod_disruption_budget,
            config.backend.build_timeout, config.backend.instance) == ("team", ("a", "b"), False, 60.0, "cp-2")
    local = cli.config_from_args(_serve_args(["--state-dir", "/srv/idegym", "--isolation", "none"]),
                                 ControlPlaneSettings())
    assert local.backend == LocalBackendConfig(state_dir=Path("/srv/idegym"), isolation="none")


def test_a_backend_config_is_told_apart_by_type_and_builds_its_backend(tmp_path: Path) -> None:
    from control_plane.backends.kubernetes import KubernetesBackend

    configs = TypeAdapter(BackendConfig)
    k8s = configs.validate_python({"type": "kubernetes", "namespace": "team", "addressing": "pod-ip",
                                   "kubeconfig": str(tmp_path / "kubeconfig")})
    backend = k8s.build()
    assert isinstance(backend, KubernetesBackend) and backend.config is k8s and backend.addressing == "pod-ip"
    local = configs.validate_json(json.dumps({"type": "local", "state_dir": str(tmp_path), "isolation": "none"}))
    assert isinstance(local.build(), LocalBackend) and local.build().state_dir == tmp_path
    with pytest.raises(ValidationError, match="'local', 'kubernetes'"):
        configs.validate_python({"type": "docker"})
    with pytest.raises(ValidationError, match="isolation"):
        configs.validate_python({"type": "local", "isolation": "chroot"})
    # the control plane's own state directory, unless the local backend's config names one
    from control_plane.config import ControlPlaneConfig

    assert ControlPlaneConfig(state_dir=tmp_path).backend == LocalBackendConfig(state_dir=tmp_path)


def test_a_setting_that_does_not_parse_names_its_variable_or_flag() -> None:
    from control_plane import cli
    from sandbox_server.env_settings import SettingsError

    with pytest.raises(SettingsError, match=r"\$IDEGYM_K8S_BUILD_TIMEOUT='soon': "):
        KubernetesBackendConfig.from_env({"IDEGYM_K8S_BUILD_TIMEOUT": "soon"})
    with pytest.raises(SystemExit, match=r"--k8s-readiness-period-seconds 'often': "):
        cli.config_from_args(_serve_args(["--backend", "kubernetes", "--k8s-readiness-period-seconds", "often"]),
                             ControlPlaneSettings())


# -- the local backend's record of a sandbox --------------------------------------------------------


def _string_key_reads(path: Path) -> list[str]:
    """``data["key"]`` / ``data.get("key")`` on a handle's data (a name ``data`` or a ``.data``)."""

    def is_data(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "data") or (isinstance(node, ast.Attribute)
                                                                      and node.attr == "data")

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        key = None
        if isinstance(node, ast.Subscript) and is_data(node.value):
            key = node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop")
              and is_data(node.func.value) and node.args):
            key = node.args[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_local_backend_reads_a_sandbox_s_record_through_its_model() -> None:
    """Can fail: ~95 reads of ``handle.data`` by string keys across ``backends/local``."""
    reads = [r for path in sorted((BACKENDS / "local").glob("*.py")) for r in _string_key_reads(path)]
    assert reads == [], "read a sandbox's record through LocalHandleData (backends/local/handle_data.py)"


def test_a_local_sandbox_s_record_is_one_json_on_disk_and_in_the_database_and_old_ones_load(tmp_path: Path) -> None:
    """The handle's data (the database) and ``sandbox.json`` are the same ``LocalHandleData``; a
    record in the shape earlier versions stored (``v``, explicit nulls, no ``forks``) is observed
    and deleted like a new one."""
    from control_plane.backends.base import SandboxHandle
    from control_plane.backends.local.handle_data import LocalHandleData
    from control_plane.backends.local.layout import read_meta
    from tests.local_helpers import LoopThread, spec

    loop = LoopThread()
    backend = LocalBackend(tmp_path / "state", isolation="none", orphan_ttl=None)
    try:
        loop.run(backend.start())
        handle = loop.run(backend.create(spec("record"), 60))
        record = LocalHandleData.of(handle.data)
        assert record.server is not None and record.socket.endswith(".sock") and record.space == "sandboxes"
        assert handle.data == record.dump() and read_meta(Path(record.dir)) == record
        old = {key: value for key, value in handle.data.items() if key not in ("forks", "owned", "adopted", "forked")}
        old.update(v=1, network_peer=None, snapshot=None, a_key_of_a_later_version={"kept": True})
        earlier = SandboxHandle.from_json({**handle.to_json(), "data": old})
        assert LocalHandleData.of(old).dump()["a_key_of_a_later_version"] == {"kept": True}
        assert loop.run(backend.observe(earlier)).running
        loop.run(backend.delete(earlier))
        assert not Path(record.dir).exists() and not loop.run(backend.observe(earlier)).exists
    finally:
        loop.run(backend.close())
        loop.close()
