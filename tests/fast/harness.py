"""A control plane's service, warm pool and watcher on the in-process backend, in the test's loop."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from control_plane.config import ControlPlaneConfig, SharingConfig, WatcherConfig
from control_plane.models import StartServerRequest, StartServerResponse
from control_plane.service import ControlPlane
from control_plane.store import ClientRow, ServerRow, SQLiteStore
from control_plane.tenants import SINGLE
from control_plane.watcher import Watcher
from sandbox_server.http import Reply
from tests.inprocess_backend import InProcessBackend

T = TypeVar("T")
IMAGE = "idegym-test:latest"


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run one test's scenario on a fresh event loop, bounded."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def make_project(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "README.md").write_text("hello\n")
    return root


@dataclass
class Harness:
    cp: ControlPlane
    backend: InProcessBackend
    watcher: Watcher
    client: ClientRow

    @property
    def store(self) -> SQLiteStore:
        return self.cp.store

    def request(self, **fields: Any) -> StartServerRequest:
        fields.setdefault("image_tag", IMAGE)
        fields.setdefault("server_start_wait_timeout_in_seconds", 10)
        return StartServerRequest(client_id=uuid.UUID(self.client.id), **fields)

    async def start(self, **fields: Any) -> StartServerResponse:
        return await self.cp.start_server(self.request(**fields), self.client)

    def server(self, server_id: int) -> ServerRow:
        row = self.store.get_server(server_id)
        assert row is not None, f"no server {server_id}"
        return row

    def serving(self) -> set[str]:
        """The sandboxes alive that are not the warm pool's (which names its fills ``pool-…`` and
        grows with demand even when the configured floor is 0)."""
        return {name for name in self.backend.alive() if not name.startswith("pool-")}

    def sandbox_of(self, server_id: int) -> str:
        """The name of the sandbox behind a server."""
        handle = self.server(server_id).handle
        assert handle is not None, f"server {server_id} has no sandbox"
        return str(json.loads(handle)["name"])

    async def call(self, server_id: int, method: str, path: str, body: Any = None,
                   timeout: float | None = None) -> Reply:
        """A call forwarded to the server's sandbox, as the forward route makes it."""
        endpoint = self.cp.forward_endpoint(self.client.id, server_id, self.client.tenant)
        data = None if body is None else json.dumps(body).encode()
        return await self.cp.forwarder.request(endpoint, method, path, {"content-type": "application/json"}, data,
                                               timeout)

    async def bash(self, server_id: int, command: str) -> dict[str, Any]:
        reply = await self.call(server_id, "POST", "api/tools/bash", {"command": command})
        assert reply.status == 200, reply.text
        answer: dict[str, Any] = json.loads(reply.body)
        return answer


@dataclass
class Served:
    """A control plane's HTTP app on the in-process backend: at ``url`` (TCP) or ``unix_socket``."""

    backend: InProcessBackend
    url: str
    unix_socket: str | None
    app: Any = None  # the aiohttp application


@asynccontextmanager
async def served(tmp_path: Path, *, tcp: bool = False, header_timeout: float = 15.0) -> AsyncIterator[Served]:
    """The whole control plane (routes, middlewares, watcher) serving on a socket, without auth."""
    from aiohttp import web

    from control_plane.app import FORWARDING, create_app
    from control_plane.forward_protocol import Sites

    backend = InProcessBackend(make_project(tmp_path / "project"))
    config = ControlPlaneConfig(state_dir=tmp_path / "state", no_auth=True, warm_pool=0, ephemeral=True,
                                header_timeout=header_timeout)
    app = create_app(config, backend)
    runner = web.AppRunner(app)
    await runner.setup()
    sites = Sites(runner, app[FORWARDING], config.header_timeout)
    try:
        if tcp:
            port = await sites.tcp("127.0.0.1", 0)
            yield Served(backend, f"http://127.0.0.1:{port}", None, app)
        else:
            sock = str(backend.root / "cp.sock")
            await sites.unix(sock)
            yield Served(backend, "http://control-plane", sock, app)
    finally:
        sites.close()
        await runner.cleanup()
        await backend.destroy()


@asynccontextmanager
async def harness(tmp_path: Path, *, warm_pool: int = 0, warm_pool_max: int = 8, images: set[str] | None = None,
                  sharing: SharingConfig | None = None, watcher: WatcherConfig | None = None,
                  **config: Any) -> AsyncIterator[Harness]:
    """A control plane (its ``ControlPlane``, without HTTP) on a fresh in-process backend."""
    backend = InProcessBackend(make_project(tmp_path / "project"), images)
    cfg = ControlPlaneConfig(state_dir=tmp_path / "state", warm_pool=warm_pool, warm_pool_max=warm_pool_max,
                             sharing=sharing or SharingConfig(), watcher=watcher or WatcherConfig(),
                             ephemeral=True, **config)
    cfg.state_dir.mkdir(parents=True)
    cp = ControlPlane(cfg, SQLiteStore(cfg.db_path), backend)
    await backend.start()
    client = cp.register_client("trainer", "idegym", 0, SINGLE)
    try:
        yield Harness(cp, backend, Watcher(cp, cfg.watcher), client)
    finally:
        await cp.close(budget=10)
        await backend.close()
        await backend.destroy()
        cp.store.close()


__all__ = ["Harness", "harness", "served", "Served", "run", "IMAGE"]
