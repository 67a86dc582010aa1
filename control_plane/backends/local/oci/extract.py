"""Read an OCI image's merged root filesystem: its project directory and account files.

Run as ``unshare --mount --propagation private -- python extract.py <json>`` (see
``rootfs.read_image``): the read-only overlay of the image's layers is mounted in that private
namespace and disappears with it. Paths are resolved *inside* the image (an absolute symlink
points into the image, never at the host), so an image cannot make us copy host files.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

ACCOUNT_FILES = ("etc/passwd", "etc/group", "etc/shadow", "etc/gshadow")


def resolve_in_root(root: str, rel: str, limit: int = 40) -> str | None:
    """``rel`` resolved inside ``root`` as if ``root`` were ``/``; None when it does not exist."""
    parts = [p for p in rel.strip("/").split("/") if p not in ("", ".")]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        try:
            st = os.lstat(candidate)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > limit:
                return None
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        resolved.append(part)
    return os.path.join(root, *resolved)


def main(argv: list[str]) -> int:
    req = json.loads(argv[0])
    layers: list[str] = req["layers"]
    out = Path(req["out"])
    with tempfile.TemporaryDirectory(dir=req["scratch"]) as scratch:
        mnt = os.path.join(scratch, "root")
        os.mkdir(mnt)
        if len(layers) == 1:  # a read-only overlay needs two lower layers
            empty = os.path.join(scratch, "empty")
            os.mkdir(empty)
            layers = [empty, *layers]
        options = "ro,lowerdir=" + ":".join(layers)
        proc = subprocess.run(["mount", "-t", "overlay", "-o", options, "idegym-extract", mnt], capture_output=True)
        if proc.returncode != 0:
            reason = proc.stderr.decode(errors="replace").strip()
            print(f"mounting the image's layers failed: {reason}", file=sys.stderr)
            return 2
        try:
            return _read(mnt, req, out)
        finally:
            subprocess.run(["umount", "-l", mnt], capture_output=True)


def _read(mnt: str, req: dict, out: Path) -> int:
    accounts: dict[str, dict[str, object]] = {}
    for rel in ACCOUNT_FILES:
        path = resolve_in_root(mnt, rel)
        if path and os.path.isfile(path):
            st = os.stat(path)
            accounts[rel] = {"text": Path(path).read_text(errors="replace"), "mode": st.st_mode & 0o7777,
                             "uid": st.st_uid, "gid": st.st_gid}
    project = resolve_in_root(mnt, req["project_dir"])
    found = bool(project and os.path.isdir(project))
    facts = {"accounts": accounts, "bash": bool(resolve_in_root(mnt, "bin/bash")), "project_found": found}
    (out / "project").mkdir(parents=True, exist_ok=True)
    if found:
        assert project is not None
        proc = subprocess.run(["cp", "-a", "--", project + "/.", str(out / "project")], capture_output=True)
        if proc.returncode != 0:
            print(f"copying {req['project_dir']} out of the image failed: "
                  f"{proc.stderr.decode(errors='replace').strip()}", file=sys.stderr)
            return 3
        for dirpath, _dirs, files in os.walk(out / "project"):  # a project holds no device nodes
            for name in files:
                path = os.path.join(dirpath, name)
                if stat.S_ISCHR(os.lstat(path).st_mode) or stat.S_ISBLK(os.lstat(path).st_mode):
                    os.unlink(path)
    (out / "facts.json").write_text(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
