"""``idegym openenv serve`` (also ``python -m idegym_env.openenv.server``): IdeGym episodes over
OpenEnv's protocol.

The app is openenv-core's own (``create_app``): the stateful WebSocket ``/ws`` (one
:class:`~.environment.IdeGymOpenEnv` per connection), ``/health``, ``/schema``, ``/metadata``,
``/mcp``, ``/openapi.json``, and the stateless HTTP ``/reset``, ``/step``, ``/state`` (each on a
fresh environment, as OpenEnv defines them: an episode needs ``/ws``).

Two ways to get sandboxes (see ``docs/openenv.md``):

* control-plane mode (default): every session gets a sandbox of its own from the control plane
  at ``--control-plane-url`` (default ``$IDEGYM_URL``, else an embedded local control plane that
  lives as long as this server); up to ``--max-sessions`` sessions at once.
* ``--in-sandbox``: the server runs inside an ``openenv`` sandbox (the control plane's local
  backend starts it so) and the episode acts on that sandbox through a private sandbox server
  started with the arguments after ``--``. One session at a time. The task comes from
  ``$IDEGYM_TASK``, which the image sets (``env: {IDEGYM_TASK: <task id>}`` in the build YAML).

With ``--ready-fd N`` the server writes ``ready\\n`` (Unix socket) or ``ready <port>\\n`` (TCP) to
file descriptor N once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import shutil
import signal
import sys
from typing import Any

from sandbox_server.http import run_loop

from ..settings import ClientSettings, add_control_plane_argument, chosen_control_plane
from ..tools import TOOL_NAMES

log = logging.getLogger("idegym.openenv")

DEFAULT_MAX_SESSIONS = 4
DESCRIPTION = f"""\
Serve IdeGym episodes with OpenEnv's protocol, for OpenEnv's own clients (EnvClient,
GenericEnvClient): the WebSocket /ws (one episode session per connection: reset, step, state,
close), /health, /schema, /metadata, /mcp, and OpenEnv's stateless HTTP /reset, /step, /state.

An action is one tool call, {{"tool": "bash", "arguments": {{"command": "ls"}}}}, of the tools
{", ".join(TOOL_NAMES)}.
"submit" runs the task's checks and ends the episode with the reward. Everything about a step
(exit code, error, checks, reward components…) is a field of the observation: OpenEnv does not
send observation metadata.

Sandboxes come from a control plane, one per session (default: an embedded local control plane;
--control-plane-url for another), or, with --in-sandbox, from the sandbox the server itself runs
in (how the control plane starts servers of kind `openenv`)."""
EPILOG = """\
examples:
  idegym openenv serve --task python-roman-numerals --port 8000
  idegym openenv serve --task ./my-task --control-plane-url http://cp:8000 --max-sessions 16

  # a client (pip install 'idegym[openenv]'):
  from openenv.core import GenericEnvClient
  with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
      result = env.reset()
      result = env.step({"tool": "bash", "arguments": {"command": "$IDEGYM_JUDGE tests/"}})
      result = env.step({"tool": "submit"})      # result.reward, result.done

  # through a control plane, for a server of kind `openenv` (its image sets IDEGYM_TASK):
  GenericEnvClient(base_url=f"{control_plane}/api/ws-forward/{client_id}/{server_id}")"""


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    env = ClientSettings.from_env()
    parser.add_argument("--task", default=env.task,
                        help="the task: a bundled task id or a task directory [$IDEGYM_TASK; default "
                             "python-roman-numerals, except with --in-sandbox, where it is required]. A client's "
                             "reset may pick a bundled task instead (control-plane mode)")
    add_control_plane_argument(parser)
    parser.add_argument("--in-sandbox", action="store_true",
                        help="run inside an `openenv` sandbox and act on it through a private sandbox server "
                             "started with SANDBOX_SERVER_ARGS (how the control plane's local backend starts "
                             "this server); one session at a time")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--port", type=int, default=env.openenv_port,
                       help="TCP port; 0 picks a free one [$IDEGYM_OPENENV_PORT, default 8000]")
    where.add_argument("--unix-socket", default=None, metavar="PATH", help="listen on this Unix socket instead")
    parser.add_argument("--host", default=env.openenv_host,
                        help="TCP address [$IDEGYM_OPENENV_HOST, default 127.0.0.1]")
    parser.add_argument("--ready-fd", type=int, metavar="N",
                        help="write 'ready' (Unix socket) or 'ready <port>' (TCP) and a newline to this file "
                             "descriptor once serving")
    parser.add_argument("--max-sessions", type=int, default=None, metavar="N",
                        help=f"WebSocket sessions at once, each with its own sandbox (default "
                             f"{DEFAULT_MAX_SESSIONS}; 1 with --in-sandbox, which allows no more); more are "
                             "refused with OpenEnv's CAPACITY_REACHED")
    parser.add_argument("--inner-dir", default=None, metavar="DIR",
                        help="with --in-sandbox: directory (made mode 0700) for the private sandbox server's "
                             "socket (default: a new temporary directory)")
    parser.add_argument("--forget-task", action="store_true",
                        help="with --in-sandbox: delete the task directory (--task) once it is loaded: the "
                             "backend's private copy, which holds the solution and hidden tests, is gone before "
                             "any tool runs")
    parser.add_argument("--reuse", choices=["RESTART", "RESET", "NONE"], default="RESTART",
                        help="control-plane mode: how a session's sandbox is made fresh for its next episode "
                             "(default RESTART; --in-sandbox always RESETs the project)")
    parser.add_argument("--max-steps", type=int, default=None, help="step budget (default: the task's)")
    parser.add_argument("--bash-timeout", type=float, default=120.0,
                        help="timeout of a bash call that names none, in seconds (default 120)")
    parser.add_argument("--invalid-action-penalty", type=float, default=0.0,
                        help="reward of an invalid action is minus this (default 0)")
    parser.add_argument("--ws-compression", action="store_true",
                        help="compress WebSocket messages (permessage-deflate) for clients that offer it: fewer "
                             "bytes on a slow link, CPU at both ends on every message (default: off)")
    parser.add_argument("--log-level", default=env.log_level,
                        help="WARNING (default), INFO… [$IDEGYM_LOG_LEVEL]")
    parser.add_argument("sandbox_server_args", nargs="*", metavar="-- SANDBOX_SERVER_ARGS",
                        help="with --in-sandbox: the sandbox server's arguments (`serve --project … "
                             "--tool-user …`), without --unix-socket/--port/--ready-fd")


def create_app(task: Any, *, control_plane_url: str | None = None, inner: Any = None,
               max_sessions: int = DEFAULT_MAX_SESSIONS, **env_kwargs: Any):
    """openenv-core's FastAPI app serving :class:`IdeGymOpenEnv` sessions (see the module docstring)."""
    from ._compat import import_openenv

    import_openenv()
    from openenv.core.env_server.http_server import create_app as openenv_app

    from .environment import IdeGymOpenEnv
    from .models import IdeAction, IdeObservation

    if inner is not None and max_sessions != 1:
        raise ValueError("a server inside its own sandbox serves one session at a time (max_sessions=1)")
    if max_sessions < 1:
        raise ValueError("max_sessions must be at least 1")
    factory = functools.partial(IdeGymOpenEnv, task, control_plane_url=control_plane_url, inner=inner,
                                **env_kwargs)
    app = openenv_app(factory, IdeAction, IdeObservation, env_name="idegym", max_concurrent_envs=max_sessions)
    app.add_middleware(_QuietWebSocketClose)
    return app


class _QuietWebSocketClose:
    """openenv-core's ``/ws`` handler closes the socket once more after the client closed it, and
    only expects ``RuntimeError`` from that; Starlette raises ``WebSocketDisconnect``, which
    uvicorn would log as an application error at the end of every session. Swallow just that."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


def _say(text: str) -> None:
    print(f"idegym openenv serve: {text}", file=sys.stderr, flush=True)


async def _serve(server, ready_fd: int | None, unix_socket: str | None, task_id: str) -> None:
    serving = asyncio.ensure_future(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.005)
    if server.started:
        if unix_socket is not None:
            where = f"the Unix socket {unix_socket}"
        else:
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            where = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        _say(f"serving task {task_id} on {where} (WebSocket /ws; HTTP /reset /step /state /health /schema)")
    if server.started and ready_fd is not None:
        if unix_socket is not None:
            os.chmod(unix_socket, 0o600)
            line = "ready\n"
        else:
            line = f"ready {server.servers[0].sockets[0].getsockname()[1]}\n"
        os.write(ready_fd, line.encode())
        os.close(ready_fd)
    await serving


def run_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    from ..tasks import TaskError, load_task

    extra = list(args.sandbox_server_args)
    if (extra or args.inner_dir or args.forget_task) and not args.in_sandbox:
        print("idegym openenv serve: --inner-dir, --forget-task and the arguments after -- are for --in-sandbox "
              "only", file=sys.stderr)
        return 2
    task_ref = args.task
    if task_ref is None:
        if args.in_sandbox:
            print("idegym openenv serve --in-sandbox: no task; pass --task or set IDEGYM_TASK (an `openenv` image "
                  "sets it: env: {IDEGYM_TASK: <task id>} in its build YAML)", file=sys.stderr)
            return 2
        from ..env import DEFAULT_TASK

        task_ref = DEFAULT_TASK
    try:
        task = load_task(task_ref)
    except TaskError as exc:
        print(f"idegym openenv serve: {exc}", file=sys.stderr)
        return 2
    if args.forget_task:
        if task.root is None:
            print(f"idegym openenv serve: --forget-task needs a task directory, not {task_ref!r}", file=sys.stderr)
            return 2
        shutil.rmtree(task.root)
    max_sessions = args.max_sessions if args.max_sessions is not None else (
        1 if args.in_sandbox else DEFAULT_MAX_SESSIONS)
    env_kwargs = dict(max_steps=args.max_steps, bash_timeout=args.bash_timeout,
                      invalid_action_penalty=args.invalid_action_penalty)

    # Our handlers: a signal while starting up ends the start-up, and uvicorn re-raising the signal
    # after its graceful shutdown lands here, so that the clean-up below still runs.
    stopped_by: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopped_by.append(signum))

    inner = None
    server = None
    embedded_cp = False
    failed = False
    try:
        if args.in_sandbox:
            from .inner import InnerSandbox, terminate_self

            def inner_died() -> None:
                # The sandbox cannot be acted on any more: stop now, without waiting for sessions.
                nonlocal failed
                failed = True
                if server is not None:
                    server.should_exit = server.force_exit = True
                else:
                    terminate_self()

            inner = InnerSandbox(extra, directory=args.inner_dir, on_exit=inner_died)
            app = create_app(task, inner=inner, max_sessions=max_sessions, **env_kwargs)
        else:
            url = chosen_control_plane(args.control_plane_url)
            if url is None:
                from .. import embedded

                _say("starting the embedded control plane (sandboxes on this machine) ...")
                url = embedded.acquire().url
                embedded_cp = True
            # Build the task's image now (and check the control plane): the first session only claims.
            from ..env import IdeGymEnv

            _say(f"preparing task {task.id} (its image is built if it is not yet) ...")
            IdeGymEnv(task, control_plane_url=url).close()
            app = create_app(task, control_plane_url=url, max_sessions=max_sessions, reuse=args.reuse,
                             **env_kwargs)
        import uvicorn

        config = uvicorn.Config(app, host=args.host, port=args.port, uds=args.unix_socket,
                                log_level=args.log_level.lower(), access_log=False, lifespan="on",
                                timeout_graceful_shutdown=15, ws_max_size=100 << 20,
                                # off by default: deflating each message cost the server ~0.02-0.03 ms
                                # of CPU a step (and the client as much), for bytes on a local link
                                ws_per_message_deflate=args.ws_compression)
        server = uvicorn.Server(config)
        if stopped_by:  # asked to stop while starting up
            return 0
        run_loop(_serve(server, args.ready_fd, args.unix_socket, task.id))  # uvloop, as uvicorn.run would
        if not server.started:
            failed = True
    except Exception as exc:  # noqa: BLE001 - one readable line, the traceback at INFO
        log.info("start-up failed", exc_info=True)
        print(f"idegym openenv serve: {type(exc).__name__}: {exc}", file=sys.stderr)
        failed = True
    finally:
        if server is not None and server.started and args.unix_socket:
            try:
                os.unlink(args.unix_socket)  # uvicorn leaves its socket behind
            except OSError:
                pass
        if inner is not None:
            inner.stop()
        if embedded_cp:
            from .. import embedded

            embedded.release()
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m idegym_env.openenv.server", description=DESCRIPTION,
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_arguments(parser)
    sys.exit(run_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
