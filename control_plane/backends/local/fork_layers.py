"""Fork layers: frozen copies of a sandbox's writable layers, shared read-only by its forks.

A fork of sandbox P freezes P's processes (cgroup freezer), copies P's writable layers — what
P changed, never its image — into a new layer, thaws P, and stacks that layer (then P's own
fork layers, if P was itself forked) under each child's own writable layer. The copy costs what
P wrote since its start, not the size of its image or project; a child's disk is its own writes.

    <state>/forks/<id>/
        levels/0/<tree>/      P's writable layer of each root tree (usr, etc, … or rootfs)
        levels/0/project/     P's project layer
        levels/<n>/<tree>/    the snapshot levels P was restored from (hard links)
        tmp/                  P's /tmp (copied into each child's /tmp; it is not a layer)
        layer.json            id, image, the layers below it, size
        holders/<holder>      one empty file per user: ``s-<sandbox>``, ``p-<snapshot>``,
                              ``o-<pid>-<token>`` (a fork in progress in that process)

A layer is removed when its last holder lets go: every sandbox holds every layer of its stack
(so a child outlives its parent), a snapshot of a forked sandbox holds its stack, and a fork in
progress holds what it works on. Holders are files, so the count survives a control-plane
restart: ``sweep`` drops holders whose sandbox or snapshot no longer exists and removes layers
nobody holds. Changes to holders are serialised by a file lock (``idegym sandboxes prune`` may
run beside the control plane).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_server import procfs

from ..base import BackendError
from . import image_trees
from .cgroups import Cgroups
from .image_trees import ALL_TREES
from .layer_copy import CopyError, copy_tree, is_empty

FORKS = "forks"
LAYER_ID = re.compile(r"^f-[0-9a-f]{12}$")
FREEZE_TIMEOUT = 5.0


def sandbox_holder(name: str) -> str:
    return f"s-{name}"


def snapshot_holder(snapshot_id: str) -> str:
    return f"p-{snapshot_id}"


@dataclass(frozen=True)
class ForkStack:
    """What a sandbox forked from others stands on: its fork layers, top first."""

    ids: tuple[str, ...]
    levels: tuple[Path, ...]  # each level holds ``<tree>/`` and maybe ``project/``, top first
    tmp: Path | None = None  # the parent's /tmp at the fork

    def tree_levels(self, tree: str) -> list[str]:
        return [str(level / tree) for level in self.levels if not is_empty(level / tree)]

    def project_levels(self) -> list[Path]:
        return [level / "project" for level in self.levels if (level / "project").is_dir()]


class ForkLayers:
    """The fork layers of one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.root = state_dir / FORKS

    # -- holders ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def path(self, layer_id: str) -> Path:
        if not LAYER_ID.match(layer_id):
            raise BackendError(f"invalid fork layer id {layer_id!r}", 400)
        return self.root / layer_id

    def hold(self, layer_ids: Iterable[str], holder: str) -> None:
        """Make ``holder`` a user of every layer; 409 when one is gone already."""
        ids = list(layer_ids)
        with self._locked():
            missing = [i for i in ids if not (self.path(i) / "layer.json").is_file()]
            if missing:
                raise BackendError(f"fork layers {missing} are gone (their last user was deleted)", 409)
            for layer_id in ids:
                (self.path(layer_id) / "holders" / holder).touch()

    def release(self, holder: str) -> list[str]:
        """``holder`` lets go of every layer it holds; returns the layers that are removed."""
        if not self.root.is_dir():
            return []
        freed = []
        with self._locked():
            for layer in self._layers():
                mark = layer / "holders" / holder
                if os.path.lexists(mark):
                    mark.unlink()
                    if is_empty(layer / "holders"):
                        freed.append(layer.name)
                        self._retire(layer)
        return freed

    def holders(self, layer_id: str) -> set[str]:
        try:
            return set(os.listdir(self.path(layer_id) / "holders"))
        except FileNotFoundError:
            return set()

    def layer_ids(self) -> set[str]:
        return {p.name for p in self._layers()} if self.root.is_dir() else set()

    def sweep(self, alive: Any) -> list[str]:
        """Drop every holder for which ``alive(holder)`` is false and remove the layers nobody
        holds, and what an interrupted run left (half-made and half-removed layers)."""
        if not self.root.is_dir():
            return []
        freed = []
        with self._locked():
            for entry in os.scandir(self.root):
                if entry.name.startswith((".tmp-", ".del-")):
                    shutil.rmtree(entry.path, ignore_errors=True)
            for layer in self._layers():
                for holder in os.listdir(layer / "holders"):
                    if not alive(holder):
                        (layer / "holders" / holder).unlink()
                if is_empty(layer / "holders"):
                    freed.append(layer.name)
                    self._retire(layer)
        return freed

    def _layers(self) -> list[Path]:
        return [Path(e.path) for e in os.scandir(self.root) if LAYER_ID.match(e.name) and e.is_dir()]

    def _retire(self, layer: Path) -> None:
        trash = self.root / f".del-{layer.name}-{secrets.token_hex(3)}"
        try:
            layer.rename(trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    # -- stacks -------------------------------------------------------------------------------------

    def stack(self, layer_ids: Iterable[str]) -> ForkStack:
        """The levels of ``layer_ids`` (top first), and the top one's /tmp."""
        ids = tuple(layer_ids)
        levels: list[Path] = []
        for layer_id in ids:
            root = self.path(layer_id) / "levels"
            try:
                numbers = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
            except FileNotFoundError:
                raise BackendError(f"fork layer {layer_id} is gone", 409) from None
            levels += [root / str(n) for n in numbers]
        tmp = self.path(ids[0]) / "tmp" if ids and (self.path(ids[0]) / "tmp").is_dir() else None
        return ForkStack(ids, tuple(levels), tmp)

    # -- taking a layer -------------------------------------------------------------------------------

    def take(self, data: dict[str, Any], holder: str) -> tuple[str, dict[str, float]]:
        """A new layer from the sandbox ``data`` describes, held by ``holder``: its processes are
        frozen while its layers (and /tmp) are copied, so every file is as one instant left it.
        Returns the layer's id and timings (ms)."""
        sb = Path(data["dir"])
        layer_id = f"f-{secrets.token_hex(6)}"
        self.root.mkdir(mode=0o700, exist_ok=True)
        tmp = self.root / f".tmp-{layer_id}"
        (tmp / "levels" / "0").mkdir(parents=True)
        (tmp / "holders").mkdir()
        (tmp / "holders" / holder).touch()
        timings: dict[str, float] = {}
        started = time.perf_counter()
        cgroups = data.get("cgroups") or {}
        if not cgroups.get("freezer"):
            shutil.rmtree(tmp, ignore_errors=True)
            raise BackendError("fork needs the cgroup freezer (to copy a consistent state): this host's "
                               "sandboxes have no freezer group", 400)
        size = 0
        try:
            frozen = Cgroups.freeze(cgroups, FREEZE_TIMEOUT)
            try:
                if not frozen:
                    raise BackendError(f"sandbox {sb.name}: its processes did not freeze within "
                                       f"{FREEZE_TIMEOUT:g} s (stuck in the kernel?); nothing was forked", 409)
                timings["freeze"] = (time.perf_counter() - started) * 1e3
                size += self._copy_layers(sb, tmp / "levels" / "0")
                size += self._copy_tmp(data, tmp / "tmp")
            finally:
                thaw_started = time.perf_counter()
                Cgroups.thaw(cgroups)
                timings["frozen"] = (thaw_started - started) * 1e3
            snap = sb / "snap"  # the snapshot the parent was restored from: its levels go below
            if snap.is_dir():  # hard links: those levels never change
                for level in sorted(int(p.name) for p in snap.iterdir() if p.name.isdigit()):
                    image_trees.copy_tree(snap / str(level), tmp / "levels" / str(level + 1), hardlink=True)
            meta = {"id": layer_id, "image": data.get("image"), "image_id": data.get("image_id"),
                    "below": list(data.get("forks") or []), "from": sb.name, "created": time.time(),
                    "size_bytes": size}
            (tmp / "layer.json").write_text(json.dumps(meta, indent=1))
            with self._locked():
                tmp.rename(self.path(layer_id))
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, CopyError):
                raise BackendError(f"fork of {sb.name}: {exc}", 409) from exc
            raise
        timings["total"] = (time.perf_counter() - started) * 1e3
        return layer_id, timings

    @staticmethod
    def _copy_layers(sb: Path, level: Path) -> int:
        size = 0
        for tree in (*ALL_TREES, "project"):
            upper = sb / "layers" / tree / "upper"
            if upper.is_dir() and (tree == "project" or not is_empty(upper)):
                size += copy_tree(upper, level / tree)
        return size

    @staticmethod
    def _copy_tmp(data: dict[str, Any], dest: Path) -> int:
        """The sandbox's /tmp (a tmpfs only its processes see), read through its init's root."""
        init = data.get("init")
        if not procfs.recorded_alive(init):
            return 0
        source = f"/proc/{init[0]}/root/tmp"
        if is_empty(Path(source)):
            return 0
        return copy_tree(source, dest)


def seed_tmp(stack: ForkStack, data: dict[str, Any]) -> None:
    """Copy the parent's /tmp into a new child's (before anything runs in it)."""
    if stack.tmp is None:
        return
    init = data.get("init")
    if not procfs.recorded_alive(init):
        raise BackendError(f"sandbox {Path(data['dir']).name} is gone before its /tmp was filled", 500)
    try:
        copy_tree(stack.tmp, f"/proc/{init[0]}/root/tmp", make_root=False)
    except (CopyError, OSError) as exc:
        raise BackendError(f"copying the parent's /tmp into {Path(data['dir']).name} failed: {exc}", 500) from exc
