"""The synchronous client: ``IdeGymClient`` (a control-plane session) and ``Sandbox`` (one server)."""

from __future__ import annotations

import builtins
import http.client as http_client
import threading
import time
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
from ._http import HTTPSession
from ._plans import ToolResult
from ._protocol import Blocking, Call, Plan, Sleep, T, Target, call
from ._settings import BUILTIN_IMAGE, Settings

if TYPE_CHECKING:
    from ..tools import ToolCall


def _send(http: HTTPSession, call: Call) -> Reply:
    try:
        resp = http.request(call.method, call.path, json=call.json, data=call.data, params=call.params,
                            headers=call.headers, timeout=call.timeout, content=call.content,
                            content_length=call.content_length or 0)
    except builtins.TimeoutError as exc:
        raise TimeoutError(f"{call.method} {shown_url(http.base_url)}{call.path}: no answer within "
                           f"{call.timeout} s") from exc
    except (OSError, http_client.HTTPException) as exc:
        raise TransportError(f"{call.method} {shown_url(http.base_url)}{call.path}: {type(exc).__name__}: "
                             f"{exc}") from exc
    return Reply(resp.status_code, resp.headers, resp.content)


def drive(http: HTTPSession, plan: Plan[T]) -> T:
    try:
        step = next(plan)
        while True:
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                step = plan.send(None)
            elif isinstance(step, Blocking):
                step = plan.send(step.work())
            else:
                step = plan.send(_send(http, step))
    except StopIteration as done:
        value: T = done.value  # the plan's return value (StopIteration types it Any)
        return value


class Sandbox:
    """One sandbox: its tools, checks, reset and life cycle.

    Get one from ``IdeGymClient.start(...)``, or connect straight to a sandbox server with
    ``Sandbox.connect(url)`` / ``Sandbox.connect(unix_socket=...)`` (no control plane: life-cycle
    calls then raise). Used as a context manager it finishes the server on exit (reusable)."""

    def __init__(self, http: HTTPSession, target: Target, client: IdeGymClient | None = None,
                 info: StartServerResponse | None = None) -> None:
        self._http = http
        self._target = target
        self._client = client
        self.info = info
        self._ended = False  # finished or stopped through this object

    @classmethod
    def connect(cls, url: str = "http://sandbox", *, unix_socket: str | None = None,
                timeout: float = 60.0) -> Sandbox:
        return cls(HTTPSession(url, unix_socket=unix_socket, default_timeout=timeout), Target.direct())

    @property
    def server_id(self) -> int | None:
        return self.info.server_id if self.info else None

    @property
    def target(self) -> Target:
        """Where this sandbox's API is (for plans made outside the client, ``_protocol.py``)."""
        return self._target

    def run_plan(self, plan: Plan[T]) -> T:
        """Drive a plan (``_protocol.py``) of calls to this sandbox."""
        return drive(self._http, plan)

    # -- tools --------------------------------------------------------------------------------

    def bash(self, command: str, *, timeout: float = 600.0, cwd: str | None = None,
             env: dict[str, str] | None = None, user: str | None = None,
             max_output_bytes: int | None = 1_048_576, strip_output: bool = False,
             graceful_termination_timeout: float = 2.0) -> BashCommandResponse:
        """Run a bash script; a non-zero exit is a result (``exit_code``), not an exception."""
        return self.run_plan(_plans.bash(self._target, command, timeout, cwd, env, user, max_output_bytes, strip_output,
                                     graceful_termination_timeout))

    def write_file(self, path: str, content: str) -> None:
        self.run_plan(_plans.write_file(self._target, path, content))

    def read_file(self, path: str) -> str:
        return self.download(path).decode("utf-8", errors="replace")

    def edit(self, path: str, start_line: int, end_line: int, new_content: str) -> None:
        self.run_plan(_plans.edit(self._target, path, start_line, end_line, new_content))

    def patch(self, path: str, patch_text: str) -> None:
        """Apply diff-match-patch patch text; raises ``Conflict`` naming hunks that did not apply."""
        self.run_plan(_plans.patch(self._target, path, patch_text))

    def upload(self, path: str, data: bytes, chunk: int = 1 << 20) -> int:
        return self.run_plan(_plans.upload(self._target, path, data, chunk))

    def download(self, path: str, chunk: int = 1 << 20) -> bytes:
        return self.run_plan(_plans.download(self._target, path, chunk))

    # -- checks ---------------------------------------------------------------------------------

    def setup_check(self, script: str, timeout: float = 600.0, *, keep_processes: bool = False) -> CheckResult:
        """The setup check; what it leaves running ends with it unless ``keep_processes``."""
        return self.run_plan(_plans.setup_check(self._target, script, timeout, keep_processes))

    def compile(self, script: str, timeout: float = 600.0, *, keep_processes: bool = False) -> CheckResult:
        """The compilation check; what it leaves running ends with it unless ``keep_processes``."""
        return self.run_plan(_plans.compile_check(self._target, script, timeout, keep_processes))

    def run_tests(self, script: str, timeout: float = 600.0, report_glob: str = "test-*.xml") -> TestReport:
        return self.run_plan(_plans.run_tests(self._target, script, timeout, report_glob))

    def execute(self, language: str, code: str, *, args: list[str] | None = None,
                files: list[dict[str, str]] | None = None, stdin: str = "", timeout: float = 10.0) -> ExecuteResponse:
        return self.run_plan(_plans.execute(self._target, language, code, args, files, stdin, timeout))

    def call(self, endpoint: Endpoint[Req, Resp], request: Req | None = None) -> Resp:
        """Any sandbox-server route (``sandbox_server.routes``) with its wire models."""
        return self.run_plan(call(self._target, endpoint, request))

    def run_tool(self, tool_call: ToolCall, *, bash_timeout: float = DEFAULT_TIMEOUT) -> ToolResult:
        """Carry out an ``idegym_env.tools`` tool call that has a route (not ``submit``); ``bash_timeout``
        is a bash call's timeout when it names none, and the most it may name. The answer is the
        route's response model. Errors are the typed exceptions, as for every call."""
        return self.run_plan(_plans.run_tool(self._target, tool_call, bash_timeout))

    def terminate_processes(self, grace: float = 2.0) -> int:
        """End every process a tool started (files stay); returns how many there were."""
        return self.run_plan(_plans.terminate_processes(self._target, grace))

    def capabilities(self) -> list[str]:
        return self.run_plan(_plans.capabilities(self._target))

    # -- background processes and terminal sessions (sandbox_server/sessions.py) -------------------

    def start_session(self, command: str, *, pty: bool = False, **fields: Any) -> SessionInfo:
        """Start ``command`` (bash) in the background, or with ``pty`` in a terminal; its output is
        kept as it comes (``read_session``). ``fields``: cwd, env, user, timeout, cols, rows,
        max_output_bytes."""
        return self.run_plan(_plans.start_session(self._target, command, {"pty": pty, **fields}))

    def read_session(self, sid: str, offset: int = 0, *, wait: float = 0.0,
                     max_bytes: int = 65_536) -> SessionReadResponse:
        """Output from ``offset`` (waiting up to ``wait`` s for some); ``next_offset`` continues it."""
        return self.run_plan(_plans.read_session(self._target, sid, offset, wait, max_bytes))

    def write_session(self, sid: str, data: str) -> SessionInfo:
        return self.run_plan(_plans.write_session(self._target, sid, data))

    def resize_session(self, sid: str, cols: int, rows: int) -> SessionInfo:
        return self.run_plan(_plans.resize_session(self._target, sid, cols, rows))

    def end_session(self, sid: str, grace: float = 2.0) -> SessionInfo:
        return self.run_plan(_plans.end_session(self._target, sid, grace))

    def reset(self, timeout: float = 600.0, *, to_fork_point: bool = False) -> ResetResult:
        """Project back to the image byte for byte; every process a tool started ends. A fork's
        child with ``to_fork_point``: back to the project as it was when it was forked."""
        return self.run_plan(_plans.reset(self._target, timeout, to_fork_point))

    # -- life cycle (through the control plane) ----------------------------------------------

    def _owner(self) -> tuple[IdeGymClient, int]:
        if self._client is None or self.server_id is None:
            raise RuntimeError("this sandbox was connected directly; life-cycle calls need the control plane")
        return self._client, self.server_id

    def restart(self, timeout: int = 300) -> ServerActionResponse:
        """As fresh as a new sandbox from the image, same server id."""
        c, server_id = self._owner()
        return c._run(_plans.server_action("POST", "/api/idegym-servers/restart", c.client_id, server_id,
                                           c.namespace, {"server_start_wait_timeout_in_seconds": timeout},
                                           timeout + 60))

    def fork(self, n: int = 1, *, server_name: str | None = None, timeout: float = 600.0) -> list[Sandbox]:
        """``n`` new servers (1 to 64), each with this sandbox's whole filesystem as it is now and
        fresh processes (no process state is copied); this sandbox keeps running and sees none of
        them. They are ordinary servers of this client, under ``server_name`` (default: this
        one's)."""
        c, server_id = self._owner()
        answer = c._run(_plans.fork(c.client_id, server_id, c.namespace, n, server_name, timeout))
        return [Sandbox(self._http, Target.forwarded(c.client_id, s.server_id), c,
                        _plans.forked_info(self.info, c.namespace, c.client_id, s)) for s in answer.servers]

    def snapshot(self) -> CreateSnapshotResponse:
        c, server_id = self._owner()
        return c._run(_plans.snapshot(c.client_id, server_id, c.namespace))

    def keepalive(self, minutes: float = 15.0) -> KeepaliveServerResponse:
        c, server_id = self._owner()
        return c._run(_plans.keepalive(c.client_id, server_id, c.namespace, minutes))

    def status(self) -> ServerStatusResponse:
        c, server_id = self._owner()
        return c._run(_plans.status(c.client_id, server_id))

    def finish(self) -> ServerActionResponse:
        """Hand the server back for reuse (FINISHED)."""
        c, server_id = self._owner()
        answer = c._run(_plans.server_action("POST", "/api/idegym-servers/finish", c.client_id, server_id,
                                             c.namespace))
        self._ended = True
        return answer

    def stop(self) -> ServerActionResponse:
        """Delete the server and its sandbox (STOPPED)."""
        c, server_id = self._owner()
        answer = c._run(_plans.server_action("DELETE", "/api/idegym-servers", c.client_id, server_id,
                                             c.namespace))
        self._ended = True
        return answer

    def close(self) -> None:
        if self._client is None:
            self._http.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._client is not None and self.server_id is not None:
            if not self._ended:
                try:
                    self.finish()
                except SandboxGone:  # crashed or reaped meanwhile: nothing to hand back
                    pass
        else:
            self.close()


class IdeGymClient:
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
        self._http = HTTPSession(self.settings.url, unix_socket=self.settings.unix_socket, auth=self.settings.auth)
        # Sandboxes' calls go on connections of their own, which carry only forwards: the control
        # plane serves those below aiohttp until a connection carries anything else
        # (``control_plane/forward_protocol.py``, ``benchmarks/forward_http.py``).
        self._sandbox_http = HTTPSession(self.settings.url, unix_socket=self.settings.unix_socket,
                                         auth=self.settings.auth)
        self._client_id: str | None = None
        self._release: Callable[[], None] | None = None  # hands an embedded control plane back
        self._stop_heartbeat = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @classmethod
    def embedded(cls, **kwargs: Any) -> IdeGymClient:
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

    def _run(self, plan: Plan[T]) -> T:
        return drive(self._http, plan)

    @property
    def client_id(self) -> str:
        if self._client_id is None:
            raise RuntimeError("not registered: use the client as a context manager or call register()")
        return self._client_id

    def register(self) -> str:
        try:
            answer = self._run(_plans.register(self.name, self.namespace))
        except TransportError as exc:
            raise unreachable(place(self.settings.url, self.settings.unix_socket), exc) from exc
        except APIError as exc:
            # A control plane always serves this route, and its errors always name their kind
            # (but the 422 shape of ``specs/``): anything else is another HTTP service.
            if exc.status in (404, 405) or (exc.kind is None and exc.status != 422):
                raise not_a_control_plane(place(self.settings.url, self.settings.unix_socket), exc) from exc
            raise
        self._client_id = str(answer.id)
        self._stop_heartbeat.clear()
        self._heartbeat = threading.Thread(target=self._beat, name="idegym-heartbeat", daemon=True)
        self._heartbeat.start()
        return self._client_id

    def _beat(self) -> None:
        while not self._stop_heartbeat.wait(self.heartbeat_interval):
            try:
                self._run(_plans.heartbeat(self.client_id))
            except Exception:  # noqa: BLE001 - a missed heartbeat is retried next interval
                pass

    def start(self, image_tag: str = BUILTIN_IMAGE, *, server_name: str = "default-idegym-server",
              reuse: ServerReuseStrategy | str = ServerReuseStrategy.RESET, run_as_root: bool = False,
              timeout: int = 300, **fields: Any) -> Sandbox:
        """Start a server (or reuse a FINISHED one) and return its sandbox handle."""
        req = StartServerRequest(client_id=self.client_id, namespace=self.namespace, image_tag=image_tag,
                                 server_name=server_name, reuse_strategy=ServerReuseStrategy(reuse),
                                 run_as_root=run_as_root, server_start_wait_timeout_in_seconds=timeout, **fields)
        info = self._run(_plans.start(req))
        return Sandbox(self._sandbox_http, Target.forwarded(self.client_id, int(info.server_id or 0)), self, info)

    def build_images(self, yaml_text: str, timeout: float = 3600.0, *, upload: bool = True) -> list[JobStatusResponse]:
        """Build the images of a build YAML (see ``control_plane.images``); waits for every job and
        raises ``ServerError`` naming the failed ones. With ``upload`` (the default) every
        ``project.path`` and ``context`` that is a directory of this machine is sent as an upload
        (only what the control plane lacks) and named by it: the control plane needs no access
        to this machine's files. ``upload=False`` sends the paths as they are, for directories of
        the control plane's own host (its ``--build-root``)."""
        if upload:
            yaml_text, trees = _uploads.local_trees(yaml_text)
            self._send_trees(trees)
        names = self._run(_plans.build_images(yaml_text, self.namespace, self._client_id))
        jobs = [self._run(_plans.wait_job(name, timeout)) for name in names]
        failed = [j for j in jobs if j.status != "success"]
        if failed:
            raise ServerError(500, "image build failed: " + "; ".join(f"{j.job_name}: {j.details}" for j in failed),
                              "", "control-plane")
        return jobs

    def upload(self, path: str | Path) -> str:
        """Send the directory ``path`` as an upload unless the control plane has it; its digest,
        for a build YAML's ``project: {upload: DIGEST}`` or ``context: upload:DIGEST``."""
        tree = _uploads.DIGESTS.tree(Path(path))
        self._send_trees([tree])
        return tree.digest

    def _send_trees(self, trees: list[_uploads.LocalTree]) -> None:
        if not trees:
            return
        wanted = set(self._run(_uploads.missing([t.digest for t in trees])))
        for tree in trees:
            if tree.digest not in wanted:
                continue
            with tree.wire_body() as body:
                for attempt in range(_uploads.UPLOAD_TRIES):  # a PUT cut off starts over
                    try:
                        self._run(_uploads.put(tree, body, self._client_id))
                        break
                    except TransportError:
                        if attempt == _uploads.UPLOAD_TRIES - 1:
                            raise

    def sandboxes(self, include_terminal: bool = False) -> list[ServerSummary]:
        return self._run(_plans.list_servers(self.client_id, include_terminal)).servers

    def close(self, stop: bool = True) -> None:
        """Stop heartbeats and, with ``stop``, every server this client still owns."""
        self._stop_heartbeat.set()
        try:
            if stop and self._client_id is not None:
                self._run(_plans.stop_client(self._client_id, self.namespace))
        finally:
            self._client_id = None
            self._http.close()
            self._sandbox_http.close()
            release, self._release = self._release, None
            if release is not None:
                release()

    def __enter__(self) -> IdeGymClient:
        self.register()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
