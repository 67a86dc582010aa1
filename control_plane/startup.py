"""Starting and stopping a control plane: its backend, the records a previous run left, the
warm pool, the watcher; and which backend a configuration asks for."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web

from .backends.base import Backend, Limits, SandboxSpec
from .config import ControlPlaneConfig
from .jobs import ImageJobs
from .models import ServerKind
from .service import ControlPlane
from .watcher import Watcher

log = logging.getLogger(__name__)


def lifecycle_context(cp: ControlPlane, watcher: Watcher, images: ImageJobs):
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        await cp.backend.start()
        failed = cp.ops.recover()
        images.recover()
        if failed:
            log.warning("failed %d operations cut off by a previous run", failed)
        await cp.pool.adopt()
        await watcher.check_crashes()  # adopt live sandboxes: crashed ones are marked now
        await watcher.sweep_orphans(at_once=True)
        for image in cp.config.pool_images:
            cp.pool.watch(SandboxSpec(0, "pool", "idegym", image, ServerKind.IDEGYM, False, None, 8000, 80, Limits()))
        watcher.start()
        yield
        await watcher.stop()
        await cp.close()
        if cp.config.ephemeral:
            # Nothing outlives an ephemeral control plane, not even a sandbox half-made by a
            # request that shutdown cut off (a code-runner lease did leave one behind).
            await cp.backend.settle()
            await watcher.sweep_orphans(at_once=True)
        await cp.backend.close()
        cp.store.close()

    return ctx


def make_backend(config: ControlPlaneConfig) -> Backend:
    if config.backend == "local":
        from .backends.local import LocalBackend

        return LocalBackend(config.state_dir, isolation=config.isolation, network=config.network,
                            storage_bytes=config.sandbox_storage, storage_inodes=config.sandbox_inodes)
    if config.backend == "kubernetes":
        from .backends.kubernetes import KubernetesBackend, KubernetesConfig

        return KubernetesBackend(KubernetesConfig.from_env(**config.kubernetes))
    raise ValueError(f"unknown backend {config.backend!r}: use 'local' or 'kubernetes'")
