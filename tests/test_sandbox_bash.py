"""The bash tool over real HTTP, on TCP and on a Unix socket."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.helpers import SandboxProcess, process_alive, rss_peak_kib, wait_until


def test_echo_streams_and_exit_code(any_server: SandboxProcess) -> None:
    out = any_server.bash("echo hello; echo oops >&2; exit 3")
    assert out["stdout"] == "hello\n"
    assert out["stderr"] == "oops\n"
    assert out["exit_code"] == 3
    assert out["timed_out"] is False


def test_default_cwd_is_project_and_relative_cwd(server: SandboxProcess, project: Path) -> None:
    assert server.bash("pwd")["stdout"].strip() == str(project)
    assert server.bash("pwd", cwd="src")["stdout"].strip() == str(project / "src")
    assert server.bash("pwd", cwd="/tmp")["stdout"].strip() == "/tmp"


def test_missing_cwd_is_a_clear_4xx(server: SandboxProcess) -> None:
    resp = server.post("/api/tools/bash", {"command": "true", "cwd": "no/such/dir"})
    assert resp.status_code == 400
    assert "no/such/dir" in resp.json()["message"]


def test_calls_are_stateless(server: SandboxProcess) -> None:
    server.bash("cd /tmp; export X=1")
    out = server.bash('pwd; echo "x=$X"')
    assert out["stdout"].splitlines() == [str(server.project), "x="]


def test_env_is_passed_and_invalid_names_are_422(server: SandboxProcess) -> None:
    assert server.bash('echo "$GREETING"', env={"GREETING": "hi there"})["stdout"] == "hi there\n"
    for bad in ({"1ABC": "x"}, {"A-B": "x"}, {"A": "nul\x00byte"}):
        resp = server.post("/api/tools/bash", {"command": "true", "env": bad})
        assert resp.status_code == 422, bad
        assert resp.json()["detail"][0]["loc"][:2] == ["body", "env"]
    # null env (as the published client may send) is accepted
    assert server.post("/api/tools/bash", {"command": "true", "env": None}).status_code == 200


def test_server_private_variables_do_not_reach_tools(project: Path, tmp_path: Path) -> None:
    import os

    env = dict(os.environ, IDEGYM_SECRET_TOKEN="s3cr3t", PYTHONPATH="/opt/private")
    proc = SandboxProcess(project, "tcp", tmp_path, env=env)
    try:
        out = proc.bash("env")["stdout"]
        assert "s3cr3t" not in out and "/opt/private" not in out
    finally:
        proc.stop()


def test_env_values_are_never_logged(project: Path, tmp_path: Path) -> None:
    proc = SandboxProcess(project, "tcp", tmp_path, extra=["--log-level", "DEBUG", "--log-json"])
    try:
        proc.bash("true", env={"API_KEY": "value-that-must-not-leak"})
        proc.post("/api/tools/bash", {"command": "true", "env": {"9BAD": "value-that-must-not-leak"}})
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert '"path": "/api/tools/bash"' in log  # request lines were logged...
    assert "value-that-must-not-leak" not in log  # ...without the values


def test_user_switch_and_unknown_user(server: SandboxProcess) -> None:
    out = server.bash("id -un; echo $HOME", user="nobody")
    assert out["stdout"].splitlines()[0] == "nobody"
    resp = server.post("/api/tools/bash", {"command": "true", "user": "no-such-user-xyz"})
    assert resp.status_code == 422
    assert "no-such-user-xyz" in resp.json()["message"]


def test_empty_and_missing_command(server: SandboxProcess) -> None:
    resp = server.post("/api/tools/bash", {"command": "   "})
    assert resp.status_code == 422 and "empty" in resp.json()["message"]
    resp = server.post("/api/tools/bash", {})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "command"]


def test_max_output_bytes_must_be_a_positive_integer(server: SandboxProcess) -> None:
    for bad in (0, -5, 1.5, "10"):
        assert server.post("/api/tools/bash", {"command": "true", "max_output_bytes": bad}).status_code == 422


def test_timeout_returns_partial_output_and_124(server: SandboxProcess) -> None:
    started = time.monotonic()
    out = server.bash("echo before; sleep 30; echo after", timeout=0.5, graceful_termination_timeout=0.5)
    elapsed = time.monotonic() - started
    assert out["exit_code"] == 124 and out["timed_out"] is True
    assert out["stdout"] == "before\n"
    assert elapsed < 15  # ended by the limit, not by the 30 s sleep, at any load


def test_timeout_escalates_to_sigkill_after_grace(server: SandboxProcess) -> None:
    started = time.monotonic()
    out = server.bash("trap '' TERM; echo stubborn; sleep 30", timeout=0.5, graceful_termination_timeout=1.0)
    elapsed = time.monotonic() - started
    assert out["timed_out"] and out["stdout"] == "stubborn\n"
    assert 1.4 <= elapsed < 15  # the grace period was given, then SIGKILL (not the 30 s sleep)


def test_background_children_holding_pipes_do_not_hang_a_timeout(server: SandboxProcess, tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    started = time.monotonic()
    # The background child escapes the process group with setsid yet keeps stdout open.
    out = server.bash(f"setsid bash -c 'echo $$ > {pidfile}; exec sleep 60' & sleep 30",
                      timeout=0.5, graceful_termination_timeout=0.5)
    assert out["timed_out"]
    assert time.monotonic() - started < 15  # not held by the child's 60 s nor the 30 s sleep, at any load
    bg = int(pidfile.read_text())
    assert wait_until(lambda: not process_alive(bg), 3), "pipe-holding background child survived the timeout"


def test_daemon_that_forks_and_returns(server: SandboxProcess, tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    started = time.monotonic()
    out = server.bash(f"(setsid sleep 120 & echo $! > {pidfile}); echo started", timeout=30)
    assert out["stdout"] == "started\n" and out["exit_code"] == 0
    assert time.monotonic() - started < 2.0  # the call did not wait for the daemon
    daemon = int(pidfile.read_text())
    assert process_alive(daemon)
    # ... and a project reset ends it, although it left the process group
    reset = server.post("/api/project/reset", {}).json()
    assert reset["status"] == "success" and reset["killed_processes"] >= 1
    assert wait_until(lambda: not process_alive(daemon), 3)


def test_output_is_capped_with_head_tail_and_marker(any_server: SandboxProcess) -> None:
    out = any_server.bash("seq 1 100000", max_output_bytes=1000)
    text = out["stdout"]
    assert len(text.encode()) <= 1000
    assert text.startswith("1\n2\n3\n")
    assert text.endswith("99999\n100000\n")
    assert "bytes omitted" in text
    full = len("".join(f"{i}\n" for i in range(1, 100001)).encode())
    dropped = int(text.split("[... ")[1].split(" bytes")[0])
    kept = len(text.encode()) - len(text.split("\n[... ")[1].split("]\n", 1)[0]) - len("\n[... ]\n")
    assert dropped == full - kept


def test_null_max_output_keeps_everything(server: SandboxProcess) -> None:
    out = server.bash("head -c 3000000 /dev/zero | tr '\\0' x", max_output_bytes=None)
    assert out["stdout"] == "x" * 3_000_000


def test_gigabytes_of_output_keep_the_server_bounded(server: SandboxProcess) -> None:
    started = time.monotonic()
    out = server.bash("head -c 2000000000 /dev/zero; echo; echo end-marker", max_output_bytes=4096, timeout=120)
    assert out["exit_code"] == 0
    assert out["stdout"].endswith("end-marker\n")
    assert len(out["stdout"].encode()) <= 4096
    assert time.monotonic() - started < 60
    assert rss_peak_kib(server.pid) < 200_000  # 2 GB went through; the server never held it


def test_binary_output_becomes_replacement_characters(server: SandboxProcess) -> None:
    out = server.bash(r"printf 'ok\xff\xfe\n'")
    assert out["stdout"] == "ok\ufffd\ufffd\n"


def test_strip_output(server: SandboxProcess) -> None:
    assert server.bash("printf '  padded  \\n\\n'", strip_output=True)["stdout"] == "padded"
    assert server.bash("printf '  padded  \\n\\n'")["stdout"] == "  padded  \n\n"


def test_each_call_is_its_own_process_group(server: SandboxProcess) -> None:
    first = server.bash("ps -o pgid= $$")["stdout"].strip()
    second = server.bash("ps -o pgid= $$")["stdout"].strip()
    assert first != second
    assert int(first) != server.pid


def test_concurrent_calls_run_in_parallel(server: SandboxProcess) -> None:
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: server.bash(f"sleep 0.5; echo {i}"), range(8)))
    assert [r["stdout"] for r in results] == [f"{i}\n" for i in range(8)]
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("body", [b"{not json", b"[1,2]", b'"text"', b"\xff\xfe"])
def test_malformed_bodies_are_422(server: SandboxProcess, body: bytes) -> None:
    resp = server.client.post("/api/tools/bash", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 422
    assert isinstance(resp.json()["detail"], list)


def test_log_lines_are_json(project: Path, tmp_path: Path) -> None:
    proc = SandboxProcess(project, "tcp", tmp_path, extra=["--log-level", "INFO", "--log-json"])
    try:
        proc.bash("true")
    finally:
        proc.stop()
    lines = [json.loads(line) for line in proc.log_path.read_text().splitlines() if line.startswith("{")]
    assert any(entry.get("path") == "/api/tools/bash" and entry.get("status") == 200 for entry in lines)


def test_root_can_be_refused_to_tools(project: Path, tmp_path: Path) -> None:
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    proc = SandboxProcess(project, "tcp", tmp_path, extra=["--tool-user", "nobody", "--no-root-tools"])
    try:
        for user in ("root", "0"):
            resp = proc.post("/api/tools/bash", {"command": "id -u", "user": user})
            assert resp.status_code == 403 and "root" in resp.json()["message"]
        assert proc.bash("id -un")["stdout"] == "nobody\n"
    finally:
        proc.stop()


def test_a_tool_user_gets_its_identity_groups_and_no_capabilities(project: Path, tmp_path: Path) -> None:
    """The switch to the tool user (its spawner, setpriv, or Popen's own) must give the
    user's uid, primary and supplementary groups, and an empty capability set."""
    import grp
    import os
    import pwd

    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    member = next(((g.gr_mem[0], g) for g in grp.getgrall() if g.gr_mem), None)
    if member is None:
        pytest.skip("no user on this host has a supplementary group")
    name, group = member
    entry = pwd.getpwnam(name)
    proc = SandboxProcess(project, "tcp", tmp_path, extra=["--tool-user", "nobody"])
    try:
        out = proc.bash("id -u; id -g; id -G; grep -E '^Cap(Prm|Eff|Amb):' /proc/self/status", user=name)["stdout"]
    finally:
        proc.stop()
    uid, gid, groups, *caps = out.splitlines()
    assert (int(uid), int(gid)) == (entry.pw_uid, entry.pw_gid)
    assert group.gr_gid in {int(g) for g in groups.split()}
    assert [c.split()[1] for c in caps] == ["0000000000000000"] * 3
