"""Which server a local sandbox runs, by server kind: data, not code paths.

Every kind starts the same way (``python -I -c <bootstrap>`` in a bwrap sandbox, a plain child
process otherwise), listens on the sandbox's socket and reports ready on the same fd; what
differs is recorded here:

* ``idegym``: ``sandbox_server`` itself.
* ``openenv`` [openenv]: the OpenEnv server (``idegym_env.openenv.server --in-sandbox``) in front
  of a private ``sandbox_server``: it takes the socket and the ready fd, and passes the arguments
  ``sandbox_server`` would have had (after ``--``) to the one it starts, whose socket goes in
  ``<run dir>/oe``. Its runtime is the closure of its own imports (our three packages' code,
  openenv-core, uvicorn…: ``closure.py``), which holds no task; it makes HTTP clients, so it
  keeps the real CA store; the image's env names its task (``IDEGYM_TASK``), so it sees that env.
  A bundled task named there reaches it as a private copy in the sandbox's run directory (root's
  only), which it deletes once it has read it (``--forget-task``), before any tool can run:
  the task's solution never lies where a tool could read it.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from ...models import ServerKind
from ..base import BackendError
from .cgroups import run_memory
from .closure import SITE, Closure, ClosureError, assemble
from .layout import RUN_INSIDE, Plan
from .runtime import SERVER_CLOSURE, SERVER_MODULE, SITE_INSIDE, Runtime


@dataclass(frozen=True)
class ServerKindEntry:
    module: str  # its ``main(argv)`` is the sandbox's server
    closure: Closure = SERVER_CLOSURE  # what it runs on: the packages bound at /opt/idegym/site
    needs: tuple[str, ...] = ()  # top-level modules it cannot run without, from the pip extra ``extra``
    extra: str = ""
    fronts_sandbox_server: bool = False  # starts its own sandbox_server with the arguments after ``--``
    image_env: bool = False  # the image's env reaches the server process itself, not only its tools
    ca_store: bool = False  # it makes TLS clients: keep the system's CA store
    # The image env variable that names the task the server loads, and where (package, directory
    # in it) the tasks it may name are: a copy of the one named is staged for it (``stage_task``).
    task_env: str = ""
    tasks: tuple[str, str] = ("", "")

    def server_args(self, sandbox_server_args: list[str], inner_dir: str, *, forget_task: bool = False
                    ) -> list[str]:
        """The server's arguments, given those ``sandbox_server`` would have had."""
        if not self.fronts_sandbox_server:
            return sandbox_server_args
        own, rest, items = [], [], iter(sandbox_server_args)
        for item in items:
            if item in ("--unix-socket", "--ready-fd"):
                own += [item, next(items)]
            else:
                rest.append(item)
        return ["--in-sandbox", *own, "--inner-dir", inner_dir, *(["--forget-task"] if forget_task else []),
                "--", *rest]


# The OpenEnv server's modules and what it imports as it starts in a sandbox: openenv-core's
# server (without the Gradio UI, as it imports it), uvicorn with every protocol it may pick, the
# task loader and the env; and the sandbox server it starts.
OPENENV_CLOSURE = Closure(
    "openenv", packages=("idegym_env", "control_plane", "sandbox_server"), resources=("sandbox_server",),
    imports=(*SERVER_CLOSURE.imports, "idegym_env.openenv.*", "idegym_env.openenv._compat:import_openenv",
             "openenv.core.env_server.http_server", "idegym_env.tasks", "idegym_env.env", "idegym_env.grading",
             "uvicorn.*", "starlette.websockets"))

SERVER_KINDS: dict[str, ServerKindEntry] = {
    ServerKind.IDEGYM.value: ServerKindEntry(SERVER_MODULE),
    ServerKind.OPENENV.value: ServerKindEntry(  # [openenv]
        "idegym_env.openenv.server", closure=OPENENV_CLOSURE, needs=("openenv", "uvicorn"), extra="openenv",
        fronts_sandbox_server=True, image_env=True, ca_store=True, task_env="IDEGYM_TASK",
        tasks=("idegym_env", "tasks/bundled")),
}


def entry(kind: str) -> ServerKindEntry:
    try:
        return SERVER_KINDS[kind]
    except KeyError:
        raise BackendError(f"the local backend runs {' and '.join(SERVER_KINDS)} servers, not {kind!r}", 400) from None


def runtime_for(base: Runtime, kind: ServerKindEntry) -> Runtime:
    """The sandbox runtime ``kind`` needs: ``base`` with its own closure at /opt/idegym/site."""
    if kind.closure == SERVER_CLOSURE and not kind.ca_store:
        return base
    for name in kind.needs:
        if importlib.util.find_spec(name) is None:
            raise BackendError(f"{kind.module} servers need the {name} package installed next to the control "
                               f"plane (pip install 'idegym[{kind.extra}]')", 500)
    binds = base.binds
    if kind.closure != SERVER_CLOSURE:
        try:
            site = assemble(kind.closure) / SITE
        except ClosureError as exc:
            raise BackendError(str(exc), 500) from exc
        binds = [(host, inside) if inside != SITE_INSIDE else (str(site), inside) for host, inside in base.binds]
    server_env = dict(base.server_env)
    if kind.ca_store:
        server_env = {k: v for k, v in server_env.items() if not k.startswith("SSL_CERT_")}
    return replace(base, binds=binds, server_env=server_env)


TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def stage_task(plan: Plan, kind: ServerKindEntry) -> dict[str, str]:
    """A private copy, for ``kind``'s server, of the task its image's env names, in the sandbox's
    run directory (``<run>/task``, root's only): the server env that names the copy, which the
    server deletes once it has read it. Nothing for a kind without tasks or an env that names
    none of them (e.g. a task directory in the image)."""
    name = plan.env.get(kind.task_env, "") if kind.task_env else ""
    package = importlib.util.find_spec(kind.tasks[0]) if name and TASK_ID.fullmatch(name) else None
    if package is None or not package.submodule_search_locations:
        return {}
    source = Path(next(iter(package.submodule_search_locations)), kind.tasks[1], name)
    if not (source / "task.yaml").is_file():
        return {}
    staged = plan.run / "task"
    staged.mkdir(mode=0o700, exist_ok=True)
    shutil.copytree(source, staged / name, symlinks=True)
    return {kind.task_env: f"{RUN_INSIDE}/task/{name}"}


def sandbox_server_args(plan: Plan, tool_env: dict[str, str], project: str, ready_fd: int, socket: str) -> list[str]:
    """``sandbox_server serve``'s arguments for ``plan``: its socket, project and tools' env."""
    args = ["serve", "--unix-socket", socket, "--project", project, "--no-inherit-env", "--ready-fd", str(ready_fd)]
    env = {**tool_env, "IDEGYM_PROJECT_ROOT": project, **plan.env}
    for key, value in env.items():
        args += ["--tool-env", f"{key}={value}"]
    if plan.isolated_runs:
        args += ["--isolated-runs", "--runner-concurrency", str(plan.isolated_runs)]
        if plan.limits.memory_bytes and plan.space.cgroups.available:  # each run its share of the tools'
            share = run_memory(plan.limits.memory_bytes, plan.space.cgroups.server_memory_reserve, plan.isolated_runs)
            args += ["--run-memory-max", str(share)]
    return args
