"""The asynchronous client: ``AsyncIdeGymClient`` and ``AsyncSandbox``, mirroring the sync ones."""

from __future__ import annotations

import asyncio
import builtins
import http.client as http_client
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from control_plane.models import (
    CreateSnapshotResponse,
    JobStatusResponse,
    KeepaliveServerResponse,
    ServerActionResponse,
    ServerReuseStrategy,
    ServerStatusResponse,
    ServerSummary,
    StartServerRequest,
    StartServerResponse,
)
from sandbox_server.http import Reply
from sandbox_server.models import (
    DEFAULT_TIMEOUT,
    BashCommandResponse,
    CheckResult,
    ExecuteResponse,
    ResetResult,
    SessionInfo,
    SessionReadResponse,
    TestReport,
)
from sandbox_server.routes import Endpoint, Req, Resp

from ..errors import APIError, SandboxGone, ServerError, TimeoutError, TransportError
from . import _plans, _uploads
from ._exceptions import not_a_control_plane, place, shown_url, unreachable
from ._http_async import AsyncHTTPSession
from ._plans import ToolResult
from ._protocol import Blocking, Call, Plan, Sleep, T, Target, call
from ._settings import BUILTIN_IMAGE, Settings

if TYPE_CHECKING:
    from ..tools import ToolCall
    from ._sync import Sandbox


async def _send(http: AsyncHTTPSession, call: Call) -> Reply:
    try:
        resp = await http.request(call.method, call.path, json=call.json, data=call.data, params=call.params,
                                  headers=call.headers, timeout=call.timeout, content=call.content,
                                  content_length=call.content_length or 0)
    except builtins.TimeoutError as exc:
        raise TimeoutError(f"{call.method} {shown_url(http.base_url)}{call.path}: no answer within "
                           f"{call.timeout} s") from exc
    except (OSError, http_client.HTTPException) as exc:
        raise TransportError(f"{call.method} {shown_url(http.base_url)}{call.path}: {type(exc).__name__}: "
                             f"{exc}") from exc
    return Reply(resp.status_code, resp.headers, resp.content)


async def drive(http: AsyncHTTPSession, plan: Plan[T]) -> T:
    try:
        step = next(plan)
        while True:
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                step = plan.send(None)
            elif isinstance(step, Blocking):
                step = plan.send(await asyncio.to_thread(step.work))
            else:
                step = plan.send(await _send(http, step))
    except StopIteration as done:
        value: T = done.value  # the plan's return value (StopIteration types it Any)
        return value


class AsyncSessions:
    """Async sessions to where synchronous sandboxes are, for one event loop: a plan of calls to a
    ``Sandbox`` (an env's step) made on the loop, over connections of its own, instead of on a
    worker thread over the sandbox's. ``close()`` from any thread; the loop must still run."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._sessions: dict[tuple[str, str | None, str | None], AsyncHTTPSession] = {}

    @classmethod
    def on_running_loop(cls, sessions: AsyncSessions | None) -> AsyncSessions:
        """``sessions`` if they are the running loop's, else new ones for it (the others closed)."""
        loop = asyncio.get_running_loop()
        if sessions is not None and sessions.loop is loop:
            return sessions
        if sessions is not None:
            sessions.close()
        return cls(loop)

    async def run(self, sandbox: Sandbox, plan: Plan[T]) -> T:
        return await drive(self._session(sandbox), plan)

    def tools(self, sandbox: Sandbox) -> AsyncSandbox:
        """``sandbox``'s tools and checks on this loop (its life cycle stays with ``sandbox``)."""
        return AsyncSandbox(self._session(sandbox), sandbox.target, info=sandbox.info)

    def _session(self, sandbox: Sandbox) -> AsyncHTTPSession:
        http = sandbox._http  # noqa: SLF001 - the sync client's own session, read for where it goes
        key = (http.base_url, http.unix_socket, http.authorization)
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = AsyncHTTPSession(http.base_url, unix_socket=http.unix_socket,
                                                             authorization=http.authorization,
                                                             default_timeout=http.default_timeout)
        return session

    def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            if self.loop.is_closed():
                continue  # nothing can be closed on it: its connections went with it
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self.loop:
                session.close()
            else:
                self.loop.call_soon_threadsafe(session.close)


class AsyncSandbox:
    """One sandbox: its tools, checks, reset and life cycle.

    Get one from ``IdeGymClient.start(...)``, or connect straight to a sandbox server with
    ``Sandbox.connect(url)`` / ``Sandbox.connect(unix_socket=...)`` (no control plane: life-cycle
    calls then raise). Used as a context manager it finishes the server on exit (reusable)."""

    def __init__(self, http: AsyncHTTPSession, target: Target, client: AsyncIdeGymClient | None = None,
                 info: StartServerResponse | None = None) -> None:
        self._http = http
        self._target = target
        self._client = client
        self.info = info
        self._ended = False  # finished or stopped through this object

    @classmethod
    def connect(cls, url: str = "http://sandbox", *, unix_socket: str | None = None,
                timeout: float = 60.0) -> AsyncSandbox:
        return cls(AsyncHTTPSession(url, unix_socket=unix_socket, default_timeout=timeout), Target.direct())

    @property
    def server_id(self) -> int | None:
        return self.info.server_id if self.info else None

    async def _run(self, plan: Plan[T]) -> T:
        return await drive(self._http, plan)

    # -- tools --------------------------------------------------------------------------------

    async def bash(self, command: str, *, timeout: float = 600.0, cwd: str | None = None,
             env: dict[str, str] | None = None, user: str | None = None,
             max_output_bytes: int | None = 1_048_576, strip_output: bool = False,
             graceful_termination_timeout: float = 2.0) -> BashCommandResponse:
        """Run a bash script; a non-zero exit is a result (``exit_code``), not an exception."""
        return await self._run(_plans.bash(self._target, command, timeout, cwd, env, user, max_output_bytes,
                                           strip_output, graceful_termination_timeout))

    async def write_file(self, path: str, content: str) -> None:
        await self._run(_plans.write_file(self._target, path, content))

    async def read_file(self, path: str) -> str:
        return (await self.download(path)).decode("utf-8", errors="replace")

    async def edit(self, path: str, start_line: int, end_line: int, new_content: str) -> None:
        await self._run(_plans.edit(self._target, path, start_line, end_line, new_content))

    async def patch(self, path: str, patch_text: str) -> None:
        """Apply diff-match-patch patch text; raises ``Conflict`` naming hunks that did not apply."""
        await self._run(_plans.patch(self._target, path, patch_text))

    async def upload(self, path: str, data: bytes, chunk: int = 1 << 20) -> int:
        return await self._run(_plans.upload(self._target, path, data, chunk))

    async def download(self, path: str, chunk: int = 1 << 20) -> bytes:
        return await self._run(_plans.download(self._target, path, chunk))

    # -- checks ---------------------------------------------------------------------------------

    async def setup_check(self, script: str, timeout: float = 600.0, *, keep_processes: bool = False) -> CheckResult:
        """The setup check; what it leaves running ends with it unless ``keep_processes``."""
        return await self._run(_plans.setup_check(self._target, script, timeout, keep_processes))

    async def compile(self, script: str, timeout: float = 600.0, *, keep_processes: bool = False) -> CheckResult:
        """The compilation check; what it leaves running ends with it unless ``keep_processes``."""
        return await self._run(_plans.compile_check(self._target, script, timeout, keep_processes))

    async def run_tests(self, script: str, timeout: float = 600.0, report_glob: str = "test-*.xml") -> TestReport:
        return await self._run(_plans.run_tests(self._target, script, timeout, report_glob))

    async def execute(self, language: str, code: str, *, args: list[str] | None = None,
                files: list[dict[str, str]] | None = None, stdin: str = "", timeout: float = 10.0) -> ExecuteResponse:
        return await self._run(_plans.execute(self._target, language, code, args, files, stdin, timeout))

    async def call(self, endpoint: Endpoint[Req, Resp], request: Req | None = None) -> Resp:
        """Any sandbox-server route (``sandbox_server.routes``) with its wire models."""
        return await self._run(call(self._target, endpoint, request))

    async def run_tool(self, tool_call: ToolCall, *, bash_timeout: float = DEFAULT_TIMEOUT) -> ToolResult:
        """Carry out an ``idegym_env.tools`` tool call that has a route (not ``submit``); ``bash_timeout``
        is a bash call's timeout when it names none, and the most it may name. The answer is the
        route's response model. Errors are the typed exceptions, as for every call."""
        return await self._run(_plans.run_tool(self._target, tool_call, bash_timeout))

    async def terminate_processes(self, grace: float = 2.0) -> int:
        """End every process a tool started (files stay); returns how many there were."""
        return await self._run(_plans.terminate_processes(self._target, grace))

    async def capabilities(self) -> list[str]:
        return await self._run(_plans.capabilities(self._target))

    # -- background processes and terminal sessions (sandbox_server/sessions.py) -------------------

    async def start_session(self, command: str, *, pty: bool = False, **fields: Any) -> SessionInfo:
        """Start ``command`` (bash) in the background, or with ``pty`` in a terminal; its output is
        kept as it comes (``read_session``). ``fields``: cwd, env, user, timeout, cols, rows,
        max_output_bytes."""
        return await self._run(_plans.start_session(self._target, command, {"pty": pty, **fields}))

    async def read_session(self, sid: str, offset: int = 0, *, wait: float = 0.0,
                     max_bytes: int = 65_536) -> SessionReadResponse:
        """Output from ``offset`` (waiting up to ``wait`` s for some); ``next_offset`` continues it."""
        return await self._run(_plans.read_session(self._target, sid, offset, wait, max_bytes))

    async def write_session(self, sid: str, data: str) -> SessionInfo:
        return await self._run(_plans.write_session(self._target, sid, data))

    async def resize_session(self, sid: str, cols: int, rows: int) -> SessionInfo:
        return await self._run(_plans.resize_session(self._target, sid, cols, rows))

    async def end_session(self, sid: str, grace: float = 2.0) -> SessionInfo:
        return await self._run(_plans.end_session(self._target, sid, grace))

    async def reset(self, timeout: float = 600.0, *, to_fork_point: bool = False) -> ResetResult:
        """Project back to the image byte for byte; every process a tool started ends. A fork's
        child with ``to_fork_point``: back to the project as it was when it was forked."""
        return await self._run(_plans.reset(self._target, timeout, to_fork_point))

    # -- life cycle (through the control plane) ----------------------------------------------

    def _owner(self) -> tuple[AsyncIdeGymClient, int]:
        if self._client is None or self.server_id is None:
            raise RuntimeError("this sandbox was connected directly; life-cycle calls need the control plane")
        return self._client, self.server_id

    async def restart(self, timeout: int = 300) -> ServerActionResponse:
        """As fresh as a new sandbox from the image, same server id."""
        c, server_id = self._owner()
        return await c._run(_plans.server_action("POST", "/api/idegym-servers/restart", c.client_id, server_id,
                                           c.namespace, {"server_start_wait_timeout_in_seconds": timeout},
                                           timeout + 60))

    async def fork(self, n: int = 1, *, server_name: str | None = None, timeout: float = 600.0) -> list[AsyncSandbox]:
        """``n`` new servers (1 to 64), each with this sandbox's whole filesystem as it is now and
        fresh processes (no process state is copied); this sandbox keeps running and sees none of
        them. They are ordinary servers of this client, under ``server_name`` (default: this
        one's)."""
        c, server_id = self._owner()
        answer = await c._run(_plans.fork(c.client_id, server_id, c.namespace, n, server_name, timeout))
        return [AsyncSandbox(self._http, Target.forwarded(c.client_id, s.server_id), c,
                        _plans.forked_info(self.info, c.namespace, c.client_id, s)) for s in answer.servers]

    async def snapshot(self) -> CreateSnapshotResponse:
        c, server_id = self._owner()
        return await c._run(_plans.snapshot(c.client_id, server_id, c.namespace))

    async def keepalive(self, minutes: float = 15.0) -> KeepaliveServerResponse:
        c, server_id = self._owner()
        return await c._run(_plans.keepalive(c.client_id, server_id, c.namespace, minutes))

    async def status(self) -> ServerStatusResponse:
        c, server_id = self._owner()
        return await c._run(_plans.status(c.client_id, server_id))

    async def finish(self) -> ServerActionResponse:
        """Hand the server back for reuse (FINISHED)."""
        c, server_id = self._owner()
        answer = await c._run(_plans.server_action("POST", "/api/idegym-servers/finish", c.client_id, server_id,
                                                   c.namespace))
        self._ended = True
        return answer

    async def stop(self) -> ServerActionResponse:
        """Delete the server and its sandbox (STOPPED)."""
        c, server_id = self._owner()
        answer = await c._run(_plans.server_action("DELETE", "/api/idegym-servers", c.client_id, server_id,
                                                   c.namespace))
        self._ended = True
        return answer

    async def close(self) -> None:
        if self._client is None:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._client is not None and self.server_id is not None:
            if not self._ended:
                try:
                    await self.finish()
                except SandboxGone:  # crashed or reaped meanwhile: nothing to hand back
                    pass
        else:
            await self.close()


class AsyncIdeGymClient:
    """A session with a control plane: registers on enter, heartbeats, stops on exit.

    ``url`` defaults to ``$IDEGYM_URL``; credentials to ``$IDEGYM_AUTH_USERNAME``/``PASSWORD``.
    """

    def __init__(self, url: str | None = None, *, name: str = "idegym", namespace: str = "idegym",
                 unix_socket: str | None = None, auth: tuple[str, str] | None = None,
                 heartbeat_interval: float = 60.0, settings: Settings | None = None) -> None:
        self.settings = settings or Settings.resolve(url, unix_socket, auth)
        self.name = name
        self.namespace = namespace
        self.heartbeat_interval = heartbeat_interval
        self._http = AsyncHTTPSession(self.settings.url, unix_socket=self.settings.unix_socket, auth=self.settings.auth)
        # Sandboxes' calls go on connections of their own, which carry only forwards: the control
        # plane serves those below aiohttp until a connection carries anything else
        # (``control_plane/forward_protocol.py``, ``benchmarks/forward_http.py``).
        self._sandbox_http = AsyncHTTPSession(self.settings.url, unix_socket=self.settings.unix_socket,
                                              auth=self.settings.auth)
        self._client_id: str | None = None
        self._release: Callable[[], None] | None = None  # hands an embedded control plane back
        self._heartbeat: asyncio.Task[None] | None = None

    @classmethod
    def embedded(cls, **kwargs: Any) -> AsyncIdeGymClient:
        """A client of this process's embedded control plane, started on demand as ``gym.make``
        starts it (``idegym_env.embedded``); ``close()`` hands it back, and it stops once its
        grace period passes without another user."""
        from .. import embedded

        control_plane = embedded.acquire()
        try:
            client = cls(control_plane.url, **kwargs)
        except BaseException:
            embedded.release()
            raise
        client._release = embedded.release
        return client

    async def _run(self, plan: Plan[T]) -> T:
        return await drive(self._http, plan)

    @property
    def client_id(self) -> str:
        if self._client_id is None:
            raise RuntimeError("not registered: use the client as a context manager or call register()")
        return self._client_id

    async def register(self) -> str:
        try:
            answer = await self._run(_plans.register(self.name, self.namespace))
        except TransportError as exc:
            raise unreachable(place(self.settings.url, self.settings.unix_socket), exc) from exc
        except APIError as exc:
            # A control plane always serves this route, and its errors always name their kind
            # (but the 422 shape of ``specs/``): anything else is another HTTP service.
            if exc.status in (404, 405) or (exc.kind is None and exc.status != 422):
                raise not_a_control_plane(place(self.settings.url, self.settings.unix_socket), exc) from exc
            raise
        self._client_id = str(answer.id)
        self._heartbeat = asyncio.ensure_future(self._beat())
        return self._client_id

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self._run(_plans.heartbeat(self.client_id))
            except Exception:  # noqa: BLE001 - a missed heartbeat is retried next interval
                pass

    async def start(self, image_tag: str = BUILTIN_IMAGE, *, server_name: str = "default-idegym-server",
              reuse: ServerReuseStrategy | str = ServerReuseStrategy.RESET, run_as_root: bool = False,
              timeout: int = 300, **fields: Any) -> AsyncSandbox:
        """Start a server (or reuse a FINISHED one) and return its sandbox handle."""
        req = StartServerRequest(client_id=self.client_id, namespace=self.namespace, image_tag=image_tag,
                                 server_name=server_name, reuse_strategy=ServerReuseStrategy(reuse),
                                 run_as_root=run_as_root, server_start_wait_timeout_in_seconds=timeout, **fields)
        info = await self._run(_plans.start(req))
        return AsyncSandbox(self._sandbox_http, Target.forwarded(self.client_id, int(info.server_id or 0)), self, info)

    async def build_images(self, yaml_text: str, timeout: float = 3600.0, *, upload: bool = True
                           ) -> list[JobStatusResponse]:
        """Build the images of a build YAML (see ``control_plane.images``); waits for every job and
        raises ``ServerError`` naming the failed ones. With ``upload`` (the default) every
        ``project.path`` and ``context`` that is a directory of this machine is sent as an upload
        (only what the control plane lacks) and named by it: the control plane needs no access
        to this machine's files. ``upload=False`` sends the paths as they are, for directories of
        the control plane's own host (its ``--build-root``)."""
        if upload:
            yaml_text, trees = await asyncio.to_thread(_uploads.local_trees, yaml_text)
            await self._send_trees(trees)
        names = await self._run(_plans.build_images(yaml_text, self.namespace, self._client_id))
        jobs = [await self._run(_plans.wait_job(name, timeout)) for name in names]
        failed = [j for j in jobs if j.status != "success"]
        if failed:
            raise ServerError(500, "image build failed: " + "; ".join(f"{j.job_name}: {j.details}" for j in failed),
                              "", "control-plane")
        return jobs

    async def upload(self, path: str | Path) -> str:
        """Send the directory ``path`` as an upload unless the control plane has it; its digest,
        for a build YAML's ``project: {upload: DIGEST}`` or ``context: upload:DIGEST``."""
        tree = await asyncio.to_thread(_uploads.DIGESTS.tree, Path(path))
        await self._send_trees([tree])
        return tree.digest

    async def _send_trees(self, trees: list[_uploads.LocalTree]) -> None:
        if not trees:
            return
        wanted = set(await self._run(_uploads.missing([t.digest for t in trees])))
        for tree in trees:
            if tree.digest not in wanted:
                continue
            body = await asyncio.to_thread(tree.wire_body)
            try:
                for attempt in range(_uploads.UPLOAD_TRIES):  # a PUT cut off starts over
                    try:
                        await self._run(_uploads.put(tree, body, self._client_id))
                        break
                    except TransportError:
                        if attempt == _uploads.UPLOAD_TRIES - 1:
                            raise
            finally:
                body.close()

    async def sandboxes(self, include_terminal: bool = False) -> list[ServerSummary]:
        return (await self._run(_plans.list_servers(self.client_id, include_terminal))).servers

    async def close(self, stop: bool = True) -> None:
        """Stop heartbeats and, with ``stop``, every server this client still owns."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        try:
            if stop and self._client_id is not None:
                await self._run(_plans.stop_client(self._client_id, self.namespace))
        finally:
            self._client_id = None
            await self._http.aclose()
            await self._sandbox_http.aclose()
            release, self._release = self._release, None
            if release is not None:
                release()

    async def __aenter__(self) -> AsyncIdeGymClient:
        await self.register()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
