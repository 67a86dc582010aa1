"""``import idegym_env.client`` (and the env) loads no server code: of ``control_plane`` and
``sandbox_server`` only their wire modules (models, routes, errors, the shared constants), which
import nothing but pydantic and the standard library; no aiohttp, h11, backend or server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

# What the client may load of the server packages: the wire shapes and the names both sides share.
WIRE_MODULES = {
    "control_plane", "control_plane.auth", "control_plane.constants", "control_plane.errors",
    "control_plane.image_tags", "control_plane.models", "control_plane.pod_spec", "control_plane.quantities",
    "control_plane.tree_pack",
    "sandbox_server", "sandbox_server.env_settings", "sandbox_server.errors", "sandbox_server.grading",
    "sandbox_server.grading.models", "sandbox_server.http", "sandbox_server.models", "sandbox_server.routes",
}
# Third-party packages: pydantic for the wire models, Gymnasium (and numpy) because importing
# ``idegym_env`` registers its environments. PyYAML loads when a build needs it; neither client
# needs httpx.
THIRD_PARTY = {"pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection",
               "gymnasium", "numpy", "farama_notifications", "cloudpickle"}


def _loaded(statement: str) -> set[str]:
    """The modules a fresh interpreter has once it ran ``statement``."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                         check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def _third_party(modules: set[str]) -> set[str]:
    tops = {name.split(".")[0] for name in modules}
    return {top for top in tops - set(sys.stdlib_module_names) - {"idegym_env", "control_plane", "sandbox_server"}
            if not top.startswith("_") and top != "cython_runtime"}


def test_the_client_loads_only_wire_modules_of_the_servers() -> None:
    loaded = _loaded("import idegym_env.client")
    ours = {name for name in loaded if name.split(".")[0] in ("control_plane", "sandbox_server")}
    assert ours == WIRE_MODULES, (f"server code loaded: {sorted(ours - WIRE_MODULES)}; "
                                  f"no longer loaded: {sorted(WIRE_MODULES - ours)}")
    assert _third_party(loaded) <= THIRD_PARTY, sorted(_third_party(loaded) - THIRD_PARTY)


@pytest.mark.parametrize("module", ["idegym_env.env", "idegym_env.embedded", "idegym_env.settings"])
def test_the_env_loads_no_server(module: str) -> None:
    loaded = _loaded(f"import {module}")
    servers = {name for name in loaded
               if name.startswith(("control_plane.backends", "control_plane.app", "control_plane.service",
                                   "control_plane.config", "sandbox_server.app", "sandbox_server.web",
                                   "aiohttp", "h11", "uvloop", "kubernetes"))}
    assert not servers, sorted(servers)


# The module of each ``idegym`` command, which builds its arguments and runs it.
COMMAND_MODULES = {
    "sandbox": "sandbox_server.cli", "control-plane": "control_plane.cli", "openenv": "idegym_env.openenv.server",
    "sandboxes": "control_plane.sandboxes_cli", "mcp": "idegym_env.integrations.mcp_cli",
    "eval": "idegym_env.eval.cli", "images": "control_plane.backends.local.oci.cli",
    "tasks": "idegym_env.tasks.sources.validate",
}


@pytest.mark.parametrize("argv", [["--help"], ["tasks", "list", "--help"], ["eval", "--help"]])
def test_the_cli_loads_only_the_module_of_its_command(argv: list[str]) -> None:
    loaded = _loaded(f"from idegym_env.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass")
    chosen = {COMMAND_MODULES[argv[0]]} if argv[0] in COMMAND_MODULES else set()
    assert {module for module in COMMAND_MODULES.values() if module in loaded} == chosen
    assert "aiohttp" not in loaded
