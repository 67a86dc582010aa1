"""The service (``control_plane.service``): starting, reusing, restarting, stopping and finishing
servers, and admission, on the in-process backend."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from control_plane.backends.base import BackendError
from control_plane.config import SharingConfig
from control_plane.errors import ApiError, Gone
from control_plane.models import AvailabilityStatus as A
from control_plane.models import ServerReuseStrategy

from .harness import harness, run


def test_a_started_server_answers_through_a_forward(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            row = h.server(started.server_id)
            assert (row.availability, started.reused, started.need_to_reset) == (A.ALIVE, False, False)
            assert h.serving() == {h.sandbox_of(started.server_id)}
            answer = await h.bash(started.server_id, "cat README.md; pwd")
            assert answer["exit_code"] == 0 and answer["stdout"].startswith("hello\n")

    run(scenario())


def test_reset_reuse_hands_over_the_same_sandbox_and_asks_for_a_reset(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            first = await h.start()
            sandbox = h.sandbox_of(first.server_id)
            await h.bash(first.server_id, "echo changed > README.md")
            h.cp.finish_server(h.server(first.server_id))
            assert h.server(first.server_id).availability == A.FINISHED
            again = await h.start(reuse_strategy=ServerReuseStrategy.RESET)
            assert (again.server_id, again.reused, again.need_to_reset) == (first.server_id, True, True)
            assert h.sandbox_of(again.server_id) == sandbox and h.backend.created == [sandbox]
            assert h.server(again.server_id).availability == A.REUSED
            assert (await h.bash(again.server_id, "cat README.md"))["stdout"] == "changed\n"

    run(scenario())


def test_restart_reuse_swaps_in_a_fresh_sandbox_and_deletes_the_old(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            first = await h.start()
            old = h.sandbox_of(first.server_id)
            await h.bash(first.server_id, "echo changed > README.md")
            h.cp.finish_server(h.server(first.server_id))
            again = await h.start(reuse_strategy=ServerReuseStrategy.RESTART)
            assert (again.server_id, again.reused, again.need_to_reset) == (first.server_id, True, False)
            new = h.sandbox_of(again.server_id)
            assert new != old and h.server(again.server_id).availability == A.ALIVE
            await h.backend.wait_for(lambda: old in h.backend.deleted)
            assert new in h.serving() and old not in h.serving()
            assert (await h.bash(again.server_id, "cat README.md"))["stdout"] == "hello\n"

    run(scenario())


def test_no_reuse_starts_a_new_server_beside_a_finished_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            first = await h.start()
            h.cp.finish_server(h.server(first.server_id))
            other = await h.start(reuse_strategy=ServerReuseStrategy.NONE)
            assert other.server_id != first.server_id and not other.reused
            assert len(h.serving()) == 2

    run(scenario())


def test_restart_keeps_the_server_id_with_a_new_sandbox(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            old = h.sandbox_of(started.server_id)
            await h.cp.restart_server(h.server(started.server_id), 10)
            assert h.sandbox_of(started.server_id) != old
            await h.backend.wait_for(lambda: old in h.backend.deleted)
            assert (await h.bash(started.server_id, "echo ok"))["stdout"] == "ok\n"

    run(scenario())


def test_a_failed_restart_marks_the_server_and_removes_its_sandbox(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            old = h.sandbox_of(started.server_id)
            h.backend.fail_creates.append(BackendError("the node ran out of room", 507))
            with pytest.raises(ApiError, match="the node ran out of room"):
                await h.cp.restart_server(h.server(started.server_id), 10)
            assert h.server(started.server_id).availability == A.RESTART_FAILED
            await h.backend.wait_for(lambda: old in h.backend.deleted)
            assert h.serving() == set()

    run(scenario())


def test_stop_deletes_the_sandbox_and_the_server_is_gone(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            sandbox = h.sandbox_of(started.server_id)
            await h.cp.stop_server(h.server(started.server_id))
            assert h.server(started.server_id).availability == A.STOPPED
            assert h.backend.deleted == [sandbox] and h.serving() == set()
            with pytest.raises(Gone, match="STOPPED, not usable"):
                h.cp.forward_endpoint(h.client.id, started.server_id, h.client.tenant)
            again = await h.cp.stop_server(h.server(started.server_id))
            assert "already STOPPED" in again.message

    run(scenario())


def test_a_stop_whose_delete_fails_is_not_reported_as_done(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            h.backend.fail_deletes = 1
            with pytest.raises(ApiError, match="Stopping .* failed: deletion failed"):
                await h.cp.stop_server(h.server(started.server_id))
            assert h.server(started.server_id).availability == A.DELETION_FAILED

    run(scenario())


def test_finish_then_finishing_again_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            h.cp.finish_server(h.server(started.server_id))
            with pytest.raises(Gone, match="only ALIVE or REUSED servers can be finished"):
                h.cp.finish_server(h.server(started.server_id))
            with pytest.raises(Gone):  # a finished server takes no calls until it is claimed again
                h.cp.forward_endpoint(h.client.id, started.server_id, h.client.tenant)

    run(scenario())


@pytest.mark.parametrize(("error", "status"), [(BackendError("image pull failed: no such manifest", 404), 404),
                                               (BackendError("unschedulable: no node fits", 503), 503)])
def test_a_failed_create_fails_the_start_with_the_backends_status(tmp_path: Path, error: BackendError,
                                                                  status: int) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            h.backend.fail_creates.append(error)
            with pytest.raises(ApiError) as raised:
                await h.start()
            assert raised.value.status == status and error.message in raised.value.message
            (row,) = h.store.servers(client_id=h.client.id)
            assert row.availability == A.FAILED_TO_START and error.message in (row.details or "")
            assert h.serving() == set()

    run(scenario())


def test_an_unknown_image_is_404(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, images={"other:1"}) as h:
            with pytest.raises(ApiError, match="not found") as raised:
                await h.start()
            assert raised.value.status == 404

    run(scenario())


def test_a_start_slower_than_its_timeout_fails_and_leaves_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            h.backend.hold_creates = asyncio.Event()
            with pytest.raises(ApiError, match="did not become ready within 1 s") as raised:
                await h.start(server_start_wait_timeout_in_seconds=1)
            assert raised.value.status == 504
            (row,) = h.store.servers(client_id=h.client.id)
            assert row.availability == A.FAILED_TO_START and h.serving() == set()

    run(scenario())


def test_a_server_stopped_while_it_starts_does_not_leak_its_sandbox(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            h.backend.hold_creates = asyncio.Event()
            start = asyncio.create_task(h.start())
            await h.backend.wait_for(lambda: bool(h.backend.creating))
            await h.cp.stop_client(h.client)
            h.backend.hold_creates.set()
            with pytest.raises(Gone, match="stopped while it was starting"):
                await start
            await h.backend.wait_for(lambda: h.backend.deleted == h.backend.created)
            assert len(h.backend.created) == 1 and not h.serving()

    run(scenario())


def test_a_client_over_its_limit_waits_for_its_turn_then_gets_429(tmp_path: Path) -> None:
    async def scenario() -> None:
        # The refused start waits 1 s (its own timeout); the waiting one up to the queue's 10 s, so
        # that a loaded host's slow stop does not time it out (0.5 s for both failed at load ~30).
        async with harness(tmp_path, sharing=SharingConfig(client_max_servers=1, queue_timeout=10)) as h:
            first = await h.start()
            with pytest.raises(ApiError, match="client") as raised:
                await h.start(reuse_strategy=ServerReuseStrategy.NONE, server_start_wait_timeout_in_seconds=1)
            assert raised.value.status == 429
            assert len(h.backend.created) == 1
            waiting = asyncio.create_task(h.start(reuse_strategy=ServerReuseStrategy.NONE,
                                                  server_start_wait_timeout_in_seconds=10))
            await h.cp.stop_server(h.server(first.server_id))  # room frees: the waiting start goes on
            second = await waiting
            assert h.server(second.server_id).availability == A.ALIVE

    run(scenario())


def test_a_finished_server_gives_way_to_a_waiting_start(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path, sharing=SharingConfig(client_max_servers=1, queue_timeout=5)) as h:
            first = await h.start()
            kept = h.sandbox_of(first.server_id)
            h.cp.finish_server(h.server(first.server_id))
            other = await h.start(reuse_strategy=ServerReuseStrategy.NONE)
            assert h.server(first.server_id).availability == A.STOPPED
            assert h.server(other.server_id).availability == A.ALIVE
            assert kept in h.backend.deleted and h.sandbox_of(other.server_id) in h.serving()

    run(scenario())
