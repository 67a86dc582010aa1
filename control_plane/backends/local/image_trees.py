"""What every local image is made of, and how its trees are copied.

An image holds one directory per root tree it adds to (``TREES``; an OCI image has the one tree
``rootfs``). Every sandbox, whatever its image, gets the mount points the backend binds its
runtime on (``OPT_SKELETON``) and the same hostname, hosts and resolv.conf (``host_files``).
``ImageError`` is what the image store, its builds and its copies raise.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
from pathlib import Path

TREES = ("usr", "etc", "var", "opt", "root", "home")
ROOTFS = "rootfs"  # an OCI image's one tree: the whole root (oci/rootfs.py)
ALL_TREES = (*TREES, ROOTFS)
HOSTNAME = "sandbox"
# Mount points the backend binds its runtime on (created in the built-in /opt layer).
OPT_SKELETON = (
    "idegym/python", "idegym/src", "idegym/site/0", "idegym/site/1", "idegym/site/2", "idegym/site/3",
    "idegym/toolchains/rustup", "idegym/toolchains/cargo", "idegym/image/project", "idegym/layer",
    "idegym/export",
)


class ImageError(Exception):
    pass


def host_files() -> dict[str, str]:
    """The /etc files every sandbox gets, whatever its image (hostname, hosts, resolv.conf…)."""
    try:  # name resolution for sandboxes with network; the content, never a link to the host's
        resolv = Path("/etc/resolv.conf").read_text()
    except OSError:
        resolv = ""
    return {"hostname": HOSTNAME + "\n",
            "hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                     "ff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n",
            "resolv.conf": resolv or "nameserver 127.0.0.1\n",
            "machine-id": secrets.token_hex(16) + "\n"}



def copy_tree(src: Path, dst: Path, *, hardlink: bool = False) -> None:
    """``cp -a`` (modes, owners, times, xattrs incl. overlay whiteouts); ``hardlink`` links files.

    ``src`` itself must be a real directory, never a symlink: a sandbox can replace directories
    it can see (e.g. its project layer's ``upper``) with a link to anywhere on the host, so the
    source is opened with O_NOFOLLOW and copied through that descriptor.
    """
    try:
        fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ImageError(f"cannot copy {src}: not a directory ({exc.strerror})") from exc
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists():
            shutil.rmtree(dst)
        st = os.fstat(fd)
        dst.mkdir()
        os.chmod(dst, stat.S_IMODE(st.st_mode))
        if os.geteuid() == 0:
            os.chown(dst, st.st_uid, st.st_gid)
        args = ["cp", "-a", "-l" if hardlink else "--reflink=auto", f"/proc/self/fd/{fd}/.", str(dst)]
        proc = subprocess.run(args, capture_output=True, pass_fds=(fd,))
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)
    if proc.returncode != 0:
        if hardlink:  # e.g. across filesystems: fall back to a real copy
            shutil.rmtree(dst, ignore_errors=True)
            copy_tree(src, dst)
            return
        raise ImageError(f"copying {src} to {dst} failed: {proc.stderr.decode(errors='replace').strip()}")


def chown_tree(root: Path, uid: int, gid: int) -> None:
    if os.geteuid() != 0:
        return
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)
