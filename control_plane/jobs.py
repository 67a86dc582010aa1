"""Background jobs that are not async operations: image builds and snapshot preparation.

Both answer at once with names to poll (``/api/jobs/status/{job_name}``,
``/api/snapshots/prepare/{request_id}``) and record their progress in the store, so a restart
of the control plane fails them visibly instead of leaving them "in progress" forever.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from . import ephemeral_state
from .backends.base import ImageBuilder, ImageDefinition, SandboxSpec
from .build_sources import SourceNotAllowed, check_allowed
from .ephemeral_state import BUILD_LOGS
from .errors import ApiError, BadRequest, Forbidden, NotFound
from .images import host_sources_of
from .models import (
    PrepareSnapshotsStatusResponse,
    SnapshotJobResult,
    SnapshotJobStatusResponse,
    StartServerRequest,
    Status,
)
from .pool import new_sandbox_name
from .service import ControlPlane
from .snapshot_caps import SnapshotReservation
from .store import SnapshotRow, now_ms
from .tenants import SINGLE

log = logging.getLogger(__name__)

MAX_DETAILS = 16_000


class ImageJobs:
    def __init__(self, cp: ControlPlane, builder: ImageBuilder | None,
                 parse: Callable[..., list[ImageDefinition]]) -> None:
        self.cp = cp
        self.builder = builder
        self.parse = parse

    def recover(self) -> None:
        for job in self.cp.store.jobs("in_progress"):
            self.cp.store.update_job(job.job_name, "failure",
                                     (job.details or "") + "\nthe control plane restarted during the build; rebuild")

    def submit(self, yaml_content: str, tenant: str, client: str = "") -> list[str]:
        if self.builder is None:
            raise BadRequest(f"the {self.cp.backend.name} backend cannot build images")
        try:
            for what, path in host_sources_of(yaml_content):  # before anything reads them
                check_allowed(what, path, self.cp.config.build_roots)
            definitions = self.parse(yaml_content, uploads=lambda digest: self.cp.uploads.resolve(tenant, digest))
        except SourceNotAllowed as exc:
            raise Forbidden(str(exc)) from exc
        except ValueError as exc:
            raise BadRequest(f"invalid image YAML: {exc}") from exc
        if not definitions:
            raise BadRequest("the YAML defines no images: add an 'images:' list")
        if tenant != SINGLE and not self.cp.config.tenant_host_builds:
            for definition in definitions:
                if self.builder.runs_as_host_root(definition):
                    raise Forbidden(f"{definition.tag}: a Dockerfile build (or one on an OCI base) runs its steps as "
                                    "this host's root, which a control plane with tenants does not do for them "
                                    "(--tenant-host-builds allows it, for tenants trusted with the host)")
        names = []
        request_id = secrets.token_hex(6)
        for definition in definitions:
            name = f"build-{secrets.token_hex(4)}"
            self.cp.store.add_job(name, request_id, f"queued: build {definition.tag}", tenant)
            self.cp.spawn(self._run(name, definition, tenant, client))
            names.append(name)
        return names

    async def _run(self, job_name: str, definition: ImageDefinition, tenant: str, client: str) -> None:
        lines: list[str] = [f"building {definition.tag} from {definition.base}"]
        log_path = build_log_path(self.cp.config.state_dir, job_name)
        asked = definition.tag

        def log_line(text: str) -> None:
            lines.append(str(text))
            details = "\n".join(lines)
            self.cp.store.update_job(job_name, "in_progress", details[-MAX_DETAILS:])

        def failed(cause: str) -> None:
            # The cause first (a reader, or a message cut to its head, sees it), then the log's end.
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text("\n".join(lines) + f"\nFAILED: {cause}\n")
            # (buildah's last lines follow in the log's end: the cause keeps only what went wrong)
            cause = cause.split("\nbuildah's last lines:", 1)[0]
            head = (f"FAILED: {cause}\nthe whole build log: {ephemeral_state.named(log_path)} "
                    f"(idegym images logs {job_name})")
            tail = "\n".join(lines)[-max(MAX_DETAILS - len(head) - 40, 0):]
            self.cp.store.update_job(job_name, "failure", f"{head}\n--- the build log's end ---\n{tail}"[:MAX_DETAILS])

        assert self.builder is not None
        images = self.cp.images
        try:
            target, built = await images.build_target(tenant, asked, bool(definition.raw.get("rebuild")))
            if built:
                # tags are content-addressed (or chosen by the user): same tag, same image
                lines.append(f"{asked} is already built; set 'rebuild: true' to build it again")
                self.cp.store.update_job(job_name, "success", "\n".join(lines), tag=asked)
                return
            base = images.resolve(tenant, definition.base)
            if base is None:
                raise NotFound(f"base image {definition.base!r} not found")
            turns = self.cp.admission.builds
            if turns.blocked((tenant, client)):
                log_line(f"waiting for a build turn: {turns.why((tenant, client))}")
            async with turns.hold((tenant, client)):
                await self.builder.build(replace(definition, tag=target, base=base), log_line)
            tag = asked
        except ApiError as exc:  # a backend's failure (BackendError) too
            failed(exc.message)
        except Exception as exc:  # noqa: BLE001 - a build failure is reported, never raised
            log.exception("image build %s failed", job_name)
            failed(f"{type(exc).__name__}: {exc}")
        else:
            lines.append(f"done: {tag}")
            self.cp.store.update_job(job_name, "success", "\n".join(lines)[-MAX_DETAILS:], tag=tag)


def build_log_path(state_dir: Path, job_name: str) -> Path:
    """Where a failed build's whole log is kept (``idegym images logs JOB`` prints it)."""
    return state_dir / BUILD_LOGS / f"{job_name}.log"


def request_hash(req: StartServerRequest) -> str:
    payload = req.model_dump(mode="json", exclude={"client_id"})
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class SnapshotJobs:
    """``/api/snapshots/prepare``: start each request's sandbox, snapshot it, throw it away."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    async def submit(self, requests: list[StartServerRequest], tenant: str) -> str:
        """Start the batch; 429 when its snapshots would pass a snapshot cap (``snapshot_caps.py``).
        Each request's sandbox waits its turn in the creation queue like any start (``admission.py``)."""
        for req in requests:  # on behalf of the tenant's own clients only
            self.cp.client(req.client_id, tenant)
        if not self.cp.backend.capabilities.snapshots:
            raise BadRequest(f"Pod snapshot feature is not enabled: the {self.cp.backend.name} backend has none")
        snapshots = await self.cp.snapshot_caps.reserve(
            len(requests), f"preparing {len(requests)} snapshot{'s' if len(requests) != 1 else ''}")
        request_id = f"prep-{secrets.token_hex(6)}"
        self.cp.store.add_batch(request_id, len(requests), tenant)
        for index, req in enumerate(requests):
            self.cp.spawn(self._prepare(request_id, index, req, tenant, snapshots))
        return request_id

    async def _prepare(self, request_id: str, index: int, req: StartServerRequest, tenant: str,
                       snapshots: SnapshotReservation) -> None:
        digest = request_hash(req)
        # a group of its own per tenant: the same request prepared by two is two snapshots
        group = f"prepared-{digest[:16]}" if tenant == SINGLE else \
            f"prepared-{hashlib.sha256(f'{tenant}/{digest}'.encode()).hexdigest()[:16]}"
        result = {"job_id": f"{request_id}-{index}", "request_hash": digest, "status": Status.FAILURE.value,
                  "snapshot_name": None, "snapshot_tag": None, "details": None}
        try:
            req = req.model_copy(update={"image_tag": await self.cp.images.startable(tenant, req.image_tag)})
            # a sandbox like a start's: it waits its turn under --max-servers, and counts until it is gone
            async with self.cp.admission.sandboxes.hold(
                    (tenant, str(req.client_id)), 1, self.cp.queue_timeout(req.server_start_wait_timeout_in_seconds)):
                await self._snapshot(req, group, tenant, result)
        except ApiError as exc:  # a backend's failure (BackendError) too, and the queue's 429
            result["details"] = exc.message
        except Exception as exc:  # noqa: BLE001
            log.exception("snapshot preparation failed")
            result["details"] = f"{type(exc).__name__}: {exc}"
        finally:
            snapshots.release(1)
            self.cp.store.batch_add_result(request_id, result)

    async def _snapshot(self, req: StartServerRequest, group: str, tenant: str, result: dict) -> None:
        """The request's sandbox made, snapshotted and deleted; ``result`` says what came of it."""
        spec = SandboxSpec.from_request(req, 0, new_sandbox_name("prep"))
        handle = await self.cp.pool.create(spec, req.server_start_wait_timeout_in_seconds or 300)
        try:
            info = await self.cp.backend.snapshot(handle, group)
            await self.cp.snapshot_caps.check_taken(info.snapshot_id, f"preparation {result['job_id']}",
                                                    self.cp.backend.delete_snapshot)
            self.cp.store.add_snapshot(SnapshotRow(
                id=info.snapshot_id, group_id=group, server_id=None, namespace=req.namespace,
                image_tag=req.image_tag, server_name=req.server_name, runtime_class_name=req.runtime_class_name,
                run_as_root=req.run_as_root, server_kind=req.server_kind.value,
                tag=info.snapshot_tag or info.snapshot_id, created_at=now_ms(), tenant=tenant,
            ))
            result.update(status=Status.SUCCESS.value, snapshot_name=group,
                          snapshot_tag=info.snapshot_tag or info.snapshot_id)
        finally:
            try:
                await self.cp.backend.delete(handle)
            except Exception:  # noqa: BLE001
                log.exception("could not delete snapshot preparation sandbox")

    def status(self, request_id: str, tenant: str) -> PrepareSnapshotsStatusResponse | None:
        batch = self.cp.store.get_batch(request_id, tenant)
        if batch is None:
            return None
        total, results = batch
        done = len(results) >= total
        return PrepareSnapshotsStatusResponse(
            request_id=request_id, status="READY" if done else "IN_PROGRESS", total_requested=total,
            succeeded=sum(r["status"] == Status.SUCCESS.value for r in results),
            failed=sum(r["status"] != Status.SUCCESS.value for r in results),
            results=[SnapshotJobResult(**{k: v for k, v in r.items() if k != "job_id"}) for r in results]
            if done else None,
        )

    def job(self, job_id: str, tenant: str) -> SnapshotJobStatusResponse | None:
        request_id, _, index = job_id.rpartition("-")
        batch = self.cp.store.get_batch(request_id, tenant)
        if batch is None or not index.isdigit() or int(index) >= batch[0]:
            return None
        for r in batch[1]:
            if r["job_id"] == job_id:
                return SnapshotJobStatusResponse(job_id=job_id, status=Status(r["status"]),
                                                 snapshot_name=r["snapshot_name"], snapshot_tag=r["snapshot_tag"],
                                                 details=r["details"])
        return SnapshotJobStatusResponse(job_id=job_id, status=Status.IN_PROGRESS)

