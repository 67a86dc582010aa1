"""The watcher (``control_plane.watcher``): orphans, dead sandboxes, idle servers and silent
clients, one pass at a time, on the in-process backend."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from control_plane.backends.base import BackendError
from control_plane.config import WatcherConfig
from control_plane.models import AvailabilityStatus as A
from control_plane.store import now_ms

from .harness import harness, run


def test_an_orphan_is_deleted_on_its_second_sighting_and_a_recorded_sandbox_never(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            await h.backend.leave_orphan("sbx-orphan")
            await h.watcher.sweep_orphans()
            assert "sbx-orphan" in h.backend.alive()  # once: it may be a sandbox being made
            await h.watcher.sweep_orphans()
            assert h.backend.deleted == ["sbx-orphan"]
            assert h.sandbox_of(started.server_id) in h.backend.alive()

    run(scenario())


def test_at_start_up_orphans_go_at_first_sight(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            await h.backend.leave_orphan("sbx-left-by-a-killed-run")
            await h.watcher.sweep_orphans(at_once=True)
            assert h.backend.deleted == ["sbx-left-by-a-killed-run"]

    run(scenario())


def test_a_sandbox_being_created_is_not_taken_for_an_orphan(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            h.backend.hold_creates = asyncio.Event()
            start = asyncio.create_task(h.start())
            await h.backend.wait_for(lambda: bool(h.backend.creating))
            for _ in range(3):
                await h.watcher.sweep_orphans()
            h.backend.hold_creates.set()
            started = await start
            assert h.backend.deleted == [] and h.server(started.server_id).availability == A.ALIVE

    run(scenario())


def test_a_dead_sandbox_makes_its_server_crashed_with_the_reason(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            sandbox = h.sandbox_of(started.server_id)
            await h.backend.crash(sandbox, "OOM-killed")
            await h.watcher.check_crashes()
            row = h.server(started.server_id)
            assert row.availability == A.CRASHED and "OOM-killed" in (row.details or "")
            assert "max_restarts 0" in (row.details or "")
            await h.backend.wait_for(lambda: sandbox in h.backend.deleted)

    run(scenario())


def test_a_vanished_sandbox_is_reported_gone(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            await h.backend.vanish(h.sandbox_of(started.server_id))
            await h.watcher.check_crashes()
            row = h.server(started.server_id)
            assert row.availability == A.CRASHED and "the sandbox is gone" in (row.details or "")

    run(scenario())


def test_a_crash_within_max_restarts_is_restarted_in_place(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start(max_restarts=1)
            first = h.sandbox_of(started.server_id)
            await h.backend.crash(first)
            await h.watcher.check_crashes()
            row = h.server(started.server_id)
            assert row.availability == A.ALIVE and row.restarts == 1 and h.sandbox_of(started.server_id) != first
            assert "restarted after a crash" in (row.details or "")
            assert (await h.bash(started.server_id, "echo back"))["stdout"] == "back\n"
            await h.backend.crash(h.sandbox_of(started.server_id))  # the second crash is one too many
            await h.watcher.check_crashes()
            assert h.server(started.server_id).availability == A.CRASHED

    run(scenario())


def test_a_failed_restart_after_a_crash_says_both(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start(max_restarts=2)
            await h.backend.crash(h.sandbox_of(started.server_id), "segfault")
            h.backend.fail_creates.append(BackendError("no node fits", 503))
            await h.watcher.check_crashes()
            row = h.server(started.server_id)
            assert row.availability == A.CRASHED
            assert "segfault; restart failed: no node fits" in (row.details or "")

    run(scenario())


def test_an_unobservable_backend_is_not_a_crash(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()

            async def broken(handle: object) -> None:
                raise OSError("the API server is down")

            h.backend.observe = broken  # type: ignore[assignment,method-assign]
            await h.watcher.check_crashes()
            assert h.server(started.server_id).availability == A.ALIVE

    run(scenario())


def test_idle_servers_are_killed_unless_a_keepalive_holds_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, watcher=WatcherConfig(inactive_timeout=60, finished_timeout=30)) as h:
            idle = await h.start(server_name="idle")
            held = await h.start(server_name="held")
            fresh = await h.start(server_name="fresh")
            finished = await h.start(server_name="finished")
            h.cp.finish_server(h.server(finished.server_id))
            long_ago = now_ms() - 120_000
            for server in (idle, held, finished):
                h.store.update_server(server.server_id, last_activity_at=long_ago)
            h.cp.keepalive(h.server(held.server_id), minutes=5)
            await h.watcher.reap_idle()
            assert h.server(idle.server_id).availability == A.KILLED
            assert "idle for 120 s (limit 60 s)" in (h.server(idle.server_id).details or "")
            assert h.server(finished.server_id).availability == A.KILLED
            assert "finished and not reused" in (h.server(finished.server_id).details or "")
            assert h.server(held.server_id).availability == A.ALIVE
            assert h.server(fresh.server_id).availability == A.ALIVE
            assert h.backend.alive() >= {h.sandbox_of(held.server_id), h.sandbox_of(fresh.server_id)}
            assert not {h.sandbox_of(idle.server_id), h.sandbox_of(finished.server_id)} & h.backend.alive()

    run(scenario())


def test_a_client_whose_heartbeat_stopped_is_killed_with_its_servers(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, watcher=WatcherConfig(heartbeat_timeout=30)) as h:
            started = await h.start()
            sandbox = h.sandbox_of(started.server_id)
            await h.watcher.reap_clients()
            assert h.store.get_client(h.client.id).availability == A.ALIVE  # its heartbeat is recent
            h.store.set_client_status(h.client.id, A.ALIVE, heartbeat=now_ms() - 60_000)
            await h.watcher.reap_clients()
            assert h.store.get_client(h.client.id).availability == A.KILLED
            row = h.server(started.server_id)
            assert row.availability == A.KILLED and "stopped sending heartbeats" in (row.details or "")
            assert sandbox in h.backend.deleted

    run(scenario())


def test_two_whole_passes_sweep_an_orphan(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            await h.backend.leave_orphan("sbx-orphan")
            await h.watcher.run_once()
            await h.watcher.run_once()
            assert h.backend.deleted == ["sbx-orphan"]

    run(scenario())


def test_a_failed_delete_is_retried_by_the_sweep_and_the_server_recorded_stopped(tmp_path: Path) -> None:
    """A server whose delete failed keeps its sandbox; the sweep deletes it by its handle, and
    the server is STOPPED (it stayed DELETION_FAILED with its sandbox gone)."""
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            sid = (await h.start()).server_id
            sandbox = h.sandbox_of(sid)
            h.backend.fail_deletes = 1
            with pytest.raises(BackendError, match="deletion failed"):
                await h.cp.stop_server(h.server(sid))
            assert h.server(sid).availability == A.DELETION_FAILED and sandbox in h.backend.alive()
            await h.watcher.sweep_orphans()
            assert sandbox in h.backend.alive()  # once: as for any orphan
            await h.watcher.sweep_orphans()
            assert sandbox not in h.backend.alive() and h.backend.deleted == [sandbox]
            assert h.server(sid).availability == A.STOPPED and "watcher's retry" in (h.server(sid).details or "")

    run(scenario())


def test_a_client_stopped_but_for_a_failed_delete_is_stopped_once_the_sweep_deletes_it(tmp_path: Path) -> None:
    """Can fail: the client stayed DELETION_FAILED after the watcher's retry had deleted what was left."""
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            kept, failing = (await h.start()).server_id, (await h.start()).server_id
            h.backend.fail_deletes = 1
            with pytest.raises(BackendError, match="could not delete 1 of 2 servers"):
                await h.cp.stop_client(h.store.get_client(h.client.id))
            assert h.store.get_client(h.client.id).availability == A.DELETION_FAILED
            failed = [s for s in (kept, failing) if h.server(s).availability == A.DELETION_FAILED]
            assert len(failed) == 1
            await h.watcher.sweep_orphans()
            assert h.store.get_client(h.client.id).availability == A.DELETION_FAILED  # once: as for any orphan
            await h.watcher.sweep_orphans()
            assert h.server(failed[0]).availability == A.STOPPED
            assert h.store.get_client(h.client.id).availability == A.STOPPED

    run(scenario())
