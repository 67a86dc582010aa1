"""What the environment says to a process that uses IdeGym: a client, an env, a trainer, the eval
harness, the integrations and the OpenEnv server. Read in one place, ``ClientSettings.from_env()``
(``sandbox_server/env_settings.py`` says how); nothing below reads ``os.environ``.

The rule for where sandboxes come from is :func:`chosen_control_plane`: the URL a caller gives,
else ``$IDEGYM_URL``, else (``None``) an embedded control plane.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from control_plane.constants import default_state_dir
from sandbox_server.env_settings import EnvSettings, variable

from .errors import ConfigurationError


class ClientSettings(EnvSettings):
    """The variables of a process that uses IdeGym (see the module docstring)."""

    error = ConfigurationError

    url: str | None = variable(
        "IDEGYM_URL", "the control plane to use (credentials may be in it: `http://idegym:<token>@host:port`); "
        "unset: the env, the integrations, the eval harness and the OpenEnv server start an embedded one, "
        "`IdeGymClient()` refuses", flag="--control-plane-url")
    auth_username: str | None = variable(
        "IDEGYM_AUTH_USERNAME", "HTTP Basic user for the control plane (what the published `idegym-client` reads "
        "too)")
    auth_password: str = variable("IDEGYM_AUTH_PASSWORD", "its password (a tenant's or the control plane's token)",
                                  "", shown="–", secret=True)
    token_file: Path | None = variable(
        "IDEGYM_TOKEN_FILE", "a file holding the control plane's token (user `idegym`), used when neither the "
        "URL nor `$IDEGYM_AUTH_USERNAME` gives credentials")
    state_dir: Path | None = variable(
        "IDEGYM_CONTROL_PLANE_STATE_DIR", "the local control plane's state directory, whose token a client uses "
        "for a loopback URL or a Unix socket when nothing else gives credentials", shown="~/.local/state/idegym")
    xdg_state_home: str | None = variable("XDG_STATE_HOME", "the default state directory is `$XDG_STATE_HOME/idegym`",
                                          shown="~/.local/state")
    embedded_state_root: Path | None = variable(
        "IDEGYM_EMBEDDED_STATE_ROOT", "where embedded control planes make their state directories",
        shown="the temporary directory")
    embedded_grace: float = variable(
        "IDEGYM_EMBEDDED_GRACE", "seconds the embedded control plane outlives its last user, so that the next "
        "`gym.make` finds it (0: it stops at once)", 60.0)
    eval_parallel: int = variable("IDEGYM_EVAL_PARALLEL", "episodes `idegym eval` runs at a time", 1,
                                  flag="--parallel")
    task_cache: Path | None = variable(
        "IDEGYM_TASK_CACHE", "where task sources keep fetched sources and built repositories",
        shown="~/.cache/idegym/tasks")
    swe_python: str | None = variable(
        "IDEGYM_SWE_PYTHON", "the interpreter (with pytest) that proves SWE tasks on this machine",
        shown="this interpreter")
    task: str | None = variable(
        "IDEGYM_TASK", "the OpenEnv server's task: a bundled task id or a task directory (an `openenv` image sets "
        "it)", flag="--task", shown="python-roman-numerals")
    openenv_host: str = variable("IDEGYM_OPENENV_HOST", "the OpenEnv server's TCP address", "127.0.0.1",
                                 flag="--host")
    openenv_port: int = variable("IDEGYM_OPENENV_PORT", "the OpenEnv server's TCP port; 0 picks a free one", 8000,
                                 flag="--port")
    log_level: str = variable("IDEGYM_LOG_LEVEL", "the OpenEnv server's log level; INFO logs every request",
                              "WARNING", flag="--log-level")
    openai_model: str | None = variable("OPENAI_MODEL", "the model of the eval harness's `openai` agent")
    openai_base_url: str | None = variable(
        "OPENAI_BASE_URL", "the chat-completions endpoint of the `openai` agent", shown="https://api.openai.com/v1")
    openai_api_key: str | None = variable("OPENAI_API_KEY", "the key the `openai` agent sends", secret=True)

    def default_state_dir(self) -> Path:
        """The local control plane's state directory: ``$IDEGYM_CONTROL_PLANE_STATE_DIR``, else
        the default one."""
        return self.state_dir or default_state_dir(self.xdg_state_home)

    def task_cache_dir(self) -> Path:
        return self.task_cache or Path.home() / ".cache" / "idegym" / "tasks"


def add_control_plane_argument(parser: argparse.ArgumentParser) -> None:
    """``--control-plane-url``, the ``url`` a command hands to :func:`chosen_control_plane`."""
    parser.add_argument("--control-plane-url", default=None, metavar="URL",
                        help="the control plane that gives the sandboxes [$IDEGYM_URL; default: start an embedded "
                             "local one, which stops when the command ends]")


def chosen_control_plane(url: str | None = None, settings: ClientSettings | None = None) -> str | None:
    """Where sandboxes come from: ``url``, else ``$IDEGYM_URL``; ``None`` means an embedded
    control plane (each caller starts or refuses it)."""
    if url:
        return url
    return (settings or ClientSettings.from_env()).url
