"""``POST /execute`` on the control plane: each request runs in a fresh sandbox claimed from the
warm pool and thrown away afterwards, so no request sees another's files or processes."""

from __future__ import annotations

import asyncio

from sandbox_server import routes

from .backends.base import BackendError, Limits, SandboxHandle, SandboxSpec
from .errors import ApiError, Unavailable
from .forwarding import FORWARD_FAILED, ForwardError, Reply
from .models import ServerKind
from .service import ControlPlane

CLAIM_TIMEOUT = 120.0


class CodeRunnerPool:
    def __init__(self, cp: ControlPlane, image: str, concurrency: int) -> None:
        self.cp = cp
        self.spec = SandboxSpec(
            server_id=0, generated_name="runner", namespace="idegym", image_tag=image, server_kind=ServerKind.IDEGYM,
            run_as_root=False, runtime_class_name=None, container_port=8000, service_port=80, limits=Limits(),
        )
        self._slots = asyncio.Semaphore(concurrency)
        self._languages: Reply | None = None

    async def run(self, method: str, path: str, body: bytes) -> Reply:
        """The code runner's answer to one request, from a sandbox of its own."""
        async with self._slots:
            try:
                handle, _warm = await self.cp.pool.acquire(self.spec, CLAIM_TIMEOUT)
            except BackendError as exc:
                raise Unavailable(f"no sandbox for the code runner: {exc.message}") from exc
            self.cp.leased.add(handle.name)  # bound to no server, yet no orphan either
            try:
                return await self.cp.forwarder.request(self.cp.backend.endpoint(handle), method, path,
                                                       {"Content-Type": "application/json"}, body)
            except ForwardError as exc:
                raise ApiError(f"{FORWARD_FAILED}: the code-runner sandbox failed: {exc.message}") from exc
            finally:
                self.cp.spawn(self._discard(handle))

    async def languages(self) -> Reply:
        """``GET /execute/languages``, asked of a sandbox once and remembered once it answered 200."""
        if self._languages is None:
            reply = await self.run("GET", routes.LANGUAGES.relative, b"")
            if reply.status != 200:
                return reply
            self._languages = reply
        return self._languages

    async def _discard(self, handle: SandboxHandle) -> None:
        try:
            await self.cp.delete_handle(handle)
        finally:
            self.cp.leased.discard(handle.name)
