"""``POST /execute`` on the control plane: a process per request, not a sandbox.

Runs go to a long-lived *runner sandbox* whose server gives every run namespaces of its own
(``sandbox_server/jail.py``): a read-only view of the sandbox in which only the run's own
directory is writable, a pid namespace whose processes all end with the program, and IPC and
network namespaces of its own. So no request sees another's files or processes, as when each
had a sandbox, and a run costs a few forks instead of a sandbox's start (~230 ms).

Where the runner's server cannot isolate runs (its capabilities lack ``isolated-runs``: it is
not root in a user namespace of its own), each request falls back to a fresh sandbox from the
warm pool, thrown away afterwards. A runner whose server stops answering is replaced.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from aiohttp import web

from sandbox_server import routes
from sandbox_server.http import Reply

from .admission import Grant
from .backends.base import BackendError, Limits, SandboxHandle, SandboxSpec
from .errors import ApiError, Unavailable
from .models import ServerKind
from .pool import new_sandbox_name
from .sandbox_http import FORWARD_FAILED, ForwardError
from .service import ControlPlane
from .tenants import SINGLE

log = logging.getLogger(__name__)

CLAIM_TIMEOUT = 120.0
ISOLATED_RUNS = "isolated-runs"  # the capability a runner sandbox's server reports
JSON = {"Content-Type": "application/json"}
# Whose its sandboxes are in the creation queue (admission.py): nobody's but the control plane's,
# so they count against --max-servers only.
QUEUE_KEY = (SINGLE, "code-runner")


class CodeRunnerPool:
    def __init__(self, cp: ControlPlane, image: str, concurrency: int) -> None:
        self.cp = cp
        self.spec = SandboxSpec(
            server_id=0, generated_name="runner", namespace="idegym", image_tag=image, server_kind=ServerKind.IDEGYM,
            run_as_root=False, runtime_class_name=None, container_port=8000, service_port=80, limits=Limits(),
        )
        self.concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._languages: Reply | None = None
        self._runner: SandboxHandle | None = None
        self._starting = asyncio.Lock()
        self._isolating = True  # until a runner's server says it cannot isolate runs
        self._closed = False
        self._room: dict[str, Grant] = {}  # each of its sandboxes counts against --max-servers while it lives

    async def run(self, method: str, path: str, body: bytes) -> Reply:
        """The code runner's answer to one request: an isolated run on the runner sandbox (or,
        where runs cannot be isolated, a sandbox of its own)."""
        async with self._slots:
            runner = await self._shared_runner()
            if runner is None:
                return await self._run_in_fresh_sandbox(method, path, body)
            try:
                return await self.cp.forwarder.request(self.cp.backend.endpoint(runner), method, path, JSON, body)
            except ForwardError as exc:
                self._retire(runner)
                raise ApiError(f"{FORWARD_FAILED}: the code runner's sandbox failed: {exc.message}") from exc

    async def languages(self) -> Reply:
        """``GET /execute/languages``, asked of a sandbox once and remembered once it answered 200."""
        if self._languages is None:
            reply = await self.run("GET", routes.LANGUAGES.relative, b"")
            if reply.status != 200:
                return reply
            self._languages = reply
        return self._languages

    async def context(self, _app: web.Application) -> AsyncIterator[None]:
        """The runner sandbox lives as long as the control plane (an aiohttp cleanup context)."""
        yield
        self._closed = True
        async with self._starting:
            if self._runner is not None:
                runner, self._runner = self._runner, None
                await self._discard(runner)

    # -- the runner sandbox -------------------------------------------------------------------------

    async def _shared_runner(self) -> SandboxHandle | None:
        """The runner sandbox, started on first use; None when its runs cannot be isolated."""
        if self._runner is not None or not self._isolating:
            return self._runner
        async with self._starting:
            if self._runner is None and self._isolating:
                if self._closed:
                    raise Unavailable("the control plane is shutting down")
                self._runner = await self._start_runner()
        return self._runner

    async def _start_runner(self) -> SandboxHandle | None:
        spec = replace(self.spec, generated_name=new_sandbox_name("runner"), isolated_runs=self.concurrency)
        handle = await self._claim(lambda: self.cp.pool.create(spec, CLAIM_TIMEOUT))
        try:
            reply = await self.cp.forwarder.request(self.cp.backend.endpoint(handle), "GET",
                                                   routes.CAPABILITIES.relative)
            plugins = json.loads(reply.body).get("plugins", []) if reply.status == 200 else []
        except (ForwardError, ValueError, AttributeError):
            plugins = []
        if ISOLATED_RUNS in plugins:
            return handle
        log.warning("the code runner's sandboxes cannot isolate runs from each other (%s image, %s backend): "
                    "every POST /execute gets a sandbox of its own", self.spec.image_tag, self.cp.backend.name)
        self._isolating = False
        self.cp.spawn(self._discard(handle))
        return None

    async def _acquire_fresh(self) -> SandboxHandle:
        handle, _warm = await self.cp.pool.acquire(self.spec, CLAIM_TIMEOUT)
        return handle

    async def _claim(self, make: Callable[[], Awaitable[SandboxHandle]]) -> SandboxHandle:
        """A sandbox from ``make`` once the admission queue gives room for it; the room is held
        until the sandbox is discarded, and the sandbox is leased: bound to no server, yet no orphan."""
        room = await self.cp.admission.sandboxes.acquire(QUEUE_KEY, 1, self.cp.queue_timeout(CLAIM_TIMEOUT))
        try:
            handle = await make()
        except BaseException as exc:
            room.release()
            if isinstance(exc, BackendError):
                raise Unavailable(f"no sandbox for the code runner: {exc.message}") from exc
            raise
        self._room[handle.name] = room
        self.cp.leased.add(handle.name)
        return handle

    def _retire(self, runner: SandboxHandle) -> None:
        if self._runner is runner:
            self._runner = None
            self.cp.spawn(self._discard(runner))

    async def _run_in_fresh_sandbox(self, method: str, path: str, body: bytes) -> Reply:
        handle = await self._claim(self._acquire_fresh)
        try:
            return await self.cp.forwarder.request(self.cp.backend.endpoint(handle), method, path, JSON, body)
        except ForwardError as exc:
            raise ApiError(f"{FORWARD_FAILED}: the code-runner sandbox failed: {exc.message}") from exc
        finally:
            self.cp.spawn(self._discard(handle))

    async def _discard(self, handle: SandboxHandle) -> None:
        try:
            await self.cp.delete_handle(handle)
        finally:
            self.cp.leased.discard(handle.name)
            room = self._room.pop(handle.name, None)
            if room is not None:
                room.release()
