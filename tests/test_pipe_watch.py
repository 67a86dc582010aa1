"""The server's one epoll for its tools' pipes (``sandbox_server/pipe_watch.py``)."""

from __future__ import annotations

import asyncio
import os

import uvloop

from sandbox_server.pipe_watch import PipeWatch


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_readers_are_called_while_their_pipe_has_data_and_never_once_removed() -> None:
    """Level-triggered, as the loop's readers are: a reader is called as long as its pipe has data.
    Of two pipes ready in the same round, the reader called first removes and closes the other:
    that one is not called (its descriptor may be another's by then). Closed, it leaves nothing."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        before = open_descriptors()
        watch = PipeWatch(loop)
        pipes = [os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK) for _ in range(3)]
        (r, w), *pair = pipes
        got: list[bytes] = []
        three = loop.create_future()

        def read_one() -> None:
            got.append(os.read(r, 1))
            if len(got) == 3:
                three.set_result(None)

        watch.add(r, read_one)
        os.write(w, b"xyz")
        await asyncio.wait_for(three, 10)
        assert got == [b"x", b"y", b"z"]
        watch.remove(r)

        called: list[int] = []
        first = loop.create_future()

        def reader(mine: int, other: int) -> None:
            called.append(mine)
            watch.remove(other)
            if not first.done():
                first.set_result(None)

        (a, a_w), (b, b_w) = pair
        watch.add(a, lambda: reader(a, b))
        watch.add(b, lambda: reader(b, a))
        os.write(a_w, b"1")
        os.write(b_w, b"1")
        await asyncio.wait_for(first, 10)
        await asyncio.sleep(0.05)  # a further round would call the remover again (its pipe still has data)
        assert len(called) >= 1 and set(called) == {called[0]}, called
        watch.remove(called[0])
        watch.close()
        for fds in pipes:
            for fd in fds:
                os.close(fd)
        assert open_descriptors() == before
        assert not errors, errors

    uvloop.run(main())
