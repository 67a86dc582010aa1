"""Harbor: :class:`IdeGymEnvironment`, a Harbor environment provider on IdeGym sandboxes
(``pip install 'idegym[harbor]'``; Harbor needs Python >= 3.12).

::

    harbor run --path path/to/tasks --agent oracle --n-concurrent 4 \\
        --env idegym_env.integrations.harbor:IdeGymEnvironment \\
        --ek control_plane_url=http://127.0.0.1:8000          # optional: default is the embedded one

(``--environment-import-path IMPORT_PATH`` is Harbor's older spelling of ``--env IMPORT_PATH``.)
Harbor itself runs the trials: it builds and starts the environment through this class, runs the
agent through :meth:`exec` and the transfer methods, uploads ``tests/`` and runs the verifier,
then reads ``/logs/verifier/reward.txt`` back with :meth:`download_dir`.

Settings (``--ek key=value``):

* ``control_plane_url`` — where sandboxes come from (default ``$IDEGYM_URL``, else the embedded
  control plane of this process, started on first use and stopped at exit);
* ``image`` — run this image instead of building ``environment/Dockerfile`` (e.g.
  ``idegym/builtin:latest`` for tasks whose Dockerfile needs nothing);
* ``start_timeout_sec`` — how long a sandbox may take to start (default 300);
* ``download_limit_mb`` — the most one download (a file, or a directory's files together, at
  their apparent sizes) may bring to this machine (default 512).

How Harbor's contract maps onto IdeGym (``harbor/environments/base.py``, 0.25):

* **image**: ``environment/Dockerfile`` is built by the control plane (``POST
  /api/build-push-images``, tagged by content as IdeGym's Harbor loader tags it, so either finds
  the other's image); its ``RUN`` steps have the network, as under Docker (``build_network``),
  whatever the trial's policy. ``environment/Dockerfile`` is also the recipe of ``[environment]
  docker_image``: it is what is built; without one, ``FROM <docker_image>`` is (pulled when a
  registry answers or a mirror is configured, else built here from distribution archives when it
  is one of those bases, else a clear error). A failed build raises ``SandboxBuildFailedError``
  with the build's message.
* **CMD/ENTRYPOINT**: as Harbor's docker environment (its compose service's ``command: sh -c
  "sleep infinity"``): the image's ``CMD`` is not run; its ``ENTRYPOINT`` (the Dockerfile's last
  stage's) is started once the sandbox is, in the background, with ``sh -c "sleep infinity"`` as
  its arguments.
* **start/stop**: one sandbox per environment, started ``run_as_root`` so that Harbor's
  ``user="root"`` calls work (root inside the sandbox only); ``stop(delete=True)`` deletes it,
  ``stop(delete=False)`` hands it back (FINISHED). Sandboxes of this process's client are stopped
  at exit either way.
* **exec**: one bash call (``cwd``, ``env`` merged with the task's and trial's environment,
  ``user``); a timeout raises ``RuntimeError`` as Harbor's Docker environment does.
* **transfers**: through bash as root (base64 in environment variables, tar for directories), so
  any path of the sandbox works, not only the project. A download (file or directory, filtered
  or not) is a ``tar --sparse`` made in the sandbox, streamed here a 1 MiB chunk at a time into a
  file beside the target and extracted within ``download_limit_mb`` (:mod:`.bounded_tar`): the
  trainer's memory stays flat whatever the size, a sparse file's holes stay holes, and what is
  over the bound is refused (:class:`~.bounded_tar.DownloadTooLarge`) before it is written.
  After a start that failed there is nothing to download: Harbor's recovery of logs and
  artifacts then gets nothing instead of a second error burying the first.
* **capabilities**: the trial's sandbox has no network unless the policy is public (then it
  shares the control plane host's network: the image is built, or re-tagged, with
  ``network: true``); no allowlists, no run-time policy changes, no GPUs/TPUs, no host mounts, no Windows.
* **compose** (``environment/docker-compose.yaml``): each service a sandbox of the trial's client,
  started in dependency order (``service_healthy`` waits for the healthcheck), all in the first
  one's network namespace (``network_of``: 127.0.0.1, and each service's name in ``/etc/hosts``),
  stopped together; the per-service operations (``service_exec``, downloads, ``stop_service``)
  reach them (:mod:`idegym_env.tasks.services`, which ``IdeGymEnv`` starts them with too).
  CPU and memory are hard limits (cgroups), fractional CPUs allowed; ``storage_mb`` bounds the
  sandbox's writable layer.
* **infrastructure failures** (sandbox died, control plane unreachable) raise, so Harbor records
  an exception for the trial instead of a reward.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import io
import json
import os
import re
import shlex
import stat
import tarfile
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import require_agent_environment_definition
from harbor.models.task.config import NetworkMode
from harbor.models.trial.config import ResourceMode
from harbor.utils.path_filter import filter_paths_by_patterns

from control_plane.dockerfile import final_entrypoint

from .. import embedded
from ..client import AsyncIdeGymClient, AsyncSandbox, SandboxGone, ServerError, ServiceError
from ..settings import chosen_control_plane
from ..tasks import TaskEnvironment
from ..tasks import services as compose
from ..tasks.environment import environment_entry, service_entry
from ..tasks.sources.harbor import compose_file
from .bounded_tar import MAX_ENTRIES, DownloadTooLarge, extract_within

ENVIRONMENT_TYPE = "idegym"
# The sandbox a transfer reaches instead of main's, while one of a compose service's runs.
_TARGET: contextvars.ContextVar[AsyncSandbox | None] = contextvars.ContextVar("idegym_harbor_target", default=None)
DEFAULT_EXEC_TIMEOUT = 24 * 3600.0  # Harbor's `None`: no timeout of its own (the sandbox server caps it)
MAX_OUTPUT = 16 << 20
DEFAULT_DOWNLOAD_LIMIT_MB = 512
_PIECE = 96 << 10  # one environment variable: below Linux's 128 KiB per string
_PIECES_PER_CALL = 12  # ~1.1 MiB of base64 per bash call: well inside ARG_MAX
# A download's piece per bash call: a call holds ~4x it in memory while it is decoded, and the
# allocator keeps what the largest pieces fragmented (4 MiB pieces: 99 MiB more at the peak for a
# 64 MiB file, 151 for 256 MiB; 1 MiB pieces: 40 and 44), for ~25 % more time per byte.
_READ_CHUNK = 1 << 20
_LISTING_LIMIT = 64 << 20  # the names of the files a filtered download chooses from
_TAG_CHARS = re.compile(r"[^a-z0-9._-]+")
_NAME_CHARS = re.compile(r"[^a-z0-9-]+")

_embedded_lock = asyncio.Lock()
_embedded_url: str | None = None


async def _default_url() -> str:
    """``$IDEGYM_URL``, else this process's embedded control plane (kept until exit)."""
    global _embedded_url
    chosen = chosen_control_plane()
    if chosen:
        return chosen
    async with _embedded_lock:
        if _embedded_url is None:
            _embedded_url = (await asyncio.to_thread(embedded.acquire)).url  # released by its atexit hook
        return _embedded_url


class IdeGymEnvironment(BaseEnvironment):
    """A Harbor environment on an IdeGym sandbox (see the module docstring)."""

    def __init__(self, environment_dir: Path, environment_name: str, session_id: str, trial_paths: Any,
                 task_env_config: Any, *, control_plane_url: str | None = None, image: str | None = None,
                 start_timeout_sec: int = 300, download_limit_mb: int = DEFAULT_DOWNLOAD_LIMIT_MB,
                 **kwargs: Any) -> None:
        self._image_override = image
        self._control_plane_url = control_plane_url
        self._start_timeout = int(start_timeout_sec)
        self._download_limit_mb = int(download_limit_mb)
        if self._download_limit_mb < 1:
            raise ValueError(f"download_limit_mb must be at least 1, not {download_limit_mb!r}")
        self._client: AsyncIdeGymClient | None = None
        self._sandbox: AsyncSandbox | None = None
        self._start_failed: str | None = None  # why the last start failed
        self._entrypoint: list[str] | None = None  # the image's ENTRYPOINT, started after the sandbox
        self._services: dict[str, AsyncSandbox] = {}  # compose services other than main, by name
        super().__init__(environment_dir=environment_dir, environment_name=environment_name, session_id=session_id,
                         trial_paths=trial_paths, task_env_config=task_env_config, **kwargs)
        self._maybe_override_task_env_config()
        self._validate_definition()
        self._validate_resource_mode_support()
        self._validate_gpu_support()
        self._validate_tpu_support()
        self._validate_windows_support()
        self._validate_network_policy_support()

    # -- what this provider is -------------------------------------------------------------------------

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, docker_compose=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _validate_definition(self) -> None:
        if self._image_override:
            return
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    # -- life cycle --------------------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        url = self._control_plane_url or await _default_url()
        client = AsyncIdeGymClient(url, name=f"harbor-{self.environment_name}"[:63])
        try:
            await client.register()
        except ServiceError as exc:
            await client.close(stop=False)
            raise RuntimeError(f"the IdeGym control plane at {url} is unreachable: {exc}") from exc
        self._client = client
        try:
            services = self._compose_services()
            image = await self._image(client, force_build)
            if services:
                await self._bring_up(client, services, image, force_build)
            else:
                await self._start_main(client, image, None)
        except BaseException as exc:
            self._start_failed = f"{type(exc).__name__}: {exc}"
            await self.stop(delete=True)
            raise
        self._start_failed = None
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()
        await self._start_entrypoint()

    async def _start_main(self, client: AsyncIdeGymClient, image: str, network_of: int | None) -> AsyncSandbox:
        try:
            self._sandbox = await client.start(
                image, server_name=self._server_name(), reuse="RESTART", run_as_root=True, timeout=self._start_timeout,
                resources=self._resources(), **({"network_of": network_of} if network_of is not None else {}))
        except ServiceError as exc:
            raise RuntimeError(f"the IdeGym sandbox for {self.environment_name!r} (image {image}) did not "
                               f"start: {exc}") from exc
        return self._sandbox

    async def _start_entrypoint(self) -> None:
        """The image's ENTRYPOINT, as Harbor's docker environment runs it
        (:func:`~idegym_env.tasks.services.entrypoint_command`), as the image's user."""
        if not self._entrypoint:
            return
        result = await self.exec(compose.entrypoint_command(self._entrypoint), timeout_sec=60)
        if result.return_code != 0:
            raise RuntimeError(f"the image's ENTRYPOINT did not start: {(result.stderr or result.stdout or '')[-500:]}")

    # -- compose services ---------------------------------------------------------------------------------

    def _compose_services(self) -> dict[str, compose.Service] | None:
        path = compose_file(self.environment_dir)
        if path is None:
            return None
        try:
            services = compose.read_compose(path, self._persistent_env)
        except compose.ComposeError as exc:
            raise SandboxBuildFailedError(str(exc)) from exc
        for service in services.values():
            if service.ignored:
                self.logger.info(f"compose service {service.name!r}: {', '.join(service.ignored)} not honoured "
                                 "(one network, nothing of the host mounted or published, no privileges beyond a "
                                 "sandbox's)")
        return services

    async def _bring_up(self, client: AsyncIdeGymClient, services: dict[str, compose.Service], image: str,
                        force_build: bool) -> None:
        """Drive :func:`~idegym_env.tasks.services.bring_up`: each service a sandbox of this client,
        main the trial's."""
        network = self._network_policy.network_mode == NetworkMode.PUBLIC
        started: dict[str, AsyncSandbox] = {}
        plan = compose.bring_up(services)
        answer: Any = None
        while True:
            try:
                step = plan.send(answer)
            except StopIteration:
                return
            if isinstance(step, compose.Start):
                name = step.service.name
                if name == compose.MAIN:
                    started[name] = await self._start_main(client, image, step.network_of)
                    self._persistent_env.update(step.service.environment)
                else:
                    entry = service_entry(step.service, network=network, rebuild=bool(force_build))
                    await self._build(client, entry, f"image of compose service {name!r}")
                    network_of = {"network_of": step.network_of} if step.network_of is not None else {}
                    try:
                        started[name] = await client.start(str(entry["tag"]), server_name=self._server_name(name),
                                                           reuse="RESTART", run_as_root=True,
                                                           timeout=self._start_timeout, **network_of)
                    except ServiceError as exc:
                        raise RuntimeError(f"the IdeGym sandbox of compose service {name!r} did not start: "
                                           f"{exc}") from exc
                    self._services[name] = started[name]
                answer = int(started[name].server_id or 0)
            elif isinstance(step, compose.Run):
                result = await started[step.service].bash(step.command, timeout=60, user=step.user)
                answer = (result.exit_code, result.stderr or result.stdout)
            else:
                await asyncio.sleep(step.seconds)

    def _service(self, service: str) -> AsyncSandbox:
        sandbox = self._services.get(service)
        if sandbox is None:
            raise RuntimeError(f"no compose service {service!r} in {self.environment_name!r} "
                               f"(services: {', '.join(sorted(self._services)) or 'none'})")
        return sandbox

    async def service_exec(self, command: str, *, service: str | None = None, cwd: str | None = None,
                           env: dict[str, str] | None = None, timeout_sec: int | None = None,
                           user: str | int | None = None) -> ExecResult:
        if self.is_main_service(service):
            return await self.exec(command, cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)
        assert service is not None
        result = await self._service(service).bash(command, timeout=float(timeout_sec or DEFAULT_EXEC_TIMEOUT),
                                                   cwd=cwd, env=env, user=None if user is None else str(user),
                                                   max_output_bytes=MAX_OUTPUT)
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code)

    @contextlib.contextmanager
    def _from_service(self, service: str | None) -> Iterator[None]:
        """The transfers inside act on compose ``service``'s sandbox (the main one's: ``None``):
        the same bounded downloads, from that sandbox."""
        if self.is_main_service(service):
            yield
            return
        assert service is not None
        token = _TARGET.set(self._service(service))
        try:
            yield
        finally:
            _TARGET.reset(token)

    async def service_download_file(self, source_path: str, target_path: Path | str, *,
                                    service: str | None = None) -> None:
        with self._from_service(service):
            await self.download_file(source_path, target_path)

    async def service_download_dir(self, source_dir: str, target_dir: Path | str, *,
                                   service: str | None = None) -> None:
        with self._from_service(service):
            await self.download_dir(source_dir, target_dir)

    async def stop_service(self, service: str) -> None:
        if self.is_main_service(service):
            await self.stop(delete=True)
            return
        sandbox = self._services.pop(service, None)
        if sandbox is not None:
            try:
                await sandbox.stop()
            except ServiceError as exc:
                self.logger.debug(f"stopping compose service {service!r}: {exc}")

    async def stop(self, delete: bool) -> None:
        services, self._services = self._services, {}
        for name, service_sandbox in services.items():
            try:
                await (service_sandbox.stop() if delete else service_sandbox.finish())
            except ServiceError as exc:
                self.logger.debug(f"stopping compose service {name!r}: {exc}")
        sandbox, self._sandbox = self._sandbox, None
        client, self._client = self._client, None
        try:
            if sandbox is not None:
                try:
                    await (sandbox.stop() if delete else sandbox.finish())
                except ServiceError as exc:  # already gone: nothing to hand back
                    self.logger.debug(f"stopping the IdeGym sandbox: {exc}")
        finally:
            if client is not None:
                await client.close(stop=delete)

    async def _image(self, client: AsyncIdeGymClient, force_build: bool) -> str:
        network = self._network_policy.network_mode == NetworkMode.PUBLIC
        dockerfile = self.environment_dir / "Dockerfile"
        prebuilt = self.task_env_config.docker_image
        if self._image_override:
            base = self._image_override
        elif dockerfile.is_file() or prebuilt:
            # environment/Dockerfile is the recipe of [environment] docker_image too: it is built
            # (the prebuilt image would need its registry); without one, the image itself is, as
            # `FROM` (pulled when a registry answers, else built here when it is one of those).
            # The same tag as IdeGym's own Harbor loader gives: a control plane that built it for
            # one finds it for the other. RUN steps have the network (as under Docker); the
            # trial's sandbox only when the policy is public.
            text = dockerfile.read_text(encoding="utf-8") if dockerfile.is_file() else f"FROM {prebuilt}\n"
            self._entrypoint = final_entrypoint(text)
            environment = TaskEnvironment(dockerfile=text,
                                          context=self.environment_dir.resolve() if dockerfile.is_file() else None)
            entry = environment_entry(environment, network=network, rebuild=bool(force_build))
            what = f"environment/Dockerfile of {self.environment_name!r}" if dockerfile.is_file() else \
                f"image {prebuilt} of {self.environment_name!r}"
            await self._build(client, entry, what)
            return str(entry["tag"])
        else:
            raise SandboxBuildFailedError(f"{self.environment_name!r} has no environment/Dockerfile and no "
                                          "docker_image")
        if not network:
            return base
        # A public network is a property of the image here: a thin image over the base says so.
        tag = _tag("harbor-net", base, "net")
        await self._build(client, {"tag": tag, "base": base, "network": True}, f"network-enabled image of {base}")
        return tag

    async def _build(self, client: AsyncIdeGymClient, entry: dict[str, Any], what: str) -> None:
        try:
            await client.build_images(json.dumps({"images": [entry]}), timeout=self.task_env_config.build_timeout_sec)
        except ServerError as exc:
            raise SandboxBuildFailedError(f"IdeGym could not build the {what}: {exc.message}") from exc

    def _server_name(self, service: str | None = None) -> str:
        prefix = f"harbor-{service}-" if service else "harbor-"  # a service's name first: never cut off
        name = _NAME_CHARS.sub("-", f"{prefix}{self.environment_name}".lower()).strip("-")
        return name[:63].rstrip("-") or "harbor"

    def _resources(self) -> dict[str, Any] | None:
        limits: dict[str, str] = {}
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        if cpus is not None:
            limits["cpu"] = str(cpus)
        if memory is not None:
            limits["memory"] = f"{int(memory)}Mi"
        if self._effective_storage_mb is not None:
            limits["ephemeral_storage"] = f"{int(self._effective_storage_mb)}Mi"
        return {"limits": limits} if limits else None

    def _never_started(self, what: str) -> bool:
        """Whether the last start failed, so that there is nothing to download: Harbor recovers
        logs and artifacts after any failure, and a second error there ("not running") would
        bury the one that matters (a build that failed, say)."""
        if self._sandbox is None and self._start_failed is not None:
            self.logger.debug(f"nothing to download from {what}: the environment did not start "
                              f"({self._start_failed[:200]})")
            return True
        return False

    def _require(self) -> AsyncSandbox:
        target = _TARGET.get()
        if target is not None:  # a compose service's download (service_download_*)
            return target
        if self._sandbox is None:
            raise RuntimeError("the IdeGym sandbox is not running: start the environment first")
        return self._sandbox

    # -- exec ----------------------------------------------------------------------------------------------

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        sandbox = self._require()
        user = self._resolve_user(user)
        timeout = float(timeout_sec) if timeout_sec else DEFAULT_EXEC_TIMEOUT
        try:
            result = await sandbox.bash(command, timeout=timeout, cwd=cwd or self.task_env_config.workdir,
                                        env=self._merge_env(env), user=None if user is None else str(user),
                                        max_output_bytes=MAX_OUTPUT)
        except SandboxGone as exc:
            raise RuntimeError(f"the IdeGym sandbox is gone: {exc.message}") from exc
        if result.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code)

    async def _root(self, command: str, env: dict[str, str] | None = None, what: str = "") -> str:
        """A transfer command as root; raises with its stderr when it fails."""
        sandbox = self._require()
        try:
            result = await sandbox.bash(command, timeout=600, env=env, user="root", max_output_bytes=2 * _READ_CHUNK)
        except SandboxGone as exc:
            raise RuntimeError(f"the IdeGym sandbox is gone: {exc.message}") from exc
        if result.exit_code != 0:
            raise RuntimeError(f"{what or 'transfer'} failed (exit code {result.exit_code}): "
                               f"{(result.stderr or result.stdout).strip()[-2000:]}")
        return result.stdout

    # -- transfers -------------------------------------------------------------------------------------------

    async def _put(self, data: bytes, target: str, *, then: str = "") -> None:
        """Write ``data`` to ``target`` (parents created), in as few bash calls as fit; ``then``
        runs after the last piece with ``$T`` naming the file."""
        encoded = base64.b64encode(data).decode("ascii")
        pieces = [encoded[i:i + _PIECE] for i in range(0, len(encoded), _PIECE)] or [""]
        quoted = shlex.quote(target)
        for start in range(0, len(pieces), _PIECES_PER_CALL):
            batch = pieces[start:start + _PIECES_PER_CALL]
            env = {f"IDEGYM_D{i}": piece for i, piece in enumerate(batch)}
            joined = "".join(f"$IDEGYM_D{i}" for i in range(len(batch)))
            redirect = ">" if start == 0 else ">>"
            prefix = f"mkdir -p -- \"$(dirname -- {quoted})\" && " if start == 0 else ""
            last = start + _PIECES_PER_CALL >= len(pieces)
            tail = f" && T={quoted} && {then}" if last and then else ""
            await self._root(f"{prefix}printf %s \"{joined}\" | base64 -d {redirect} {quoted}{tail}", env,
                             f"upload to {target}")

    async def _fetch(self, source: str, target: Path, limit: int, what: str, remedy: str) -> None:
        """Copy the sandbox's file ``source`` into ``target`` a chunk at a time (one chunk in
        memory), refusing it once more than ``limit`` bytes came, whatever its size said
        (``remedy`` ends the refusal's message)."""
        quoted = shlex.quote(source)
        size = int((await self._root(f"stat -c %s -- {quoted}", what=f"download of {what}")).strip())
        if size > limit:
            raise DownloadTooLarge(f"{what} is larger than {limit} bytes: {remedy}")
        received = 0
        with open(target, "wb") as out:
            while True:
                text = await self._root(f"dd if={quoted} iflag=skip_bytes,count_bytes skip={received} "
                                        f"count={_READ_CHUNK} status=none | base64 -w0", what=f"download of {what}")
                try:
                    piece = base64.b64decode(text, validate=True)
                except binascii.Error:
                    raise RuntimeError(f"download of {what}: the sandbox sent something that is not base64") from None
                out.write(piece)
                received += len(piece)
                if received > limit:
                    raise DownloadTooLarge(f"{what} is larger than {limit} bytes: {remedy}")
                if len(piece) < _READ_CHUNK:
                    return

    @property
    def _setting(self) -> str:
        return f"download_limit_mb={self._download_limit_mb} (--ek download_limit_mb=N)"

    async def _download_tree(self, source_dir: str, target: Path, what: str, *, tar_args: str) -> None:
        """``tar`` in the sandbox (holes kept where its ``tar`` can), the archive streamed to a
        file beside ``target``, and extracted there within the bound (``bounded_tar``)."""
        limit = self._download_limit_mb << 20
        staged = f"/tmp/.idegym-transfer-{uuid.uuid4().hex}.tar.gz"
        target.mkdir(parents=True, exist_ok=True)
        # GNU tar's --sparse stores a file's data and where its holes are; others store zeros
        sparse = "$(tar --sparse --version >/dev/null 2>&1 && echo --sparse)"
        try:
            await self._root(f"tar {sparse} -czf {shlex.quote(staged)} -C {shlex.quote(source_dir)} {tar_args}",
                             what=f"download of {what}")
            with tempfile.TemporaryDirectory(prefix=".idegym-download-", dir=target.parent) as scratch:
                archive = Path(scratch) / "transfer.tar.gz"
                # gzip may add a little to what it cannot compress
                await self._fetch(staged, archive, limit + limit // 100 + (1 << 20), f"the archive of {what}",
                                  f"the bound {self._setting} sets, with room for gzip's overhead")
                extract_within(archive, target, limit=limit, what=what, tar_filter=transfer_tar_filter,
                               setting=self._setting)
        finally:
            await self._root(f"rm -f -- {shlex.quote(staged)}", what="cleanup")

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = Path(source_path)
        mode = source.stat().st_mode & 0o777
        await self._put(source.read_bytes(), target_path, then=f"chmod {mode:o} \"$T\"")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        source = Path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"{source}: not a directory")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for path in sorted(source.rglob("*")):
                tar.add(path, arcname=path.relative_to(source).as_posix(), recursive=False)
        staged = f"/tmp/.idegym-transfer-{uuid.uuid4().hex}.tar.gz"
        target = shlex.quote(target_dir)
        await self._put(buffer.getvalue(), staged,
                        then=f"mkdir -p -- {target} && tar xzf \"$T\" --no-same-owner -C {target}; s=$?; rm -f \"$T\"; "
                             "exit $s")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        if self._never_started(source_path):
            return
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        quoted = shlex.quote(source_path)
        # the type from the mode bits: %F says "regular empty file" for an empty one
        mode, size, kind = (await self._root(f"stat -L -c '%f %s %F' -- {quoted}", what=f"download of {source_path}")
                            ).strip().split(" ", 2)
        if not stat.S_ISREG(int(mode, 16)):
            raise RuntimeError(f"download of {source_path}: not a regular file ({kind})")
        if int(size) > self._download_limit_mb << 20:
            raise DownloadTooLarge(f"{source_path} is {size} bytes, more than the bound {self._setting} sets: "
                                   "raise it, or download less")
        name = PurePosixPath(source_path).name
        with tempfile.TemporaryDirectory(prefix=".idegym-download-", dir=target.parent) as scratch:
            await self._download_tree(str(PurePosixPath(source_path).parent), Path(scratch) / "tree", source_path,
                                      tar_args=f"--dereference -- {shlex.quote(name)}")
            got = Path(scratch) / "tree" / name
            if got.is_symlink() or not got.is_file():
                raise RuntimeError(f"download of {source_path}: the sandbox sent no regular file of that name")
            os.replace(got, target)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        if self._never_started(source_dir):
            return
        await self._download_tree(source_dir, Path(target_dir), source_dir, tar_args=".")

    async def download_dir_with_exclusions(self, *, source_dir: str, target_dir: Path | str,
                                           exclude: list[str]) -> None:
        if self._never_started(source_dir):
            return
        flags = " ".join(f"--exclude={shlex.quote(pattern)}" for pattern in exclude)
        await self._download_tree(source_dir, Path(target_dir), source_dir, tar_args=f"{flags} .")

    async def download_dir_filtered(self, *, source_dir: str, target_dir: Path | str,
                                    include: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
                                    protect: Sequence[str] | None = None) -> None:
        """Harbor's selection (``include``/``exclude`` globs, ``protect`` paths always), through
        the bounded download."""
        if self._never_started(source_dir):
            return
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        names = f"/tmp/.idegym-transfer-{uuid.uuid4().hex}.list"
        try:
            await self._root(f"cd {shlex.quote(source_dir)} && find . -type f > {shlex.quote(names)}",
                             what=f"listing of {source_dir}")
            with tempfile.TemporaryDirectory(prefix=".idegym-download-", dir=target.parent) as scratch:
                await self._fetch(names, Path(scratch) / "names", _LISTING_LIMIT, f"the listing of {source_dir}",
                                  "download a part of it")
                paths: list[str] = []
                with open(Path(scratch) / "names", encoding="utf-8", errors="surrogateescape") as listing:
                    for line in listing:
                        if len(paths) >= MAX_ENTRIES:
                            raise DownloadTooLarge(f"{source_dir} holds more than {MAX_ENTRIES} files: download a "
                                                   "part of it")
                        if line.strip():
                            paths.append(line.rstrip("\n").removeprefix("./"))
            selected = filter_paths_by_patterns(paths, include=include, exclude=exclude)
            missing = set(protect or ()) - set(selected)
            selected += [path for path in paths if path in missing]
            if not selected:
                self.logger.warning(f"No files in {source_dir!r} matched include={include} exclude={exclude}; "
                                    "downloading nothing")
                return
            await self._put(("\n".join(selected) + "\n").encode("utf-8", "surrogateescape"), names)
            await self._download_tree(source_dir, target, source_dir, tar_args=f"-T {shlex.quote(names)}")
        finally:
            await self._root(f"rm -f -- {shlex.quote(names)}", what="cleanup")


def _tag(prefix: str, name: str, version: str) -> str:
    repo = _TAG_CHARS.sub("-", name.lower()).strip("-.") or "task"
    return f"{prefix}/{repo}:{_TAG_CHARS.sub('-', version.lower())[:32]}"


__all__ = ["IdeGymEnvironment", "ENVIRONMENT_TYPE", "DownloadTooLarge"]

