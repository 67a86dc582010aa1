"""The root filesystem of a sandbox of an OCI image.

Lower layers, top first: our *adaptation layer* (below), then the image's own layer
directories in buildah's store (shared by every sandbox and image that uses them, never
written). The sandbox's writes go to its own upper layer, as for every image.

The adaptation layer is small and made once per image when it enters the local store:
``appuser`` (uid 1000) added to the image's ``passwd``/``group`` (and ``shadow``/``gshadow``
when it has them), ``/home/appuser/work``, the mount points the backend binds its runtime on
(``/opt/idegym/...``), ``/proc``, ``/dev``, ``/tmp``, ``/run``, and the hostname, hosts and
resolv.conf every sandbox gets. Nothing of the host's userland is in it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ....appuser import APPUSER, PROJECT_DIR
from ..cgroups import CONTROLLERS as CGROUP_CONTROLLERS
from .settings import OciError

ADAPT_VERSION = 3
RUNTIME_MOUNTS = ("idegym/lib", "idegym/packages/0", "idegym/packages/1", "idegym/packages/2")
ROOT_DIRS = (("proc", 0o555), ("dev", 0o755), ("tmp", 0o1777), ("run", 0o755), ("run/idegym", 0o755),
             ("run/idegym-cgroup", 0o755), ("run/lock", 0o1777), ("mnt", 0o755), ("srv", 0o755),
             ("root", 0o700), ("home", 0o755), ("etc", 0o755), ("opt", 0o755))


def read_image(layers: list[Path], out: Path, scratch: Path, project_dir: str = PROJECT_DIR) -> dict[str, Any]:
    """Copy the image's project directory to ``out/project``; return its account files and facts."""
    request = {"layers": [str(p) for p in layers], "out": str(out), "scratch": str(scratch),
               "project_dir": project_dir}
    # extract.py needs only the standard library: run by its path, nothing of ours is imported.
    argv = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-I",
            str(Path(__file__).with_name("extract.py")), json.dumps(request)]
    proc = subprocess.run(argv, capture_output=True, timeout=1800)
    if proc.returncode != 0:
        raise OciError(f"reading the image's root filesystem failed: {proc.stderr.decode(errors='replace')[-2000:]}",
                       500)
    return json.loads((out / "facts.json").read_text())


def write_adapt_layer(dest: Path, facts: dict[str, Any], host_files: dict[str, str], opt_skeleton: tuple[str, ...],
                      project_dir: str = PROJECT_DIR) -> list[str]:
    """Make the adaptation layer in ``dest``; returns notes about what was added."""
    notes: list[str] = []
    dest.mkdir(parents=True)
    os.chmod(dest, 0o755)
    for rel, mode in ROOT_DIRS:
        (dest / rel).mkdir(parents=True, exist_ok=True)
        os.chmod(dest / rel, mode)
    for ctrl in CGROUP_CONTROLLERS:  # bind targets: the tools' delegated cgroups (backends/local/cgroups.py)
        (dest / "run" / "idegym-cgroup" / "tools" / ctrl).mkdir(parents=True, exist_ok=True)
    name, uid, gid, home = APPUSER
    accounts = facts.get("accounts") or {}
    shell = "/bin/bash" if facts.get("bash") else "/bin/sh"
    passwd = accounts.get("etc/passwd", {}).get("text")
    if passwd is None:
        passwd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        notes.append("the image has no /etc/passwd: root, appuser and nobody provided")
    group = accounts.get("etc/group", {}).get("text")
    if group is None:
        group = "root:x:0:\nnogroup:x:65534:\n"
    users = {line.split(":", 1)[0] for line in passwd.splitlines() if line}
    groups = {line.split(":", 1)[0] for line in group.splitlines() if line}
    files: dict[str, tuple[str, int, int, int]] = {}
    if name not in users:
        passwd = _append(passwd, f"{name}:x:{uid}:{gid}::{home}:{shell}")
        notes.append(f"user {name} (uid {uid}) added for the sandbox's tools")
    if name not in groups:
        group = _append(group, f"{name}:x:{gid}:")
    files["etc/passwd"] = (passwd, 0o644, 0, 0)
    files["etc/group"] = (group, 0o644, 0, 0)
    for rel, line in (("etc/shadow", f"{name}:*:19000:0:99999:7:::"), ("etc/gshadow", f"{name}:*::")):
        info = accounts.get(rel)
        if info is not None:
            text = info["text"]
            if name not in {ln.split(":", 1)[0] for ln in text.splitlines() if ln}:
                text = _append(text, line)
            files[rel] = (text, int(info["mode"]), int(info["uid"]), int(info["gid"]))
    for rel, text in host_files.items():
        files[f"etc/{rel}"] = (text, 0o644, 0, 0)
    for rel, (text, mode, owner, grp) in files.items():
        path = dest / rel
        path.write_text(text)
        os.chmod(path, mode)
        os.chown(path, owner, grp)
    home_dir = dest / home.lstrip("/")
    (home_dir / "work").mkdir(parents=True, exist_ok=True)
    for path in (home_dir, home_dir / "work"):
        os.chown(path, uid, gid)
        os.chmod(path, 0o755)
    if not facts.get("project_found"):  # the server mounts the project there
        (dest / project_dir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for rel in (*opt_skeleton, *RUNTIME_MOUNTS):
        if not rel.startswith("idegym/toolchains"):  # the host's toolchains are not bound in OCI images
            (dest / "opt" / rel).mkdir(parents=True, exist_ok=True)
    for rel in ("idegym/layer", "idegym/export"):
        if (dest / "opt" / rel).is_dir():
            os.chmod(dest / "opt" / rel, 0o700)
    return notes


def _append(text: str, line: str) -> str:
    return (text if text.endswith("\n") or not text else text + "\n") + line + "\n"
