"""NeMo Gym: :class:`IdeGymSandboxProvider`, a sandbox provider found through the entry-point group
``nemo_gym.sandbox_providers`` under the name ``idegym`` (``pip install 'idegym[nemo-gym]'``).

Selected by YAML alone::

    sandbox:
      idegym:
        control_plane_url: http://127.0.0.1:8000   # optional: default $IDEGYM_URL, else an embedded control plane

    my_agent:
      responses_api_agents:
        mini_swe_agent_2:
          sandbox_provider: sandbox
          ...                                        # rows name their image: idegym-task:<task>

or in code: ``nemo_gym.sandbox.Sandbox({"idegym": {}}).start(SandboxSpec(image="idegym-task:python-roman-numerals"))``.

NeMo Gym (``nemo_gym/sandbox/providers/registry.py``) loads the class from this package's entry
point and calls it with the block's keys; its ``Sandbox``/``AsyncSandbox`` then drive the
``SandboxProvider`` protocol (``nemo_gym/sandbox/providers/base.py``). Here:

* ``create(spec)``: ``spec.image`` ``idegym-task:<task>`` (any IdeGym task spec: a bundled id, a
  task directory, ``humaneval/...``, ``swe/...``, ``harbor:...``) starts an episode of that task
  (:class:`~._episode.ToolCallEpisode`: its image built when missing, its files written, its own
  resource limits); any other ``image`` is an image of the control plane's store, started with
  ``spec.resources`` (CPU, memory, disk as hard limits). ``ready_timeout_s`` bounds the start.
  What IdeGym cannot honour is refused with ``SandboxCreateError`` naming it: GPUs, an
  ``entrypoint``. A failed start is ``SandboxCreateError``.
* ``exec``: one bash call (``cwd``, ``spec.env`` under ``env``, ``user``: a user other than the
  tool user needs a sandbox that runs as root, ``run_as_root: true``). A timeout kills the
  command's process group and answers NeMo Gym's ``error_type="timeout"``; a sandbox that died or
  a control plane that is unreachable answers ``error_type="sandbox"`` (return code 125, NeMo
  Gym's runtime-failure convention), never an exit code of the agent's.
* ``upload_file``/``download_file``: the sandbox's file API inside the project; elsewhere through
  bash (base64), as the tool user.
* ``status``: RUNNING while the server is usable, STOPPED once it is gone.
* ``close``: hands the sandbox back (FINISHED: restarted fresh for its next user); ``aclose`` closes
  what the provider still holds; at exit the process's client stops everything it started.
* :meth:`IdeGymSandboxProvider.grade` grades a task's sandbox with the task's checks (IdeGym's
  grading, as ``IdeGymEnv``'s submit); :func:`grade` does it for a NeMo Gym ``Sandbox``.
* No PTY, port endpoints, pause/resume or cross-process handles: IdeGym's sandbox API has none of
  them, so the provider implements none of NeMo Gym's optional protocols.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import shlex
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxExecResult,
    SandboxHandle,
    SandboxSpec,
    SandboxStatus,
)

from ..client import Sandbox, SandboxGone, ServiceError, Unauthorized
from ..client._async import AsyncSessions
from ._episode import InfrastructureError, ToolCallEpisode, ToolCallError, shared_client

log = logging.getLogger(__name__)

PROVIDER_NAME = "idegym"
TASK_PREFIX = "idegym-task:"
RUNTIME_FAILURE = 125  # NeMo Gym providers' return code when the sandbox, not the command, failed
DEFAULT_EXEC_TIMEOUT = 180.0  # NeMo Gym's Sandbox.exec default
_PIECE = 96 << 10  # base64 per environment variable: below Linux's 128 KiB per string
_READ_CHUNK = 4 << 20


@dataclass
class _Held:
    """What a handle's ``raw`` is: the sandbox, its episode when it plays a task, its defaults."""

    sandbox: Sandbox
    episode: ToolCallEpisode | None = None
    env: dict[str, str] = field(default_factory=dict)
    closed: bool = False


class IdeGymSandboxProvider:
    """NeMo Gym's ``SandboxProvider`` on IdeGym sandboxes (see the module docstring).

    ``control_plane_url``: where sandboxes come from (default: ``$IDEGYM_URL``, else the embedded control plane);
    ``run_as_root``: image sandboxes whose tools may run as root (``exec(user="root")``);
    ``start_timeout_s``: a start's bound when the spec gives no ``ready_timeout_s``."""

    name = PROVIDER_NAME

    def __init__(self, *, control_plane_url: str | None = None, run_as_root: bool = False,
                 start_timeout_s: float = 300.0) -> None:
        if start_timeout_s <= 0:
            raise ValueError("start_timeout_s must be > 0")
        self.control_plane_url = control_plane_url
        self.run_as_root = bool(run_as_root)
        self.start_timeout_s = float(start_timeout_s)
        self._held: dict[str, _Held] = {}
        self._sessions: AsyncSessions | None = None  # exec's connections, on its caller's loop

    # -- life cycle ---------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        self._refuse_unsupported(spec)
        held = await asyncio.to_thread(self._start, spec)
        held.env = dict(spec.env)
        handle = SandboxHandle(sandbox_id=f"{held.sandbox.server_id}", provider_name=PROVIDER_NAME, raw=held)
        self._held[handle.sandbox_id] = held
        return handle

    async def close(self, handle: SandboxHandle) -> None:
        held = self._raw(handle)
        self._held.pop(handle.sandbox_id, None)
        if held.closed:
            return
        held.closed = True
        await asyncio.to_thread(self._release, held)

    async def aclose(self) -> None:
        for sandbox_id, held in list(self._held.items()):
            self._held.pop(sandbox_id, None)
            if not held.closed:
                held.closed = True
                await asyncio.to_thread(self._release, held)
        sessions, self._sessions = self._sessions, None
        if sessions is not None:
            sessions.close()

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        held = self._raw(handle)
        if held.closed:
            return SandboxStatus.STOPPED
        try:
            answer = await asyncio.to_thread(held.sandbox.status)
        except SandboxGone:
            return SandboxStatus.STOPPED
        except ServiceError as exc:
            log.warning("IdeGym sandbox %s: status unknown: %s", handle.sandbox_id, exc)
            return SandboxStatus.UNKNOWN
        return SandboxStatus.RUNNING if answer.usable else SandboxStatus.STOPPED

    # -- data plane ---------------------------------------------------------------------------------

    async def exec(self, handle: SandboxHandle, command: str, *, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_s: int | float | None = None,
                   user: str | int | None = None) -> SandboxExecResult:
        held = self._live(handle)
        seconds = float(timeout_s) if timeout_s else DEFAULT_EXEC_TIMEOUT
        try:
            self._sessions = AsyncSessions.on_running_loop(self._sessions)  # on the caller's loop: no thread hop
            answer = await self._sessions.tools(held.sandbox).bash(command, timeout=seconds, cwd=cwd,
                                                                   env={**held.env, **(env or {})},
                                                                   user=None if user is None else str(user))
        except ServiceError as exc:
            return SandboxExecResult(stdout=None, stderr=f"IdeGym sandbox failed: {exc}",
                                     return_code=RUNTIME_FAILURE, error_type="sandbox")
        if answer.timed_out:
            return SandboxExecResult(stdout=answer.stdout, stderr=answer.stderr + (
                f"\ncommand timed out after {seconds:g}s (its process group was killed)"),
                return_code=RUNTIME_FAILURE, error_type="timeout")
        return SandboxExecResult(stdout=answer.stdout, stderr=answer.stderr, return_code=answer.exit_code)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        held = self._live(handle)
        await asyncio.to_thread(self._put, held.sandbox, Path(source_path).read_bytes(), target_path)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        held = self._live(handle)
        data = await asyncio.to_thread(self._get, held.sandbox, source_path)
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    # -- grading ------------------------------------------------------------------------------------

    async def grade(self, handle: SandboxHandle) -> dict[str, Any]:
        """Grade a task's sandbox with the task's checks; ``{"reward", "checks", "summary"}``.

        The episode ends (the sandbox is handed back, as by ``close``). Raises
        :class:`~._episode.InfrastructureError` when it could not be graded (no fake 0), and
        ``ValueError`` for a sandbox of a plain image (no task, nothing to grade)."""
        return await asyncio.to_thread(self.grade_now, handle)

    def grade_now(self, handle: SandboxHandle) -> dict[str, Any]:
        """:meth:`grade`, blocking (for callers outside an event loop)."""
        held = self._raw(handle)
        if held.episode is None:
            raise ValueError(f"sandbox {handle.sandbox_id} runs a plain image, not an IdeGym task: nothing to grade "
                             f"(start it with image '{TASK_PREFIX}<task>')")
        try:
            outcome = held.episode.submit()
        finally:
            held.closed = True
            self._held.pop(handle.sandbox_id, None)
        return {"reward": outcome.reward, "checks": outcome.info.get("checks"), "summary": outcome.text}

    # -- helpers ------------------------------------------------------------------------------------

    def _refuse_unsupported(self, spec: SandboxSpec) -> None:
        resources = spec.resources
        if getattr(resources, "gpu", None) or getattr(resources, "gpu_type", None):
            raise SandboxCreateError("IdeGym sandboxes have no GPUs: leave resources.gpu and gpu_type unset")
        if spec.entrypoint:
            raise SandboxCreateError("IdeGym sandboxes run no entrypoint (the sandbox server is their process); "
                                     "start long-running services with exec")
        if not spec.image:
            raise SandboxCreateError(f"the spec names no image: give '{TASK_PREFIX}<task>' (an IdeGym task) or an "
                                     "image of the control plane's store (e.g. idegym/builtin:latest)")

    def _start(self, spec: SandboxSpec) -> _Held:
        image = str(spec.image)
        if image.startswith(TASK_PREFIX):
            episode = ToolCallEpisode(control_plane_url=self.control_plane_url)
            try:
                episode.start(image[len(TASK_PREFIX):])
            except ToolCallError as exc:
                raise SandboxCreateError(f"no IdeGym task {image[len(TASK_PREFIX):]!r}: {exc}") from None
            except InfrastructureError as exc:
                raise SandboxCreateError(str(exc)) from exc
            assert episode.env is not None and episode.env.sandbox is not None
            return _Held(sandbox=episode.env.sandbox, episode=episode)
        timeout = int(spec.ready_timeout_s or self.start_timeout_s)
        try:
            client = shared_client(self.control_plane_url)
            sandbox = client.start(image, server_name="nemo-gym", reuse="RESTART", run_as_root=self.run_as_root,
                                   timeout=timeout, **self._resources(spec))
        except ServiceError as exc:
            raise SandboxCreateError(f"the IdeGym sandbox of image {image!r} did not start: {exc}") from exc
        return _Held(sandbox=sandbox)

    @staticmethod
    def _resources(spec: SandboxSpec) -> dict[str, Any]:
        resources = spec.resources
        limits = {key: value for key, value in (
            ("cpu", None if resources.cpu is None else f"{resources.cpu:g}"),
            ("memory", None if resources.memory_mib is None else f"{resources.memory_mib}Mi"),
            ("ephemeral_storage", None if resources.disk_gib is None else f"{resources.disk_gib}Gi"),
        ) if value is not None}
        return {"resources": {"limits": limits}} if limits else {}

    @staticmethod
    def _release(held: _Held) -> None:
        if held.episode is not None:
            held.episode.end()
            return
        try:
            held.sandbox.finish()
        except ServiceError as exc:  # already gone: nothing to hand back
            log.debug("handing the IdeGym sandbox back: %s", exc)

    def _raw(self, handle: SandboxHandle) -> _Held:
        if handle.provider_name != PROVIDER_NAME or not isinstance(handle.raw, _Held):
            raise ValueError(f"not a handle of the {PROVIDER_NAME!r} provider: {handle.provider_name!r}")
        return handle.raw

    def _live(self, handle: SandboxHandle) -> _Held:
        held = self._raw(handle)
        if held.closed:
            raise RuntimeError(f"IdeGym sandbox {handle.sandbox_id} is closed")
        return held

    @staticmethod
    def _put(sandbox: Sandbox, data: bytes, target: str) -> None:
        try:
            sandbox.upload(target, data)
            return
        except Unauthorized:  # outside the directories the file API may touch: bash, as the tool user
            pass
        encoded = base64.b64encode(data).decode("ascii")
        pieces = [encoded[i:i + _PIECE] for i in range(0, len(encoded), _PIECE)] or [""]
        quoted = shlex.quote(target)
        staged = shlex.quote(f"{target}.idegym-{uuid.uuid4().hex}")
        for index, piece in enumerate(pieces):
            prefix = f"mkdir -p -- \"$(dirname -- {quoted})\" && : > {staged} && " if index == 0 else ""
            last = f" && mv -f -- {staged} {quoted}" if index == len(pieces) - 1 else ""
            answer = sandbox.bash(f"{prefix}printf %s \"$IDEGYM_PIECE\" | base64 -d >> {staged}{last}",
                                  env={"IDEGYM_PIECE": piece}, timeout=120)
            if answer.exit_code != 0:
                sandbox.bash(f"rm -f -- {staged}", timeout=30)
                raise RuntimeError(f"upload to {target} failed (exit code {answer.exit_code}): "
                                   f"{answer.stderr.strip()[-2000:]}")

    @staticmethod
    def _get(sandbox: Sandbox, source: str) -> bytes:
        try:
            return sandbox.download(source)
        except Unauthorized:
            pass
        quoted = shlex.quote(source)
        answer = sandbox.bash(f"stat -c %s -- {quoted}", timeout=60)
        if answer.exit_code != 0:
            raise FileNotFoundError(f"{source}: {answer.stderr.strip()}")
        chunks = []
        for offset in range(0, int(answer.stdout.strip()), _READ_CHUNK):
            piece = sandbox.bash(f"dd if={quoted} iflag=skip_bytes,count_bytes skip={offset} count={_READ_CHUNK} "
                                 "status=none | base64 -w0", timeout=120, max_output_bytes=2 * _READ_CHUNK)
            if piece.exit_code != 0:
                raise RuntimeError(f"download of {source} failed: {piece.stderr.strip()[-2000:]}")
            chunks.append(base64.b64decode(piece.stdout))
        return b"".join(chunks)


def grade(sandbox: Any) -> dict[str, Any]:
    """Grade a NeMo Gym ``Sandbox`` or ``AsyncSandbox`` started on ``idegym-task:<task>`` (blocking):
    ``{"reward", "checks", "summary"}`` (see :meth:`IdeGymSandboxProvider.grade`). It reads the
    provider and handle NeMo Gym 0.4's sandboxes keep (``_provider``, ``_handle``)."""
    inner = getattr(sandbox, "_async_sandbox", sandbox)
    provider, handle = getattr(inner, "_provider", None), getattr(inner, "_handle", None)
    if not isinstance(provider, IdeGymSandboxProvider) or handle is None:
        raise ValueError("not a started NeMo Gym sandbox of the 'idegym' provider")
    return provider.grade_now(handle)

__all__ = ["IdeGymSandboxProvider", "PROVIDER_NAME", "TASK_PREFIX", "grade"]
