"""A sandbox's root filesystem: an image's layers below, the sandbox's own layer on top.

Three steps, each with one job (an image format only has to provide the first's input):

1. ``lower_layers``: image (and the snapshot it is restored from, the fork layers it stands on:
   ``fork_layers.py``) → the lower directories of
   each root tree, top layer first: ``/usr /etc /var /opt /root /home`` for the built-in image's
   family, one tree ``rootfs`` (the whole root, ``oci/rootfs.py``) for an OCI image.
2. ``prepare_layers``: on the host, the sandbox's writable layer of each tree (``upper``/``work``
   pairs, in a size-bounded tmpfs when storage is limited) and its project layer.
3. ``mount_root``: in the launching thread's private mount namespace, a small tmpfs as ``/``
   with one overlay per tree (an OCI image: one overlay as ``/``), and the read-only binds of
   the server's runtime (``/opt/idegym``).

Isolation ``none`` has no root filesystem: the sandbox gets a copy of the project only.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from sandbox_server.project import FORK_LAYERS

from ..base import BackendError
from . import layer_mounts, mounts
from .handle_data import LocalHandleData
from .image_trees import ALL_TREES, ROOTFS, TREES, copy_tree
from .images import ResolvedImage
from .isolation import say_once
from .layout import RUN_INSIDE, TOOL_CGROUPS_INSIDE, Plan
from .runtime import INSIDE
from .storage import DEFAULT_STORAGE_INODES, LayerStorage

log = logging.getLogger(__name__)

MERGED_USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
ROOT_DIRS = (*TREES, "proc", "dev", "tmp", "run", "run/idegym", "run/lock", "mnt", "srv")
MAX_OVERLAY_OPTIONS = 4000  # the mount options must fit in a page


def fork_inside(index: int) -> str:
    """Where a forked sandbox sees its ``index``-th fork layer of the project (read-only)."""
    return f"{INSIDE}/fork/{index}"


def usr_links() -> list[str]:
    """The top-level directories that are symlinks into ``/usr`` on a merged-/usr host."""
    return [name for name in MERGED_USR_LINKS if os.path.isdir(f"/usr/{name}")]


def trees(image: ResolvedImage) -> tuple[str, ...]:
    """The trees a sandbox of ``image`` has a writable layer for."""
    return (ROOTFS,) if image.is_oci else TREES


def lower_layers(plan: Plan) -> dict[str, list[str]]:
    """The lower directories of each tree, top first: the snapshot's layers (staged in the
    sandbox directory, see ``stage_snapshot``) over the image's."""
    levels = _snapshot_levels(plan.snapshot)  # level 0 is the snapshot's own layer: the top
    lowers = {}
    for tree in trees(plan.image):
        staged = [plan.sb / "snap" / str(level) / tree for level in levels]
        forked = plan.forks.tree_levels(tree) if plan.forks else []  # below a snapshot's: older
        image = plan.image.rootfs if tree == ROOTFS else plan.image.lowers[tree]
        lowers[tree] = [str(p) for p in staged if p.is_dir()] + forked + list(image)
    return lowers


def _snapshot_levels(snapshot: Path | None) -> list[int]:
    if snapshot is None or not (snapshot / "levels").is_dir():
        return []
    return sorted(int(p.name) for p in (snapshot / "levels").iterdir() if p.name.isdigit())


def stage_snapshot(plan: Plan) -> None:
    """A snapshot's layers become lower layers of this sandbox (hard-linked: nothing is copied but
    names), and its project layer the start of this sandbox's project layer."""
    snap = plan.snapshot
    assert snap is not None
    for level in _snapshot_levels(snap):
        for tree in ALL_TREES:
            src = snap / "levels" / str(level) / tree
            if src.is_dir():
                copy_tree(src, plan.sb / "snap" / str(level) / tree, hardlink=True)
    if (snap / "project").is_dir():
        copy_tree(snap / "project", plan.layers / "project" / "upper")


def prepare_layers(plan: Plan, data: LocalHandleData, *, isolated: bool, storage: LayerStorage | None) -> None:
    """The sandbox's writable layers on the host (``plan.layers``), its log, and ``plan.lowers``.
    With ``storage``, the layers are a filesystem of their own bounded by ``plan.storage_bytes``
    and ``plan.storage_inodes``; without, a requested bound is a tmpfs (RAM)."""
    layers = plan.layers
    layers.mkdir(mode=0o700)
    if plan.storage_bytes and isolated and storage is not None:
        with layer_mounts.held(plan.space.root):
            storage.mount(layers, plan.layers_image, plan.storage_bytes,
                          plan.storage_inodes or DEFAULT_STORAGE_INODES)
        data.layers_fs = "ext4"
    elif plan.limits.storage_bytes and isolated:
        with layer_mounts.held(plan.space.root):
            mounts.mount("idegym-layers", layers, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV,
                         f"size={plan.limits.storage_bytes},mode=0700")
        data.layers_fs = "tmpfs"
    elif plan.limits.storage_bytes:
        say_once("storage-ignored", logging.WARNING,
                 "local backend: ephemeral-storage limits are not enforced without isolation")
    plan.log.touch(mode=0o600)
    if not isolated:
        project = plan.sb / "project"
        if plan.snapshot is not None and (plan.snapshot / "project").is_dir():
            copy_tree(plan.snapshot / "project", project)
        else:
            project.mkdir()
        return
    for tree in (*trees(plan.image), "project"):
        (layers / tree / "upper").mkdir(parents=True)
        (layers / tree / "work").mkdir()
    os.chmod(layers / "project", 0o700)
    forked = plan.forks.project_levels() if plan.forks else []
    lower = os.stat(forked[0] if forked else plan.project_lower)
    # The overlay's root directory takes its owner and mode from the upper directory.
    upper = layers / "project" / "upper"
    os.chown(upper, lower.st_uid, lower.st_gid)
    os.chmod(upper, lower.st_mode & 0o7777)
    os.utime(upper, ns=(lower.st_atime_ns, lower.st_mtime_ns))
    (plan.sb / "root").mkdir()
    if plan.snapshot is not None:
        stage_snapshot(plan)
    if forked:  # the server stacks them under the project (sandbox_server.project.fork_layers)
        (layers / "project" / FORK_LAYERS).write_text(json.dumps([fork_inside(i) for i in range(len(forked))]))
    plan.lowers = lower_layers(plan)


def _stores_inside_state(plan: Plan, lowers: list[str], state: str) -> list[str]:
    """Lower layers outside the state directory (the shared cache's buildah store) seen through
    binds under the sandbox's directory, in this private namespace: the overlay's options then
    name only state-relative paths (short, and no host path in the sandbox's /proc/mounts)."""
    stores: dict[str, str] = {}
    out = []
    for path in lowers:
        head, sep, tail = path.partition("/overlay/")
        if path.startswith(state) or not sep:
            out.append(path)
            continue
        if head not in stores:
            target = plan.sb / "stores" / str(len(stores))
            target.mkdir(parents=True, exist_ok=True)
            mounts.bind(head, target, readonly=True)
            stores[head] = str(target)
        out.append(f"{stores[head]}/overlay/{tail}")
    return out


def mount_root(plan: Plan, *, state_dir: Path, links: list[str], binds: list[tuple[str, str]],
               tool_cgroups: dict[str, str], tmp_bytes: int, skeletons: tuple[str, ...] = ()) -> None:
    """The sandbox's root tree at ``<sb>/root``, mounted in the calling thread's private mount
    namespace (which bwrap inherits); ``binds`` are the runtime's read-only (host, inside) pairs,
    ``skeletons`` the directories that hold only binds (read-only tmpfs: nothing else can appear
    there), ``tool_cgroups`` the tools' groups (``<sandbox>/tools`` per controller) if any."""
    root = plan.sb / "root"
    r = str(root)
    # Paths relative to the state directory (this thread's cwd is private after unshare):
    # shorter mount options, and /proc/mounts inside shows no host paths.
    os.chdir(state_dir)
    state = str(state_dir) + "/"

    def rel(path: str) -> str:
        return path[len(state):] if path.startswith(state) else path

    layers = rel(str(plan.layers))

    def overlay(tree: str, target: str, flags: int = 0) -> None:
        options = (f"lowerdir={':'.join(rel(p) for p in plan.lowers[tree])},upperdir={layers}/{tree}/upper,"
                   f"workdir={layers}/{tree}/work")
        if len(options) > MAX_OVERLAY_OPTIONS:
            raise BackendError(f"too many layers for /{'' if tree == ROOTFS else tree} ({len(plan.lowers[tree])}): "
                               "the overlay options exceed a page; rebuild the image from fewer layers or snapshots")
        mounts.mount("overlay", target, "overlay", flags, options)

    if plan.image.is_oci:  # the image's own root; its mount points are in our layer (oci/rootfs.py)
        plan.lowers[ROOTFS] = _stores_inside_state(plan, plan.lowers[ROOTFS], state)
        # nodev (bwrap's --bind adds it too): image layers may hold device nodes; none opens a host device
        overlay(ROOTFS, r, mounts.MS_NODEV)
    else:
        mounts.mount("idegym-root", root, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, "size=8m,mode=0755")
        for name in ROOT_DIRS:
            os.mkdir(f"{r}/{name}")
        os.chmod(f"{r}/run/lock", 0o1777)
        for name in links:
            os.symlink(f"usr/{name}", f"{r}/{name}")
        for tree in TREES:
            overlay(tree, f"{r}/{tree}")
    # /tmp: RAM, bounded in bytes and in files (bwrap's own --tmpfs has no inode bound)
    inodes = f",nr_inodes={plan.storage_inodes}" if plan.storage_inodes else ""
    mounts.mount("idegym-tmp", f"{r}/tmp", "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV,
                 f"size={tmp_bytes},mode=1777{inodes}")
    # A skeleton that is itself a bind target would make the remount below the bound filesystem's
    # (the host's!) read-only: only directories that hold binds below them are skeletons.
    skeletons = tuple(inside for inside in skeletons if inside not in {i for _, i in binds})
    for inside in sorted(skeletons, key=len):
        os.makedirs(r + inside, exist_ok=True)
        mounts.mount("idegym-runtime", r + inside, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, "size=64k,mode=0755")
    all_binds = [(host, inside, True) for host, inside in binds]
    fork_levels = plan.forks.project_levels() if plan.forks else []
    all_binds += [(str(p), fork_inside(i), True) for i, p in enumerate(fork_levels)]
    all_binds += [(plan.project_lower, f"{INSIDE}/image/project", True),
                  (str(plan.layers / "project"), f"{INSIDE}/layer", False),
                  (str(plan.run), RUN_INSIDE, False)]
    if plan.export is not None:
        all_binds.append((str(plan.export), f"{INSIDE}/export", False))
    for host, inside, readonly in all_binds:
        target = r + inside
        if os.path.isdir(host):
            os.makedirs(target, exist_ok=True)
        elif not os.path.exists(target):  # a file (e.g. rustup's settings.toml)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            # mknod, not open: a thread forking meanwhile would hold a writable descriptor on the
            # skeleton until its child execs, and the read-only remount below would fail (EBUSY)
            os.mknod(target, stat.S_IFREG | 0o644)
        mounts.bind(host, target, readonly=readonly)
    for inside in skeletons:
        mounts.mount(None, r + inside, None, mounts.MS_REMOUNT | mounts.MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV)
    for ctrl, path in tool_cgroups.items():  # delegated to the server: it starts its tools there
        target = f"{r}{TOOL_CGROUPS_INSIDE}/{ctrl}"
        os.makedirs(target, exist_ok=True)
        mounts.bind(os.path.join(path, "delegated"), target, readonly=False)
