"""Forwarding (``control_plane.forwarding``, ``forward_calls``, the forward route): the sandbox's
answers pass through as they are, our failures are mapped to 410/500 with the marker the client
reads, ``Prefer: wait`` answers inline or turns into an operation, and large bodies cross
intact; on the in-process backend, through the real HTTP app and client at the end."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import tracemalloc
import uuid
from pathlib import Path

import pytest

from control_plane import forward_calls
from control_plane.constants import FORWARD_FAILED, PREFER_HEADER
from control_plane.forward_calls import ForwardedCall, Forwards
from control_plane.metrics import Metrics
from control_plane.models import AsyncOperationStatus, ForwardRequestResponse
from control_plane.models import AvailabilityStatus as A
from control_plane.sandbox_http import ForwardError
from idegym_env.client import AsyncIdeGymClient
from idegym_env.errors import SandboxGone
from sandbox_server.http import Reply

from .harness import IMAGE, Harness, harness, run, served


async def forward(h: Harness, server_id: int, path: str, body: object, wait: float | None) -> tuple[int, object]:
    """``path`` forwarded as the route does; the inline answer, or the operation id."""
    headers = {"content-type": "application/json"}
    if wait is not None:
        headers[PREFER_HEADER] = f"wait={wait:g}"
    call = ForwardedCall(uuid.UUID(h.client.id), server_id, "POST", path, headers, json.dumps(body).encode())
    endpoint = h.cp.forward_endpoint(h.client.id, server_id, h.client.tenant)
    answer = await Forwards(h.cp, Metrics()).forward(call, endpoint)
    return answer.operation_id, answer.value


def test_the_sandboxs_own_errors_pass_through_untouched(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            unknown = await h.call(started.server_id, "POST", "api/no/such/route", {})
            assert unknown.status == 404 and json.loads(unknown.body)["error"] == "NotFound"
            invalid = await h.call(started.server_id, "POST", "api/tools/bash", {"command": 42})
            assert invalid.status == 422 and "command" in invalid.text
            missing = await h.call(started.server_id, "POST", "api/tools/file/download",
                                   {"file_path": "nope.txt", "offset": 0, "length": 10})
            assert missing.status == 404 and "nope.txt" in missing.text
            assert h.server(started.server_id).availability == A.ALIVE

    run(scenario())


def test_a_dead_sandbox_is_410_and_its_server_is_checked_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            await h.bash(started.server_id, "true")  # a kept-alive connection to it now exists
            await h.backend.crash(h.sandbox_of(started.server_id), "killed by the OOM killer")
            _op, value = await forward(h, started.server_id, "api/tools/bash", {"command": "true"}, wait=10)
            assert isinstance(value, ForwardError) and value.status == 410
            assert value.message.startswith(FORWARD_FAILED)
            await h.backend.wait_for(lambda: h.server(started.server_id).availability == A.CRASHED)
            assert "killed by the OOM killer" in (h.server(started.server_id).details or "")

    run(scenario())


def test_a_sandbox_that_does_not_answer_in_time_is_500(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            with pytest.raises(ForwardError) as raised:
                await h.call(started.server_id, "POST", "api/tools/bash", {"command": "sleep 30"}, timeout=0.3)
            assert raised.value.status == 500
            assert raised.value.message.startswith(FORWARD_FAILED) and "read timeout" in raised.value.message
            assert h.server(started.server_id).availability == A.ALIVE  # slow is not dead
            assert (await h.bash(started.server_id, "echo still here"))["stdout"] == "still here\n"

    run(scenario())


def test_prefer_wait_answers_inline_and_records_the_call(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            op_id, value = await forward(h, started.server_id, "api/tools/bash",
                                         {"command": "echo inline", "env": {"TOKEN": "s3cret"}}, wait=10)
            assert isinstance(value, Reply) and value.status == 200
            assert json.loads(value.body)["stdout"] == "inline\n"
            h.store.flush()
            row = h.store.get_operation(op_id)
            assert row is not None and row.status == AsyncOperationStatus.SUCCEEDED
            assert "s3cret" not in (row.request or "") and "TOKEN" in (row.request or "")

    run(scenario())


def test_records_waiting_to_be_written_hold_no_large_body(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inline answers' records wait to be written together, holding only what the history keeps
    of a large body: 24 concurrent forwards of 1 MiB bodies leave less than 3 MiB held once all
    are answered (what waits is written once it holds 1 MiB), and every record is there, its body
    truncated.

    Can fail: on main each waiting record held its call's whole body until the timed flush
    (here never: the delay is an hour), 24 MiB and more.
    """
    monkeypatch.setattr(forward_calls, "RECORD_DELAY", 3600.0)
    mib = 1 << 20

    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            endpoint = h.cp.forward_endpoint(h.client.id, started.server_id, h.client.tenant)
            forwards = Forwards(h.cp, Metrics())
            headers = {"content-type": "application/json", PREFER_HEADER: "wait=60"}

            async def one(i: int) -> int:
                body = b'{"content": "' + bytes([97 + i % 26]) * mib + b'"}'
                call = ForwardedCall(uuid.UUID(h.client.id), started.server_id, "POST", "api/no/such/route", headers,
                                     body)
                answer = await forwards.forward(call, endpoint)
                assert isinstance(answer.value, Reply) and answer.value.status == 404
                return answer.operation_id

            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                ids = await asyncio.gather(*(one(i) for i in range(24)))
                held = tracemalloc.get_traced_memory()[0] - base
            finally:
                tracemalloc.stop()
            assert held < 3 * mib, f"{held / mib:.1f} MiB held after the calls were answered"
            for op_id in ids:
                row = h.store.get_operation(op_id)
                assert row is not None and row.status == AsyncOperationStatus.FAILED
                assert f"[{mib + 15} bytes; truncated in the request history]" in (row.request or "")

    run(scenario(), timeout=120)


def test_a_call_longer_than_its_wait_becomes_an_operation_that_ends_with_the_answer(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            op_id, value = await forward(h, started.server_id, "api/tools/bash",
                                         {"command": "sleep 0.5; echo late"}, wait=0.05)
            assert value is None
            row = h.store.get_operation(op_id)
            assert row is not None and row.status == AsyncOperationStatus.IN_PROGRESS
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while (row := h.store.get_operation(op_id)).status == AsyncOperationStatus.IN_PROGRESS:
                assert loop.time() < deadline, "the operation did not end"
                await asyncio.sleep(0.02)
            assert row.status == AsyncOperationStatus.SUCCEEDED
            result = ForwardRequestResponse.model_validate_json(row.result or "{}")
            assert result.status_code == 200 and json.loads(result.body or "{}")["stdout"] == "late\n"

    run(scenario())


def test_without_prefer_wait_a_call_is_an_operation(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            op_id, value = await forward(h, started.server_id, "api/tools/bash", {"command": "echo queued"}, None)
            assert value is None
            assert await h.cp.ops.outcome(op_id, 10) is not None
            row = h.store.get_operation(op_id)
            assert row is not None and row.status == AsyncOperationStatus.SUCCEEDED
            assert "queued" in (row.result or "")

    run(scenario())


def test_large_bodies_cross_intact_both_ways(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            started = await h.start()
            data = os.urandom(6 << 20)
            encoded = base64.b64encode(data).decode()
            up = await h.call(started.server_id, "POST", "api/tools/file/upload",
                              {"file_path": "blob.bin", "content_base64": encoded, "offset": 0, "truncate": True})
            assert up.status == 200, up.text
            down = await h.call(started.server_id, "POST", "api/tools/file/download",
                                {"file_path": "blob.bin", "offset": 0, "length": len(data)})
            assert down.status == 200
            assert base64.b64decode(json.loads(down.body)["content_base64"]) == data

    run(scenario())


def test_the_client_through_the_http_app_to_an_in_process_sandbox(tmp_path: Path) -> None:
    """The whole path: the published-shape client, the control plane's routes and middlewares,
    the forward, the sandbox server; and a sandbox that dies is ``SandboxGone`` to the client."""

    async def scenario() -> None:
        async with served(tmp_path) as cp:
            async with AsyncIdeGymClient(cp.url, unix_socket=cp.unix_socket) as client:
                sandbox = await client.start(IMAGE)
                assert (await sandbox.bash("cat README.md")).stdout == "hello\n"
                await sandbox.write_file("notes.txt", "x" * (2 << 20))
                assert len(await sandbox.read_file("notes.txt")) == 2 << 20
                await cp.backend.crash(next(iter(cp.backend.alive())))
                with pytest.raises(SandboxGone):
                    await sandbox.bash("true")
        assert cp.backend.alive() == set()

    run(scenario())


def test_every_forward_is_counted_in_the_metrics(tmp_path: Path) -> None:
    """Forwards, their round trips and the forward route's requests, each counted once per call,
    by status (the counts are made after the answer, with each label set's child kept)."""
    import re

    import httpx

    def value(text: str, series: str) -> float:
        found = re.search(rf"^{re.escape(series)} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    route = 'idegym_http_requests_total{method="POST",route="/api/forward/{client_id}/{server_id}/{path}",status="%d"}'

    async def scenario() -> None:
        async with served(tmp_path) as cp:
            async with AsyncIdeGymClient(cp.url, unix_socket=cp.unix_socket) as client, httpx.AsyncClient(
                    transport=httpx.AsyncHTTPTransport(uds=cp.unix_socket), base_url=cp.url) as http:
                sandbox = await client.start(IMAGE)
                before = (await http.get("/metrics")).text
                for _ in range(5):
                    await sandbox.bash("true")
                invalid = await http.post(f"/api/forward/{client.client_id}/{sandbox.server_id}/api/tools/bash",
                                          json={"command": 7}, headers={"Prefer": "wait=30"})
                assert invalid.status_code == 422, invalid.text  # the sandbox's own answer, passed through
                after = (await http.get("/metrics")).text
        for series, more in [('idegym_forwards_total{status="200"}', 5), ('idegym_forwards_total{status="422"}', 1),
                             ("idegym_forward_seconds_count", 6), (route % 200, 5), (route % 422, 1)]:
            assert value(after, series) - value(before, series) == more, (series, after)

    run(scenario())


@pytest.mark.security
@pytest.mark.parametrize("body", [
    b'{"command": "true", "env": {"TOKEN": "hunter3-secret"}}',
    b'{"command": "true", "\\u0065nv": {"TOKEN": "hunter3-secret"}}',  # the sandbox reads this key as env
    b'{"command": "true", "env": {}, "env": {"TOKEN": "hunter3-secret"}}',
    b'{"command": "true", "env":\n{"TOKEN": "hunter3-secret"}}',
])
def test_env_values_are_never_in_the_request_history_however_the_body_spells_them(body: bytes) -> None:
    """Seen failing before: a key written with an escape was stored with its values (only a
    literal ``"env"`` made the history parse the body)."""
    call = ForwardedCall(uuid.uuid4(), 1, "POST", "api/tools/bash", {"content-type": "application/json"}, body)
    stored = call.record("http://sandbox/api/tools/bash")
    assert "hunter3-secret" not in stored and "TOKEN" in stored, stored


def test_a_bash_call_without_env_values_is_stored_as_sent() -> None:
    body = b'{"timeout": 600.0, "command": "echo env", "cwd": null, "env": {}, "user": null}'
    stored = json.loads(ForwardedCall(uuid.uuid4(), 1, "POST", "api/tools/bash", {}, body).record("x"))
    assert stored["body"] == body.decode()
