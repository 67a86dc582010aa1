"""What the environment says to a sandbox server: the defaults of its flags (``cli.py``) and what
has no flag. Read once per server, in ``cli.config_from_args`` (a server the zygote forks reads
its own environment, not the zygote's); nothing below reads ``os.environ`` for configuration.
"""

from __future__ import annotations

from pathlib import Path

from .env_settings import EnvSettings, variable

DEFAULT_HEADER_TIMEOUT = 10.0


class ServerSettings(EnvSettings):
    """The sandbox server's variables (see the module docstring)."""

    project: Path = variable("IDEGYM_PROJECT_PATH", "the project directory: tools' working directory and the base "
                             "of relative paths", Path(".project"), flag="--project")
    project_source: Path | None = variable(
        ("IDEGYM_PROJECT_ARCHIVE", "IDEGYM_PROJECT_ARCHIVE_PATH"), "the pristine project (a directory or a "
        ".tar.gz/.zip archive) that reset restores", flag="--project-source")
    host: str = variable("IDEGYM_SERVER_HOST", "the TCP address (pods use 0.0.0.0)", "127.0.0.1", flag="--host")
    port: int = variable("IDEGYM_SERVER_PORT", "the TCP port", 8000, flag="--port")
    unix_socket: Path | None = variable("IDEGYM_SERVER_UNIX_SOCKET", "listen on this Unix socket instead of TCP",
                                        flag="--unix-socket")
    server_id: str | None = variable("IDEGYM_SERVER_ID", "the server's id, set by the Kubernetes backend (a pod)")
    tool_user: str | None = variable("IDEGYM_TOOL_USER", "the user tools run as when a request names none",
                                     flag="--tool-user", shown="the server's user")
    isolated_runs: bool = variable("IDEGYM_ISOLATED_RUNS", "every code-runner program in namespaces of its own",
                                   False, flag="--isolated-runs")
    tool_spawner: bool = variable(
        "IDEGYM_TOOL_SPAWNER", "start the tool user's tools from a process that already is that user (0: each "
        "the long way); a control plane passes its own value to its servers", True, flag="--tool-spawner")
    memory_events: Path | None = variable(
        "IDEGYM_MEMORY_EVENTS", "the sandbox's cgroup memory.oom_control or memory.events file (OOM reporting)",
        flag="--memory-events", shown="/sys/fs/cgroup/memory.events when present")
    tool_cgroups: Path | None = variable("IDEGYM_TOOL_CGROUPS", "the directory of the tools' delegated cgroup v1 "
                                         "groups, one per controller", flag="--tool-cgroups")
    header_timeout: float = variable(
        "IDEGYM_SERVER_HEADER_TIMEOUT", "seconds a request head may take from the connection's start or the "
        "request's first byte; slower connections are closed", DEFAULT_HEADER_TIMEOUT)
    log_json: bool = variable("IDEGYM_LOG_JSON", "one JSON object per log line", False, flag="--log-json")
    log_level: str = variable("IDEGYM_LOG_LEVEL", "WARNING; INFO logs one line per request", "WARNING",
                              flag="--log-level")
    kubernetes_service_host: str | None = variable(
        "KUBERNETES_SERVICE_HOST", "set in every pod: the server says it runs isolated in one")
