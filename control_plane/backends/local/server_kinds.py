"""Which server a local sandbox runs, by server kind: data, not code paths.

Every kind starts the same way (``python -I -c <bootstrap>`` in a bwrap sandbox, a plain child
process otherwise), listens on the sandbox's socket and reports ready on the same fd; what
differs is recorded here:

* ``idegym``: ``sandbox_server`` itself.
* ``openenv`` [openenv]: the OpenEnv server (``idegym_env.openenv.server --in-sandbox``) in front
  of a private ``sandbox_server``: it takes the socket and the ready fd, and passes the arguments
  ``sandbox_server`` would have had (after ``--``) to the one it starts, whose socket goes in
  ``<run dir>/oe``. It imports our three packages, so those not inside a bound site-packages
  directory (an editable install) are copied and bound like ``sandbox_server``; it makes HTTP
  clients, so it keeps the real CA store; the image's env names its task, so it sees that env.
"""

from __future__ import annotations

import importlib.util
import site
from dataclasses import dataclass, replace
from pathlib import Path

from ...models import ServerKind
from ..base import BackendError
from .layout import Plan
from .runtime import INSIDE, SERVER_MODULE, Runtime, sync_package


@dataclass(frozen=True)
class ServerKindEntry:
    module: str  # its ``main(argv)`` is the sandbox's server
    packages: tuple[str, ...] = ()  # importable inside beyond sandbox_server (copied if not installed)
    fronts_sandbox_server: bool = False  # starts its own sandbox_server with the arguments after ``--``
    image_env: bool = False  # the image's env reaches the server process itself, not only its tools
    ca_store: bool = False  # it makes TLS clients: keep the system's CA store

    def server_args(self, sandbox_server_args: list[str], inner_dir: str) -> list[str]:
        """The server's arguments, given those ``sandbox_server`` would have had."""
        if not self.fronts_sandbox_server:
            return sandbox_server_args
        own, rest, items = [], [], iter(sandbox_server_args)
        for item in items:
            if item in ("--unix-socket", "--ready-fd"):
                own += [item, next(items)]
            else:
                rest.append(item)
        return ["--in-sandbox", *own, "--inner-dir", inner_dir, "--", *rest]


SERVER_KINDS: dict[str, ServerKindEntry] = {
    ServerKind.IDEGYM.value: ServerKindEntry(SERVER_MODULE),
    ServerKind.OPENENV.value: ServerKindEntry(  # [openenv]
        "idegym_env.openenv.server", packages=("idegym_env", "control_plane", "sandbox_server"),
        fronts_sandbox_server=True, image_env=True, ca_store=True),
}


def entry(kind: str) -> ServerKindEntry:
    try:
        return SERVER_KINDS[kind]
    except KeyError:
        raise BackendError(f"the local backend runs {' and '.join(SERVER_KINDS)} servers, not {kind!r}", 400) from None


def runtime_for(base: Runtime, kind: ServerKindEntry) -> Runtime:
    """The sandbox runtime ``kind`` needs: ``base`` plus its packages, bound where it finds them."""
    if not kind.packages and not kind.ca_store:
        return base
    site_dirs = [Path(p).resolve() for p in site.getsitepackages() if Path(p).is_dir()]  # as runtime.detect
    binds, first = list(base.binds), []
    for index, name in enumerate(kind.packages):
        found = importlib.util.find_spec(name)
        if found is None or not found.submodule_search_locations:
            raise BackendError(f"{kind.module} servers need the {name} package installed next to the control "
                               "plane (pip install 'idegym[openenv]')", 500)
        package = Path(next(iter(found.submodule_search_locations))).resolve()
        if any(package.is_relative_to(d) for d in site_dirs):
            continue  # importable from a bound site-packages directory already
        copy = sync_package(package)
        binds.append((str(copy), f"{INSIDE}/packages/{index}"))
        first.append(f"{INSIDE}/packages/{index}")
    if kind.packages:
        # The bound site-packages (a virtualenv's) go before the interpreter's own, which the
        # bootstrap leaves first on sys.path: there, e.g. an old typing_extensions would shadow
        # the one openenv-core needs.
        first += [inside for _, inside in base.binds if inside.startswith(f"{INSIDE}/site/")]
    server_env = dict(base.server_env)
    if kind.ca_store:
        server_env = {k: v for k, v in server_env.items() if not k.startswith("SSL_CERT_")}
    return replace(base, binds=binds, first=first, server_env=server_env)


def sandbox_server_args(plan: Plan, tool_env: dict[str, str], project: str, ready_fd: int, socket: str) -> list[str]:
    """``sandbox_server serve``'s arguments for ``plan``: its socket, project and tools' env."""
    args = ["serve", "--unix-socket", socket, "--project", project, "--no-inherit-env", "--ready-fd", str(ready_fd)]
    env = {**tool_env, "IDEGYM_PROJECT_ROOT": project, **plan.env}
    for key, value in env.items():
        args += ["--tool-env", f"{key}={value}"]
    if plan.isolated_runs:
        args += ["--isolated-runs", "--runner-concurrency", str(plan.isolated_runs)]
    return args
