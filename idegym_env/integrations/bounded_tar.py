"""Extracting an archive that a sandbox made, within a bound on what lands on this machine.

The sandbox's side is the adversary's (in a Harbor trial the agent is root there and can replace
``tar`` itself), so nothing it says about sizes is believed: :func:`extract_within` counts each
entry's apparent size (a sparse file's full length, holes included) and a block for its header
before anything is written, and refuses the archive when they add up past the bound, or when it
has more than :data:`MAX_ENTRIES` entries. Entries are written by :mod:`tarfile` with the filter
given (Harbor's ``transfer_tar_filter``: no absolute paths, no links out, no devices); a sparse
entry (GNU ``tar --sparse``) is written as data and holes, so its holes stay holes.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path

from ..errors import IdeGymError

MAX_ENTRIES = 100_000  # each costs memory here (tarfile keeps them) whatever its size
HEADER_BYTES = 512


class DownloadTooLarge(IdeGymError, RuntimeError):
    """A download over its bound; the message names the setting that raises it."""


def extract_within(archive: Path, target: Path, *, limit: int, what: str, setting: str,
                   tar_filter: Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None]) -> None:
    """Extract the gzipped tar ``archive`` into ``target`` unless its entries add up to more than
    ``limit`` bytes (``what`` names the download, ``setting`` how to raise the bound)."""
    with tarfile.open(archive, "r:gz") as tar:
        total = 0
        for count, member in enumerate(tar, 1):
            total += member.size + HEADER_BYTES
            if total > limit:
                raise DownloadTooLarge(f"{what} holds more than {limit} bytes (apparent sizes, sparse files at their "
                                       f"full length), the bound {setting} sets: raise it, or download less")
            if count > MAX_ENTRIES:
                raise DownloadTooLarge(f"{what} holds more than {MAX_ENTRIES} files: download a part of it")
        tar.extractall(path=target, filter=tar_filter)


__all__ = ["DownloadTooLarge", "extract_within", "MAX_ENTRIES"]
