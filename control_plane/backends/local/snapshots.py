"""Filesystem snapshots of local sandboxes (no process checkpoints: CRIU does not run here).

A snapshot is ``<state>/snapshots/<id>/``: ``levels/<n>/<tree>`` (the sandbox's writable layer
as level 0, the layers of the snapshot it was itself restored from below), ``project/`` (its
project layer) and ``snapshot.json``. The sandbox is frozen while it is copied when the host
has a freezer. Restoring stages the levels as lower layers (``rootfs.stage_snapshot``). A
snapshot of a fork's child also names (and holds) the fork layers the child stands on: those
go below the levels when it is restored.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from ..base import BackendError, SnapshotInfo
from .cgroups import Cgroups
from .fork_layers import ForkLayers, snapshot_holder
from .handle_data import LocalHandleData
from .image_trees import ALL_TREES, ImageError, copy_tree

SNAPSHOT_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


class Snapshots:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.layers = ForkLayers(root.parent)

    def path(self, snapshot_id: str) -> Path:
        if not SNAPSHOT_ID.match(snapshot_id) or snapshot_id.startswith("."):
            raise BackendError(f"invalid snapshot id {snapshot_id!r}", 400)
        return self.root / snapshot_id

    @staticmethod
    def meta(snap: Path) -> dict[str, Any]:
        try:
            return json.loads((snap / "snapshot.json").read_text())
        except (OSError, ValueError):
            raise BackendError(f"snapshot {snap.name!r} does not exist", 404) from None

    @staticmethod
    def new_id(group: str) -> str:
        safe_group = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(group))[:40] or "snapshot"
        return f"{safe_group}-{secrets.token_hex(6)}"

    def take(self, data: LocalHandleData, snapshot_id: str, group: str) -> SnapshotInfo:
        """Copy a sandbox's layers (``data`` is its handle's data) into a new snapshot."""
        sb = Path(data.dir)
        tmp = self.root / f".tmp-{snapshot_id}"
        tmp.mkdir(parents=True)
        freezing = Cgroups.freeze(data.cgroups) if data.cgroups else None
        frozen = bool(freezing)
        try:
            if data.isolation == "bwrap":
                for tree in ALL_TREES:  # the built-in family's trees, or an OCI image's one
                    upper = sb / "layers" / tree / "upper"
                    if upper.is_dir() and any(upper.iterdir()):
                        copy_tree(upper, tmp / "levels" / "0" / tree)
                snap = sb / "snap"
                if snap.is_dir():  # the sandbox itself came from a snapshot: keep those layers below
                    for level in sorted(int(p.name) for p in snap.iterdir() if p.name.isdigit()):
                        copy_tree(snap / str(level), tmp / "levels" / str(level + 1), hardlink=True)
                copy_tree(sb / "layers" / "project" / "upper", tmp / "project")
            else:
                copy_tree(sb / "project", tmp / "project")
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, ImageError):
                raise BackendError(f"snapshot of {data.dir} failed: {exc}", 409) from exc
            raise
        finally:
            if freezing is not None:  # thawed even when freezing did not complete in time
                Cgroups.thaw(data.cgroups)
        size = sum(e.stat(follow_symlinks=False).st_size for e in tmp.rglob("*"))
        meta: dict[str, Any] = {"id": snapshot_id, "group": group, "image": data.image, "image_id": data.image_id,
                                "isolation": data.isolation, "created": time.time(), "frozen": frozen,
                                "size_bytes": size}
        forks = list(data.forks)
        if forks:  # a fork's child: the snapshot stands on its fork layers, and holds them
            meta["forks"] = forks
            try:
                self.layers.hold(forks, snapshot_holder(snapshot_id))
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        (tmp / "snapshot.json").write_text(json.dumps(meta, indent=1))
        tmp.rename(self.root / snapshot_id)
        return SnapshotInfo(snapshot_id, data.image, size)

    def total_bytes(self) -> int:
        """What the snapshots take (each as its record says; levels shared by hard links count in each)."""
        total = 0
        try:
            entries = [e for e in os.scandir(self.root) if e.is_dir() and not e.name.startswith(".")]
        except FileNotFoundError:
            return 0
        for entry in entries:
            try:
                total += int(json.loads(Path(entry.path, "snapshot.json").read_text()).get("size_bytes", 0))
            except (OSError, ValueError, TypeError):
                continue
        return total

    def exists(self, snapshot_id: str) -> bool:
        try:
            return (self.path(snapshot_id) / "snapshot.json").exists()
        except BackendError:
            return False

    def retire(self, snapshot_id: str) -> Path | None:
        """Take a snapshot out of sight at once (a rename); returns the directory to remove."""
        snap = self.path(snapshot_id)
        if not snap.exists():
            return None
        trash = self.root / f".del-{snapshot_id}-{secrets.token_hex(3)}"
        snap.rename(trash)  # sandboxes restored from it hold hard links: they keep working
        self.layers.release(snapshot_holder(snapshot_id))  # (and their own holds on its fork layers)
        return trash
