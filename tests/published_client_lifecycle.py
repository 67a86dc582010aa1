"""Run by tests/test_published_client.py under Python 3.12 with the published idegym-client 0.13.1.

Drives the whole life cycle against our control plane and prints one JSON line per step; any
exception fails the run. Usage: python published_client_lifecycle.py <control-plane-url>, with the
credentials in $IDEGYM_AUTH_USERNAME / $IDEGYM_AUTH_PASSWORD (the client reads them itself).
"""

import asyncio
import base64
import hashlib
import json
import os
import sys

from diff_match_patch import diff_match_patch
from idegym.api.orchestrator.servers import ServerReuseStrategy
from idegym.client import IdeGYMClient
from idegym.client.client import ServerCloseAction
from idegym.client.exceptions import IdeGYMNotFoundError, IdeGYMSandboxError

IMAGE = "idegym/builtin:latest"


def step(name, **data):
    print(json.dumps({"step": name, **data}), flush=True)


async def main(url: str) -> None:
    async with IdeGYMClient(orchestrator_url=url, name="published", namespace="idegym") as client:
        step("register", client_id=str(client.client_id))
        health = await client.health_check()
        step("health", status=health.status)

        server = await client.start_server(image_tag=IMAGE, reuse_strategy=ServerReuseStrategy.NONE,
                                           server_start_wait_timeout_in_seconds=120)
        step("start", server_id=server.server_id, reused=server.reused)

        bash = await server.execute_bash("echo hello && id -un && pwd")
        assert bash.stdout.splitlines() == ["hello", "appuser", "/home/appuser/work"], bash
        assert bash.exit_code == 0
        step("bash", stdout=bash.stdout)

        created = await server.create_file("src/calc.py", "def add(a, b):\n    return a - b\n")
        assert created.status == "success"
        await server.edit_file("src/calc.py", 2, 2, "    return a + b")
        dmp = diff_match_patch()
        old = "def add(a, b):\n    return a + b\n"
        new = "def add(a, b):\n    \"\"\"Sum.\"\"\"\n    return a + b\n"
        await server.patch_file("src/calc.py", dmp.patch_toText(dmp.patch_make(old, new)))
        text = (await server.download_bytes("src/calc.py")).decode()
        assert text == new, text
        step("files", content=text)

        blob = os.urandom(5 * 1024 * 1024 + 123)
        size = await server.upload_bytes("data/blob.bin", blob)
        assert size == len(blob)
        back = await server.download_bytes("data/blob.bin")
        assert hashlib.sha256(back).digest() == hashlib.sha256(blob).digest()
        step("upload-download", size=size)

        try:
            await server.download_bytes("missing.bin")
            raise AssertionError("download of a missing file succeeded")
        except IdeGYMSandboxError as exc:
            assert exc.status_code == 404, exc
        step("sandbox-error", status=404)

        await server.create_file("test_calc.py",
                                 "from src.calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
        script = ("python3 -c \"import src.calc as c; ok = c.add(2, 3) == 5; "
                  "open('test-results.xml','w').write('<testsuite tests=\\'1\\' failures=\\'%d\\'>"
                  "<testcase name=\\'add\\'>%s</testcase></testsuite>' "
                  "% (0 if ok else 1, '' if ok else '<failure/>'))\"")
        report = await server.test_reward(script)
        assert report.status == "success" and report.scores.total == 1 and report.scores.passed == 1, report
        setup = await server.setup_reward("python3 --version")
        assert setup.status == "success"
        compiled = await server.compilation_reward("python3 -m py_compile src/calc.py")
        assert compiled.status == "success"
        step("rewards", scores=report.scores.model_dump())

        kept = await server.keepalive(minutes=30)
        assert kept.server_id == server.server_id and kept.minutes > 29
        listed = await client.list_servers()
        assert any(s.server_id == server.server_id and s.usable for s in listed)
        status = await server.status()
        assert status.availability == "ALIVE" and status.idle_seconds >= 0
        caps = await server.list_capabilities()
        assert "tools" in caps.plugins
        step("keepalive-list-status-capabilities", minutes=kept.minutes, plugins=caps.plugins)

        await server.execute_bash("echo before-restart > /tmp/mark")
        restarted = await server.restart_server(server_start_wait_timeout_in_seconds=120)
        step("restart", message=restarted.message)
        gone = await server.execute_bash("cat /tmp/mark 2>&1 || true")
        assert "No such file" in gone.stdout, gone

        snap = await server.snapshot()
        assert snap.server_id == server.server_id and snap.snapshot_tag
        step("snapshot", snapshot_id=snap.snapshot_id, tag=snap.snapshot_tag)

        reset = await server.reset_project()
        assert reset.status == "success", reset
        first_id = server.server_id
        await server.execute_bash("echo kept > /tmp/note && echo scratch > scratch.txt")
        await client.finish_server(server)
        step("finish", server_id=first_id)

        async with client.with_server(image_tag=IMAGE, reuse_strategy=ServerReuseStrategy.RESET,
                                      close_action=ServerCloseAction.STOP,
                                      server_start_wait_timeout_in_seconds=120) as again:
            assert again.server_id == first_id and again.reused, (again.server_id, first_id)
            out = await again.execute_bash("cat /tmp/note; ls scratch.txt 2>&1 || true")
            assert out.stdout.splitlines()[0] == "kept" and "No such file" in out.stdout, out
            step("reuse-reset", server_id=again.server_id)
        try:
            await again.execute_bash("true")
            raise AssertionError("a stopped server still answered")
        except IdeGYMNotFoundError:
            pass
        step("stop", server_id=first_id)

        other = await client.start_server(image_tag=IMAGE, reuse_strategy=ServerReuseStrategy.NONE,
                                          server_start_wait_timeout_in_seconds=120)
        step("second-server", server_id=other.server_id)
    step("stop-client")
    print(json.dumps({"done": True, "b64": base64.b64encode(b"ok").decode()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
