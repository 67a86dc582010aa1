"""``make demo`` / ``idegym demo``: a sandbox server and a few real tool calls, printed as they happen."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n\ndef test_zero():\n    assert add(0, 0) == 0\n"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="idegym-demo-") as tmp:
        root = Path(tmp)
        project = root / "project"
        project.mkdir()
        (project / "calc.py").write_text(BUGGY)
        (project / "test_calc.py").write_text(TESTS)
        sock = root / "sandbox.sock"
        read_fd, write_fd = os.pipe()
        print(f"starting a sandbox server on {sock} for a project with a bug in calc.py ...", flush=True)
        server = subprocess.Popen(
            [sys.executable, "-m", "sandbox_server", "serve", "--project", str(project), "--state-dir",
             str(root / "state"), "--unix-socket", str(sock), "--ready-fd", str(write_fd)],
            pass_fds=(write_fd,),
        )
        os.close(write_fd)
        select.select([read_fd], [], [], 30)
        os.read(read_fd, 16)
        client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://sandbox", timeout=120)
        pytest_cmd = f"{sys.executable} -m pytest -q -p no:cacheprovider --junitxml=test-results.xml"
        steps = [
            ("bash", "/api/tools/bash", {"command": "ls -l && python3 --version"}),
            ("test reward (before the fix)", "/api/rewards/test", {"test_script": pytest_cmd}),
            ("edit calc.py line 2", "/api/tools/file/edit",
             {"file_path": "calc.py", "start_line": 2, "end_line": 2, "new_content": "    return a + b"}),
            ("test reward (after the fix)", "/api/rewards/test", {"test_script": pytest_cmd}),
            ("code runner: C", "/execute",
             {"language": "c", "code": '#include <stdio.h>\nint main(){puts("hello from C");}'}),
            ("project reset", "/api/project/reset", {}),
            ("bash after reset", "/api/tools/bash", {"command": "cat calc.py"}),
        ]
        try:
            for i, (label, path, body) in enumerate(steps, 1):
                started = time.perf_counter()
                resp = client.post(path, json=body)
                ms = (time.perf_counter() - started) * 1000
                data = resp.json()
                shown = {k: v for k, v in data.items() if k not in ("duration_seconds", "durationSeconds")}
                text = json.dumps(shown)
                print(f"[{i}/{len(steps)}] {label:<30} {resp.status_code} in {ms:7.1f} ms  "
                      f"{text[:150] + ('…' if len(text) > 150 else '')}", flush=True)
        finally:
            client.close()
            server.terminate()
            server.wait(10)
    print("done: the sandbox server is stopped and its files are gone.")
    return 0
