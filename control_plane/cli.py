"""``idegym control-plane serve``: run the control plane (embedded local backend by default)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from aiohttp import web
from pydantic import ValidationError

from sandbox_server.env_settings import SettingsError
from sandbox_server.http import run_loop, setup_logging

from . import ephemeral_state
from .auth import TOKEN_USER, token_path
from .backends.config import BackendConfig, KubernetesBackendConfig, LocalBackendConfig
from .config import ControlPlaneConfig, SharingConfig, WatcherConfig, flags
from .settings import ControlPlaneSettings, parse_bytes
from .tenants import TenantsFileError

T = TypeVar("T")

log = logging.getLogger(__name__)


# Each flag's variable (``settings.py``), by the flag's dest.
VARIABLES = {extra["flag"].lstrip("-").replace("-", "_"): extra["env"][0]
             for extra in (cast("dict[str, Any]", info.json_schema_extra)
                           for info in ControlPlaneSettings.model_fields.values())
             if extra.get("flag")}


def _bytes(text: str) -> int:
    """``8Gi``, ``512Mi``, ``1000000``: a size as Kubernetes writes quantities."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _optional_path(text: str) -> Path | None:
    return Path(text) if text else None  # "" turns a variable's file off (the embedded control plane)


def _shown(value: object) -> str:
    if value is None or value == [] or value == "":
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _document(parser: argparse.ArgumentParser) -> None:
    """Every flag's help ends with its environment variable and its default (unless it says them)."""
    for action in parser._actions:
        if action.dest == "help" or action.help == argparse.SUPPRESS:
            continue
        text, first, last = action.help or "", [], []
        if "$" not in text:
            if action.dest in VARIABLES:
                first.append(f"${VARIABLES[action.dest]}")
            else:
                first.append("no environment variable")
        if "default" not in text:
            last.append(f"default {_shown(action.default).replace('%', '%%')}")
        if not first and not last:
            continue
        if text.endswith("]") and "[" in text:  # into the bracket the help already ends with
            text, _, inner = text[:-1].rpartition("[")
            first.append(inner)
        action.help = f"{text.rstrip()} [{', '.join(first + last)}]".lstrip()


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _add_config_flags(parser: argparse.ArgumentParser, config: Any, default: Callable[[str, Any], Any]) -> None:
    """The flags of a configuration dataclass (``config.flag``), each defaulting to its variable,
    else to ``config``'s value."""
    for option, spec in flags(type(config)):
        parser.add_argument(option, type=_bytes if spec.metadata["size"] else type(spec.default),
                            default=default(_dest(option), getattr(config, spec.name)), help=spec.metadata["help"])


def _config_from_flags(config: type[T], args: argparse.Namespace) -> T:
    return config(**{spec.name: getattr(args, _dest(option)) for option, spec in flags(config)})


def add_serve_arguments(parser: argparse.ArgumentParser, env: ControlPlaneSettings | None = None) -> None:
    """The flags of ``idegym control-plane serve``, each defaulting to its variable (``env``: the
    process's environment when not given), else to ``ControlPlaneConfig``'s default."""
    env = ControlPlaneSettings.from_env() if env is None else env
    cfg, watch = ControlPlaneConfig(state_dir=env.default_state_dir()), WatcherConfig()  # the defaults, defined there
    local = LocalBackendConfig()

    def _default(field: str, value: T) -> T:
        """The variable of ``field``, else the configuration's default ``value``."""
        chosen = getattr(env, field)
        return value if chosen is None else chosen
    parser.add_argument("--state-dir", type=Path, default=cfg.state_dir,
                        help="database, images, sandboxes and snapshots [$IDEGYM_CONTROL_PLANE_STATE_DIR, "
                             "default ~/.local/state/idegym]")
    parser.add_argument("--host", default=_default("host", cfg.host),
                        help=f"address to listen on [$IDEGYM_CONTROL_PLANE_HOST, default {cfg.host}]")
    parser.add_argument("--port", type=int, default=_default("port", cfg.port),
                        help=f"TCP port; 0 picks a free one [$IDEGYM_CONTROL_PLANE_PORT, default {cfg.port}]")
    parser.add_argument("--unix-socket", type=Path, default=_default("unix_socket", cfg.unix_socket),
                        help="also listen on this Unix socket")
    parser.add_argument("--auth", default=_default("auth", "token"), metavar="token|none|USER:PASSWORD",
                        help="credentials every route but /health requires: 'token' (default) makes a random token "
                             "in <state-dir>/token (HTTP Basic, user 'idegym', the token as password); "
                             "USER:PASSWORD uses those; 'none' turns authentication off; one tenant for every "
                             "client (see --tenants) [$IDEGYM_CONTROL_PLANE_AUTH]")
    parser.add_argument("--tenants", type=_optional_path, default=_default("tenants", cfg.tenants),
                        metavar="FILE",
                        help="several trainers on one control plane: each tenant's clients, servers, operations, "
                             "snapshots and builds are its own, and another tenant's ids answer 404. FILE has one "
                             "'NAME sha256:HEX' line per tenant (the SHA-256 of its token; 'idegym control-plane "
                             "tenants add NAME --file FILE' makes a token and its line), may be written by its "
                             "owner only, and is read again when it changes and on SIGHUP. Clients send HTTP Basic "
                             "auth: the tenant's name as user, its token as password. Replaces --auth; '' turns a "
                             "variable's file off")
    parser.add_argument("--tenant-host-builds", action="store_true",
                        default=_default("tenant_host_builds", cfg.tenant_host_builds),
                        help="with --tenants: let tenants build Dockerfiles and images on OCI bases, whose steps "
                             "buildah runs as this host's root (refused otherwise): only for tenants trusted with "
                             "the host")
    parser.add_argument("--build-root", action="append", type=Path, default=None, metavar="DIR",
                        help="image builds may take project paths, archives and file:// git repositories from "
                             "under this directory (repeatable; default: none) "
                             "[$IDEGYM_CONTROL_PLANE_BUILD_ROOTS, separated by ':']")
    parser.add_argument("--backend", choices=["local", "kubernetes"], default=_default("backend", local.type),
                        help=f"where sandboxes live [default {local.type}]")
    parser.add_argument("--isolation", choices=["auto", "bwrap", "none"],
                        default=_default("isolation", local.isolation),
                        help="local backend: bubblewrap sandboxes (auto uses them when available)")
    parser.add_argument("--network", action="store_true", default=_default("network", local.network),
                        help="local backend: give sandboxes network access (off by default)")
    parser.add_argument("--sandbox-storage", type=_bytes,
                        default=_default("sandbox_storage", local.sandbox_storage),
                        metavar="BYTES", help="local backend: what a sandbox may write when its request sets no "
                        f"ephemeral-storage, e.g. 8Gi; 0: unbounded [$IDEGYM_CONTROL_PLANE_SANDBOX_STORAGE, default "
                        f"{local.sandbox_storage >> 30}Gi]")
    parser.add_argument("--sandbox-inodes", type=int, default=_default("sandbox_inodes", local.sandbox_inodes),
                        metavar="N", help="local backend: files and directories a sandbox may make; 0: unbounded "
                        f"[$IDEGYM_CONTROL_PLANE_SANDBOX_INODES, default {local.sandbox_inodes}]")
    parser.add_argument("--orphan-ttl", type=float, default=_default("orphan_ttl", local.orphan_ttl),
                        metavar="SECONDS", help="local backend: every sandbox holds a lease this control plane "
                        "renews; one not renewed for this long (the control plane died and did not come back) "
                        "ends itself, processes, mounts and cgroups [$IDEGYM_CONTROL_PLANE_ORPHAN_TTL, default "
                        f"{local.orphan_ttl:g}]")
    parser.add_argument("--delete-timeout", type=float, default=_default("delete_timeout", local.delete_timeout),
                        metavar="SECONDS", help="local backend: a sandbox's stop or delete fails after this long, "
                        "naming the process that did not end and its state (it goes on in the background and can "
                        "be retried; the watcher retries it); until a second before it, killed processes are "
                        "waited for (one in the kernel under heavy disk load may take seconds) "
                        f"[$IDEGYM_CONTROL_PLANE_DELETE_TIMEOUT, default {local.delete_timeout:g}]")
    parser.add_argument("--image-registry", default=env.image_registry,
                        metavar="HOST[:PORT][/PREFIX]",
                        help="local backend: a registry mirror OCI builds may pull bases other than Debian/Python "
                             "from (http://… for plain HTTP) [$IDEGYM_IMAGE_REGISTRY]")
    parser.add_argument("--image-cache", type=Path, default=env.image_cache,
                        help="local backend: the shared cache of OCI bases [$IDEGYM_IMAGE_CACHE, "
                             "default ~/.cache/idegym/images]")
    parser.add_argument("--build-cache", action=argparse.BooleanOptionalAction,
                        default=_default("build_cache", local.build_cache),
                        help="local backend: an OCI image built here is published to the host's build cache "
                             "(where IDEGYM_BUILD_CACHE_DIR says, default <image cache>/builds), and a build of the "
                             "same inputs (Dockerfile, context, arguments, bases, network) by any control plane of the "
                             "host takes it from there instead of building again [$IDEGYM_BUILD_CACHE, default on]")
    parser.add_argument("--host-package-config", action=argparse.BooleanOptionalAction,
                        default=_default("host_package_config", local.host_package_config),
                        help="local backend: builds whose RUN steps have the network, and networked sandboxes, get "
                             "this host's package sources (CA bundle, pip/uv/npm index and apt proxy settings, proxy "
                             "variables), bound read-only at /run/idegym-host-config, never in an image layer "
                             "[$IDEGYM_CONTROL_PLANE_HOST_PACKAGE_CONFIG, default on]")
    parser.add_argument("--warm-pool", type=int, default=_default("warm_pool", cfg.warm_pool),
                        help="spare sandboxes kept ready per image in use (grows with demand)")
    parser.add_argument("--warm-pool-max", type=int, default=_default("warm_pool_max", cfg.warm_pool_max),
                        help="ceiling of the warm pool per image")
    parser.add_argument("--warm-pool-parallel", type=int,
                        default=_default("warm_pool_parallel", cfg.warm_pool_parallel),
                        help="pool sandboxes made at once ahead of demand (a kind whose claims outrun its fills: up to "
                             "its target)")
    parser.add_argument("--pool-image", action="append", default=list(_default("pool_image", ())),
                        help="keep this image warm from start-up (repeatable; comma-separated in the variable)")
    parser.add_argument("--max-servers", type=int, default=_default("max_servers", cfg.max_servers),
                        help="live servers allowed at once, all tenants together; more starts wait their turn in the "
                             "creation queue (--queue-timeout), and FINISHED servers give way to them; snapshot "
                             "preparations and the code runner's sandboxes count too")
    parser.add_argument("--max-snapshots", type=int, default=_default("max_snapshots", cfg.max_snapshots),
                        help=f"snapshots kept; more snapshots get 429 [{cfg.max_snapshots}]")
    parser.add_argument("--max-snapshot-bytes", type=_bytes,
                        default=_default("max_snapshot_bytes", cfg.max_snapshot_bytes),
                        help="what snapshots may take on disk (local backend), e.g. 64Gi; a snapshot past it "
                             f"gets 429 [{cfg.max_snapshot_bytes >> 30}Gi]")
    _add_config_flags(parser, cfg.sharing, _default)
    parser.add_argument("--body-budget", type=int, default=_default("body_budget", cfg.body_budget_bytes),
                        metavar="BYTES", help="bytes of large request bodies held in memory at once (each counts "
                                              "3 times its size); more wait, then get 503 [default 3 × the "
                                              f"{cfg.max_body_bytes >> 20} MiB body limit]")
    parser.add_argument("--header-timeout", type=float, default=_default("header_timeout", cfg.header_timeout),
                        help="close a connection whose request head is not complete this many seconds after it "
                             "opened or after its last answer (slow-header clients, idle keep-alive; a request "
                             "already in the socket then is served; answers say it in Keep-Alive, and our clients "
                             "reuse a connection for that less 2 s, or for half of it below 4 s) "
                             f"[default {cfg.header_timeout:g}]")
    _add_config_flags(parser, watch, _default)
    parser.add_argument("--ephemeral", action="store_true", default=_default("ephemeral", cfg.ephemeral),
                        help="delete every sandbox on shutdown (for embedded use)")
    add_kubernetes_arguments(parser)
    parser.add_argument("--remove-state", action="store_true",
                        help="with --ephemeral: also remove the state directory on shutdown")
    parser.add_argument("--parent-pid", type=int,
                        help="shut down (cleanly) when this process exits: embedded use never outlives its owner")
    parser.add_argument("--ready-fd", type=int, help="write 'ready <port>\\n' to this fd once listening")
    parser.add_argument("--log-json", action="store_true", default=_default("log_json", False),
                        help="one JSON object per log line")
    parser.add_argument("--log-level", default=_default("log_level", "WARNING"),
                        help="WARNING (default); INFO logs every request")
    _document(parser)


def add_kubernetes_arguments(parser: argparse.ArgumentParser) -> None:
    """``--k8s-<field>`` per ``KubernetesBackendConfig`` field, unset unless given: with ``--backend
    kubernetes`` a given flag wins over its ``IDEGYM_K8S_<FIELD>`` variable (read then, not here)."""
    group = parser.add_argument_group("kubernetes backend", "with --backend kubernetes; lists comma-separated, "
                                      "extra-env as K=V,K=V")
    for name, info in KubernetesBackendConfig.model_fields.items():
        if name == "type":
            continue
        default = info.get_default(call_default_factory=True)
        if isinstance(default, tuple | dict):
            default = list(default) if isinstance(default, tuple) else [f"{k}={v}" for k, v in default.items()]
        shown = _shown(default)
        text = f"[${KubernetesBackendConfig.ENV_PREFIX}{name.upper()}, default {shown.replace('%', '%%')}]"
        flag, dest = "--k8s-" + name.replace("_", "-"), f"k8s_{name}"
        if isinstance(default, bool) or name == "in_cluster":
            group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            group.add_argument(flag, dest=dest, default=None, metavar=name.upper(), help=text)


def backend_config_from_args(args: argparse.Namespace, env: ControlPlaneSettings) -> BackendConfig:
    """The backend ``--backend`` names, with its settings: flags, else variables, else defaults."""
    if args.backend == "local":
        try:
            return LocalBackendConfig(
                state_dir=args.state_dir, isolation=args.isolation, network=args.network,
                sandbox_storage=args.sandbox_storage, sandbox_inodes=args.sandbox_inodes, orphan_ttl=args.orphan_ttl,
                delete_timeout=args.delete_timeout, image_registry=args.image_registry,
                image_cache=args.image_cache, build_cache=args.build_cache,
                host_package_config=args.host_package_config)
        except ValidationError as exc:
            raise _refused(exc, lambda name: ("--" + name.replace("_", "-"), getattr(args, name))) from None
    given = {name: value for name in KubernetesBackendConfig.settings()
             if (value := getattr(args, f"k8s_{name}")) is not None}
    try:
        return KubernetesBackendConfig.from_env(env.kubernetes, **given)
    except ValidationError as exc:
        raise _refused(exc, lambda name: ("--k8s-" + name.replace("_", "-"), given.get(name))) from None


def _refused(exc: ValidationError, flag_of: Callable[[str], tuple[str, Any]]) -> SystemExit:
    """A backend setting's first refusal, as the flag (and value, by ``flag_of``) that set it."""
    error = exc.errors()[0]
    flag, value = flag_of(str(error["loc"][0]))
    return SystemExit(f"idegym control-plane: {flag} {value!r}: {error['msg']}")


def config_from_args(args: argparse.Namespace, env: ControlPlaneSettings | None = None) -> ControlPlaneConfig:
    """The configuration the flags (whose defaults are the variables) say; ``env`` gives what has no
    flag (read now if not given)."""
    env = ControlPlaneSettings.from_env() if env is None else env
    auth = None
    if args.auth not in ("token", "none"):
        user, sep, password = args.auth.partition(":")
        if not sep or not user:
            raise SystemExit("--auth: expected 'token', 'none' or USER:PASSWORD")
        auth = (user, password)
    if args.tenants is not None and args.auth != "token":
        raise SystemExit(f"--tenants and --auth {args.auth.partition(':')[0]}...: choose one (with a tenants file "
                         "every client authenticates as its tenant)")
    build_roots = args.build_root
    if build_roots is None:
        build_roots = list(env.build_roots or ())
    return ControlPlaneConfig(
        backend=backend_config_from_args(args, env),
        state_dir=args.state_dir, host=args.host, port=args.port, unix_socket=args.unix_socket, auth=auth,
        no_auth=args.auth == "none", tenants=args.tenants, tenant_host_builds=args.tenant_host_builds,
        build_roots=build_roots, header_timeout=args.header_timeout,
        body_budget_bytes=args.body_budget,
        warm_pool=args.warm_pool, warm_pool_max=args.warm_pool_max, warm_pool_parallel=args.warm_pool_parallel,
        pool_images=list(args.pool_image), max_servers=args.max_servers,
        max_snapshots=args.max_snapshots, max_snapshot_bytes=args.max_snapshot_bytes,
        ephemeral=args.ephemeral, pod_name=env.pod_name,
        sharing=_config_from_flags(SharingConfig, args), watcher=_config_from_flags(WatcherConfig, args),
    )


async def _watch_parent(pid: int, stop: asyncio.Event) -> None:
    from sandbox_server import procfs

    # A dead parent nobody reaps stays a zombie, which ``kill(pid, 0)`` still finds (the node
    # keepers are double-forked: their parent is init, which need not reap promptly); and its pid
    # may be reused.
    started = procfs.record(pid)
    while not stop.is_set():
        if started is None or not procfs.alive(pid, started[1]):
            log.warning("parent process %d is gone: shutting down", pid)
            stop.set()
            return
        await asyncio.sleep(0.5)


async def serve(config: ControlPlaneConfig, ready_fd: int | None = None, parent_pid: int | None = None,
                remove_state: bool = False) -> None:
    from .app import FORWARDING, SHUTDOWN, TENANTS, create_app
    from .forward_protocol import Sites

    app = create_app(config)
    # aiohttp's keep-alive timer runs from the connection's start and from each answer until the next
    # request's head is complete: it is the header timeout.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0,
                           keepalive_timeout=config.header_timeout)
    await runner.setup()
    sites = Sites(runner, app[FORWARDING], config.header_timeout)
    port = await sites.tcp(config.host, config.port)
    if config.unix_socket is not None:
        if config.unix_socket.exists():
            config.unix_socket.unlink()
        await sites.unix(str(config.unix_socket))
    if config.tenants is not None:
        credentials = f"tenants {', '.join(app[TENANTS].names)} of {config.tenants}"
    elif config.no_auth:
        credentials = "NO AUTHENTICATION (--auth none)"
    elif config.auth:
        credentials = f"HTTP Basic user {config.auth[0]!r} (--auth)"
    else:
        credentials = f"HTTP Basic user {TOKEN_USER!r}, password in {token_path(config.state_dir)}"
    log.warning("IdeGym control plane listening on http://%s:%s (state in %s; %s)", config.host, port,
                config.state_dir, credentials)
    if ready_fd is not None:
        os.write(ready_fd, f"ready {port}\n".encode())
        os.close(ready_fd)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if config.tenants is not None:
        loop.add_signal_handler(signal.SIGHUP, app[TENANTS].reload, True)
    watcher = asyncio.ensure_future(_watch_parent(parent_pid, stop)) if parent_pid else None
    await stop.wait()
    app[SHUTDOWN].begin()  # calls in flight answer 503 now
    sites.close()
    if watcher is not None:
        watcher.cancel()
    await runner.cleanup()
    if config.ephemeral and remove_state:
        ephemeral_state.remove(config.state_dir, keep_logs=ephemeral_state.logs_named(config.state_dir))


def raise_open_files_limit() -> None:
    """The soft limit on open descriptors raised to the hard one (and the kernel's ``nr_open``).

    The control plane keeps a connection to each live sandbox and one per client, and the usual
    soft limit (1,024) ran out before 1,000 sandboxes. Sandboxes inherit the raised soft limit,
    which gives their processes nothing: any process may raise its own soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        ceiling = int(Path("/proc/sys/fs/nr_open").read_text())
    except (OSError, ValueError):
        ceiling = 1 << 20
    wanted = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def run_serve(args: argparse.Namespace) -> None:
    setup_logging(args.log_json, args.log_level)
    raise_open_files_limit()
    config = config_from_args(args)
    try:
        run_loop(serve(config, args.ready_fd, args.parent_pid, args.remove_state))
    except TenantsFileError as exc:
        print(f"idegym control-plane: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    except OSError as exc:
        print(f"idegym control-plane: cannot serve on {config.host}:{config.port}: {exc}; "
              "choose another --port or stop what uses it", file=sys.stderr)
        raise SystemExit(2) from exc


def add_tenants_arguments(parser: argparse.ArgumentParser) -> None:
    """``idegym control-plane tenants add|remove NAME``: edit a tenants file (``tenants.py``)."""
    sub = parser.add_subparsers(dest="tenants_command", required=True, metavar="COMMAND")
    file_default = ControlPlaneSettings.from_env().tenants
    for name, text in (("add", "make a random token for tenant NAME, append 'NAME sha256:<its hash>' to FILE "
                                "(made 0600) and print the token: it is shown only once"),
                       ("remove", "remove every line of tenant NAME from FILE: its clients are refused at their "
                                  "next request")):
        command = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        command.add_argument("name", metavar="NAME")
        command.add_argument("--file", type=Path, default=file_default, required=file_default is None,
                             help="the tenants file [$IDEGYM_CONTROL_PLANE_TENANTS]")


def run_tenants(args: argparse.Namespace) -> int:
    from . import tenants

    try:
        if args.tenants_command == "add":
            token = tenants.add(args.file, args.name)
            print(f"tenant {args.name!r} added to {args.file}; its clients use HTTP Basic user {args.name!r} and "
                  f"this token as password (IDEGYM_AUTH_USERNAME={args.name} IDEGYM_AUTH_PASSWORD=<token>):",
                  file=sys.stderr)
            print(token)
        elif not tenants.remove(args.file, args.name):
            print(f"no tenant {args.name!r} in {args.file}", file=sys.stderr)
            return 1
    except (OSError, TenantsFileError) as exc:
        print(f"idegym control-plane tenants: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="idegym-control-plane", description="Run the IdeGym control plane.")
    try:
        add_serve_arguments(parser)
    except SettingsError as exc:
        parser.exit(2, f"idegym control-plane: {exc}\n")
    run_serve(parser.parse_args(argv))
