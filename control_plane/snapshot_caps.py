"""The snapshot caps: how many snapshots there may be (``--max-snapshots``) and what they may take
on disk (``--max-snapshot-bytes``, where the backend can tell).

A snapshot (``POST /api/idegym-servers/snapshot``) or a preparation (``/api/snapshots/prepare``,
one snapshot per request) past a cap is a 429 that names the flag, before anything is made; one
whose own size takes the total past the byte cap is deleted at once and refused the same way.
(The sandboxes a preparation makes wait their turn under ``--max-servers`` like any other:
``admission.py``.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .backends.base import Backend
from .config import ControlPlaneConfig
from .errors import ApiError
from .store import SQLiteStore


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


class SnapshotReservation:
    """Room for ``count`` snapshots being taken, held until ``release``d (one at a time or all)."""

    def __init__(self, caps: SnapshotCaps, count: int) -> None:
        self._caps, self.count = caps, count

    def release(self, count: int | None = None) -> None:
        n = self.count if count is None else min(count, self.count)
        self.count -= n
        self._caps.in_flight -= n


class SnapshotCaps:
    def __init__(self, config: ControlPlaneConfig, store: SQLiteStore, backend: Backend) -> None:
        self.config, self.store, self.backend = config, store, backend
        self.in_flight = 0  # snapshots being taken (not in the store yet)

    async def reserve(self, count: int, what: str) -> SnapshotReservation:
        """Room for ``count`` new snapshots: 429 when they would pass ``--max-snapshots``, or
        when the snapshots there are already take ``--max-snapshot-bytes``."""
        limit = self.config.max_snapshots
        have = self.store.count_snapshots() + self.in_flight
        if have + count > limit:
            raise ApiError.for_status(
                429, f"Snapshot limit exceeded: {what} would make {count} more snapshot{'s' if count > 1 else ''}, "
                     f"and {have} of the {limit} allowed exist or are being taken (--max-snapshots)")
        used = await self.backend.snapshot_bytes()
        cap = self.config.max_snapshot_bytes
        if used is not None and used >= cap:
            raise ApiError.for_status(
                429, f"Snapshot limit exceeded: snapshots take {_size(used)} of the {_size(cap)} allowed "
                     f"(--max-snapshot-bytes); {what} makes no new one")
        self.in_flight += count
        return SnapshotReservation(self, count)

    async def check_taken(self, snapshot_id: str, what: str, delete: Callable[[str], Awaitable[None]]) -> None:
        """After a snapshot was taken: when it made the snapshots pass ``--max-snapshot-bytes``,
        ``delete`` it and answer 429."""
        used = await self.backend.snapshot_bytes()
        cap = self.config.max_snapshot_bytes
        if used is not None and used > cap:
            await delete(snapshot_id)
            raise ApiError.for_status(
                429, f"Snapshot limit exceeded: {what} made a snapshot that took the snapshots to {_size(used)}, "
                     f"past the {_size(cap)} allowed (--max-snapshot-bytes); it was deleted")
