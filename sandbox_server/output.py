"""Bounded capture of a process's output stream: keep the head and the tail, count the rest;
and reading such a stream from a non-blocking descriptor."""

from __future__ import annotations

import os


def read_available(fd: int, size: int) -> bytes | None:
    """``os.read`` of a non-blocking ``fd``: None when nothing is there yet, ``b""`` at its end
    or when reading fails (either way the stream is over)."""
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def omitted_marker(dropped: int) -> str:
    return f"\n[... {dropped} bytes omitted ...]\n"


def _prefix_within(text: str, budget: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding fits in ``budget`` bytes."""
    encoded = text.encode("utf-8")
    return text if len(encoded) <= budget else encoded[: max(budget, 0)].decode("utf-8", errors="ignore")


def _suffix_within(text: str, budget: int) -> str:
    encoded = text.encode("utf-8")
    if len(encoded) <= budget:
        return text
    return encoded[len(encoded) - max(budget, 0) :].decode("utf-8", errors="ignore") if budget > 0 else ""


class BoundedOutput:
    """Collects a byte stream while never holding more than about ``limit`` bytes of it.

    The first half of the budget keeps the head of the stream, the second half a rolling tail;
    what falls between is only counted. ``limit=None`` keeps everything.
    """

    __slots__ = ("limit", "_head", "_tail", "_tail_cap", "total")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._head = bytearray()
        self._tail = bytearray()
        self._tail_cap = 0 if limit is None else limit - limit // 2
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        if self.limit is None:
            self._head += data
            return
        room = self.limit // 2 - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        if len(data) >= self._tail_cap:
            self._tail[:] = data[len(data) - self._tail_cap :]
        else:
            self._tail += data
            excess = len(self._tail) - self._tail_cap
            if excess > 0:
                del self._tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.limit is not None and self.total > len(self._head) + len(self._tail)

    def text(self, strip: bool = False) -> str:
        """Decoded output (U+FFFD for undecodable bytes) whose UTF-8 encoding fits in ``limit``.

        When bytes were dropped, or replacement characters make the text too long, the result is
        head + a marker naming how many bytes were left out + tail.
        """
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        if not self.truncated:
            whole = head + tail
            if strip:
                whole = whole.strip()
            if self.limit is None or len(whole.encode("utf-8")) <= self.limit:
                return whole
            head, tail = whole, whole
        elif strip:
            head, tail = head.lstrip(), tail.rstrip()
        assert self.limit is not None
        marker = omitted_marker(self.total)
        if len(marker) >= self.limit:  # a tiny limit: no room for a marker
            return _prefix_within(head, self.limit)
        budget = self.limit - len(marker)
        kept_head = _prefix_within(head, budget // 2)
        kept_tail = _suffix_within(tail, budget - len(kept_head.encode("utf-8")))
        dropped = max(self.total - len(kept_head.encode("utf-8")) - len(kept_tail.encode("utf-8")), 0)
        return kept_head + omitted_marker(dropped) + kept_tail
