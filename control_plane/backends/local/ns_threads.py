"""Threads that join a sandbox's mount namespace for a job, then come back (``adopt.py``).

A thread may join another mount namespace (``setns``) once it has a working directory and root
of its own (``unshare(CLONE_FS)``). A new thread per job for that cost a fork into 8 about as
much as its remounts did: on a busy host a started thread waits for the scheduler before it runs.
These threads get their own once, when made, and after each job return to the control plane's
mount namespace (with ``/`` as working directory): a job calls ``enter`` and ``leave``, and the
thread goes back after the job whatever it did; one that cannot ends, so no job runs where an
earlier one left off. Idle threads wait for work; more are made while all are busy.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from . import mounts

CLONE_FS = 0x00000200
T = TypeVar("T")


class NamespaceThreads:
    """Run jobs that may ``setns`` into a mount namespace on threads that come back from it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...]]] = \
            queue.SimpleQueue()
        self._idle = threading.Semaphore(0)

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        if not self._idle.acquire(timeout=0):
            threading.Thread(target=self._work, name=self._name, daemon=True).start()
        return future

    def _work(self) -> None:
        try:
            _local.home = _own_fs()
        except OSError as exc:
            future, _fn, _args = self._jobs.get()
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)
            return
        try:
            while True:
                future, fn, args = self._jobs.get()
                if not future.set_running_or_notify_cancel():
                    self._idle.release()
                    continue
                result: Any = None
                failure: BaseException | None = None
                try:
                    result = fn(*args)
                except BaseException as exc:  # noqa: BLE001 - handed to the submitter
                    failure = exc
                home = _back_home()
                if home:  # free for the next job before this one's submitter hears of it
                    self._idle.release()
                if failure is not None:
                    future.set_exception(failure)
                else:
                    future.set_result(result)
                if not home:
                    return
        finally:
            os.close(_local.home[0])


_local = threading.local()  # a NamespaceThreads thread's home: its namespace's descriptor and inode


def require() -> None:
    """RuntimeError unless on a ``NamespaceThreads`` thread: any other shares its root and working
    directory with the whole process."""
    if getattr(_local, "home", None) is None:
        raise RuntimeError("this needs a NamespaceThreads thread (a working directory of its own)")


def enter(ns: int) -> None:
    """Join the mount namespace ``ns`` (a descriptor) until ``leave`` (``require``)."""
    require()
    mounts.enter_mount_namespace(ns)


def leave() -> None:
    """Back in the control plane's mount namespace (where host paths and pids resolve again)."""
    if not _back_home():
        raise OSError("could not return to the control plane's mount namespace")


def _own_fs() -> tuple[int, int]:
    """This thread's own working directory and root (so it may join a mount namespace); an open
    descriptor of the mount namespace it is in, and that namespace's inode."""
    if mounts._libc.unshare(CLONE_FS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_FS): {os.strerror(err)}")
    home = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    return home, os.fstat(home).st_ino


def _back_home() -> bool:
    """This thread back in its home mount namespace (its root and working directory that
    namespace's ``/``); False when it cannot be (the thread must end)."""
    home, inode = _local.home
    try:
        mounts.enter_mount_namespace(home)
        return os.stat("/proc/thread-self/ns/mnt").st_ino == inode
    except OSError:
        return False
