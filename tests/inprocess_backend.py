"""A ``Backend`` for fast tests: it lives in the test's process, and its sandboxes are real sandbox
servers, each a process of its own on a Unix socket in a temporary directory.

No root, no bubblewrap, no cgroups: a template process (``tests/sandbox_template.py``) has
imported the sandbox server once and forks one per sandbox (~10 ms), so every call the control
plane forwards is real HTTP to a real server, a crash is a real process dying, and a server ends
only its own processes. Tools run as this process's user, unisolated: it is for testing the
control plane's logic (the service, the warm pool, the watcher, forwarding), never for what
isolation must show.

It keeps the contract of ``control_plane.backends.base.Backend``, failures included, and lets a
test cause them: a create that fails (``fail_creates``), an image it does not have
(``images``), a start that waits (``hold_creates``; those of some names only: ``hold_named``),
a server that dies (``crash``) or vanishes with its sandbox (``vanish``), a delete that fails
(``fail_deletes``), and a sandbox no record names (``leave_orphan``). What it did is recorded
(``asked``, ``created``, ``deleted``, ``claimed``, ``background``, ``hurried``) and ``changed`` is set at
every change, for tests to wait on.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.backends.base import (
    Backend,
    BackendError,
    ImageNotFound,
    Observation,
    SandboxAddress,
    SandboxHandle,
    SandboxSpec,
)
from sandbox_server import procfs
from tests.forked import Template

BASE_URL = "http://sandbox"
STOP_GRACE = 5.0  # a deleted server's own shutdown (it ends its processes), then SIGKILL


@dataclass
class _Sandbox:
    """One sandbox: its directory and its server process, as the template reports it."""

    name: str
    root: Path
    forked: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    ready: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    exited: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    reason: str | None = None

    @property
    def socket(self) -> Path:
        return self.root / "s.sock"

    @property
    def pid(self) -> int:
        return self.forked.result() if self.forked.done() else 0

    @property
    def running(self) -> bool:
        return self.ready.done() and self.ready.result() and not self.exited.done()


class InProcessBackend(Backend):
    name = "inprocess"

    def __init__(self, project: Path, images: set[str] | None = None) -> None:
        self.project = project  # every sandbox starts with a copy of this tree
        self.images = images  # None: any image tag starts
        self.root = Path(tempfile.mkdtemp(prefix="idegym-ipb-"))  # short: Unix socket paths are
        self.fail_creates: list[BackendError] = []  # raised by the next creates, in order
        self.fail_deletes = 0  # this many deletes fail next
        self.hold_creates: asyncio.Event | None = None  # creates wait for it (a slow start)
        self.hold_named: dict[str, asyncio.Event] = {}  # a create whose name starts with a key waits for its event
        self.asked: list[str] = []  # every create, failed ones included
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.claimed: list[str] = []
        self.hurried: list[str] = []  # background creates a start waited for
        self.background: set[str] = set()
        self.creating: set[str] = set()
        self.changed = asyncio.Event()  # set at every create, delete, crash (a test clears it)
        self._sandboxes: dict[str, _Sandbox] = {}
        self._deleted_while_created: set[str] = set()
        self._known: dict[str, _Sandbox] = {}  # every server not yet seen to exit, deleted ones too
        self._template: Template | None = None

    # -- what tests use ----------------------------------------------------------------------

    def alive(self) -> set[str]:
        """Names of the sandboxes whose server is serving."""
        return {name for name, box in self._sandboxes.items() if box.running}

    async def crash(self, name: str, reason: str = "the server process was killed") -> None:
        """The sandbox's server dies (SIGKILL, its processes with it); the sandbox stays."""
        box = self._sandboxes[name]
        box.reason = reason
        await self._kill(box)

    async def vanish(self, name: str) -> None:
        """The sandbox disappears as a whole, as if someone outside deleted it."""
        box = self._sandboxes.pop(name)
        await self._kill(box)
        shutil.rmtree(box.root, ignore_errors=True)

    async def leave_orphan(self, name: str) -> SandboxHandle:
        """A sandbox that no record names (what a killed control plane leaves behind)."""
        return await self._start(name, 30.0)

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
        """Kill every sandbox and remove the directory (the end of a test)."""
        try:
            for box in list(self._known.values()):
                await self._kill(box)
        finally:
            self._sandboxes.clear()
            shutil.rmtree(self.root, ignore_errors=True)

    # -- the contract ------------------------------------------------------------------------

    async def start(self) -> None:
        self._template = await asyncio.to_thread(Template.shared)

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
            holds = [e for prefix, e in self.hold_named.items() if name.startswith(prefix)]
            if self.hold_creates is not None:
                holds.append(self.hold_creates)
            for hold in holds:
                try:
                    await asyncio.wait_for(hold.wait(), timeout)
                except TimeoutError:
                    raise BackendError(f"sandbox {name} did not become ready within {timeout:g} s", 504) from None
            if name in self._deleted_while_created:
                raise BackendError(f"sandbox {name} was deleted while it was being created")
            handle = await self._start(name, timeout)
            self.created.append(name)
            if background:
                self.background.add(name)
            return handle
        finally:
            self.creating.discard(name)
            self._changed()

    def claim(self, handle: SandboxHandle) -> None:
        self.claimed.append(handle.name)

    def hurry(self, name: str) -> None:
        if name in self.creating:
            self.hurried.append(name)
            self._changed()

    async def delete(self, handle: SandboxHandle) -> None:
        await self.delete_name(handle.name)

    async def observe(self, handle: SandboxHandle) -> Observation:
        box = self._sandboxes.get(handle.name)
        if box is None:
            return Observation(exists=False, running=False, ready=False, phase="Gone", reason="the sandbox is gone")
        if not box.running:
            return Observation(exists=True, running=False, ready=False, phase="Failed",
                               reason=box.reason or "the server process ended")
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
        await self._stop(box)
        shutil.rmtree(box.root, ignore_errors=True)
        self.deleted.append(name)
        self._changed()

    async def settle(self) -> None:
        await self.wait_for(lambda: not self.creating, timeout=30.0)

    # -- the template and its servers --------------------------------------------------------

    def _changed(self) -> None:
        self.changed.set()

    async def _start(self, name: str, timeout: float) -> SandboxHandle:
        if self._template is None:
            raise BackendError("the in-process backend is not started (call start() first)")
        root = self.root / name
        root.mkdir()
        box = self._sandboxes[name] = self._known[name] = _Sandbox(name, root)
        argv = ["serve", "--unix-socket", str(box.socket), "--project", str(root / "project"),
                "--project-source", str(self.project), "--state-dir", str(root / "state")]
        loop = asyncio.get_running_loop()

        def route(message: dict[str, Any]) -> None:  # on the template's reader thread
            try:
                loop.call_soon_threadsafe(self._heard, box, message)
            except RuntimeError:  # the test's loop is closed: nobody is listening any more
                pass

        self._template.fork({"name": name, "argv": argv, "log": str(root / "server.log")}, route)
        try:
            ready = await asyncio.wait_for(asyncio.shield(box.ready), timeout)
        except TimeoutError:
            ready = False
        except asyncio.CancelledError:  # e.g. a warm-pool fill cut off: nothing of it stays
            self._sandboxes.pop(name, None)
            await self._kill(box)
            raise
        if not ready:
            self._sandboxes.pop(name, None)
            await self._kill(box)
            log = (root / "server.log").read_text(errors="replace")[-2000:]
            shutil.rmtree(root, ignore_errors=True)
            raise BackendError(f"sandbox {name} did not become ready within {timeout:g} s: {log}", 504)
        record = procfs.record(box.pid)
        return SandboxHandle(self.name, name, SandboxAddress(BASE_URL, unix_socket=str(box.socket)),
                             {"root": str(root), "server": record})

    def _heard(self, box: _Sandbox, message: dict[str, Any]) -> None:
        """What the template says about a server it forked."""
        if "pid" in message:
            box.forked.set_result(message["pid"])
        elif "ready" in message and not box.ready.done():
            box.ready.set_result(message["ready"])
        elif "exited" in message:
            self._known.pop(box.name, None)
            if not box.ready.done():
                box.ready.set_result(False)
            box.exited.set_result(message["exited"])
            self._changed()

    async def _stop(self, box: _Sandbox) -> None:
        """End a server as a delete does: SIGTERM (it ends its own processes), then SIGKILL."""
        await _forked(box)
        if box.pid and not box.exited.done():
            _signal(box.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(box.exited), STOP_GRACE)
            except TimeoutError:
                await self._kill(box)

    async def _kill(self, box: _Sandbox) -> None:
        """SIGKILL the server and every process it started (they are in sessions of their own)."""
        await _forked(box)
        if box.pid and not box.exited.done():
            victims = procfs.descendants(box.pid)
            _signal(box.pid, signal.SIGKILL)
            for pid in victims:
                procfs.kill(pid, signal.SIGKILL)
            try:
                await asyncio.wait_for(asyncio.shield(box.exited), 10.0)
            except TimeoutError:
                state = procfs.stat(box.pid)
                raise AssertionError(f"the server of {box.name} (pid {box.pid}, {state}) was not seen to end "
                                     f"after SIGKILL") from None
        self._changed()


async def _forked(box: _Sandbox) -> None:
    """Until the template has said the server's pid (the request is on its way)."""
    try:
        await asyncio.wait_for(asyncio.shield(box.forked), 10.0)
    except TimeoutError:
        raise AssertionError(f"the template did not fork the server of {box.name}") from None


def _signal(pid: int, sig: signal.Signals) -> None:
    """The server and its group: the group is its own only once it has called setsid, which a
    signal sent right after the fork may come before."""
    for send in (os.kill, os.killpg):
        try:
            send(pid, sig)
        except ProcessLookupError:
            pass
