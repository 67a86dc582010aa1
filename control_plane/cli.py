"""``idegym control-plane serve``: run the control plane (embedded local backend by default)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from aiohttp import web

from sandbox_server.http import run_loop, setup_logging

from .config import ControlPlaneConfig, WatcherConfig
from .quantities import memory_bytes

T = TypeVar("T")

log = logging.getLogger(__name__)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"IDEGYM_CONTROL_PLANE_{name}", default)


def _default(name: str, value: T, parse: Callable[[str], T]) -> T:
    """``$IDEGYM_CONTROL_PLANE_<name>`` parsed, else the configuration's default ``value``."""
    raw = _env(name)
    return value if raw in (None, "") else parse(raw)


def _bytes(text: str) -> int:
    """``8Gi``, ``512Mi``, ``1000000``: a size as Kubernetes writes quantities."""
    if text.strip() == "0":
        return 0
    try:
        return memory_bytes(text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 8Gi, 512Mi, 1000000): {exc}") from None


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    cfg, watch = ControlPlaneConfig(), WatcherConfig()  # the defaults, defined once there
    parser.add_argument("--state-dir", type=Path, default=_default("STATE_DIR", cfg.state_dir, Path),
                        help="database, images, sandboxes and snapshots [$IDEGYM_CONTROL_PLANE_STATE_DIR, "
                             "default ~/.local/state/idegym]")
    parser.add_argument("--host", default=_default("HOST", cfg.host, str),
                        help=f"address to listen on [$IDEGYM_CONTROL_PLANE_HOST, default {cfg.host}]")
    parser.add_argument("--port", type=int, default=_default("PORT", cfg.port, int),
                        help=f"TCP port; 0 picks a free one [$IDEGYM_CONTROL_PLANE_PORT, default {cfg.port}]")
    parser.add_argument("--unix-socket", type=Path, default=_default("UNIX_SOCKET", cfg.unix_socket, Path),
                        help="also listen on this Unix socket")
    parser.add_argument("--auth", default=_env("AUTH"), metavar="USER:PASSWORD",
                        help="require HTTP Basic auth on every route but /health [$IDEGYM_CONTROL_PLANE_AUTH]")
    parser.add_argument("--backend", choices=["local", "kubernetes"], default=_default("BACKEND", cfg.backend, str),
                        help=f"where sandboxes live [default {cfg.backend}]")
    parser.add_argument("--isolation", choices=["auto", "bwrap", "none"],
                        default=_default("ISOLATION", cfg.isolation, str),
                        help="local backend: bubblewrap sandboxes (auto uses them when available)")
    parser.add_argument("--network", action="store_true", default=_default("NETWORK", cfg.network, bool),
                        help="local backend: give sandboxes network access (off by default)")
    parser.add_argument("--sandbox-storage", type=_bytes,
                        default=_default("SANDBOX_STORAGE", cfg.sandbox_storage, _bytes),
                        metavar="BYTES", help="local backend: what a sandbox may write when its request sets no "
                        f"ephemeral-storage, e.g. 8Gi; 0: unbounded [$IDEGYM_CONTROL_PLANE_SANDBOX_STORAGE, default "
                        f"{cfg.sandbox_storage >> 30}Gi]")
    parser.add_argument("--sandbox-inodes", type=int, default=_default("SANDBOX_INODES", cfg.sandbox_inodes, int),
                        metavar="N", help="local backend: files and directories a sandbox may make; 0: unbounded "
                        f"[$IDEGYM_CONTROL_PLANE_SANDBOX_INODES, default {cfg.sandbox_inodes}]")
    parser.add_argument("--orphan-ttl", type=float, default=_default("ORPHAN_TTL", cfg.orphan_ttl, float),
                        metavar="SECONDS", help="local backend: every sandbox holds a lease this control plane "
                        "renews; one not renewed for this long (the control plane died and did not come back) "
                        "ends itself, processes, mounts and cgroups [$IDEGYM_CONTROL_PLANE_ORPHAN_TTL, default "
                        f"{cfg.orphan_ttl:g}]")
    parser.add_argument("--warm-pool", type=int, default=_default("WARM_POOL", cfg.warm_pool, int),
                        help="spare sandboxes kept ready per image in use (grows with demand)")
    parser.add_argument("--warm-pool-max", type=int, default=_default("WARM_POOL_MAX", cfg.warm_pool_max, int),
                        help="ceiling of the warm pool per image")
    parser.add_argument("--pool-image", action="append", default=[],
                        help="keep this image warm from start-up (repeatable)")
    parser.add_argument("--max-servers", type=int, default=_default("MAX_SERVERS", cfg.max_servers, int),
                        help="live servers allowed at once; more starts get 429 (the client retries)")
    parser.add_argument("--watch-interval", type=float, default=_default("WATCH_INTERVAL", watch.interval, float),
                        help="seconds between watcher passes")
    parser.add_argument("--inactive-timeout", type=float,
                        default=_default("INACTIVE_TIMEOUT", watch.inactive_timeout, float),
                        help="reap ALIVE servers idle this many seconds (keepalive extends)")
    parser.add_argument("--finished-timeout", type=float,
                        default=_default("FINISHED_TIMEOUT", watch.finished_timeout, float),
                        help="reap FINISHED servers not reused within this many seconds")
    parser.add_argument("--heartbeat-timeout", type=float,
                        default=_default("HEARTBEAT_TIMEOUT", watch.heartbeat_timeout, float),
                        help="reap clients silent this many seconds")
    parser.add_argument("--operation-retention", type=float,
                        default=_default("RETENTION", watch.operation_retention, float),
                        help="seconds of request history kept")
    parser.add_argument("--ephemeral", action="store_true", default=cfg.ephemeral,
                        help="delete every sandbox on shutdown (for embedded use)")
    if _wants_kubernetes():
        # the client library costs ~0.4 s to import: only when this backend is chosen
        from .backends.kubernetes import KubernetesConfig

        KubernetesConfig.add_arguments(parser)
    else:
        parser.epilog = "With --backend kubernetes, --help also lists the --k8s-* settings."
    parser.add_argument("--remove-state", action="store_true",
                        help="with --ephemeral: also remove the state directory on shutdown")
    parser.add_argument("--parent-pid", type=int,
                        help="shut down (cleanly) when this process exits: embedded use never outlives its owner")
    parser.add_argument("--ready-fd", type=int, help="write 'ready <port>\\n' to this fd once listening")
    parser.add_argument("--log-json", action="store_true", default=bool(os.environ.get("IDEGYM_LOG_JSON")),
                        help="one JSON object per log line")
    parser.add_argument("--log-level", default=os.environ.get("IDEGYM_LOG_LEVEL", "WARNING"),
                        help="WARNING (default); INFO logs every request")


def _wants_kubernetes() -> bool:
    argv = sys.argv[1:]
    return ("kubernetes" in argv or "--backend=kubernetes" in argv
            or os.environ.get("IDEGYM_CONTROL_PLANE_BACKEND") == "kubernetes")


def config_from_args(args: argparse.Namespace) -> ControlPlaneConfig:
    auth = None
    if args.auth:
        user, sep, password = args.auth.partition(":")
        if not sep or not user:
            raise SystemExit("--auth: expected USER:PASSWORD")
        auth = (user, password)
    kubernetes: dict = {}
    if args.backend == "kubernetes":
        from dataclasses import asdict

        from .backends.kubernetes import KubernetesConfig

        kubernetes = asdict(KubernetesConfig.from_args(args))
    return ControlPlaneConfig(
        kubernetes=kubernetes,
        state_dir=args.state_dir, host=args.host, port=args.port, unix_socket=args.unix_socket, auth=auth,
        backend=args.backend, isolation=args.isolation, network=args.network, warm_pool=args.warm_pool,
        sandbox_storage=args.sandbox_storage, sandbox_inodes=args.sandbox_inodes, orphan_ttl=args.orphan_ttl,
        warm_pool_max=args.warm_pool_max, pool_images=list(args.pool_image), max_servers=args.max_servers,
        ephemeral=args.ephemeral,
        watcher=WatcherConfig(interval=args.watch_interval, inactive_timeout=args.inactive_timeout,
                              finished_timeout=args.finished_timeout, heartbeat_timeout=args.heartbeat_timeout,
                              operation_retention=args.operation_retention),
    )


async def _watch_parent(pid: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log.warning("parent process %d is gone: shutting down", pid)
            stop.set()
            return
        await asyncio.sleep(0.5)


async def serve(config: ControlPlaneConfig, ready_fd: int | None = None, parent_pid: int | None = None,
                remove_state: bool = False) -> None:
    from .app import SHUTDOWN, create_app

    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    await site.start()
    port = site._server.sockets[0].getsockname()[1] if site._server else config.port  # type: ignore[union-attr]
    if config.unix_socket is not None:
        if config.unix_socket.exists():
            config.unix_socket.unlink()
        await web.UnixSite(runner, str(config.unix_socket)).start()
    log.warning("IdeGym control plane listening on http://%s:%s (state in %s)", config.host, port, config.state_dir)
    if ready_fd is not None:
        os.write(ready_fd, f"ready {port}\n".encode())
        os.close(ready_fd)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.ensure_future(_watch_parent(parent_pid, stop)) if parent_pid else None
    await stop.wait()
    app[SHUTDOWN].begin()  # calls in flight answer 503 now
    if watcher is not None:
        watcher.cancel()
    await runner.cleanup()
    if config.ephemeral and remove_state:
        shutil.rmtree(config.state_dir, ignore_errors=True)


def run_serve(args: argparse.Namespace) -> None:
    setup_logging(args.log_json, args.log_level)
    config = config_from_args(args)
    try:
        run_loop(serve(config, args.ready_fd, args.parent_pid, args.remove_state))
    except OSError as exc:
        print(f"idegym control-plane: cannot serve on {config.host}:{config.port}: {exc}; "
              "choose another --port or stop what uses it", file=sys.stderr)
        raise SystemExit(2) from exc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="idegym-control-plane", description="Run the IdeGym control plane.")
    add_serve_arguments(parser)
    run_serve(parser.parse_args(argv))
