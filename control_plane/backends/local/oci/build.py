"""OCI image builds: a Dockerfile (or a YAML definition on an OCI base) built with buildah.

The bases the Dockerfile names are provided first (Debian/Python bases from the shared cache,
images of this store, or pulled through the operator's registry mirror), then ``buildah bud
--isolation chroot --layers --pull=never`` runs without network unless the definition allows
it (``network`` or the build-only ``build_network``; an unchanged Dockerfile and context rebuild
from buildah's layer cache), unless the host's build cache (``build_cache``) has the result of the
same inputs, which any control plane of the host published. The result enters
the local image store as an OCI image (see ``rootfs``); its id is the image's, so importing the
same image again is free.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ....appuser import APPUSER, PROJECT_DIR
from ....dockerfile import add_stage_args, base_images, lower_heredocs, rewrite_bases
from ...base import BackendError, ImageDefinition
from .. import hostconfig
from ..image_trees import OPT_SKELETON, chown_tree, host_files
from ..images import ImageStore
from . import bases as base_catalog
from . import catalog, refs
from .build_cache import NAME, BuildCache, BuildInputs, build_key
from .buildah import Buildah, available, storage_name
from .rootfs import ADAPT_VERSION, read_image, write_adapt_layer
from .settings import OciError, OciSettings

log = logging.getLogger(__name__)
BUILDAH_HEREDOCS = "1.28 (here-documents came in 1.33)"

Emit = Callable[[str], None]
FetchProject = Callable[[dict[str, Any], Path], Awaitable[Path]]


class OciBuilder:
    """Builds OCI images into ``store``; ``images_dir`` holds this state directory's buildah store."""

    def __init__(self, store: ImageStore, images_dir: Path, settings: OciSettings | None = None, *,
                 host_config: Path | None = None) -> None:
        self.store = store
        self.host_config = host_config  # where the host's package configuration is written (None: not used)
        self.settings = settings or OciSettings.from_env()
        self.cache = base_catalog.BaseCache(self.settings)
        self.builds = BuildCache(self.settings, self.cache.store_home)
        shared = (self.cache.store_home, *((self.builds.store_home,) if self.settings.share_builds else ()))
        self.buildah = Buildah(images_dir / "buildah", self.settings, additional=shared)
        self.work_root = images_dir / "oci-work"
        self._lock = asyncio.Lock()  # one bud at a time: leftovers of a failed one are removed safely
        self._tags: dict[str, asyncio.Lock] = {}  # concurrent jobs of one tag: the first builds it

    # -- what goes through buildah ----------------------------------------------------------

    def wants(self, definition: ImageDefinition) -> bool:
        """A Dockerfile, or a YAML definition whose base is not an image of the host's userland."""
        if definition.dockerfile is not None:
            return True
        meta = self.store.meta(definition.base)
        # Not in the store: a distribution base, a registry image, or unknown (the build says
        # what is supported).
        return meta is None or meta.get("kind") == "oci"

    # -- building -----------------------------------------------------------------------------

    async def build(self, definition: ImageDefinition, emit: Emit, fetch_project: FetchProject, *,
                    network: bool, timeout: float = 3600.0) -> str:
        async with self._tags.setdefault(definition.tag, asyncio.Lock()):
            if not definition.raw.get("rebuild") and self.store.exists(definition.tag):
                emit(f"{definition.tag} was built meanwhile by another job")  # many envs of one task set
                return definition.tag
            return await self._build(definition, emit, fetch_project, network=network, timeout=timeout)

    async def _build(self, definition: ImageDefinition, emit: Emit, fetch_project: FetchProject, *,
                     network: bool, timeout: float) -> str:
        reason = available()
        if reason:
            raise OciError(f"cannot build OCI images here: {reason}", 500)
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        await loop.run_in_executor(None, self._ensure_dirs)
        work = self.work_root / secrets.token_hex(6)
        work.mkdir(parents=True)
        try:
            context = await self._context(definition, work, fetch_project)
            if definition.dockerfile is not None:
                text = definition.dockerfile
            else:  # a project laid over an OCI base goes where that base keeps its project
                base_meta = self.store.meta(definition.base) or {}
                text = render_yaml(definition, has_project=context[1],
                                   project_dir=base_meta.get("project_dir") or PROJECT_DIR)
            if definition.dockerfile is None:
                emit("rendered Dockerfile (the YAML definition on an OCI base):\n" + text.rstrip())
            text, heredocs = lower_heredocs(text)
            if heredocs:
                emit(f"{heredocs} here-document instruction(s) (RUN <<EOF, COPY <<EOF) said in exec form for buildah "
                     f"{BUILDAH_HEREDOCS}: the same commands, the shell reads the documents")
            dockerfile = work / "Dockerfile"
            dockerfile.write_text(text)
            mapping: list[dict[str, Any]] = []
            for ref in base_images(text, definition.build_args):
                mapping.append(await self._provide(ref, emit))
            rewrites = {m["ref"]: m["image"] for m in mapping if m.get("image")}
            if rewrites:  # by image id: a tag or a digest the base built here cannot have is not looked up
                dockerfile.write_text(rewrite_bases(text, definition.build_args, rewrites))
            host = await self._host_config(dockerfile, network, emit)
            inputs = BuildInputs(dockerfile.read_text(), context[0], dict(definition.build_args),
                                 _base_labels(mapping), tuple(rewrites.values()), network,
                                 host.directory if host else None, host.proxies if host else None)
            image_id, cached = await self._cached_or_built(definition, inputs, dockerfile, host, emit, timeout)
            notes = [m["note"] for m in mapping if m.get("note")]
            ident = await loop.run_in_executor(None, self._import, definition, image_id, work, notes, mapping)
            emit(f"{'took' if cached else 'built'} {definition.tag} (image {image_id[:12]}, store id {ident}"
                 f"{', from the host build cache' if cached else ''}) in {time.monotonic() - started:.1f} s")
            return definition.tag
        finally:
            await loop.run_in_executor(None, shutil.rmtree, work, True)

    def _ensure_dirs(self) -> None:
        self.cache.ensure_dirs()
        if self.settings.share_builds:
            self.builds.ensure_dirs()
        self.buildah.ensure()
        self.work_root.mkdir(parents=True, exist_ok=True)

    async def _context(self, definition: ImageDefinition, work: Path, fetch_project: FetchProject
                       ) -> tuple[Path, bool]:
        """The build context directory, and whether it is the definition's project."""
        if definition.context:
            context = Path(definition.context).expanduser().resolve()
            if not context.is_dir():
                raise OciError(f"build context {context} is not a directory")
            return context, False
        if definition.project:
            return await fetch_project(definition.project, work), True
        empty = work / "context"
        empty.mkdir()
        return empty, False

    async def _provide(self, ref: str, emit: Emit) -> dict[str, Any]:
        """Make ``FROM ref`` resolvable without a registry; what it maps to (for the record and the
        Dockerfile's rewrite: ``image`` is the id the build uses)."""
        loop = asyncio.get_running_loop()
        meta = await loop.run_in_executor(None, self.store.meta, ref)
        if meta is not None:  # an image of this store
            if meta.get("kind") != "oci":
                raise OciError(f"base {ref!r} is an image of the host's userland (the built-in image or one built "
                               "on it), not an OCI image: a Dockerfile cannot build on it. Use a Debian base "
                               f"({catalog.supported_text()})")
            image_id = meta["oci"]["image_id"]  # by id: one the host's build cache gave has no name here
            if not await loop.run_in_executor(None, self.buildah.image_id, image_id):
                raise OciError(f"base {ref!r} is in the local image store but not in buildah's: build it again")
            return {"ref": ref, "local": meta["id"], "image": image_id}
        try:
            image = refs.parse(ref)
        except refs.RefError as exc:
            raise OciError(f"FROM {ref!r}: {exc}") from None
        pull_failed = ""
        source = self.settings.registry or (image.registry if await loop.run_in_executor(
            None, refs.registry_reachable, image) else None)
        if source:
            pull = image.pull_name
            if self.settings.registry and image.official:  # the mirror serves Docker Hub's names
                pull = refs.parse(f"{image.official}@{image.digest}" if image.digest else
                                  f"{image.official}:{image.tag_or_latest}").pull_name
            how = f"through the registry mirror {source}" if self.settings.registry else f"from {source}"
            emit(f"base {ref}: pulling {pull} {how}")
            result = await self.buildah.run(["pull", "--policy", "always", "--signature-policy", self.buildah.policy,
                                             pull], network=True, emit=emit, timeout=1800)
            ident = await loop.run_in_executor(None, self.buildah.image_id, pull) if result.returncode == 0 else None
            if ident:
                return {"ref": ref, "pulled_from": source, "pulled": pull, "image": ident, "digest": image.digest}
            pull_failed = f"pulling {pull} {how} failed: {result.message(6)}"
        try:
            spec = catalog.resolve(ref, ubuntu=await loop.run_in_executor(None, self._ubuntu_usable, image))
        except OciError as exc:
            raise OciError(f"{pull_failed}\n{exc.message}" if pull_failed else exc.message) from None
        if spec is None:
            if pull_failed:
                raise OciError(pull_failed)
            raise OciError(f"base image {ref!r} is not available: its registry {image.api_host} is not reachable "
                           f"and no registry mirror is configured (--image-registry), and it is not one built here "
                           f"from distribution archives. Supported bases: {catalog.supported_text()}, and OCI images "
                           "built here (`idegym images list` on this host)")
        if pull_failed:
            emit(f"base {ref}: {pull_failed.splitlines()[0]}; building it here instead")
        emit(f"base {ref}: {spec.note or spec.release.title} (built here from distribution archives)")
        if image.digest:
            emit(f"base {ref}: its digest {image.digest} is not honoured: no registry has it here, and a base "
                 "built here cannot have that digest")
        built = await self.cache.ensure(spec, emit)
        return {"ref": ref, "base": spec.name, "debian": spec.release.codename, "distro": spec.release.distro,
                "key": built.key, "python": built.python_version, "debian_version": built.debian_version,
                "versions": built.versions, "note": spec.note, "image": built.image_id,
                "digest_not_honoured": image.digest}

    def _ubuntu_usable(self, image: refs.ImageRef) -> bool:
        """Whether an Ubuntu archive can build this (asked only for images that may need one)."""
        wants = image.official in ("ubuntu", "eclipse-temurin") or \
            f"{image.registry}/{image.path}" in catalog.DERIVED
        return wants and self.cache.ubuntu_archive() is not None

    async def _host_config(self, dockerfile: Path, network: bool, emit: Emit) -> hostconfig.HostConfig | None:
        """The host's package configuration for RUN steps with the network (one ARG step per stage
        names it in ``dockerfile``), or None."""
        if not network or self.host_config is None:
            return None
        host = await asyncio.get_running_loop().run_in_executor(None, hostconfig.collect, self.host_config)
        if host.env:
            dockerfile.write_text(add_stage_args(dockerfile.read_text(), host.env))
        emit(f"the host's package configuration reaches RUN steps at {hostconfig.MOUNT} (read-only, not in any "
             f"layer; one ARG step per stage names it): {host.describe()}")
        return host

    async def _cached_or_built(self, definition: ImageDefinition, inputs: BuildInputs, dockerfile: Path,
                               host: hostconfig.HostConfig | None, emit: Emit, timeout: float) -> tuple[str, bool]:
        """The image's id, and whether it came from the host's build cache: built (and published
        there) unless a control plane of this host built the same inputs before."""
        if not self.settings.share_builds:
            return await self._bud(definition, dockerfile, inputs, host, emit, timeout), False
        loop = asyncio.get_running_loop()
        key = await loop.run_in_executor(None, lambda: build_key(inputs, self.builds.buildah_version()))
        async with self.builds.claim(key, emit):
            if not definition.raw.get("rebuild"):
                record = await loop.run_in_executor(None, self.builds.lookup, key)
                if record is not None:
                    emit(f"image from the host's build cache (key {key}; built in {record.get('seconds')} s as "
                         f"{record.get('tag')}): not built again")
                    return record["image_id"], True
            if not await loop.run_in_executor(None, self.builds.sees, inputs.bases):
                emit("built in this state directory, not in the host's build cache: it builds on an image only this "
                     "state directory has")
                return await self._bud(definition, dockerfile, inputs, host, emit, timeout), False
            started = time.monotonic()
            image_id = await self._bud(definition, dockerfile, inputs, host, emit, timeout,
                                       into=self.builds.buildah, name=f"{NAME}:{key}")
            await loop.run_in_executor(None, self.builds.publish, key, image_id, definition.tag,
                                       time.monotonic() - started)
            emit(f"published to the host's build cache (key {key}): built in its store, nothing copied")
            return image_id, False

    async def _bud(self, definition: ImageDefinition, dockerfile: Path, inputs: BuildInputs,
                   host: hostconfig.HostConfig | None, emit: Emit, timeout: float, *, into: Buildah | None = None,
                   name: str | None = None) -> str:
        """Build into this state directory's store, or ``into`` another (the host's build cache)
        as ``name``."""
        loop = asyncio.get_running_loop()
        store = into or self.buildah
        network, context = inputs.network, inputs.context
        iidfile = dockerfile.with_name("iid")
        args = ["bud", "--isolation", "chroot", "--layers", "--pull=never", "--signature-policy", store.policy,
                "--force-rm", "-f", str(dockerfile), "-t", name or storage_name(definition.tag), "--iidfile",
                str(iidfile)]
        for key, value in definition.build_args.items():
            args += ["--build-arg", f"{key}={value}"]
        for key, value in inputs.labels.items():
            args += ["--label", f"{key}={value}"]
        if host is not None:
            args += ["--volume", f"{host.directory}:{hostconfig.MOUNT}:ro"]
            for key, value in host.proxies.items():  # predefined: their values stay out of the history
                args += ["--build-arg", f"{key}={value}"]
        args.append(str(context))
        emit(f"buildah bud (RUN network {'on' if network else 'off'}), context {context}")
        batch = _Batcher(emit)
        async with self._lock, (self.builds.building() if into is not None else contextlib.nullcontext()):
            # A build killed mid-way leaves its working containers: removed in this state
            # directory's store, where this lock orders every build, and in the shared one when no
            # build runs there (``BuildCache.building``).
            before = await loop.run_in_executor(None, store.containers) if into is None else set()
            try:
                result = await store.run(args, network=network, emit=batch.add, timeout=timeout)
            finally:
                batch.flush()
                if into is None:
                    left = await loop.run_in_executor(None, store.containers)
                    await loop.run_in_executor(None, store.remove_containers, left - before)
        if result.returncode != 0:
            why = "timed out" if result.timed_out else f"exit {result.returncode}"
            raise OciError(f"buildah could not build {definition.tag} ({why}):\n{result.message()}")
        try:
            image_id = iidfile.read_text().strip().removeprefix("sha256:")
        except OSError:
            raise OciError(f"buildah reported success but wrote no image id:\n{result.message()}", 500) from None
        return image_id

    def _import(self, definition: ImageDefinition, image_id: str, work: Path, notes: list[str],
                mapping: list[dict[str, Any]]) -> str:
        info = self.buildah.inspect(image_id)
        project_dir = project_dir_of(definition, info.config)
        # The store entry carries the sandboxes' network flag and variables: the same image with and
        # without them (a task that may use the network and one that may not; two tasks whose
        # Dockerfiles build the same image, with variables of their own) are two entries.
        recipe = f"{ADAPT_VERSION}\0{project_dir}" + ("\0network" if definition.network else "")
        if definition.env:
            recipe += "\0" + json.dumps(sorted(definition.env.items()))
        salt = hashlib.sha256(recipe.encode()).hexdigest()[:6]
        ident = f"oci-{image_id[:32]}-{salt}"
        env = _env_dict(info.config.get("Env") or [])
        env.update(definition.env)
        meta = {"oci": {"image_id": info.id, "name": storage_name(definition.tag),
                        "layers": [str(p) for p in info.layers], "config": info.config},
                "env": env, "network": definition.network, "project_dir": project_dir, "bases": mapping,
                "notes": notes}
        if (self.store.data / ident / "image.json").exists():
            self.store.add_oci(definition.tag, ident, None, meta)
            return ident
        prepared = self.store.data / f".tmp-{ident}.{secrets.token_hex(3)}"
        prepared.mkdir(parents=True)
        try:
            facts = read_image(list(info.layers), prepared, work, project_dir)
            if not facts.get("project_found"):
                notes.append(f"the image has no {project_dir}: the project is empty")
            chown_tree(prepared / "project", APPUSER.uid, APPUSER.gid)
            os.chmod(prepared / "project", 0o755)
            notes += write_adapt_layer(prepared / "adapt", facts, host_files(), OPT_SKELETON, project_dir)
            (prepared / "facts.json").unlink(missing_ok=True)
            meta["notes"] = notes
            self.store.add_oci(definition.tag, ident, prepared, meta)
        finally:
            shutil.rmtree(prepared, ignore_errors=True)
        return ident


def project_dir_of(definition: ImageDefinition, config: dict[str, Any]) -> str:
    """Where the sandbox's project is: the definition's ``project_dir`` when it names one, else
    the image's final WORKDIR (Harbor tasks use e.g. /app), else /home/appuser/work."""
    if definition.project_dir:
        return definition.project_dir
    workdir = str(config.get("WorkingDir") or "").rstrip("/")
    return workdir if workdir.startswith("/") and ".." not in workdir.split("/") else PROJECT_DIR


def render_yaml(definition: ImageDefinition, *, has_project: bool, project_dir: str = PROJECT_DIR) -> str:
    """A YAML definition on an OCI base as a Dockerfile: appuser, the project laid over
    ``project_dir`` (the base's project directory), the commands."""
    name, uid, gid, home = APPUSER
    target = definition.project_dir or project_dir
    lines = [f"FROM {definition.base}"]
    for key, value in definition.env.items():
        lines.append(f"ENV {key}={json.dumps(value)}")
    # appuser as the local sandboxes (and the upstream `user` plugin) have it, so commands may name it
    setup = (f"grep -q '^{name}:' /etc/passwd || echo '{name}:x:{uid}:{gid}::{home}:/bin/sh' >> /etc/passwd; "
             f"grep -q '^{name}:' /etc/group || echo '{name}:x:{gid}:' >> /etc/group; "
             f"mkdir -p {home} {target} && chown {uid}:{gid} {home} {target}")
    lines.append(f"RUN {setup}")
    if has_project:
        lines.append(f"COPY --chown={uid}:{gid} . {target}/")
    for command in definition.commands:
        lines.append("RUN " + json.dumps(["/bin/sh", "-c", f"set -eux\n{command}"]))
    lines.append(f"WORKDIR {target}")
    return "\n".join(lines) + "\n"


def _base_labels(mapping: list[dict[str, Any]]) -> dict[str, str]:
    """What each base built here stands for, with the versions installed, on the image itself."""
    labels: dict[str, str] = {}
    for number, entry in enumerate(m for m in mapping if m.get("base")):
        installed = ", ".join(f"{k} {v}" for k, v in ({"python3": entry.get("python")} | entry.get("versions", {}))
                              .items() if v)
        labels[f"org.idegym.substituted.{number}"] = (f"{entry['note'] or entry['ref'] + ' -> ' + entry['base']}"
                                                      + (f"; installed: {installed}" if installed else ""))
        if entry.get("digest_not_honoured"):
            labels[f"org.idegym.digest-not-honoured.{number}"] = f"{entry['ref']}"
    return labels


def _env_dict(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep and key not in ("HOSTNAME", "HOME"):
            out[key] = value
    return out


class _Batcher:
    """Build output to the job log in chunks (every second), not one store write per line."""

    def __init__(self, emit: Emit, interval: float = 1.0) -> None:
        self.emit = emit
        self.interval = interval
        self.lines: list[str] = []
        self.last = time.monotonic()

    def add(self, line: str) -> None:
        self.lines.append(line)
        if time.monotonic() - self.last >= self.interval:
            self.flush()

    def flush(self) -> None:
        if self.lines:
            self.emit("\n".join(self.lines))
            self.lines = []
        self.last = time.monotonic()


__all__ = ["BackendError", "OciBuilder", "render_yaml"]
