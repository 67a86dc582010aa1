"""Image builds as Kubernetes Jobs running an in-cluster image builder (Kaniko by default).

One image of the build YAML becomes a ConfigMap holding its Dockerfile (the entry's own
``dockerfile``, or one rendered from the entry) and, when the entry has a ``context`` or a
project ``path``, that directory as ``context.tar.gz`` (the builder's ``tar://`` context),
and a Job whose single pod runs the builder with that ConfigMap mounted at ``/workspace`` and
pushes to the image's tag. The Job is the durable record: its status, read
back by name, is what ``/api/jobs/status/{job_name}`` reports, so a restarted control plane
still knows how a build ended (until the Job's TTL removes it).

``parse_build_yaml`` reads the shared build YAML (``control_plane.images``) with the cluster's
rules on top; ``KubernetesImageBuilder.parse_yaml`` applies the configured registry to tags.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import json
import re
import secrets
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from ...appuser import APPUSER, PROJECT_DIR
from ...models import Status
from ..base import BackendError, ImageBuilder, ImageDefinition
from . import kube
from .manifests import GROUP, managed_labels, owner_reference

if TYPE_CHECKING:
    from ...images import Uploads
    from .backend import KubernetesBackend

IMAGE_TAG_ANNOTATION = f"{GROUP}/image-tag"
CONTEXT_MOUNT = "/workspace"
CONTEXT_ARCHIVE = "context.tar.gz"
MAX_CONTEXT_BYTES = 700 * 1024  # a ConfigMap holds at most 1 MiB: base64 (4/3) and the Dockerfile included


# -- the YAML -----------------------------------------------------------------------------------


def parse_build_yaml(text: str, registry: str | None = None, uploads: Uploads | None = None
                     ) -> list[ImageDefinition]:
    """The shared build YAML (``control_plane.images``), with what a cluster needs on top: every
    entry names a real ``base`` image or has a ``dockerfile`` (there is no built-in image on a
    cluster) and builds may use the network unless an entry says otherwise."""
    from ...images import BUILTIN_IMAGE
    from ...images import parse_build_yaml as parse_shared

    definitions = parse_shared(text, registry, uploads)
    for index, definition in enumerate(definitions):
        if definition.dockerfile is None and ("base" not in definition.raw or definition.base == BUILTIN_IMAGE):
            raise ValueError(f"images[{index}]: needs a 'base' image (or a 'dockerfile') to build from on Kubernetes")
        if definition.dockerfile is None and definition.project and "path" not in definition.project \
                and "url" not in definition.project:
            raise ValueError(f"images[{index}]: on Kubernetes a project is an `upload` or a local `path` (sent as "
                             "the build context) or an archive `url`")
        if "network" not in definition.raw:
            definition.network = True
    return definitions


def render_dockerfile(definition: ImageDefinition) -> str:
    if definition.dockerfile is not None:  # the user's own, as written; the label on its last stage
        return definition.dockerfile.rstrip("\n") + f'\nLABEL {IMAGE_TAG_ANNOTATION}="{definition.tag}"\n'
    lines = [f"FROM {definition.base}", f'LABEL {IMAGE_TAG_ANNOTATION}="{definition.tag}"']
    for key, value in definition.env.items():
        lines.append(f"ENV {key}={json.dumps(value)}")
    project = definition.project or {}
    if isinstance(project, dict) and project.get("url"):
        lines.append(f"ADD {project['url']} {PROJECT_DIR}/")
    if isinstance(project, dict) and project.get("path"):  # the build context (build_context)
        lines.append(f"COPY --chown={APPUSER.uid}:{APPUSER.gid} . {PROJECT_DIR}/")
    lines += [f"RUN {command}" for command in definition.commands]
    lines.append(f"WORKDIR {PROJECT_DIR}")
    return "\n".join(lines) + "\n"


def build_context(definition: ImageDefinition) -> bytes | None:
    """The build context the Job gets, as a gzipped tar: the upload's own archive when the
    context (or the project) is an upload, else the definition's ``context`` or its project's
    ``path`` (a directory under a build root of the control plane's host). It travels in the
    Job's ConfigMap, so it must stay under ``MAX_CONTEXT_BYTES``; bigger projects need a ``url``."""
    if definition.context_archive is not None:
        return _uploaded_context(Path(definition.context_archive))
    root = definition.context or (definition.project or {}).get("path")
    if not root:
        return None
    directory = Path(str(root)).expanduser()
    if not directory.is_dir():
        raise BackendError(f"build context {directory} is not a directory", 400)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for path in sorted(directory.rglob("*")):
            rel = path.relative_to(directory)
            if rel.parts[0] == ".git":
                continue
            tar.add(path, arcname=str(rel), recursive=False)
            if buffer.tell() > MAX_CONTEXT_BYTES:
                break
    return _within_limit(buffer, f"the build context {directory}")


def _uploaded_context(archive: Path) -> bytes:
    """An upload's tar, gzipped as it is: the tree the client sent, byte for byte."""
    buffer = io.BytesIO()
    with archive.open("rb") as source, gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0) as out:
        while chunk := source.read(1 << 20):
            out.write(chunk)
            if buffer.tell() > MAX_CONTEXT_BYTES:
                break
    return _within_limit(buffer, "the uploaded build context")


def _within_limit(buffer: io.BytesIO, what: str) -> bytes:
    """The compressed context, or 413 when it is too big to travel in the build Job's ConfigMap."""
    data = buffer.getvalue()
    if len(data) > MAX_CONTEXT_BYTES:
        raise BackendError(f"{what} is over {MAX_CONTEXT_BYTES // 1024} KiB compressed: too big for the build Job's "
                           "ConfigMap; give the project as an archive `url`, or build the image locally and push it "
                           "(`idegym images push`)", 413)
    return data


# -- the Job ------------------------------------------------------------------------------------


@dataclass
class BuildStatus:
    job_name: str
    status: Status
    tag: str | None = None
    details: str | None = None


def build_job(job_name: str, namespace: str, definition: ImageDefinition, backend: KubernetesBackend
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Job and its ConfigMap (the ConfigMap's ownerReference is added once the Job exists)."""
    cfg = backend.config
    labels = managed_labels(job_name, backend.settings, component="image-build")
    context = build_context(definition)
    source = f"tar://{CONTEXT_MOUNT}/{CONTEXT_ARCHIVE}" if context is not None else f"dir://{CONTEXT_MOUNT}"
    args = [f"--dockerfile={CONTEXT_MOUNT}/Dockerfile", f"--context={source}",
            f"--destination={definition.tag}", *cfg.builder_args]
    if cfg.insecure_registry:
        args.append("--insecure")
    mounts = [{"name": "context", "mountPath": CONTEXT_MOUNT, "readOnly": True}]
    volumes: list[dict[str, Any]] = [{"name": "context", "configMap": {"name": f"{job_name}-context"}}]
    if cfg.registry_secret:  # a kubernetes.io/dockerconfigjson Secret, as Kaniko reads it
        mounts.append({"name": "registry", "mountPath": "/kaniko/.docker", "readOnly": True})
        volumes.append({"name": "registry", "secret": {
            "secretName": cfg.registry_secret, "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}})
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name, "namespace": namespace, "labels": labels,
                     "annotations": {IMAGE_TAG_ANNOTATION: definition.tag}},
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": cfg.build_ttl_seconds,
            "activeDeadlineSeconds": int(cfg.build_timeout),
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "containers": [{
                        "name": "builder",
                        "image": cfg.builder_image,
                        "args": args,
                        "volumeMounts": mounts,
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                    }],
                    "volumes": volumes,
                },
            },
        },
    }
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{job_name}-context", "namespace": namespace, "labels": labels},
        "data": {"Dockerfile": render_dockerfile(definition)},
    }
    if context is not None:
        configmap["binaryData"] = {CONTEXT_ARCHIVE: base64.b64encode(context).decode()}
    return job, configmap


def _log_sink(log: Any) -> Callable[[str], None]:
    if log is None:
        return lambda line: None
    if callable(log):
        return log
    for attr in ("append", "write", "info"):
        if hasattr(log, attr):
            return getattr(log, attr)
    return lambda line: None


class KubernetesImageBuilder(ImageBuilder):
    """Runs builds as Jobs in the backend's namespace; ``build`` waits, ``submit``/``status``
    let a control plane report a running build by its Job name."""

    def __init__(self, backend: KubernetesBackend, poll_interval: float = 1.0) -> None:
        self.backend = backend
        self.poll_interval = poll_interval

    @property
    def namespace(self) -> str:
        return self.backend.config.namespace

    async def submit(self, definition: ImageDefinition) -> str:
        backend = self.backend
        slug = re.sub(r"[^a-z0-9-]", "-", definition.tag.rsplit("/", 1)[-1].split(":")[0].lower())[:30].strip("-")
        job_name = f"idegym-build-{slug or 'image'}-{secrets.token_hex(4)}"
        job, configmap = build_job(job_name, self.namespace, definition, backend)
        try:
            created = await kube.call(backend.batch.create_namespaced_job, self.namespace, job)
            configmap["metadata"]["ownerReferences"] = [owner_reference(created)]
            await kube.call(backend.core.create_namespaced_config_map, self.namespace, configmap)
        except ApiException as exc:
            await kube.delete_quietly(backend.batch.delete_namespaced_job, job_name, self.namespace,
                                      body={"propagationPolicy": "Background"})
            raise BackendError(f"could not start the build of {definition.tag}: {kube.error_text(exc)}",
                               exc.status if exc.status in (400, 403, 409, 422) else 500) from exc
        return job_name

    async def status(self, job_name: str) -> BuildStatus:
        job = await kube.call_or_none(self.backend.batch.read_namespaced_job, job_name, self.namespace)
        if job is None:
            raise BackendError(f"build job {job_name!r} not found", 404)
        tag = (job["metadata"].get("annotations") or {}).get(IMAGE_TAG_ANNOTATION)
        conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []
                      if c.get("status") == "True"}
        if "Complete" in conditions:
            return BuildStatus(job_name, Status.SUCCESS, tag, f"built and pushed {tag}")
        if "Failed" in conditions:
            reason = conditions["Failed"].get("message") or conditions["Failed"].get("reason") or "failed"
            detail = await self._pod_failure(job_name)
            return BuildStatus(job_name, Status.FAILURE, tag, f"{reason}: {detail}" if detail else reason)
        return BuildStatus(job_name, Status.IN_PROGRESS, tag, None)

    async def _job_pods(self, job_name: str) -> list[dict[str, Any]]:
        data = await kube.call(self.backend.core.list_namespaced_pod, self.namespace,
                               label_selector=f"batch.kubernetes.io/job-name={job_name}")
        return data.get("items") or []

    async def _pod_failure(self, job_name: str) -> str | None:
        for pod in await self._job_pods(job_name):
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                term = (status.get("state") or {}).get("terminated") or {}
                if term.get("exitCode"):
                    message = (term.get("message") or "").strip()
                    return f"builder exited with code {term['exitCode']}" + (f": {message[-1000:]}" if message else "")
        return None

    async def logs(self, job_name: str, tail_lines: int = 200) -> str:
        for pod in await self._job_pods(job_name):
            try:
                return await asyncio.to_thread(self.backend.core.read_namespaced_pod_log, pod["metadata"]["name"],
                                               self.namespace, tail_lines=tail_lines)
            except ApiException:
                continue
        return ""

    async def wait(self, job_name: str, timeout: float | None = None) -> BuildStatus:
        deadline = time.monotonic() + (timeout or self.backend.config.build_timeout)
        while True:
            status = await self.status(job_name)
            if status.status != Status.IN_PROGRESS:
                return status
            if time.monotonic() >= deadline:
                return BuildStatus(job_name, Status.FAILURE, status.tag, "timed out waiting for the build job")
            await asyncio.sleep(self.poll_interval)  # builds take minutes; a Job poll per second is cheap

    def parse_yaml(self, text: str, uploads: Uploads | None = None) -> list[ImageDefinition]:
        """The build YAML as this cluster builds it: tags under the configured registry."""
        return parse_build_yaml(text, registry=self.backend.config.registry, uploads=uploads)

    async def build(self, definition: ImageDefinition, log: Any) -> str:
        sink = _log_sink(log)
        job_name = await self.submit(definition)
        sink(f"build job {job_name} started for {definition.tag}")
        result = await self.wait(job_name)
        for line in (await self.logs(job_name)).splitlines():
            sink(line)
        if result.status != Status.SUCCESS:
            raise BackendError(f"build of {definition.tag} failed ({job_name}): {result.details}")
        return definition.tag

    async def exists(self, tag: str) -> bool:
        # A cluster pulls from registries the control plane cannot list; a missing image shows up
        # as the pod's ErrImagePull (reported as ImageNotFound, 404) when a server starts.
        return True
