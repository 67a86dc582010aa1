"""Threads that join a sandbox's mount namespace and come back (``ns_threads.py``), with a real
process in a mount namespace of its own."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator

import pytest

from control_plane.backends.local import ns_threads
from control_plane.backends.local.ns_threads import NamespaceThreads
from tests.local_helpers import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="joining a mount namespace needs root")


def _ns_inode() -> int:
    return os.stat("/proc/thread-self/ns/mnt").st_ino


@pytest.fixture
def other_ns() -> Iterator[int]:
    """A descriptor of a mount namespace that is not the test's (a process's made with unshare)."""
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    try:
        mine = _ns_inode()
        assert wait_for(lambda: os.stat(f"/proc/{proc.pid}/ns/mnt").st_ino != mine, timeout=10), \
            "unshare did not make a mount namespace"
        fd = os.open(f"/proc/{proc.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        yield fd
        os.close(fd)
    finally:
        proc.kill()
        proc.wait()


def test_a_thread_comes_back_after_its_job_whatever_the_job_did(other_ns: int) -> None:
    """A job joins another mount namespace; the next job on the same thread is back in the
    control plane's, with a working directory of its own (the process's is untouched), also
    after a job that raised without leaving. Threads are reused, not made per job."""
    pool = NamespaceThreads("test-ns")
    home, cwd = _ns_inode(), os.getcwd()
    inside = os.fstat(other_ns).st_ino

    def visit(fail: bool) -> tuple[int, str]:
        os.chdir("/proc")
        ns_threads.enter(other_ns)
        seen = (_ns_inode(), threading.current_thread().name)
        if fail:
            raise ValueError("the job failed inside")
        ns_threads.leave()
        return seen

    def where() -> tuple[int, str, str]:
        return _ns_inode(), os.getcwd(), threading.current_thread().name

    names = set()
    for fail in (False, True, False):
        future = pool.submit(visit, fail)
        if fail:
            with pytest.raises(ValueError, match="failed inside"):
                future.result(30)
        else:
            assert future.result(30)[0] == inside
        ns, its_cwd, name = pool.submit(where).result(30)
        assert ns == home and its_cwd == "/"
        names.add(name)
    assert names == {"test-ns"} and len([t for t in threading.enumerate() if t.name == "test-ns"]) == 1
    assert os.getcwd() == cwd and _ns_inode() == home


def test_joining_a_namespace_is_refused_off_those_threads(other_ns: int) -> None:
    """Any other thread shares its root and working directory with the whole process."""
    with pytest.raises(RuntimeError, match="NamespaceThreads"):
        ns_threads.enter(other_ns)
    assert os.stat("/proc/self/ns/mnt").st_ino == _ns_inode()
