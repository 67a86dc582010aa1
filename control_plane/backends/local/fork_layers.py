"""Fork layers: frozen copies of a sandbox's writable layers, shared read-only by its forks.

A fork of sandbox P freezes P's processes (cgroup freezer), copies P's writable layers — what
P changed, never its image — into a new layer, thaws P, and stacks that layer (then P's own
fork layers, if P was itself forked) under each child's own writable layer. The copy costs what
P wrote since its start, not the size of its image or project; a child's disk is its own writes.

    <state>/forks/<id>/
        fs/                   a filesystem of the layer's own (ext4 on a loop device, read-only
                              once made; a plain directory where sandboxes have no bounded storage)
        fs/level/<tree>/      P's writable layer of each root tree (usr, etc, … or rootfs): level 0
        fs/level/project/     P's project layer
        fs/tmp/               P's /tmp (copied into each child's /tmp; it is not a layer)
        layers.ext4           the image of ``fs``
        levels/<n>/<tree>/    the snapshot levels P was restored from (hard links), n ≥ 1
        layer.json            id, image, the layers below it, size
        holders/<holder>      one empty file per user: ``s-<sandbox>``, ``p-<snapshot>``,
                              ``o-<pid>-<token>`` (a fork in progress in that process)
    <state>/forks/.spare-<pid>-<id>/   an empty layer made ahead (levels/, holders/, fs/ mounted)

A layer's filesystem is in the host's mount tree only while an operation of this process uses it
(``reachable``: mounted again read-only when needed, detached after its last user), never between
operations, where a killed control plane would leave it for good: the overlays of the sandboxes
standing on it keep it alive on their own, and it is gone with the last of them. The exception is
a *spare* (``make_spares``): an empty layer whose filesystem is made, after a fork answered, for
the next fork of the same bound, ``.spare-<pid>-<id>``; it holds nothing until a fork copies into
it, the backend's close removes it, and ``sweep`` removes one whose process is gone.

The copy is made while P is frozen, so it goes to a fresh filesystem of its own, made before the
freeze: creating files on the host's filesystem took 100-360 µs each while other sandboxes were
made and deleted (a journal shared with all of them), 10-45 ms for 100 changed files, against
~4 ms into the layer's own filesystem (no journal, nothing else on it).

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
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox_server import procfs

from ..base import BackendError
from . import image_trees, mounts
from .cgroups import Cgroups
from .handle_data import LocalHandleData
from .image_trees import ALL_TREES
from .layer_copy import CopyError, copy_tree, is_empty, underlay
from .storage import IMAGE_NAME, LayerStorage, mount_readonly

FORKS = "forks"
LAYER_ID = re.compile(r"^f-[0-9a-f]{12}$")
FREEZE_TIMEOUT = 5.0
FS = "fs"  # the layer's own filesystem: level 0 and the parent's /tmp
SPARE = ".spare-"  # .spare-<pid>-<id>: a layer's filesystem made ahead of a fork by that process
# A child stands on at most this many fork layers: a fork of a sandbox that stands on as many
# merges them into its new layer (``take``), so a chain of forks costs no more mounts, loop
# devices or overlay layers at depth 100 than at depth 8. The merge copies what the layers below
# hold, once every this many generations; a layer holds what its parent wrote, a few MiB in a
# typical episode.
DEFAULT_MAX_STACK = 8
OPAQUE_KEYS = {"project": "user.overlay.opaque"}  # the server mounts the project overlay with userxattr
# Operations of this process using a layer's filesystem (its directory -> how many): the last one
# to finish detaches it from the host's mount tree.
_users: dict[str, int] = {}
_users_lock = threading.Lock()


def sandbox_holder(name: str) -> str:
    return f"s-{name}"


def snapshot_holder(snapshot_id: str) -> str:
    return f"p-{snapshot_id}"


@dataclass(frozen=True)
class ForkStack:
    """What a sandbox forked from others stands on: its fork layers, top first."""

    ids: tuple[str, ...]
    levels: tuple[Path, ...]  # each level holds ``<tree>/`` and maybe ``project/``, top first
    tmp: Path | None  # the parent's /tmp at the fork
    # Which levels hold each tree and the project, read once (``read``), not by each of a fork's
    # children (their remounts ran the same scans 8 times over, on 2 cores).
    _trees: Mapping[str, tuple[str, ...]] = field(compare=False)
    _projects: tuple[Path, ...] = field(compare=False)

    @classmethod
    def read(cls, ids: tuple[str, ...], levels: tuple[Path, ...], tmp: Path | None) -> ForkStack:
        """The stack of ``levels``, which are reachable and change no more."""
        return cls(ids, levels, tmp,
                   {tree: tuple(str(level / tree) for level in levels if not is_empty(level / tree))
                    for tree in ALL_TREES},
                   tuple(level / "project" for level in levels if (level / "project").is_dir()))

    def tree_levels(self, tree: str) -> list[str]:
        return list(self._trees[tree])

    def project_levels(self) -> list[Path]:
        return list(self._projects)


class ForkLayers:
    """The fork layers of one state directory."""

    def __init__(self, state_dir: Path, max_stack: int = DEFAULT_MAX_STACK) -> None:
        self.state_dir = state_dir
        self.root = state_dir / FORKS
        self.max_stack = max(max_stack, 1)
        self._spares: dict[tuple[int, int], list[tuple[str, Path]]] = {}  # bound -> (id, directory)
        self._wanted: set[tuple[int, int]] = set()  # the bounds forks of this process used
        self._making: set[tuple[int, int]] = set()
        self._spares_lock = threading.Lock()

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

    def hold(self, layer_ids: Iterable[str], *holders: str) -> None:
        """Make each of ``holders`` a user of every layer, under one turn of the lock; 409 when one
        is gone already."""
        ids = list(layer_ids)
        with self._locked():
            missing = [i for i in ids if not (self.path(i) / "layer.json").is_file()]
            if missing:
                raise BackendError(f"fork layers {missing} are gone (their last user was deleted)", 409)
            for layer_id in ids:
                for holder in holders:
                    (self.path(layer_id) / "holders" / holder).touch()

    def release(self, holder: str) -> list[str]:
        """``holder`` lets go of every layer it holds; returns the layers that are removed."""
        if not self.root.is_dir():
            return []
        return self._let_go(None, [holder])

    def unhold(self, layer_ids: Iterable[str], *holders: str) -> list[str]:
        """``hold`` undone: each of ``holders`` lets go of ``layer_ids`` (only); returns the
        layers that are removed."""
        return self._let_go([self.path(i) for i in layer_ids], holders)

    def _let_go(self, layers: list[Path] | None, holders: Iterable[str]) -> list[str]:
        freed, trash = [], []
        with self._locked():
            for layer in self._layers() if layers is None else layers:
                marks = [layer / "holders" / h for h in holders if os.path.lexists(layer / "holders" / h)]
                for mark in marks:
                    mark.unlink()
                if marks and is_empty(layer / "holders"):
                    freed.append(layer.name)
                    trash += self._retire(layer)
        _remove_all(trash)
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
        freed, trash = [], []
        with self._locked():
            for entry in os.scandir(self.root):
                if entry.name.startswith((".tmp-", ".del-")) or _dead_spare(entry.name):
                    _remove(Path(entry.path))
            for layer in self._layers():
                for holder in os.listdir(layer / "holders"):
                    if not alive(holder):
                        (layer / "holders" / holder).unlink()
                if is_empty(layer / "holders"):
                    freed.append(layer.name)
                    trash += self._retire(layer)
                elif not _users.get(str(layer)):  # left mounted by a run cut off mid-operation
                    mounts.umount(layer / FS)
        _remove_all(trash)
        return freed

    def _layers(self) -> list[Path]:
        return [Path(e.path) for e in os.scandir(self.root) if LAYER_ID.match(e.name) and e.is_dir()]

    def _retire(self, layer: Path) -> list[Path]:
        """Take ``layer`` out of use (under the lock); the caller removes what this returns once
        the lock is let go: removing a layer's files took tens of milliseconds under load, and
        every fork's holds wait on the lock."""
        trash = self.root / f".del-{layer.name}-{secrets.token_hex(3)}"
        try:
            layer.rename(trash)
        except FileNotFoundError:
            return []
        return [trash]

    # -- stacks -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def reachable(self, layer_ids: Iterable[str]) -> Iterator[ForkStack]:
        """The stack of ``layer_ids`` with every layer's filesystem mounted for the block (see the
        module doc): what makes overlays on it or copies out of it runs inside."""
        ids = list(layer_ids)
        self.enter(ids)
        try:
            yield self.stack(ids)
        finally:
            self.leave(ids)

    def enter(self, layer_ids: Iterable[str]) -> None:
        """``reachable``'s entry: every layer's filesystem mounted until ``leave``."""
        ids = list(layer_ids)
        entered: list[str] = []
        try:
            for layer_id in ids:
                layer = self.path(layer_id)
                with _users_lock:
                    users = _users.get(str(layer), 0)
                    if users == 0 and (layer / IMAGE_NAME).is_file() and not os.path.ismount(layer / FS):
                        mount_readonly(layer / FS, layer / IMAGE_NAME)
                    _users[str(layer)] = users + 1
                entered.append(layer_id)
        except BaseException:
            self.leave(entered)
            raise

    def leave(self, layer_ids: Iterable[str]) -> None:
        """One user of each layer's filesystem is done (``reachable``'s exit; a ``take``'s
        caller). The last one makes it read-only, which writes a new layer's copy out (nothing
        writes it again; a later mount of its image sees all of it), and detaches it."""
        for layer_id in layer_ids:
            layer = self.path(layer_id)
            with _users_lock:
                users = _users.pop(str(layer), 0) - 1
                if users > 0:
                    _users[str(layer)] = users
                    continue
                fs = layer / FS
                if os.path.ismount(fs):
                    mounts.mount(None, fs, None,
                                 mounts.MS_REMOUNT | mounts.MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV)
                    mounts.umount(fs)

    def stack(self, layer_ids: Iterable[str]) -> ForkStack:
        """The levels of ``layer_ids`` (top first), and the top one's /tmp."""
        ids = tuple(layer_ids)
        levels: list[Path] = []
        for layer_id in ids:
            layer = self.path(layer_id)
            root = layer / "levels"
            try:
                numbers = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
            except FileNotFoundError:
                raise BackendError(f"fork layer {layer_id} is gone", 409) from None
            # Level 0 in the layer's own filesystem (a layer of an earlier version: in levels/0).
            levels += [layer / FS / "level"] if (layer / FS / "level").is_dir() else []
            levels += [root / str(n) for n in numbers]
        top = self.path(ids[0]) if ids else None
        tmp = next((p for p in (top / FS / "tmp", top / "tmp") if p.is_dir()), None) if top else None
        return ForkStack.read(ids, tuple(levels), tmp)

    # -- taking a layer -------------------------------------------------------------------------------

    def take(self, data: LocalHandleData, holder: str, storage: LayerStorage | None = None,
             merge: ForkStack | None = None) -> tuple[str, dict[str, float]]:
        """A new layer from the sandbox ``data`` describes, held by ``holder``: its processes are
        frozen while its layers (and /tmp) are copied, so every file is as one instant left it.
        With ``storage`` and a parent whose layers are bounded, the copy goes to a filesystem of
        the layer's own, as large as the parent's layers and /tmp; it stays mounted for the
        caller, who says ``leave([id])`` when done with it. With ``merge`` (the parent's fork
        layers, reachable), those and the snapshot levels the parent was restored from are merged
        in below the copy once the parent is thawed: the new layer then stands on nothing but the
        image. Returns the layer's id and timings (ms)."""
        sb = Path(data.dir)
        cgroups = data.cgroups
        if not cgroups.get("freezer"):
            raise BackendError("fork needs the cgroup freezer (to copy a consistent state): this host's "
                               "sandboxes have no freezer group", 400)
        self.root.mkdir(mode=0o700, exist_ok=True)
        timings: dict[str, float] = {}
        began = started = time.perf_counter()
        size = 0
        snap = sb / "snap"  # the snapshot the parent was restored from: its levels go below
        snap_levels = sorted(int(p.name) for p in snap.iterdir() if p.name.isdigit()) if snap.is_dir() else []
        merged = len(snap_levels) + len(merge.levels) if merge is not None else 0
        bound = _bound(data, merged) if storage is not None else None
        if bound is not None and not merged:  # a merge's bound (once every max_stack generations): made when needed
            self._wanted.add(bound)
        spare = self._take_spare(bound)
        layer_id = spare[0] if spare else f"f-{secrets.token_hex(6)}"
        tmp = self.root / f".tmp-{layer_id}"
        try:
            if spare is not None:
                spare[1].rename(tmp)  # its filesystem mounted at fs/ comes along
            else:
                self._blank(tmp, storage, bound)
            (tmp / "holders" / holder).touch()
            fs = tmp / FS
            timings["prepare"] = (time.perf_counter() - started) * 1e3
            started = time.perf_counter()
            frozen = Cgroups.freeze(cgroups, FREEZE_TIMEOUT)
            try:
                if not frozen:
                    raise BackendError(f"sandbox {sb.name}: its processes did not freeze within "
                                       f"{FREEZE_TIMEOUT:g} s (stuck in the kernel?); nothing was forked", 409)
                timings["freeze"] = (time.perf_counter() - started) * 1e3
                (fs / "level").mkdir(mode=0o700)
                size += self._copy_layers(sb, fs / "level")
                size += self._copy_tmp(data, fs / "tmp")
            finally:
                thaw_started = time.perf_counter()
                Cgroups.thaw(cgroups)
                timings["frozen"] = (thaw_started - started) * 1e3
            if merge is not None:
                started = time.perf_counter()
                size += _merge(fs / "level", [snap / str(n) for n in snap_levels] + list(merge.levels))
                timings["merge"] = (time.perf_counter() - started) * 1e3
            else:  # hard links: those levels never change
                for level in snap_levels:
                    image_trees.copy_tree(snap / str(level), tmp / "levels" / str(level + 1), hardlink=True)
            meta = {"id": layer_id, "image": data.image, "image_id": data.image_id,
                    "below": [] if merge is not None else list(data.forks), "from": sb.name,
                    "created": time.time(), "size_bytes": size}
            (tmp / "layer.json").write_text(json.dumps(meta, indent=1))
            with self._locked():
                tmp.rename(self.path(layer_id))
                with _users_lock:
                    _users[str(self.path(layer_id))] = 1
        except BaseException as exc:
            _remove(tmp)
            if isinstance(exc, CopyError):
                raise BackendError(f"fork of {sb.name}: {exc}", 409) from exc
            raise
        timings["total"] = (time.perf_counter() - began) * 1e3
        return layer_id, timings

    # -- spare layers: a layer's filesystem made before a fork asks for it -------------------------

    @staticmethod
    def _blank(path: Path, storage: LayerStorage | None, bound: tuple[int, int] | None) -> None:
        """An empty layer at ``path``: its directories, and its filesystem (``bound``) mounted at fs/."""
        (path / "levels").mkdir(parents=True)
        (path / "holders").mkdir()
        (path / FS).mkdir(mode=0o700)
        if bound is not None:
            assert storage is not None
            # nobarrier: the read-only remount at the last ``leave`` writes the copy out without
            # flushing the host's disk; it need only reach the page cache every mount reads through.
            storage.mount(path / FS, path / IMAGE_NAME, *bound, options="nobarrier")

    def _take_spare(self, bound: tuple[int, int] | None) -> tuple[str, Path] | None:
        """A spare layer of ``bound`` (its id, its directory), or None."""
        if bound is None:
            return None
        with self._spares_lock:
            found = self._spares.get(bound)
            while found:
                layer_id, path = found.pop()
                if os.path.ismount(path / FS):  # else removed behind our back: never used
                    return layer_id, path
        return None

    def make_spares(self, storage: LayerStorage | None) -> None:
        """One spare layer for every bound a fork of this process used, made now (after a fork
        answered) so that the next fork's copy goes to a filesystem mounted already: a loop device
        and a mount, 5-30 ms off the fork's path. A spare is ``.spare-<pid>-<id>``: a later run's
        ``sweep`` removes what a killed one left; ``drop_spares`` at a clean end."""
        if storage is None:
            return
        for bound in list(self._wanted):
            with self._spares_lock:
                if self._spares.get(bound) or bound in self._making:
                    continue
                self._making.add(bound)
            layer_id = f"f-{secrets.token_hex(6)}"
            path = self.root / f"{SPARE}{os.getpid()}-{layer_id}"
            try:
                self._blank(path, storage, bound)
            except BaseException:
                _remove(path)
                raise
            finally:
                with self._spares_lock:
                    self._making.discard(bound)
            with self._spares_lock:
                self._spares.setdefault(bound, []).append((layer_id, path))

    def spares(self) -> list[Path]:
        """The spare layers made and not yet used (one per bound, at most)."""
        with self._spares_lock:
            return [path for found in self._spares.values() for _id, path in found]

    def drop_spares(self) -> None:
        """Remove the spare layers (their filesystems unmounted, their loop devices gone with them)."""
        with self._spares_lock:
            spares = [path for found in self._spares.values() for _id, path in found]
            self._spares.clear()
            self._wanted.clear()
        for path in spares:
            _remove(path)

    @staticmethod
    def _copy_layers(sb: Path, level: Path) -> int:
        size = 0
        for tree in (*ALL_TREES, "project"):
            upper = sb / "layers" / tree / "upper"
            if upper.is_dir() and (tree == "project" or not is_empty(upper)):
                size += copy_tree(upper, level / tree)
        return size

    @staticmethod
    def _copy_tmp(data: LocalHandleData, dest: Path) -> int:
        """The sandbox's /tmp (a tmpfs only its processes see), read through its init's root."""
        init = data.init
        if not procfs.recorded_alive(init):
            return 0
        source = f"/proc/{init[0]}/root/tmp"
        if is_empty(Path(source)):
            return 0
        return copy_tree(source, dest)


def _dead_spare(name: str) -> bool:
    """Whether ``name`` is a spare layer of a process that is gone."""
    if not name.startswith(SPARE):
        return False
    pid = name[len(SPARE):].partition("-")[0]
    return not (pid.isdigit() and os.path.isdir(f"/proc/{pid}"))


def _merge(level: Path, lowers: list[Path]) -> int:
    """Merge ``lowers`` (top first) under ``level``, tree by tree (``layer_copy.underlay``)."""
    size = 0
    for lower in lowers:
        for tree in (*ALL_TREES, "project"):
            if (lower / tree).is_dir() and (tree == "project" or not is_empty(lower / tree)):
                size += underlay(lower / tree, level / tree, OPAQUE_KEYS.get(tree, "trusted.overlay.opaque"))
    return size


def _bound(data: LocalHandleData, merged: int = 0) -> tuple[int, int] | None:
    """Bytes and inodes of a filesystem that holds whatever the sandbox's layers and its /tmp can
    hold (their bounds added up; times 1 + ``merged``, the levels merged in, each at most as
    large), or None when its layers are not bounded (a plain directory then). The bounds are the
    configuration's, so one formatted template serves every fork of a kind (the image is sparse:
    a larger bound costs nothing until it is used)."""
    if data.layers_fs != "ext4":
        return None
    sb = Path(data.dir)
    size = os.stat(sb / IMAGE_NAME).st_size
    inodes = os.statvfs(sb / "layers").f_files
    init = data.init
    if procfs.recorded_alive(init):
        tmp = os.statvfs(f"/proc/{init[0]}/root/tmp")  # a tmpfs: its size and inodes are its bounds
        size += tmp.f_blocks * tmp.f_frsize
        inodes += tmp.f_files
    return size * (1 + merged), inodes * (1 + merged)


def _remove_all(paths: list[Path]) -> None:
    for path in paths:
        _remove(path)


def _remove(path: Path) -> None:
    """Remove a layer's directory (made, half-made or retired): its filesystem unmounted first."""
    mounts.umount(path / FS)
    shutil.rmtree(path, ignore_errors=True)


def seed_tmp(stack: ForkStack, data: LocalHandleData) -> None:
    """Copy the parent's /tmp into a new child's (before anything runs in it)."""
    if stack.tmp is None:
        return
    init = data.init
    if not procfs.recorded_alive(init):
        raise BackendError(f"sandbox {Path(data.dir).name} is gone before its /tmp was filled", 500)
    try:
        copy_tree(stack.tmp, f"/proc/{init[0]}/root/tmp", make_root=False)
    except (CopyError, OSError) as exc:
        raise BackendError(f"copying the parent's /tmp into {Path(data.dir).name} failed: {exc}", 500) from exc
