"""A ``Backend`` whose sandboxes are real sandbox servers served in this process, for fast tests.

Each sandbox is ``sandbox_server``'s app on a Unix socket of its own in a temporary directory,
on the caller's event loop: no root, no bubblewrap, no cgroups, no process start (a sandbox is
ready in ~10 ms), and every call the control plane forwards is real HTTP to a real server. Its
tools run as this process's user, unisolated: it is for testing the control plane's logic (the
service, the warm pool, the watcher, forwarding), never for what isolation must show.

It keeps the contract of ``control_plane.backends.base.Backend``, failures included, and lets a
test cause them: a create that fails (``fail_creates``), an image it does not have
(``images``), a start that waits (``hold_creates``), a server that dies (``crash``) or vanishes
with its sandbox (``vanish``), a delete that fails (``fail_deletes``), and a sandbox no record
names (``leave_orphan``). What it did is recorded (``asked``, ``created``, ``deleted``, ``claimed``,
``background``) and ``changed`` is set at every change, for tests to wait on.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from control_plane.backends.base import (
    Backend,
    BackendError,
    Endpoint,
    ImageNotFound,
    Observation,
    SandboxHandle,
    SandboxSpec,
)
from sandbox_server.app import create_app
from sandbox_server.cli import config_from_args, parser
from sandbox_server.web import App, serve_connection

BASE_URL = "http://sandbox"


@dataclass
class _Sandbox:
    """One sandbox: its server's app, its listening socket and the connections it serves."""

    name: str
    root: Path
    app: App
    listener: asyncio.AbstractServer | None = None
    contexts: list[AsyncIterator[None]] = field(default_factory=list)
    connections: set[asyncio.StreamWriter] = field(default_factory=set)
    running: bool = True
    reason: str | None = None

    @property
    def socket(self) -> Path:
        return self.root / "s.sock"


class InProcessBackend(Backend):
    name = "inprocess"

    def __init__(self, project: Path, images: set[str] | None = None) -> None:
        self.project = project  # every sandbox starts with a copy of this tree
        self.images = images  # None: any image tag starts
        self.root = Path(tempfile.mkdtemp(prefix="idegym-ipb-"))  # short: Unix socket paths are
        self.fail_creates: list[BackendError] = []  # raised by the next creates, in order
        self.fail_deletes = 0  # this many deletes fail next
        self.hold_creates: asyncio.Event | None = None  # creates wait for it (a slow start)
        self.asked: list[str] = []  # every create, failed ones included
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.claimed: list[str] = []
        self.background: set[str] = set()
        self.creating: set[str] = set()
        self.changed = asyncio.Event()  # set at every create, delete, crash (a test clears it)
        self._sandboxes: dict[str, _Sandbox] = {}
        self._deleted_while_created: set[str] = set()

    # -- what tests use ----------------------------------------------------------------------

    def alive(self) -> set[str]:
        """Names of the sandboxes whose server is serving."""
        return {name for name, box in self._sandboxes.items() if box.running}

    async def crash(self, name: str, reason: str = "the server process was killed") -> None:
        """The sandbox's server dies: connections reset, the socket gone; the sandbox stays."""
        box = self._sandboxes[name]
        await self._stop_server(box)
        box.running, box.reason = False, reason
        self._changed()

    async def vanish(self, name: str) -> None:
        """The sandbox disappears as a whole, as if someone outside deleted it."""
        box = self._sandboxes.pop(name)
        await self._stop_server(box)
        shutil.rmtree(box.root, ignore_errors=True)
        self._changed()

    async def leave_orphan(self, name: str) -> SandboxHandle:
        """A sandbox that no record names (what a killed control plane leaves behind)."""
        return await self._start(name)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Until ``predicate()`` holds, re-checked at each change of this backend (or raise)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            self.changed.clear()
            if predicate():
                return
            try:
                await asyncio.wait_for(self.changed.wait(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                if predicate():
                    return
                raise AssertionError(f"condition not met within {timeout} s") from None

    async def destroy(self) -> None:
        """Stop every sandbox and remove the directory (the end of a test)."""
        for box in list(self._sandboxes.values()):
            await self._stop_server(box)
        self._sandboxes.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- the contract ------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec, timeout: float, *, background: bool = False) -> SandboxHandle:
        name = spec.generated_name
        self.asked.append(name)
        self.creating.add(name)
        self._changed()
        try:
            if self.fail_creates:
                raise self.fail_creates.pop(0)
            if self.images is not None and spec.image_tag not in self.images:
                raise ImageNotFound(f"image {spec.image_tag!r} not found; build it first")
            if self.hold_creates is not None:
                try:
                    await asyncio.wait_for(self.hold_creates.wait(), timeout)
                except TimeoutError:
                    raise BackendError(f"sandbox {name} did not become ready within {timeout:g} s", 504) from None
            if name in self._deleted_while_created:
                raise BackendError(f"sandbox {name} was deleted while it was being created")
            handle = await self._start(name)
            self.created.append(name)
            if background:
                self.background.add(name)
            return handle
        finally:
            self.creating.discard(name)
            self._changed()

    def claim(self, handle: SandboxHandle) -> None:
        self.claimed.append(handle.name)

    async def delete(self, handle: SandboxHandle) -> None:
        await self.delete_name(handle.name)

    async def observe(self, handle: SandboxHandle) -> Observation:
        box = self._sandboxes.get(handle.name)
        if box is None:
            return Observation(exists=False, running=False, ready=False, phase="Gone", reason="the sandbox is gone")
        if not box.running:
            return Observation(exists=True, running=False, ready=False, phase="Failed", reason=box.reason)
        return Observation(exists=True, running=True, ready=True, phase="Running")

    async def list_names(self) -> set[str]:
        return set(self._sandboxes) | self.creating

    async def delete_name(self, name: str) -> None:
        if self.fail_deletes:
            self.fail_deletes -= 1
            raise BackendError(f"could not delete sandbox {name}: the backend failed (injected)")
        box = self._sandboxes.pop(name, None)
        if box is None:
            if name in self.creating:  # what is made so far goes, and the create fails
                self._deleted_while_created.add(name)
            return
        await self._stop_server(box)
        shutil.rmtree(box.root, ignore_errors=True)
        self.deleted.append(name)
        self._changed()

    async def settle(self) -> None:
        await self.wait_for(lambda: not self.creating, timeout=30.0)

    # -- serving -----------------------------------------------------------------------------

    def _changed(self) -> None:
        self.changed.set()

    async def _start(self, name: str) -> SandboxHandle:
        root = self.root / name
        root.mkdir()
        args = parser().parse_args(["serve", "--unix-socket", str(root / "s.sock"), "--project", str(root / "project"),
                                    "--project-source", str(self.project), "--state-dir", str(root / "state")])
        box = _Sandbox(name, root, create_app(config_from_args(args)))
        for factory in box.app.cleanup_ctx:  # as ``sandbox_server.web.Server.start`` does
            context = factory(box.app)
            await context.__anext__()
            box.contexts.append(context)

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            box.connections.add(writer)
            try:
                await serve_connection(box.app, reader, writer)
            finally:
                box.connections.discard(writer)

        box.listener = await asyncio.start_unix_server(serve, path=str(box.socket))
        self._sandboxes[name] = box
        return SandboxHandle(self.name, name, Endpoint(BASE_URL, unix_socket=str(box.socket)), {"root": str(root)})

    @staticmethod
    async def _stop_server(box: _Sandbox) -> None:
        """Stop serving as a dying process would: no new connections, the open ones reset."""
        if box.listener is not None:
            box.listener.close()
            box.listener = None
        for writer in list(box.connections):
            writer.transport.abort()
        box.socket.unlink(missing_ok=True)
        for context in reversed(box.contexts):
            try:
                await context.__anext__()
            except StopAsyncIteration:
                pass
        box.contexts.clear()
