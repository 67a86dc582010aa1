"""The warm pool's target: it follows a burst of claims at once, not a minute later."""

from __future__ import annotations

import time
from collections import deque

from control_plane.pool import WarmPool


def test_a_burst_of_claims_raises_the_target_from_their_rate_at_once() -> None:
    """Five claims 40 ms apart (a trainer's first episodes) with fills that take 70 ms: what must
    be on its way is 25/s × 0.07 s, doubled, over the floor — not the minute's count halved (2).

    Can fail: with the target from the minute's count alone it stays at the floor."""
    pool = WarmPool(backend=None, store=None, floor=2, ceiling=8)  # type: ignore[arg-type]
    key = ("image",)
    now = time.monotonic()
    pool._last_used[key] = now
    pool._fill_seconds[key] = 0.07
    pool._demand[key] = deque(now - 0.04 * i for i in range(4, -1, -1))
    assert pool.target(key) == 2 + 4
    pool._demand[key] = deque([now - 30.0])  # one claim half a minute ago: the floor
    assert pool.target(key) == 2
    pool._demand[key] = deque(now - 0.001 * i for i in range(99, -1, -1))  # 1,000/s: the ceiling
    assert pool.target(key) == 8
