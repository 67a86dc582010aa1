"""``Launcher``: start, stop and remove local sandboxes — the API the backend and image builds use.

A launch prepares the sandbox on the host (directories, layers, cgroups), starts its server
(bubblewrap or a plain process) on a launch thread, waits for the server's ``ready`` while
moving its processes into their cgroups, then publishes its socket. Launches run in threads
that cannot be interrupted: a cancelled one settles, and what it made is removed (``settle``
waits for that).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_server import procfs

from ...constants import DEFAULT_DELETE_TIMEOUT
from ...models import ServerKind
from ..base import BackendError, Limits, SandboxAddress, SandboxHandle
from . import bwrap, cgroups, plain, priority, readiness, rootfs, teardown
from .fork_layers import ForkLayers, ForkStack, sandbox_holder
from .handle_data import LocalHandleData
from .harness_layers import with_harness_layers
from .hostconfig import HostConfig
from .images import ResolvedImage
from .isolation import say_once
from .layout import NAME_RE, SOCKET_NAME, Plan, Space, tail, write_meta
from .lease import Lease, record_pids
from .oci.hostrt import oci_runtime
from .removals import Removals
from .runtime import Runtime
from .server_kinds import entry, runtime_for
from .storage import LayerStorage
from .zygote import Zygote, fork_server

log = logging.getLogger(__name__)

BACKEND_NAME = "local"
# Teardowns under way at once; more wait for a turn, and their bound starts with it. 200 deleted
# at once on the 2-core host (shared, load 17-46): 8 -> ~38/s, each 0.1-0.3 s; 16 -> ~42/s, each
# 0.2-0.7 s; 32 and 64 no faster, each ~1 s; all at once ~65/s (by taking the CPU of everything
# else on the host), each as long as the whole batch: 1,000 took 20-35 s each.
TEARDOWNS_AT_ONCE = 16
# Spawns under way at once, of each priority. Most of a spawn's time is waiting for bubblewrap
# to make the namespaces: on one thread, 4 launches at once waited 18 ms p50 (65 p90) for it.
LAUNCH_THREADS = 8


def _runtime_key(plan: Plan) -> str:
    return f"{plan.kind}/oci" if plan.image.is_oci else plan.kind


def _in_thread(work: Callable[..., None], *args: Any) -> asyncio.Future:
    """Run ``work`` on a thread of its own: a teardown stuck in the kernel holds only its own
    thread (a daemon: it never keeps the process from exiting), never a shared pool's."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if not future.done():
            future.set_result(None) if exc is None else future.set_exception(exc)

    def run() -> None:
        outcome: BaseException | None = None
        try:
            work(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            outcome = exc
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop is gone (the control plane shut down meanwhile)
            pass

    threading.Thread(target=run, name="idegym-teardown", daemon=True).start()
    return future


@dataclass
class _Teardown:
    """A teardown's thread under way: since when, and the steps it has begun (the last one names
    where it is, for a timeout's message)."""

    future: asyncio.Future
    started: float  # the loop's time
    steps: list[str]


@dataclass
class _Behind:
    """A launch in the background that no start waits for (yet)."""

    data: LocalHandleData


class Launcher:
    """Launches of one backend: ``isolation`` is ``bwrap`` or ``none`` (already chosen)."""

    def __init__(self, *, state_dir: Path, isolation: str, runtime: Runtime, pids_max: int | None,
                 tmp_bytes: int, shm_bytes: int, delete_timeout: float = DEFAULT_DELETE_TIMEOUT,
                 storage: LayerStorage | None = None, storage_bytes: int | None = None,
                 storage_inodes: int | None = None, lease: Lease | None = None, zygotes: bool = True) -> None:
        self.state_dir = state_dir
        self.isolation = isolation
        self.runtime = runtime
        self.pids_max = pids_max
        self.bwrap_host = bwrap.BwrapHost(state_dir, rootfs.usr_links(), tmp_bytes, shm_bytes)
        # Spawns run on threads of their own: each gives itself a private mount namespace and
        # working directory (bwrap.py), which no other work of this process may share.
        self._spawns = concurrent.futures.ThreadPoolExecutor(LAUNCH_THREADS, thread_name_prefix="idegym-launch")
        # Sandboxes made ahead of demand (priority.py): their own threads, so that a start's steps
        # never queue behind theirs; at the normal priority (they hold the event loop's GIL).
        self._background_spawns = concurrent.futures.ThreadPoolExecutor(
            LAUNCH_THREADS, thread_name_prefix="idegym-launch-bg")
        self._background = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="idegym-bg")
        self._runtimes: dict[str, Runtime] = {}
        # The foreground and background launch threads both make runtimes and zygotes on first use.
        self._runtime_lock = threading.RLock()
        # Servers forked from a template process (zygote.py), one per runtime; off: started afresh.
        self.zygotes = zygotes and isolation == "bwrap"
        self._zygote_of: dict[str, Zygote] = {}
        self._children: dict[int, subprocess.Popen] = {}
        self.creating: set[str] = set()  # in flight here: never reported as orphans
        self._settling: set[asyncio.Task] = set()  # cancelled launches, being undone
        self._launches: set[asyncio.Future] = set()  # launches in flight
        self._behind: dict[str, _Behind] = {}  # launches in the background no start waits for
        self._behind_lock = threading.Lock()  # a hurry and a step's start or end on its thread
        self.delete_timeout = delete_timeout
        self.storage = storage  # bounded layer filesystems, when the host can make them
        self.storage_bytes = storage_bytes  # the default bound of a sandbox's layers (None: unbounded)
        self.storage_inodes = storage_inodes
        self.lease = lease  # every sandbox's monitor watches it (lease.py)
        # Teardowns by (what, space, name): waiting for a turn, and under way on their threads.
        self._queued: dict[tuple[str, str, str], asyncio.Task[_Teardown]] = {}
        self._teardowns: dict[tuple[str, str, str], _Teardown] = {}
        self._turns = asyncio.Semaphore(TEARDOWNS_AT_ONCE)
        self._turns_held: set[asyncio.Task] = set()
        self.removals = Removals(self._remove_now)  # retired sandboxes, removed after a quiet moment
        # The host's package configuration for networked sandboxes (hostconfig.py); None: not given them.
        self.host_config: Callable[[], HostConfig] | None = None

    # -- the API -------------------------------------------------------------------------------

    async def launch(self, space: Space, name: str, image: ResolvedImage, *, run_as_root: bool, network: bool,
                     limits: Limits, env: dict[str, str], timeout: float, kind: str = "idegym",
                     snapshot: Path | None = None, project_lower: str | None = None,
                     export: Path | None = None, isolated_runs: int = 0,
                     forks: ForkStack | None = None, background: bool = False,
                     network_peer: LocalHandleData | None = None) -> SandboxHandle:
        """A ready sandbox ``name`` in ``space`` running ``kind``'s server on ``image``; ``export``
        is bound writable at ``/opt/idegym/export`` (image builds take their project out there);
        ``forks`` are the fork layers a fork's child stands on (it holds them until deleted).
        ``background``: made ahead of demand, at a low CPU priority until ``claim`` (priority.py).
        ``network_peer``: another sandbox's record, whose network namespace this one joins (its
        network, if it has one, is theirs: no user-mode networking of its own)."""
        if not NAME_RE.match(name):
            raise BackendError(f"invalid sandbox name {name!r}: use letters, digits, '-', '_', '.'", 400)
        entry(kind)  # an unknown kind fails here, before anything is made
        if image.is_oci and self.isolation != "bwrap":
            raise BackendError(f"image {image.tag!r} is an OCI image: its sandboxes run on its own root filesystem, "
                               "which needs bubblewrap isolation (bwrap installed, control plane as root)", 400)
        sb = space.root / name
        if sb.exists() or name in self.creating:
            raise BackendError(f"a sandbox named {name!r} already exists in {space.root}", 409)
        if network_peer is not None:
            if self.isolation != "bwrap":
                raise BackendError("joining another sandbox's network needs bubblewrap isolation", 400)
            network = network_peer.network
        host = self.host_config() if network and self.host_config is not None else None
        if host is not None:  # the host's package sources; the image's own settings come first
            env = {**host.env, **host.proxies, **env}
        plan = Plan(name=name, space=space, sb=sb, run=space.run_dir(name), image=image,
                    project_lower=project_lower or image.project, run_as_root=run_as_root, network=network,
                    limits=limits, pids_max=cgroups.runner_pids(self.pids_max, isolated_runs), env=env, kind=kind,
                    snapshot=snapshot, export=export,
                    host_config=host.directory if host is not None else None, network_peer=network_peer,
                    isolated_runs=isolated_runs, forks=forks,
                    # image builds keep their layers on the state disk: they become the image's
                    storage_bytes=limits.storage_bytes or (self.storage_bytes if space.kind == "sandboxes" else None),
                    storage_inodes=self.storage_inodes if space.kind == "sandboxes" else None)
        data = LocalHandleData(
            isolation=self.isolation, dir=str(sb), run_dir=str(plan.run), socket=str(plan.run / SOCKET_NAME),
            log=str(plan.log), image=image.tag, image_id=image.id, run_as_root=run_as_root, network=network,
            network_peer=network_peer.dir if network_peer else None, snapshot=snapshot.name if snapshot else None,
            space=space.kind, forks=list(forks.ids) if forks is not None else [],
            # While this process creates it, another process's orphan sweep leaves it alone (inventory.py).
            creator=procfs.record(os.getpid()))
        self.creating.add(name)
        if background:  # from now on: a hurry before the launch's first step is not lost
            self._behind[name] = _Behind(data)
        launch = asyncio.ensure_future(self._launch(plan, data, timeout, background))
        self._launches.add(launch)
        launch.add_done_callback(self._launches.discard)
        try:
            return await asyncio.shield(launch)
        except asyncio.CancelledError:
            # Cancelling half-way left a directory and cgroups behind (a shutdown during a
            # warm-pool fill did): the launch settles instead, and what it made is removed.
            task = asyncio.ensure_future(self._remove_when_settled(launch, space, name))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
            raise
        finally:
            if launch.done():
                self.creating.discard(name)

    def hurry(self, name: str) -> None:
        """The background launch ``name`` is waited for by a start: its group weighs as a serving
        sandbox's now, and its processes not started yet start at the normal priority. It makes no
        warm-up call (``readiness.warm_up``) unless one is under way: the start waits for it, and
        the call (its round trip, the tool it runs) took 8.6 ms p50, 17.7 p90 of a hurried launch
        (load 4-6) to save the start's first call ~1.5 ms of CPU."""
        with self._behind_lock:
            behind = self._behind.pop(name, None)
        if behind is not None:
            priority.restore(behind.data)

    def _yield_cpu(self, name: str, data: LocalHandleData) -> None:
        """The background weight (priority.py) for the launch ``name`` while it is still made
        ahead of demand, from now on: bubblewrap, born in the sandbox's groups, has set it up
        (its init runs the placeholder, or the server it started).
        At that weight from the start, bubblewrap's setup waited behind every claimed sandbox's
        calls (a fill's spawn 17 -> 40 ms p50 under back-to-back RESTART resets). Under the lock
        a hurry takes: a hurried launch keeps the weight its hurry gave it."""
        with self._behind_lock:
            if name in self._behind and data.cpu_shares is not None:
                cgroups.Cgroups.set_shares(data.cgroups, cgroups.BACKGROUND_SHARES)

    async def stop(self, space: Space, name: str, data: LocalHandleData | None) -> None:
        """End every process of the sandbox; its files and cgroups stay."""
        await self._bounded("stop", space, name, self._stop_sync, data)

    async def remove(self, space: Space, name: str, data: LocalHandleData | None) -> None:
        """End the sandbox and remove everything it holds; ``data`` None: found from its record.

        Bounded by ``delete_timeout``: a sandbox whose processes are stuck in the kernel raises
        ``BackendError`` saying where it is stuck, while its teardown goes on in the background;
        asking again joins that teardown instead of starting a second one. A retired sandbox
        whose removal waits (``retire``) is removed now."""
        for _ in range(2):  # once more when a retire's signals under way queued it meanwhile
            self.removals.drop(space, name)
            await self._remove_now(space, name, data)
            if name not in self.removals.names(space.kind):
                return

    async def _remove_now(self, space: Space, name: str, data: LocalHandleData | None) -> None:
        await self._bounded("remove", space, name, self._remove_sync, data)

    async def retire(self, space: Space, name: str, data: LocalHandleData | None) -> None:
        """SIGKILL every process of the sandbox now; the rest of its teardown (the wait for them
        to be gone included) is queued (``removals.py``)."""
        if name in self.removals.names(space.kind):
            return
        loop = asyncio.get_running_loop()

        def kill(space: Space, name: str, data: LocalHandleData | None, progress: teardown.Progress) -> None:
            teardown.signal_all(name, space, data, self.isolation)
            loop.call_soon_threadsafe(self.removals.add, space, name, data)

        # a key of its own: the removal, queued before this ends, must not join it
        await self._bounded("retire", space, name, kill, data)

    async def _bounded(self, what: str, space: Space, name: str, work: Callable[..., None],
                       data: LocalHandleData | None) -> None:
        """``work`` on a thread of its own once a turn is free (``TEARDOWNS_AT_ONCE``), waited for
        ``delete_timeout`` from its start, or from this ask when it joins one under way: a
        teardown queued behind many others is not late (a client's close of 1,000 failed the
        last 11 of them when every one was counted from the request)."""
        loop = asyncio.get_running_loop()
        asked = loop.time()
        key = (what, space.kind, name)
        teardown = self._teardowns.get(key)
        if teardown is None:
            queued = self._queued.get(key)
            if queued is None:
                queued = self._queued[key] = asyncio.ensure_future(self._start(key, work, space, name, data))
                queued.add_done_callback(lambda _: self._queued.pop(key, None))
            teardown = await asyncio.shield(queued)
        left = max(teardown.started, asked) + self.delete_timeout - loop.time()
        try:
            await asyncio.wait_for(asyncio.shield(teardown.future), max(left, 0))
        except TimeoutError:
            if teardown.future.done():  # it ended as the bound passed (a busy loop saw both at once)
                teardown.future.result()
                return
            raise BackendError(f"{'stopping' if what == 'stop' else 'deleting'} sandbox {name!r} did not finish "
                               f"within {self.delete_timeout:g} s (it was {teardown.steps[-1]}); it goes on in the "
                               "background and can be retried") from None

    async def _start(self, key: tuple[str, str, str], work: Callable[..., None], space: Space, name: str,
                     data: LocalHandleData | None) -> _Teardown:
        """Start the teardown ``key`` once a turn is free; the turn is given back when it ends, or
        after ``delete_timeout`` (one stuck in the kernel holds only its own thread, not a turn)."""
        await self._turns.acquire()
        steps = ["starting"]
        try:
            future = _in_thread(work, space, name, data, steps.append)
        except BaseException:
            self._turns.release()
            raise
        teardown = self._teardowns[key] = _Teardown(future, asyncio.get_running_loop().time(), steps)

        def done(finished: asyncio.Future) -> None:
            self._teardowns.pop(key, None)
            if not finished.cancelled() and finished.exception() is not None:  # seen, whoever waits
                log.debug("teardown of %s: %s", name, finished.exception())

        teardown.future.add_done_callback(done)
        held = asyncio.ensure_future(self._hold_turn(teardown.future))
        self._turns_held.add(held)
        held.add_done_callback(self._turns_held.discard)
        return teardown

    async def _hold_turn(self, future: asyncio.Future) -> None:
        try:
            await asyncio.wait({future}, timeout=self.delete_timeout)
        finally:
            self._turns.release()

    async def settle(self) -> None:
        """Until no launch is in flight (each ends made or undone)."""
        while self._launches or self._settling:
            await asyncio.gather(*self._launches, *self._settling, return_exceptions=True)

    async def close(self) -> None:
        await self.settle()
        await self.removals.drain()
        for queued in list(self._queued.values()):  # never started: left to the next start's sweep
            queued.cancel()
        for held in list(self._turns_held):
            held.cancel()
        for executor in (self._spawns, self._background_spawns, self._background):
            executor.shutdown(wait=True)
        for zygote in self._zygote_of.values():
            zygote.close()

    def reap(self, data: LocalHandleData | None = None) -> None:
        """Collect the exited processes this launcher started (bwrap or plain servers, lease
        monitors): those the sandbox ``data`` records, or (None) every one. A look at one
        sandbox costs the same however many run: the watcher looks at each on every pass."""
        if data is None:
            pids = list(self._children)
        else:
            pids = [record[0] for record in (*data.processes().values(), data.lease_monitor) if record]
        for pid in pids:
            popen = self._children.get(pid)
            if popen is not None and popen.poll() is not None:
                self._children.pop(pid, None)  # deletes run in several threads at once

    # -- a launch -------------------------------------------------------------------------------

    async def _launch(self, plan: Plan, data: LocalHandleData, timeout: float, background: bool) -> SandboxHandle:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        deadline = time.monotonic() + timeout

        def behind() -> bool:  # still made ahead of demand (no start hurried it)
            return plan.name in self._behind

        def host(work: Callable[..., Any], *args: Any, thread: concurrent.futures.Executor | None = None) -> Any:
            """A host-side step: on the background threads while no start waits for the sandbox."""
            if behind():
                thread = self._background if thread is None else self._background_spawns
            return loop.run_in_executor(thread, work, *args)

        try:
            await host(self._prepare, plan, data, behind())
            if self.lease is not None:
                # From now on the sandbox ends itself if we stop renewing, even one we are killed
                # while making (a SIGKILLed control plane left a bubblewrap waiting for good). On
                # a thread of the normal priority: the monitor inherits it.
                await loop.run_in_executor(None, self._watch, plan, data)
            prepared = time.perf_counter()
            ready_fd, pending = await host(self._spawn, plan, data, thread=self._spawns)
            if pending is not None:
                nice = priority.BACKGROUND_NICE if behind() else priority.NORMAL_NICE
                try:
                    await loop.run_in_executor(None, fork_server, self._zygote(plan), data, pending, nice)
                except BaseException:
                    os.close(ready_fd)
                    raise
            if background:
                self._yield_cpu(plan.name, data)
            spawned = time.perf_counter()
            # The pids recorded: findable if we die now. File work (renames on the host's
            # journalled disk, milliseconds while other sandboxes are made) stays off the event
            # loop, which serves every call and fork meanwhile.
            if background and not behind():  # hurried while its processes started at the low priority
                priority.restore(data)
            await host(self._record, plan, data)
            # Moving tasks into v1 cgroups is slow (readiness.attach): do it while the server imports.
            results = await asyncio.gather(
                readiness.wait_ready(ready_fd, max(deadline - time.monotonic(), 0.1), timeout),
                loop.run_in_executor(None, readiness.attach, data), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            await host(readiness.publish_socket, data)
            # Still made ahead of demand (not hurried: see ``hurry``), its server the zygote's fork
            # (no other kind) sharing the zygote's pages.
            if data.forked and behind():
                await readiness.warm_up(data, max(deadline - time.monotonic(), 0.1))
            if background:
                await host(priority.settle, data)
            ended = time.perf_counter()
            data.timings_ms = {"prepare": round((prepared - started) * 1e3, 2),
                                  "spawn": round((spawned - prepared) * 1e3, 2),
                                  "server_start": round((ended - spawned) * 1e3, 2),
                                  "total": round((ended - started) * 1e3, 2)}
            data.creator = None  # created: from now on a record must name it, or it is an orphan
            await host(write_meta, plan.sb, plan.name, data)
        except BaseException as exc:
            detail = tail(plan.log, 30).strip()
            if data.owned:  # never clean up a same-named sandbox we did not make
                cleanup = asyncio.ensure_future(self.remove(plan.space, plan.name, data))
                try:
                    await asyncio.shield(cleanup)
                except BaseException:  # noqa: BLE001 - cancelled again, or cleanup trouble: it was tried
                    log.warning("cleaning up the failed sandbox %s left something behind", plan.name, exc_info=True)
            if not isinstance(exc, Exception):
                raise
            message = exc.message if isinstance(exc, BackendError) else f"{type(exc).__name__}: {exc}"
            if detail:
                message += f"\n--- sandbox server log (last lines) ---\n{detail}"
            raise BackendError(f"sandbox {plan.name!r} failed to start: {message}",
                               exc.status if isinstance(exc, BackendError) else 500) from exc
        finally:
            self._behind.pop(plan.name, None)
        return SandboxHandle(BACKEND_NAME, plan.name, SandboxAddress("http://sandbox", data.socket), data.dump())

    def _prepare(self, plan: Plan, data: LocalHandleData, background: bool = False) -> None:
        """Directories, layers (size-bounded when storage is limited), cgroups: all on the host."""
        plan.space.root.mkdir(parents=True, exist_ok=True)
        try:
            plan.sb.mkdir(mode=0o700)
        except FileExistsError:
            raise BackendError(f"a sandbox named {plan.name!r} already exists", 409) from None
        data.owned = True
        write_meta(plan.sb, plan.name, data)
        if plan.forks is not None:  # released when the sandbox is removed (teardown.destroy)
            ForkLayers(self.state_dir).hold(plan.forks.ids, sandbox_holder(plan.name))
        for attempt in range(3):  # a concurrent delete may remove an empty run root meanwhile
            plan.space.run_root.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                plan.run.mkdir(mode=0o700, exist_ok=True)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        (plan.run / ".name").write_text(plan.name)
        rootfs.prepare_layers(plan, data, isolated=self.isolation == "bwrap", storage=self.storage)
        cg = plan.space.cgroups
        if cg.available:
            data.cgroups = cg.paths(plan.name)
            cg.create(plan.name, memory=plan.limits.memory_bytes, pids=plan.pids_max,
                      cpu_millicores=plan.limits.cpu_millicores)
            if background and "cpu" in data.cgroups:
                data.cpu_shares = cgroups.cpu_shares(plan.limits.cpu_millicores)
        elif plan.limits.memory_bytes or plan.limits.cpu_millicores:
            say_once("limits-ignored", logging.WARNING,
                     "local backend: resource limits requested but cgroups are unavailable (%s): not enforced",
                     cg.reason)
        write_meta(plan.sb, plan.name, data)

    def _watch(self, plan: Plan, data: LocalHandleData) -> None:
        assert self.lease is not None
        monitor = self.lease.watch(data)
        self._children[monitor.pid] = monitor
        # Recorded at once: a delete by name (of what a killed control plane left) ends the
        # monitors it finds in the record, and one it misses holds the space's bind for its sleep.
        write_meta(plan.sb, plan.name, data)

    def _record(self, plan: Plan, data: LocalHandleData) -> None:
        if self.lease is not None:
            record_pids(data)
        write_meta(plan.sb, plan.name, data)

    def _forks_server(self, plan: Plan) -> bool:
        """Whether a zygote forks ``plan``'s server: ``sandbox_server`` itself (other kinds start
        the long way, and so does a sandbox in another's network namespace: the zygote joins the
        sandbox's user namespace first, which has no rights over a namespace its peer's owns)."""
        return self.zygotes and plan.kind == ServerKind.IDEGYM.value and plan.network_peer is None

    def _zygote(self, plan: Plan) -> Zygote:
        """The zygote of ``plan``'s runtime (the host's, or the one an OCI image's sandbox brings)."""
        key = _runtime_key(plan)
        with self._runtime_lock:
            zygote = self._zygote_of.get(key)
            if zygote is None:
                log_name = f"zygote-{key.replace('/', '-')}.log"
                zygote = self._zygote_of[key] = Zygote(self._runtime(plan), self.bwrap_host.usr_links,
                                                        self.state_dir / log_name)
        return zygote

    def _runtime(self, plan: Plan) -> Runtime:
        key = _runtime_key(plan)
        with self._runtime_lock:
            runtime = self._runtimes.get(key)
            if runtime is None:
                runtime = runtime_for(self.runtime, entry(plan.kind))
                if plan.image.is_oci:  # nothing of the host's /usr in the sandbox: the server brings its own
                    runtime = oci_runtime(runtime, self.state_dir)
                runtime = with_harness_layers(runtime)  # agent harnesses, read-only
                self._runtimes[key] = runtime
        return runtime

    def _spawn(self, plan: Plan, data: LocalHandleData) -> tuple[int, bwrap.PendingSandbox | None]:
        """On a launch thread: start the server, or (``PendingSandbox``) the sandbox the zygote is to
        fork it into, at the background priority while no start waits for it; returns the fd it
        reports ready on."""
        kind = entry(plan.kind)
        nice = priority.BACKGROUND_NICE if plan.name in self._behind else priority.NORMAL_NICE

        def track(popen: subprocess.Popen) -> None:
            """Reap ``popen``; and, as soon as it runs, tell the sandbox's monitor (called again
            once more of the sandbox's pids are recorded in ``data``)."""
            self._children[popen.pid] = popen
            if self.lease is not None:
                record_pids(data, procfs.record(popen.pid))

        if self.isolation != "bwrap":
            return plain.spawn(plan, data, kind, track, nice), None
        tools = cgroups.sub(data.cgroups, cgroups.TOOLS) if data.cgroups else {}
        return bwrap.spawn(plan, data, self.bwrap_host, self._runtime(plan), kind, tools, track,
                           forked=self._forks_server(plan), nice=nice)

    async def _remove_when_settled(self, launch: asyncio.Future, space: Space, name: str) -> None:
        try:
            handle = await launch
        except BaseException:  # noqa: BLE001 - a failed launch has cleaned up after itself
            return
        else:
            try:
                await self.remove(space, name, LocalHandleData.of(handle.data))
            except Exception:  # noqa: BLE001
                log.warning("deleting the sandbox %s of a cancelled create failed", name, exc_info=True)
        finally:
            self.creating.discard(name)

    # -- ending ---------------------------------------------------------------------------------

    @property
    def _kill_timeout(self) -> float:
        """How long a teardown waits for a sandbox's killed processes: until a second before its own
        bound (``teardown.KILL_TIMEOUT`` at least), so that one slow to die is waited for and one that
        does not die is named, with its state, before the bound passes."""
        return max(teardown.KILL_TIMEOUT, self.delete_timeout - 1.0)

    def _stop_sync(self, space: Space, name: str, data: LocalHandleData | None, progress: teardown.Progress = None
                   ) -> None:
        *_, problems = teardown.kill(name, space, data, self.isolation, progress, self._kill_timeout)
        self.reap(data)
        if problems:
            raise BackendError(f"stopping sandbox {name!r}: {'; '.join(problems)}")

    def _remove_sync(self, space: Space, name: str, data: LocalHandleData | None,
                     progress: teardown.Progress = None) -> None:
        try:
            teardown.destroy(name, space, data, self.isolation, progress, self._kill_timeout)
        finally:
            self.reap(data)



