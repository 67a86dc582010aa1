"""The typed client (``idegym_env.client``), sync and async, against the embedded control plane
with real sandboxes: the same calls through the control plane and straight to a sandbox's socket
give the same answers, errors arrive as the documented exception types with the right origin,
and chunked transfers round-trip bytes exactly."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from control_plane.backends.local.layout import pick_run_root, state_key
from idegym_env.client import (
    AsyncIdeGymClient,
    BadRequest,
    Conflict,
    IdeGymClient,
    NotFound,
    Sandbox,
    SandboxGone,
    ValidationError,
)
from idegym_env.embedded import EmbeddedControlPlane
from idegym_env.tools import (
    BashArguments,
    BashCall,
    ReadFileArguments,
    ReadFileCall,
    SubmitCall,
    WriteFileArguments,
    WriteFileCall,
)
from sandbox_server import routes
from sandbox_server.models import BashCommandResponse, DownloadFileChunkResponse, FileResult, HealthResponse
from tests.helpers import embedded_control_plane


@pytest.fixture(scope="module")
def control_plane() -> Iterator[EmbeddedControlPlane]:
    yield from embedded_control_plane(warm_pool=0)


@pytest.fixture
def client(control_plane: EmbeddedControlPlane) -> Iterator[IdeGymClient]:
    with IdeGymClient(control_plane.url, name="client-tests") as c:
        yield c


def test_tool_calls_through_the_control_plane(client: IdeGymClient) -> None:
    with client.start() as sandbox:
        result = sandbox.bash("echo out; echo err >&2; exit 3")
        assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
        assert sandbox.bash("pwd", cwd=".").stdout.strip()
        sandbox.write_file("notes/a.txt", "one\ntwo\nthree\n")
        sandbox.edit("notes/a.txt", 2, 2, "TWO")
        assert sandbox.read_file("notes/a.txt") == "one\nTWO\nthree\n"
        assert sandbox.execute("bash", "echo $((6 * 7))").stdout == "42\n"


def test_tool_calls_and_routes_are_typed(client: IdeGymClient) -> None:
    with client.start() as sandbox:
        ran = sandbox.run_tool(BashCall(arguments=BashArguments(command="echo hi")), bash_timeout=30)
        assert isinstance(ran, BashCommandResponse) and (ran.stdout, ran.exit_code) == ("hi\n", 0)
        wrote = sandbox.run_tool(WriteFileCall(arguments=WriteFileArguments(path="t.txt", content="x\n")))
        assert isinstance(wrote, FileResult) and wrote.status == "success"
        read = sandbox.run_tool(ReadFileCall(arguments=ReadFileArguments(path="t.txt")))
        assert isinstance(read, DownloadFileChunkResponse) and read.eof and read.bytes_read == 2
        assert isinstance(sandbox.call(routes.HEALTH), HealthResponse)
        with pytest.raises(ValueError, match="not a sandbox call"):
            sandbox.run_tool(SubmitCall())
        # A body that fails its wire model is refused before it is sent, as the server would.
        with pytest.raises(ValidationError) as invalid:
            sandbox.run_tool(BashCall(arguments=BashArguments(command="echo \x00")))
        assert invalid.value.origin == "client" and invalid.value.status == 422
        assert invalid.value.detail[0]["loc"] == ["body", "command"]


def test_chunked_upload_and_download_round_trip_every_byte(client: IdeGymClient) -> None:
    data = os.urandom(300_000) + bytes(range(256))
    with client.start() as sandbox:
        assert sandbox.upload("blob.bin", data, chunk=64 * 1024) == len(data)
        assert sandbox.download("blob.bin", chunk=50_000) == data
        assert sandbox.bash("wc -c < blob.bin").stdout.strip() == str(len(data))


def test_errors_are_typed_and_say_who_answered(client: IdeGymClient) -> None:
    with client.start() as sandbox:
        with pytest.raises(NotFound) as missing:
            sandbox.read_file("no/such/file.txt")
        assert missing.value.origin == "sandbox" and "no/such/file.txt" in str(missing.value)
        with pytest.raises(ValidationError) as invalid:
            sandbox.bash("true", env={"BAD NAME": "x"})
        assert isinstance(invalid.value, BadRequest) and invalid.value.status == 422
        sandbox.write_file("p.txt", "completely unrelated content that shares nothing\n" * 5)
        with pytest.raises(Conflict) as conflict:  # mapped by the server's error kind
            sandbox.patch("p.txt", "@@ -3,8 +3,8 @@\n pha \n-beta\n+BETA\n  gam\n")
        assert conflict.value.kind == "Conflict" and conflict.value.details["failed_hunks"]
        with pytest.raises(TypeError, match="upload"):
            sandbox.write_file("x.bin", b"\x00\x01")  # type: ignore[arg-type]
        sandbox.stop()
        with pytest.raises((SandboxGone, NotFound)) as gone:
            sandbox.bash("true")
        assert gone.value.origin == "control-plane"


def test_direct_connection_to_a_sandbox_socket_answers_like_the_control_plane(
        client: IdeGymClient, control_plane: EmbeddedControlPlane) -> None:
    with client.start() as sandbox:
        sandbox.write_file("same.txt", "hello\n")
        # (a long state path keeps its sockets elsewhere: unix socket paths are short)
        run_root = pick_run_root(control_plane.state_dir, state_key(control_plane.state_dir))
        sockets = list(run_root.glob("*.sock"))
        assert sockets, f"no sandbox socket in {run_root}"
        direct = [Sandbox.connect(unix_socket=str(p)) for p in sockets]
        try:
            seen = [d for d in direct if d.bash("cat same.txt 2>/dev/null").stdout == "hello\n"]
            assert len(seen) == 1, "exactly one live sandbox holds the file"
            via_cp, straight = sandbox.bash("id -un; pwd"), seen[0].bash("id -un; pwd")
            assert via_cp.stdout == straight.stdout and via_cp.exit_code == straight.exit_code == 0
        finally:
            for d in direct:
                d.close()


def test_async_client_does_the_same(control_plane: EmbeddedControlPlane) -> None:
    async def main() -> tuple[str, str, bytes]:
        async with AsyncIdeGymClient(control_plane.url, name="client-tests-async") as client:
            sandbox = await client.start()
            try:
                results = await asyncio.gather(*(sandbox.bash(f"echo {i}") for i in range(5)))
                await sandbox.write_file("a.txt", "async\n")
                await sandbox.upload("b.bin", b"\x00\xffdata")
                return ("".join(r.stdout for r in results), await sandbox.read_file("a.txt"),
                        await sandbox.download("b.bin"))
            finally:
                await sandbox.stop()

    outputs, text, blob = asyncio.run(main())
    assert outputs == "0\n1\n2\n3\n4\n" and text == "async\n" and blob == b"\x00\xffdata"
