"""The readiness pipe of a child process IdeGym starts (an embedded control plane, a node's
keeper, an inner sandbox server): the child writes one line on it once it serves."""

from __future__ import annotations

import os
import select


def read_ready(fd: int, timeout: float, limit: int = 64) -> bytes:
    """What the child wrote on ``fd`` within ``timeout`` seconds (at most ``limit`` bytes; ``b""``
    when nothing came in time or the child closed its end first). ``fd`` is closed either way."""
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, limit) if ready else b""
    finally:
        os.close(fd)


__all__ = ["read_ready"]
