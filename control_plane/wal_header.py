"""Whether an SQLite database in WAL mode may have changed, without asking SQLite.

Every connection to such a database maps its ``-shm`` file, whose first 96 bytes are the
WAL-index header, twice (SQLite's documented file format): a commit by any connection, in any
process, rewrites it (its change counter, the last frame, the checksums), and a reader learns of
the commit from it. So its bytes, read with one ``pread``, change whenever the database does.
``PRAGMA data_version`` says the same, but a statement costs a forward ~30 us of the control
plane's CPU on a loaded host (SQLite's code is cold then), the ``pread`` a few.
"""

from __future__ import annotations

import os
from pathlib import Path

HEADER = 96  # both copies: a writer writes the second, then the first


class WalHeader:
    """The WAL-index header of the database at ``path``, read afresh by ``read()``."""

    def __init__(self, path: Path) -> None:
        try:
            self._fd: int | None = os.open(f"{path}-shm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # not in WAL mode (or no shared memory file): callers ask SQLite
            self._fd = None

    def read(self) -> bytes | None:
        """The header's bytes now; None when there is none to read."""
        if self._fd is None:
            return None
        try:
            data = os.pread(self._fd, HEADER, 0)
        except OSError:
            return None
        return data if len(data) == HEADER else None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
