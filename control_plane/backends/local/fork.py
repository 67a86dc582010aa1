"""Fork of a local sandbox into N children (``LocalBackend.fork``).

1. The parent's processes are frozen (cgroup freezer) for the instant its writable layers and
   its /tmp are copied into a new fork layer (``fork_layers.py``, a filesystem of its own made
   before the freeze): what the parent wrote since its start, never its image, so the cost does
   not grow with the project.
2. Each child stands on that layer, then the layers the parent itself stood on, then the image:
   its own writable layer starts empty, so its disk is only what it writes. A parent that stands
   on as many fork layers as a stack may hold (``ForkLayers.max_stack``) has them merged into the
   new layer, after the thaw: depth costs nothing. A child is a warm-
   pool sandbox of the parent's kind remounted onto that stack (``adopt.py``, a few
   milliseconds) when one is at hand and the image allows it, else a new sandbox launched on it.
3. The parent's /tmp is copied into each child's.

No process state is copied: a child's processes are new (its sandbox server, then whatever its
tools start). The parent runs on and sees nothing of its children; a child outlives its parent
(the layers are held until their last user is gone).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_server import procfs

from ..base import BackendError, ForkChild, SandboxHandle
from . import adopt, priority
from .fork_layers import ForkLayers, ForkStack, sandbox_holder, seed_tmp
from .handle_data import LocalHandleData
from .image_trees import ImageError
from .images import ImageStore, ResolvedImage
from .launcher import Launcher
from .layout import Space, write_meta
from .storage import LayerStorage

log = logging.getLogger(__name__)
# A fork's blocking steps run here, not on the loop's default executor (as many threads as CPUs
# + 4: 6 here), where 8 children queued behind each other and behind the warm pool's and the
# deletes' work. Idle threads cost nothing but their stacks.
_threads = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="idegym-fork")
# Seconds after a fork answered, the next one's layer filesystem is made and its adopted
# children's records are written: the children's first calls come first.
SPARE_AFTER = 0.5


@dataclass(frozen=True)
class LocalForkSite:
    """What a fork uses of the local backend (``LocalBackend.fork`` makes one)."""

    launcher: Launcher
    space: Space  # where the children live: the backend's sandboxes
    layers: ForkLayers
    images: ImageStore
    state_dir: Path
    delete: Callable[[SandboxHandle], Awaitable[None]]


def check_parent(site: LocalForkSite, name: str, data: LocalHandleData) -> ResolvedImage:
    """The image of the parent ``name``; ``BackendError`` when this parent cannot be forked here."""
    if data.isolation != "bwrap":
        raise BackendError("fork needs bubblewrap isolation (overlay layers to stack): this sandbox runs as a "
                           "plain process", 400)
    if data.space == "builds":
        raise BackendError("image-build sandboxes cannot be forked", 400)
    if not procfs.recorded_alive(data.server):
        raise BackendError(f"sandbox {name!r} is not running: nothing to fork", 409)
    try:
        return site.images.resolve_id(data.image_id or "", data.image)
    except ImageError as exc:
        raise BackendError(f"the image of sandbox {name!r} is gone: {exc}", 409) from exc


async def fork(site: LocalForkSite, parent: SandboxHandle, children: list[ForkChild],
               timeout: float) -> list[SandboxHandle]:
    launcher, loop = site.launcher, asyncio.get_running_loop()
    warm = [c.warm for c in children if c.warm is not None]
    record = LocalHandleData.of(parent.data)
    try:
        image = check_parent(site, parent.name, record)
    except BaseException:
        await _delete_all(site, warm)
        raise
    layers = site.layers
    op = f"o-{os.getpid()}-{secrets.token_hex(6)}"  # a holder for the fork's own time
    below = list(record.forks)
    made: list[SandboxHandle] = []
    began = time.perf_counter()
    own: dict[str, float] = {}  # each child's own time (ms), by name
    try:
        adopters = [c.warm.name for c in children if c.warm is not None]
        taking = loop.run_in_executor(_threads, _take, layers, record, op, launcher.storage, below, adopters)
        try:
            layer_id, stack, timings = await asyncio.shield(taking)
        except asyncio.CancelledError:  # the take runs on in its thread: undone when it ends
            taking.add_done_callback(lambda f: _in_background(
                _undo_take, layers, None if f.cancelled() or f.exception() else f.result()[0], below, op, adopters))
            raise
        try:
            started = time.perf_counter()
            results = await _children(site, image, record, stack, children, timeout, own)
            timings["children"] = (time.perf_counter() - started) * 1e3
        finally:
            _leave_later(layers, layer_id)
            _spare_later(layers, launcher.storage)
            _in_background(layers.leave, below)
        made = [r for r in results if isinstance(r, SandboxHandle)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        log.info("forked %s into %d (layer %s: frozen %.1f ms)", parent.name, len(made), layer_id,
                 timings.get("frozen", 0.0))
        timings["total"] = (time.perf_counter() - began) * 1e3
        for handle in made:
            data = LocalHandleData.of(handle.data)
            data.fork_frozen_ms = round(timings.get("frozen", 0.0), 2)
            data.fork_ms = {k: round(v, 2) for k, v in {**timings, "this child": own.get(handle.name, 0.0)}.items()}
            handle.data = data.dump()
            if data.adopted:
                _record_later(site, handle.name, data)
        # The fork's own hold goes after the answer (the children hold what they stand on): a
        # hop to a thread and a turn of the layers' lock the answer waited for: 0.6-0.9 ms p50 (2-4 under load).
        _in_background(layers.release, op)
        return made
    except BaseException:
        await _delete_all(site, made)
        await loop.run_in_executor(_threads, layers.release, op)
        raise


async def _children(site: LocalForkSite, image: ResolvedImage, parent: LocalHandleData, stack: ForkStack,
                    children: list[ForkChild], timeout: float,
                    own: dict[str, float]) -> list[SandboxHandle | BaseException]:
    """Each child: its warm sandbox remounted onto ``stack`` when it can be (all of them in one
    job: ``_adopt_all``), else a new sandbox; ``own`` hears how long each took (ms)."""
    started = time.perf_counter()
    suitable = []
    for child in children:
        if child.warm is not None:
            why_not = adopt.unsuitable(LocalHandleData.of(child.warm.data), image, parent)
            if why_not is None:
                suitable.append(child.warm)
            else:
                log.debug("warm sandbox %s not used for a fork: %s", child.warm.name, why_not)
    adopting = asyncio.ensure_future(_adopt_all(site, image, stack, suitable, timeout))

    async def one(child: ForkChild) -> SandboxHandle:
        if child.warm is not None:
            name = child.warm.name
            outcomes = await adopting if any(w is child.warm for w in suitable) else {}
            if name in outcomes and outcomes[name] is None:
                own[name] = (time.perf_counter() - started) * 1e3
                return child.warm
            if outcomes.get(name) is not None:
                log.warning("turning warm sandbox %s into a fork child failed (%s); launching one", name,
                            outcomes[name])
            await _delete_all(site, [child.warm])
        return await _launch(site, image, parent, stack, child, timeout, own)

    try:
        return await asyncio.gather(*map(one, children), return_exceptions=True)
    finally:
        await asyncio.wait((adopting,))


async def _adopt_all(site: LocalForkSite, image: ResolvedImage, stack: ForkStack,
                     warm: list[SandboxHandle], timeout: float) -> dict[str, BaseException | None]:
    """The warm sandboxes ``warm`` claimed and remounted onto ``stack`` (``_adopt``), each one's
    failure or None, by name. One job of the native helper for all (``adopt.adopt_all``; a fork
    into 8 alternated with the Python remounts, 4 rounds at load 1.7-4.4: making the 8 children
    14.8/15.4/15.9/21.8 -> 14.4/10.1/12.6/16.0 ms: docs/fork.md), else one job each on threads
    that may join a sandbox's mount namespace (``adopt.THREADS``)."""
    if not warm:
        return {}
    loop = asyncio.get_running_loop()
    records = [LocalHandleData.of(handle.data) for handle in warm]
    failures: list[BaseException | None]
    try:
        if adopt.REMOUNT.exists():
            failures = await loop.run_in_executor(_threads, _adopt_natively, site, records, image, stack,
                                                  min(timeout, adopt.REMOUNT_TIMEOUT))
        else:
            jobs = (asyncio.wrap_future(adopt.THREADS.submit(_adopt, site, r, image, stack)) for r in records)
            failures = list(await asyncio.gather(*jobs, return_exceptions=True))
    except Exception as exc:  # noqa: BLE001 - each is launched instead
        failures = [exc] * len(records)
    finally:
        for handle, record in zip(warm, records, strict=True):
            handle.data = record.dump()  # it stands on the fork's layers (or some: deleted by the caller)
    return {h.name: f if isinstance(f, BaseException) else None for h, f in zip(warm, failures, strict=True)}


def _adopt_natively(site: LocalForkSite, warm: list[LocalHandleData], image: ResolvedImage,
                    stack: ForkStack, timeout: float) -> list[BaseException | None]:
    """``_adopt`` for all of ``warm`` in one job, their remounts by ``adopt.adopt_all``."""
    for data in warm:
        priority.restore(data)
    failures = adopt.adopt_all(site.state_dir, warm, image, stack, timeout)
    for i, data in enumerate(warm):
        if failures[i] is None:
            try:
                seed_tmp(stack, data)
            except BackendError as exc:
                failures[i] = exc
    return failures


async def _launch(site: LocalForkSite, image: ResolvedImage, parent: LocalHandleData, stack: ForkStack,
                  child: ForkChild, timeout: float, own: dict[str, float]) -> SandboxHandle:
    """A new sandbox launched on ``stack``, the parent's /tmp in it; ``own`` hears how long it took (ms)."""
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    spec = child.spec
    handle = await site.launcher.launch(site.space, spec.generated_name, image, run_as_root=spec.run_as_root,
                                        network=parent.network, limits=spec.limits, env=dict(image.env),
                                        timeout=timeout, kind=spec.server_kind.value, forks=stack)
    try:
        await loop.run_in_executor(_threads, seed_tmp, stack, LocalHandleData.of(handle.data))
    except BaseException:
        await _delete_all(site, [handle])
        raise
    own[handle.name] = (time.perf_counter() - started) * 1e3
    return handle


def _stack_ids(layer_id: str, below: list[str], merge: ForkStack | None) -> list[str]:
    """The layers a child of the fork stands on, top first (``below`` merged into the new one or not)."""
    return [layer_id] if merge is not None else [layer_id, *below]


def _take(layers: ForkLayers, record: LocalHandleData, op: str, storage: LayerStorage | None,
          below: list[str], adopters: list[str]) -> tuple[str, ForkStack, dict[str, float]]:
    """The fork's new layer (``ForkLayers.take``) and the stack its children stand on, one job on
    a thread (each hop to one waited for the scheduler on a busy host). The layers ``below`` are
    held by the fork (``op``: none goes meanwhile) and reachable until the caller leaves them (left
    here when this fails); the new layer is held at once by the warm sandboxes ``adopters`` that
    may become its children: one turn of the layers' lock, where each child's own hold took turns
    on it. One not made a child is deleted, which lets go of what it holds."""
    began = time.perf_counter()
    layers.hold(below, op)
    layers.enter(below)
    try:
        # As deep as a stack may be: the layers below are merged into the new one (fork_layers.py).
        merge = layers.stack(below) if len(below) + 1 > layers.max_stack else None
        took = time.perf_counter()
        layer_id, timings = layers.take(record, op, storage, merge)
        try:
            ids = _stack_ids(layer_id, below, merge)
            layers.hold(ids, *map(sandbox_holder, adopters))
            stack = layers.stack(ids)
        except BaseException:
            layers.leave([layer_id])
            raise
    except BaseException:
        layers.leave(below)
        raise
    timings["layers below"] = (took - began) * 1e3
    timings["snapshot"] = timings.pop("total", 0.0)
    return layer_id, stack, timings


def _undo_take(layers: ForkLayers, layer_id: str | None, below: list[str], op: str, adopters: list[str]) -> None:
    """What ``_take`` did for a fork cancelled while it ran, undone once it ended: the layers'
    filesystems it entered left, its holds and the would-be children's let go, so the new layer
    (``layer_id``; None when the take failed, which left what it entered) goes."""
    if layer_id is not None:
        layers.leave([layer_id, *below])
        layers.unhold([layer_id], *map(sandbox_holder, adopters))
    layers.release(op)


def _adopt(site: LocalForkSite, warm: LocalHandleData, image: ResolvedImage, stack: ForkStack) -> None:
    """The warm sandbox ``warm`` describes claimed (``LocalBackend.claim``: the normal priority for all of
    it), remounted onto ``stack``, the parent's /tmp in it. Its record is written after the fork
    answered (``_record_later``)."""
    priority.restore(warm)
    adopt.adopt(site.state_dir, warm, image, stack)
    seed_tmp(stack, warm)


# An adopted child's record to write: its timer and the write's start until it is due, then the
# write under way.
_records_due: dict[str, tuple[asyncio.TimerHandle, Callable[[], None]] | asyncio.Future] = {}


def _record_later(site: LocalForkSite, name: str, data: LocalHandleData) -> None:
    """Write the record (sandbox.json) of the adopted child ``name`` ``SPARE_AFTER`` seconds
    from now, after the children's first calls: it was two thirds of a child's remount under
    load (a create and a rename in the host's journalled filesystem), and the warm sandbox's
    record, kept meanwhile, already names everything a record-less teardown needs (its
    directories, processes, cgroups; its fork layers are released by holder). A delete first
    drops a write not begun and waits for one under way (``record_written``)."""
    loop = asyncio.get_running_loop()

    def due() -> None:
        future = loop.run_in_executor(_threads, write_meta, site.space.root / name, name, data)
        _records_due[name] = future

        def done(f: asyncio.Future) -> None:
            if _records_due.get(name) is f:
                del _records_due[name]
            if not f.cancelled() and f.exception() is not None:
                log.warning("writing the record of fork child %s: %s", name, f.exception())

        future.add_done_callback(done)

    _records_due[name] = (loop.call_later(SPARE_AFTER, due), due)


async def record_written(name: str) -> None:
    """Before the delete of fork child ``name``: its record's write dropped if not begun, else
    waited for."""
    due = _records_due.pop(name, None)
    if isinstance(due, tuple):
        due[0].cancel()
    elif due is not None:
        await asyncio.wait((due,))


_background: set[asyncio.Future] = set()
_spares_due: set[asyncio.TimerHandle] = set()
_leaves_due: dict[asyncio.TimerHandle, Callable[[], None]] = {}


def _leave_later(layers: ForkLayers, layer_id: str) -> None:
    """The new layer's filesystem made read-only and detached ``SPARE_AFTER`` seconds from now
    (``ForkLayers.leave``): that writes its copy out to the loop device's file, 12-23 ms of disk
    work under load, which ran beside the children's first calls when begun at the answer. A
    fork or launch on the layer meanwhile holds it as a user of its own (``enter``)."""
    def due() -> None:
        del _leaves_due[timer]
        _in_background(layers.leave, [layer_id])

    timer = asyncio.get_running_loop().call_later(SPARE_AFTER, due)
    _leaves_due[timer] = due


def _spare_later(layers: ForkLayers, storage: LayerStorage | None) -> None:
    """The next fork's layer filesystem, made ``SPARE_AFTER`` seconds from now: the children's
    first calls come first (made at once, its image copy, loop device and mount ran beside them)."""
    def due() -> None:
        _spares_due.discard(timer)
        _in_background(layers.make_spares, storage)

    timer = asyncio.get_running_loop().call_later(SPARE_AFTER, due)
    _spares_due.add(timer)


def _in_background(work: Callable[..., object], *args: Any) -> None:
    """``work`` on an executor thread, not waited for (a failure is logged)."""
    future = asyncio.get_running_loop().run_in_executor(_threads, work, *args)
    _background.add(future)

    def done(f: asyncio.Future) -> None:
        _background.discard(f)
        if not f.cancelled() and f.exception() is not None:
            log.warning("after a fork: %s", f.exception())

    future.add_done_callback(done)


async def settle() -> None:
    """Until the work forks left running in the background is done (before the spares are
    dropped); spares not begun yet are not made, layers not detached yet are detached now."""
    for timer in _spares_due:
        timer.cancel()
    _spares_due.clear()
    for timer, detach in list(_leaves_due.items()):  # detached now: nothing is left in the host's mount tree
        timer.cancel()
        detach()
    for due in list(_records_due.values()):
        if isinstance(due, tuple):  # written now: the child lives on
            due[0].cancel()
            due[1]()
    while _background or _records_due:
        await asyncio.wait({*_background, *(f for f in _records_due.values() if isinstance(f, asyncio.Future))})


async def _delete_all(site: LocalForkSite, handles: list[SandboxHandle]) -> None:
    results = await asyncio.gather(*(site.delete(h) for h in handles), return_exceptions=True)
    for handle, result in zip(handles, results, strict=True):
        if isinstance(result, BaseException):
            log.warning("deleting sandbox %s after a failed fork: %s", handle.name, result)
