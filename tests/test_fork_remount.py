"""The native remount of a fork's warm children (``control_plane/backends/local/native/remount.c``, called by
``adopt.adopt_all``). It runs with the control plane's privilege, so a malformed request is
refused whole and changes nothing, and a sandbox whose recorded server is not the process its pid
names now is refused before anything of it is touched. (Remounts themselves: tests/test_fork_local.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from control_plane.backends.local.adopt import REMOUNT
from sandbox_server import procfs

pytestmark = pytest.mark.skipif(not os.access(REMOUNT, os.X_OK), reason="the helper is not built (make native)")


def _job(layers: str, pid: int, start: int) -> list[str]:
    return [str(pid), str(start), layers, "/home/appuser/work", "[]", "",
            "1", "etc", "1", "lower/etc",
            "1", "lower/project",
            "1", "/state/forks/f-1/project", "/opt/idegym/fork/0"]


def _run(fields: list[str], state: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([REMOUNT], input=b"".join(f.encode() + b"\0" for f in fields), capture_output=True,
                          cwd=state, timeout=30, check=False)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def state(tmp_path: Path) -> Path:
    for tree in ("etc", "project"):
        for part in ("upper", "work"):
            (tmp_path / "sandboxes/w-1/layers" / tree / part).mkdir(parents=True)
    return tmp_path


def test_malformed_requests_are_refused_and_change_nothing(state: Path) -> None:
    record = procfs.record(os.getpid())
    assert record is not None
    head = ["idegym-remount/1", str(state), "fork-layers.json", "1"]
    job = _job("sandboxes/w-1/layers", *record)
    before = _tree(state)

    def at(index: int, value: str) -> list[str]:
        return [*job[:index], value, *job[index + 1:]]

    malformed = {
        "another protocol": ["idegym-remount/2", *head[1:], *job],
        "a relative state directory": [head[0], "state", *head[2:], *job],
        "a record name with a slash": [*head[:2], "../fork-layers.json", head[3], *job],
        "no job": [*head[:3], "0"],
        "more jobs than a fork has": [*head[:3], "65", *job * 65],
        "fewer jobs than counted": [*head[:3], "2", *job],
        "a pid that is not a number": [*head, *at(0, "12x")],
        "a negative pid": [*head, *at(0, "-5")],
        "init's pid": [*head, *at(0, "1")],
        "layers outside the state directory": [*head, *at(2, "sandboxes/../../etc")],
        "a relative project directory": [*head, *at(3, "home/appuser/work")],
        "a like path with ..": [*head, *at(5, "/state/../etc")],
        "a tree that is a path": [*head, *at(7, "../etc")],
        "a tree named project": [*head, *at(7, "project")],
        "a tree with no lower": [*head, *at(8, "0")],
        "more trees than there are": [*head, *at(6, "9")],
        "an empty lower": [*head, *at(9, "")],
        "a relative bind target": [*head, *at(14, "opt/idegym/fork/0")],
        "a bind source with ..": [*head, *at(13, "/state/../etc")],
        "bytes after the last job": [*head, *job, "more"],
    }
    for what, fields in malformed.items():
        done = _run(fields, state)
        assert done.returncode == 2 and done.stderr.startswith(b"idegym-remount: refused"), (what, done)
        assert done.stdout == b"", what
        assert _tree(state) == before, what
    cut = b"".join(f.encode() + b"\0" for f in [*head, *job])[:-1]  # the last field not NUL-terminated
    done = subprocess.run([REMOUNT], input=cut, capture_output=True, timeout=30, check=False)
    assert done.returncode == 2 and b"ends early" in done.stderr


def test_a_server_whose_pid_names_another_process_now_is_refused_before_anything_changes(state: Path) -> None:
    """A recorded server is a pid and its start time: a pid reused by another process (the server
    ended, its sandbox is being deleted) is not remounted, nor are its layers touched. Each job is
    its own: the others of the request go on."""
    record = procfs.record(os.getpid())
    assert record is not None
    before = _tree(state)
    done = _run(["idegym-remount/1", str(state), "fork-layers.json", "2",
                 *_job("sandboxes/w-1/layers", record[0], record[1] + 1),
                 *_job("sandboxes/w-1/layers", 0x7fffffff, 0)], state)
    assert done.returncode == 1, done
    lines = sorted(done.stdout.decode().splitlines())
    assert [line.split(" ", 2)[:2] for line in lines] == [["0", "3"], ["1", "2"]], lines  # ESRCH, ENOENT
    assert all("is gone" in line for line in lines), lines
    assert _tree(state) == before
