"""The read ends of tools' pipes, watched through one epoll of the server's own that the loop
watches, instead of one loop watcher each.

uvloop's ``add_reader`` and ``remove_reader`` cost ~20 us a descriptor (it probes the descriptor
with an epoll ADD and DEL, makes it non-blocking, and removes it three times: seven syscalls and
a libuv handle), and every call has two output pipes; here a descriptor costs one ``epoll_ctl`` to
add and one to remove (~1.5 us). Level-triggered, as the loop's readers are."""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable


class PipeWatch:
    """Readers of descriptors on one event loop: ``add`` a callback, ``remove`` it before the
    descriptor is closed. One per server (``Supervisor``), closed with it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll = select.epoll()  # close-on-exec
        self._readers: dict[int, Callable[[], object]] = {}
        loop.add_reader(self._epoll.fileno(), self._ready)

    def add(self, fd: int, reader: Callable[[], object]) -> None:
        self._epoll.register(fd, select.EPOLLIN)
        self._readers[fd] = reader

    def remove(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            self._epoll.unregister(fd)

    def _ready(self) -> None:
        for fd, _ in self._epoll.poll(0):
            reader = self._readers.get(fd)  # removed by an earlier reader of this round: not called
            if reader is not None:
                reader()

    def close(self) -> None:
        if not self._epoll.closed:
            self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()
            self._readers.clear()
