"""``idegym sandbox serve`` (also ``idegym-sandbox serve`` / ``python -m sandbox_server serve``)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import sys
from pathlib import Path
from typing import Any

from .config import ServerConfig
from .env_settings import SettingsError
from .http import run_loop, setup_logging
from .settings import ServerSettings


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags; those a variable also sets default to None here and to the variable's value in
    ``config_from_args`` (the zygote builds this parser once, before it knows a server's environment)."""
    parser.add_argument("--project", type=Path, default=None,
                        help="project directory: default cwd of tools and base of relative paths "
                             "[$IDEGYM_PROJECT_PATH, default .project]")
    parser.add_argument("--project-source", type=Path, default=None,
                        help="pristine project: a directory or .tar.gz/.zip archive; an empty project is "
                             "populated from it and reset restores it [$IDEGYM_PROJECT_ARCHIVE]. Without it, "
                             "the project's content at start-up is the pristine state")
    parser.add_argument("--overlay-lower", type=Path, help="reset by overlay remount: read-only pristine tree")
    parser.add_argument("--overlay-layer", type=Path, help="reset by overlay remount: directory for the writes")
    parser.add_argument("--state-dir", type=Path, help="private directory for the pristine copy")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--port", type=int, default=None,
                       help="TCP port [$IDEGYM_SERVER_PORT, default 8000]")
    where.add_argument("--unix-socket", type=Path, default=None,
                       help="listen on this Unix socket instead of TCP [$IDEGYM_SERVER_UNIX_SOCKET]")
    parser.add_argument("--host", default=None,
                        help="TCP address [$IDEGYM_SERVER_HOST, default 127.0.0.1; pods use 0.0.0.0]")
    parser.add_argument("--tool-user", default=None,
                        help="user that tools run as when a request names none (default: the server's user) "
                             "[$IDEGYM_TOOL_USER]")
    parser.add_argument("--no-root-tools", action="store_true",
                        help="refuse to run tools as root, whatever a request's 'user' says (the server may "
                             "still run as root to switch to other users)")
    parser.add_argument("--file-root", type=Path, action="append", default=[],
                        help="directory the file tools may touch (repeatable; default: the project)")
    parser.add_argument("--tool-env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment variable for every tool process (repeatable)")
    parser.add_argument("--no-inherit-env", action="store_true",
                        help="tools start from a minimal environment instead of the server's")
    parser.add_argument("--max-body-bytes", type=int, default=256 << 20, help="largest accepted request body")
    parser.add_argument("--runner-concurrency", type=int, default=os.cpu_count() or 2,
                        help="code-runner programs running at once; more requests wait in a queue "
                             "(with --isolated-runs, as many isolated inits wait ready for their runs)")
    parser.add_argument("--ready-fd", type=int, help="write 'ready\\n' to this file descriptor once listening")
    parser.add_argument("--isolated-runs", action="store_true", default=None,
                        help="run every code-runner program in mount, pid, IPC and network namespaces of its "
                             "own, with only its directory writable (needs root in the sandbox's user namespace; "
                             "GET /api/capabilities lists 'isolated-runs' when it is on) [$IDEGYM_ISOLATED_RUNS]")
    parser.add_argument("--runner-template", action=argparse.BooleanOptionalAction, default=True,
                        help="with --isolated-runs: fork each Python run from a template interpreter started "
                             "once (no interpreter start per run; runs share its hash seed and address layout). "
                             "--no-runner-template: each run starts a fresh python3 (a hash seed of its own)")
    parser.add_argument("--run-memory-max", type=int, default=None, metavar="BYTES",
                        help="with --isolated-runs and --tool-cgroups: each run's own memory limit (every run "
                             "already has a pids limit of its own; default: only the tools' limit they share)")
    parser.add_argument("--tool-spawner", action=argparse.BooleanOptionalAction, default=None,
                        help="start the tool user's tools from a small process that already is that user "
                             "(sandbox_server/native/spawner.c, built by make): less time a call than a user switch "
                             "per tool; --no-tool-spawner starts each the long way [$IDEGYM_TOOL_SPAWNER=0 for "
                             "no; default: on when the program is built]")
    parser.add_argument("--memory-events", type=Path, default=None,
                        help="the sandbox's cgroup memory.oom_control (v1) or memory.events (v2) file: bash results "
                             "then say when the OOM killer struck [$IDEGYM_MEMORY_EVENTS; default: "
                             "/sys/fs/cgroup/memory.events when present]")
    parser.add_argument("--tool-cgroups", type=Path, default=None,
                        help="directory holding the tools' delegated cgroup v1 groups, one per controller "
                             "(<dir>/memory, <dir>/pids…): every tool starts in them, and stages run in child "
                             "groups that are emptied when they end [$IDEGYM_TOOL_CGROUPS]")
    parser.add_argument("--log-json", action="store_true", default=None,
                        help="one JSON object per log line [$IDEGYM_LOG_JSON]")
    parser.add_argument("--log-level", default=None,
                        help="WARNING (default), INFO logs one line per request [$IDEGYM_LOG_LEVEL]")


def config_from_args(args: argparse.Namespace, env: ServerSettings | None = None) -> ServerConfig:
    """The server's configuration: its flags, else its variables (``env``: read now if not given)."""
    env = env or ServerSettings.from_env()
    tool_env = {}
    for item in args.tool_env:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--tool-env {item!r}: expected NAME=VALUE")
        tool_env[name] = value

    def chosen(flag: str) -> Any:
        value = getattr(args, flag)
        return getattr(env, flag) if value is None else value

    return ServerConfig(
        project=chosen("project"),
        project_source=chosen("project_source"),
        overlay_lower=args.overlay_lower,
        overlay_layer=args.overlay_layer,
        state_dir=args.state_dir,
        host=chosen("host"),
        port=chosen("port"),
        unix_socket=chosen("unix_socket"),
        tool_user=chosen("tool_user"),
        root_tools=not args.no_root_tools,
        file_roots=list(args.file_root),
        max_body_bytes=args.max_body_bytes,
        runner_concurrency=args.runner_concurrency,
        tool_env=tool_env,
        inherit_env=not args.no_inherit_env,
        log_json=chosen("log_json"),
        log_level=chosen("log_level"),
        ready_fd=args.ready_fd,
        memory_events=chosen("memory_events"),
        isolated_runs=chosen("isolated_runs"),
        run_memory_max=args.run_memory_max,
        runner_template=args.runner_template,
        tool_spawner=chosen("tool_spawner"),
        tool_cgroups=chosen("tool_cgroups"),
        header_timeout=env.header_timeout,
        in_pod=bool(env.server_id or env.kubernetes_service_host),
    )


def isolated_by(config: ServerConfig) -> str | None:
    """What isolates this server, if anything: a user namespace (bubblewrap, as the local backend
    runs every sandbox; rootless containers), or a pod of the Kubernetes backend."""
    if config.in_pod:
        return "a Kubernetes pod"
    try:
        uid_map = Path("/proc/self/uid_map").read_text().split()
    except OSError:
        return None
    if uid_map and uid_map != ["0", "0", "4294967295"]:
        return "a user namespace"
    return None


def _tool_user(config: ServerConfig) -> str:
    import pwd

    uid = os.geteuid()
    if config.tool_user is not None:
        return f"{config.tool_user!r}"
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return f"{name} (uid {uid}{', ROOT' if uid == 0 else ''})"


async def serve(config: ServerConfig) -> None:
    from .app import create_app
    from .web import Server

    if os.geteuid() == 0:
        os.setgroups([])  # file tools switch fsuid/fsgid; stray root groups would leak access
    server = Server(create_app(config), header_timeout=config.header_timeout)
    if config.unix_socket is not None:
        await server.start(unix_socket=str(config.unix_socket))
        os.chmod(config.unix_socket, 0o600)
    else:
        await server.start(host=config.host, port=config.port)
    print(f"idegym sandbox server: listening on {server.address} (project {config.project.resolve()})",
          file=sys.stderr, flush=True)
    if isolated_by(config) is None:
        print(f"idegym sandbox server: WARNING: not inside a sandbox: tools run UNISOLATED as {_tool_user(config)} on "
              "this machine (every bash call can read and change what that user can); for isolated sandboxes "
              "run `idegym control-plane serve` and start them through it", file=sys.stderr, flush=True)
    if config.ready_fd is not None:
        os.write(config.ready_fd, b"ready\n")
        os.close(config.ready_fd)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()


@functools.cache
def parser() -> argparse.ArgumentParser:
    """Built once per process (the zygote builds it for every server it forks)."""
    main_parser = argparse.ArgumentParser(
        prog="idegym-sandbox",
        description="IdeGym's in-sandbox server: bash and file tools, rewards, project reset and a "
                    "code runner over HTTP. Normally started by the control plane inside a sandbox.",
    )
    sub = main_parser.add_subparsers(dest="command", required=True)
    serve_parser = sub.add_parser("serve", help="run the server", description="Run the sandbox server.")
    add_serve_arguments(serve_parser)
    return main_parser


def main(argv: list[str] | None = None) -> None:
    run_serve(parser().parse_args(argv))


def run_serve(args: argparse.Namespace) -> None:
    try:
        config = config_from_args(args)
    except SettingsError as exc:
        print(f"idegym-sandbox: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    setup_logging(config.log_json, config.log_level)
    from .project import ProjectError

    try:
        run_loop(serve(config))
    except ProjectError as exc:
        print(f"idegym-sandbox: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    except OSError as exc:
        where = config.unix_socket or f"{config.host}:{config.port}"
        print(f"idegym-sandbox: cannot serve on {where}: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
