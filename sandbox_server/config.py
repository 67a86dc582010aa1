"""Server configuration: CLI flags, with their variables as defaults (``settings.py``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .env_settings import env_flag  # noqa: F401 - how tests read a flag as the server does
from .settings import DEFAULT_HEADER_TIMEOUT

# Variables the server uses for itself; tools never see them.
PRIVATE_ENV_PREFIXES = ("IDEGYM_",)
PRIVATE_ENV = {"PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "PYTHONSAFEPATH", "PYTHONNOUSERSITE"}


@dataclass
class ServerConfig:
    project: Path = Path(".project")
    project_source: Path | None = None  # a directory or archive with the pristine project; reset restores it
    # Overlay reset: the read-only lower tree and a directory for the writable layer.
    overlay_lower: Path | None = None
    overlay_layer: Path | None = None
    state_dir: Path | None = None
    owns_state_dir: bool = False  # created by the server itself: removed at shutdown
    host: str = "127.0.0.1"
    port: int = 8000
    unix_socket: Path | None = None
    tool_user: str | None = None
    root_tools: bool = True  # False: no tool runs as uid 0, whatever a request's `user` says
    file_roots: list[Path] = field(default_factory=list)
    max_body_bytes: int = 256 << 20
    max_timeout: float = 24 * 3600.0
    runner_concurrency: int = field(default_factory=lambda: os.cpu_count() or 2)
    plugins: tuple[str, ...] = ("tools", "rewards", "project", "code-runner")
    tool_env: dict[str, str] = field(default_factory=dict)
    inherit_env: bool = True
    log_json: bool = False
    log_level: str = "WARNING"
    ready_fd: int | None = None
    memory_events: Path | None = None  # the sandbox's memory.oom_control / memory.events (OOM reporting)
    isolated_runs: bool = False  # every code-runner run in namespaces of its own (jail.py)
    run_memory_max: int | None = None  # each isolated run's memory limit (in its own cgroups: jail.py)
    runner_template: bool = True  # isolated Python runs forked from a template interpreter (run_template.py)
    tool_spawner: bool = True  # the tool user's tools started by a process that is that user (spawner.py)
    tool_cgroups: Path | None = None  # the tools' delegated cgroups, <dir>/<controller> (tool_cgroups.py)
    header_timeout: float = DEFAULT_HEADER_TIMEOUT  # a request head must be complete this soon (web.py)
    in_pod: bool = False  # a pod of the Kubernetes backend isolates this server

    def tool_environment(self) -> dict[str, str]:
        """The base environment of every tool process: no variable of the server's own."""
        base = dict(os.environ) if self.inherit_env else {"PATH": os.environ.get("PATH", os.defpath)}
        env = {
            k: v
            for k, v in base.items()
            if k not in PRIVATE_ENV and not k.startswith(PRIVATE_ENV_PREFIXES)
        }
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env.setdefault("LANG", "C.UTF-8")
        env.update(self.tool_env)
        return env


