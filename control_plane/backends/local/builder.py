"""``LocalImageBuilder``: build an ``ImageDefinition`` into the local image store.

A Dockerfile, or a definition whose base is not an image of the host's userland (``debian:…``,
``python:…``, an OCI image built here, a registry image), is built with buildah (``oci.build``).
Otherwise a build starts a sandbox from the base image (as root, with network only when the definition
asks for it) whose project is the definition's project, runs the ``commands`` in it as one
``set -eux`` script, exports the project and then takes the sandbox's upper layers as the new
image's layers: an image on top of another stacks layers, nothing is copied from the base.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from ...appuser import APPUSER, PROJECT_DIR
from ...images import BUILTIN_IMAGE
from ..base import BackendError, ImageBuilder, ImageDefinition, Limits
from .handle_data import LocalHandleData
from .image_trees import TREES, ImageError, chown_tree, copy_tree
from .images import check_tag
from .oci.build import OciBuilder

if TYPE_CHECKING:
    from .backend import LocalBackend

log = logging.getLogger(__name__)

class LocalImageBuilder(ImageBuilder):
    def __init__(self, backend: LocalBackend, *, command_timeout: float = 3600.0, start_timeout: float = 120.0) -> None:
        self.backend = backend
        self.command_timeout = command_timeout
        self.start_timeout = start_timeout
        self.oci = OciBuilder(backend.store, backend.state_dir / "images", backend.oci_settings,
                              host_config=backend.host_config_root if backend.host_package_config else None)

    async def exists(self, tag: str) -> bool:
        return self.backend.store.exists(tag)

    def runs_as_host_root(self, definition: ImageDefinition) -> bool:
        return self.oci.wants(definition)  # buildah's chroot isolation (docs/security.md §6)

    async def build(self, definition: ImageDefinition, log: Any = None) -> str:
        emit = _emitter(log)
        backend = self.backend
        launcher = backend.require_started()
        try:
            check_tag(definition.tag)
        except ImageError as exc:
            raise BackendError(str(exc), 400) from exc
        started = time.monotonic()
        if self.oci.wants(definition):  # a Dockerfile, or a base that is an OCI image: buildah builds it
            try:
                return await self.oci.build(definition, emit, self._fetch,
                                            network=definition.network or definition.build_network
                                            or backend.network,
                                            timeout=self.command_timeout)
            except ImageError as exc:
                raise BackendError(str(exc), 400) from exc
        notes = _notes(definition.raw)
        for note in notes:
            emit(f"note: {note}")
        base_tag = definition.base or BUILTIN_IMAGE
        base = backend.store.resolve(base_tag)
        assert base is not None and backend.builds is not None
        if backend.isolation != "bwrap" and definition.commands:
            raise BackendError("image builds that run commands need isolated sandboxes (bubblewrap): without it "
                               "the commands would change this host. Install bubblewrap, or build without "
                               "'commands' (a project only)", 400)
        build_id = secrets.token_hex(5)
        work = backend.state_dir / "builds" / "work" / build_id
        work.mkdir(parents=True)
        name = f"build-{build_id}"
        handle = None
        tmp_image: Path | None = None
        loop = asyncio.get_running_loop()
        try:
            project = base.project
            if definition.project:
                emit(f"fetching the project from {_describe(definition.project)}")
                project = str(await loop.run_in_executor(None, _fetch_project, definition.project, work))
            export = work / "export"
            export.mkdir(mode=0o700)
            env = {**base.env, **definition.env}
            network = definition.network or definition.build_network or backend.network
            emit(f"starting a build sandbox from {base_tag} (network {'on' if network else 'off'})")
            handle = await launcher.launch(backend.builds, name, base, run_as_root=True, network=network,
                                           limits=Limits(), env=env, timeout=self.start_timeout,
                                           project_lower=project, export=export)
            record = LocalHandleData.of(handle.data)
            socket = record.socket
            if definition.commands:
                script = "set -eux\n" + "\n".join(definition.commands)
                emit(f"running {len(definition.commands)} command(s) as root")
                result = await _bash(socket, script, self.command_timeout, definition.env)
                for stream in ("stdout", "stderr"):
                    text = result.get(stream, "").rstrip()
                    if text:
                        emit(f"--- {stream} ---\n{_last(text, 200)}")
                if result.get("exit_code") != 0:
                    raise BackendError(f"build command failed with exit code {result.get('exit_code')}"
                                       f"{' (timed out)' if result.get('timed_out') else ''}:\n"
                                       f"{_last(result.get('stderr', '') or result.get('stdout', ''), 30)}", 400)
            if backend.isolation == "bwrap":
                result = await _bash(socket, "mkdir /opt/idegym/export/project && "
                                             f"cp -a {PROJECT_DIR}/. /opt/idegym/export/project/", 600, {})
                if result.get("exit_code") != 0:
                    raise BackendError(f"exporting the project failed: {result.get('stderr')}")
            else:  # a plain process: its project is a directory of ours
                await loop.run_in_executor(None, copy_tree, Path(record.dir) / "project", export / "project")
            await launcher.stop(backend.builds, name, record)
            tmp_image = backend.store.new_image_dir(definition.tag)
            layers = Path(record.dir) / "layers"
            for tree in TREES:
                upper = layers / tree / "upper"
                if upper.is_dir() and any(upper.iterdir()):
                    upper.rename(tmp_image / "layers" / tree)
            if not stat.S_ISDIR(os.lstat(export / "project").st_mode):
                raise BackendError("the build replaced the exported project with a non-directory")
            (export / "project").rename(tmp_image / "project")
            backend.store.commit(tmp_image, definition.tag, base_id=base.id, base=base_tag, env=definition.env,
                                 network=definition.network, notes=notes)
            tmp_image = None
            emit(f"built {definition.tag} in {time.monotonic() - started:.1f} s")
            return definition.tag
        except ImageError as exc:
            raise BackendError(str(exc), 400) from exc
        finally:
            if handle is not None:
                try:
                    await launcher.remove(backend.builds, name, LocalHandleData.of(handle.data))
                except BackendError as exc:
                    emit(f"warning: {exc.message}")
            if tmp_image is not None:
                shutil.rmtree(tmp_image, ignore_errors=True)
            await loop.run_in_executor(None, shutil.rmtree, work, True)


    async def _fetch(self, project: dict[str, Any], work: Path) -> Path:
        return await asyncio.get_running_loop().run_in_executor(None, _fetch_project, project, work)


def _notes(raw: dict[str, Any]) -> list[str]:
    """Notes a parser attached (``_notes``, from ``control_plane.images``) or our own."""
    attached = raw.get("_notes")
    if isinstance(attached, list):
        return [str(n) for n in attached]
    return local_notes(raw)


_IGNORED_TOP = {
    "runtime_class_name": "sandboxes run under bubblewrap locally, not a container runtime",
    "resources": "limits come from each server request's `resources`",
    "platforms": "local images are built for this host only",
    "base_image": None,
}


def local_notes(raw: dict[str, Any]) -> list[str]:
    """What a build YAML entry asks for that the local backend ignores or translates."""
    notes = []
    for key, why in _IGNORED_TOP.items():  # noqa: B007
        if key in raw and why:
            notes.append(f"`{key}` ignored: {why}")
    for plugin in raw.get("plugins") or []:
        kind = plugin.get("type") if isinstance(plugin, dict) else None
        if kind == "base-system":
            notes.append("plugin `base-system` ignored: the built-in image uses the host's installed packages "
                         "(install more with `commands` and `network: true`)")
        elif kind == "user":
            if str(plugin.get("username")) == APPUSER[0] or int(plugin.get("uid", 1000)) == APPUSER[1]:
                notes.append("plugin `user` ignored: `appuser` (uid 1000) always exists locally")
            else:
                notes.append(f"plugin `user` translated to useradd commands for {plugin.get('username')!r}")
            if plugin.get("sudo"):
                notes.append("`sudo: true` ignored: sandboxes run with no_new_privs; use run_as_root instead")
        elif kind == "idegym-server":
            notes.append("plugin `idegym-server` ignored: the local backend injects its own sandbox server")
        elif kind in ("pycharm", "idea", "mcp-upstream"):
            notes.append(f"plugin `{kind}` ignored: not available in local images")
        elif kind == "permissions":
            notes.append("plugin `permissions` translated to chown/chmod commands")
        elif kind not in ("project", None):
            notes.append(f"plugin `{kind}` ignored: unknown to the local backend")
    return notes


def _emitter(sink: Any):
    def emit(line: str) -> None:
        log.info("image build: %s", line)
        if sink is None:
            return
        if callable(sink):
            sink(line)
        elif hasattr(sink, "append"):
            sink.append(line)
        elif hasattr(sink, "write"):
            sink.write(line + "\n")

    return emit


def _describe(project: dict[str, Any]) -> str:
    if "git" in project:
        return f"git {project['git']} at {project.get('ref', 'HEAD')}"
    return f"{'archive' if 'archive' in project else 'directory'} {project.get('archive') or project.get('path')}"


def _last(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


async def _bash(socket: str, command: str, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    body = {"command": command, "timeout": timeout, "env": {**env, "IDEGYM_PROJECT_ROOT": PROJECT_DIR},
            "max_output_bytes": 1 << 20}
    connector = aiohttp.UnixConnector(path=socket)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.post("http://sandbox/api/tools/bash", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout + 60)) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise BackendError(f"the build sandbox refused the command ({resp.status}): {data}")
            return data


def _fetch_project(project: dict[str, Any], work: Path) -> Path:
    dest = work / "project"
    if "path" in project:
        src = Path(project["path"]).expanduser().resolve()
        if not src.is_dir():
            raise BackendError(f"project path {src} is not a directory", 400)
        copy_tree(src, dest)
    elif "git" in project:
        clone = work / "clone"
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        ref = str(project.get("ref") or "HEAD")
        # `--`: positionals are never options (the parser refuses a URL or ref starting with '-')
        steps = [["git", "clone", "--quiet", "--", str(project["git"]), str(clone)]]
        if ref != "HEAD":
            steps.append(["git", "-C", str(clone), "checkout", "--quiet", ref, "--"])
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, env=env, timeout=1800)
            if proc.returncode != 0:
                raise BackendError(f"{' '.join(argv[:2])} failed: {proc.stderr.decode(errors='replace')[-2000:]}", 400)
        shutil.rmtree(clone / ".git", ignore_errors=True)  # like the upstream archive: no history
        src = clone / project["subdir"] if project.get("subdir") else clone
        if not src.is_dir():
            raise BackendError(f"{project.get('subdir')!r} is not a directory of {project['git']}", 400)
        src.rename(dest)
    elif "archive" in project:
        _extract(Path(project["archive"]).expanduser(), dest)
    else:
        raise BackendError("a project needs `path`, `git` or `archive`", 400)
    if project.get("subdir") and "git" not in project:
        sub = dest / project["subdir"]
        if not sub.is_dir():
            raise BackendError(f"{project['subdir']!r} is not a directory of the project", 400)
        sub.rename(work / "project-sub")
        shutil.rmtree(dest)
        (work / "project-sub").rename(dest)
    chown_tree(dest, APPUSER.uid, APPUSER.gid)
    return dest


def _extract(archive: Path, dest: Path) -> None:
    from sandbox_server.project import ProjectError, extract_archive

    if not archive.is_file():
        raise BackendError(f"project archive {archive} does not exist", 400)
    try:
        extract_archive(archive, dest)
    except ProjectError as exc:
        raise BackendError(str(exc), 400) from exc


__all__ = ["LocalImageBuilder"]
