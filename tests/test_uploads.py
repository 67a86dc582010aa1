"""Uploads: the pack format, and the control plane's ``/api/uploads`` against real HTTP.

A tree packs to the same bytes wherever it lies and whenever it was touched; the control plane
asks for what it lacks, checks the bytes against their name while it reads them, refuses what
``pack`` never makes (absolute paths, ``..``, links out of the tree, hard links, devices, too
many entries) and stores a whole tree or nothing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import socket
import stat
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from control_plane import tree_pack
from tests.cp_helpers import ControlPlaneProcess
from tests.helpers import wait_until


def make_tree(root: Path, marker: str = "") -> Path:
    (root / "src" / "pkg").mkdir(parents=True)
    if marker:  # another tree than the other tests'
        (root / "marker.txt").write_text(marker)
    (root / "src" / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "empty").mkdir()
    os.symlink("src/pkg/mod.py", root / "link.py")
    return root


def packed(root: Path) -> tuple[str, bytes]:
    out = io.BytesIO()
    result = tree_pack.pack(root, out)
    return result.digest, out.getvalue()


# -- the format -------------------------------------------------------------------------------------


def test_a_tree_packs_to_the_same_bytes_wherever_and_whenever(tmp_path: Path) -> None:
    """Can fail: tarfile's defaults write the owner, the times and the host's order."""
    a, b = make_tree(tmp_path / "a"), make_tree(tmp_path / "elsewhere" / "b")
    os.utime(b / "run.sh", (1, 1))
    os.chown(b / "src" / "pkg" / "mod.py", 1234, 1234)
    (b / "src" / "__pycache__").mkdir()
    (b / "src" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"cache")
    digest, data = packed(a)
    assert packed(b) == (digest, data)
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["empty", "link.py", "run.sh", "src", "src/pkg", "src/pkg/mod.py"]
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members.values()} == {(0, 0, "", "", 0)}
    assert members["run.sh"].mode == 0o755 and members["src/pkg/mod.py"].mode == 0o644
    assert members["link.py"].issym() and members["link.py"].linkname == "src/pkg/mod.py"


@pytest.mark.parametrize("change", ["content", "exec bit", "link target", "new empty directory"])
def test_what_a_build_sees_changes_the_digest(tmp_path: Path, change: str) -> None:
    root = make_tree(tmp_path / "t")
    before = packed(root)[0]
    if change == "content":
        (root / "src" / "pkg" / "mod.py").write_text("VALUE = 2\n")
    elif change == "exec bit":
        os.chmod(root / "run.sh", 0o644)
    elif change == "link target":
        (root / "link.py").unlink()
        os.symlink("run.sh", root / "link.py")
    else:
        (root / "more").mkdir()
    assert packed(root)[0] != before


@pytest.mark.security
def test_a_link_out_of_the_tree_is_refused_when_packing(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t")
    os.symlink("/etc/passwd", root / "passwd")
    with pytest.raises(tree_pack.PackError, match="points outside the tree"):
        tree_pack.pack(root)
    (root / "passwd").unlink()
    os.symlink("../../outside", root / "src" / "up")
    with pytest.raises(tree_pack.PackError, match="points outside the tree"):
        tree_pack.pack(root)


# -- the control plane --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneProcess]:
    proc = ControlPlaneProcess(tmp_path_factory.mktemp("uploads") / "state",
                               ["--warm-pool", "0", "--ephemeral", "--max-upload-bytes", "1Mi",
                                "--max-upload-files", "50"], build_roots=[])
    yield proc
    proc.stop()


def put(cp: ControlPlaneProcess, digest: str, data: bytes, **headers: str) -> tuple[int, dict]:
    resp = cp.http.put(f"/api/uploads/{digest}", content=data, headers=headers)
    return resp.status_code, resp.json() if resp.content else {}


def missing(cp: ControlPlaneProcess, *digests: str) -> list[str]:
    resp = cp.http.post("/api/uploads/missing", json={"digests": list(digests)})
    assert resp.status_code == 200, resp.text
    return resp.json()["missing"]


def tmp_entries(cp: ControlPlaneProcess) -> list[str]:
    return sorted(p.name for p in (cp.state_dir / "uploads" / "tmp").iterdir())


def test_an_upload_is_sent_once_and_stored_whole(cp: ControlPlaneProcess, tmp_path: Path) -> None:
    digest, data = packed(make_tree(tmp_path / "t"))
    assert missing(cp, digest, digest) == [digest]
    status, body = put(cp, digest, data)
    assert (status, body["stored"], body["bytes"], body["files"]) == (201, True, len(data), 6)
    assert missing(cp, digest) == []
    status, body = put(cp, digest, data)  # again: answered without a copy
    assert (status, body["stored"]) == (200, False)
    tree = cp.state_dir / "uploads" / "sha256" / digest.split(":")[1]
    assert (tree / "src" / "pkg" / "mod.py").read_text() == "VALUE = 1\n"
    assert stat.S_IMODE((tree / "run.sh").stat().st_mode) == 0o755 and os.readlink(tree / "link.py") == "src/pkg/mod.py"
    assert tmp_entries(cp) == []


def test_a_body_that_is_not_its_name_is_refused(cp: ControlPlaneProcess, tmp_path: Path) -> None:
    digest, data = packed(make_tree(tmp_path / "t", "test_a_body_that_is_not_its_name_is_refused"))
    (tmp_path / "t" / "run.sh").write_text("#!/bin/sh\necho other\n")
    _, other = packed(tmp_path / "t")
    status, body = put(cp, digest, other)
    assert status == 400 and f"the body sent as {digest} is sha256:" in body["message"]
    assert missing(cp, digest) == [digest] and tmp_entries(cp) == []
    assert cp.http.put("/api/uploads/sha256:xyz", content=b"").status_code == 400


def test_an_upload_over_the_limit_is_413_naming_the_flag(cp: ControlPlaneProcess) -> None:
    data = os.urandom(2 << 20)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    status, body = put(cp, digest, data)  # declared too large: refused before a byte is read
    assert status == 413 and "--max-upload-bytes" in body["message"]

    def chunked() -> Iterator[bytes]:  # no length given: refused once it is over
        for i in range(0, len(data), 64 << 10):
            yield data[i:i + (64 << 10)]

    resp = cp.http.put(f"/api/uploads/{digest}", content=chunked())
    assert resp.status_code == 413 and "--max-upload-bytes" in resp.json()["message"]
    assert tmp_entries(cp) == []


def test_a_put_cut_off_leaves_nothing_and_starts_over(cp: ControlPlaneProcess, tmp_path: Path) -> None:
    digest, data = packed(make_tree(tmp_path / "t", "test_a_put_cut_off_leaves_nothing_and_starts_over"))
    assert cp.auth is not None
    auth = "Basic " + base64.b64encode(":".join(cp.auth).encode()).decode()
    with socket.create_connection(("127.0.0.1", cp.port)) as sock:
        sock.sendall(f"PUT /api/uploads/{digest} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data[:len(data) // 2])
        assert wait_until(lambda: tmp_entries(cp) != [], 10)  # being received
    assert wait_until(lambda: tmp_entries(cp) == [], 10), tmp_entries(cp)
    assert missing(cp, digest) == [digest]
    assert put(cp, digest, data)[0] == 201


def evil_tar(add: Callable[[tarfile.TarFile], None]) -> tuple[str, bytes]:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add(tar)
    data = out.getvalue()
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"x", mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _entry(name: str, kind: bytes, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, linkname
        if kind == tarfile.DIRTYPE:
            info.mode = 0o755
        tar.addfile(info)
    return add


EVIL = {
    "absolute path": (lambda t: _file(t, "/tmp/idegym-upload-escape"), "not a plain relative path"),
    "dot-dot": (lambda t: _file(t, "../idegym-upload-escape"), "not a plain relative path"),
    "dot-dot inside": (lambda t: (_entry("a", tarfile.DIRTYPE)(t), _file(t, "a/../../escape")),
                       "not a plain relative path"),
    "link out": (_entry("out", tarfile.SYMTYPE, "/etc"), "leaves the tree"),
    "relative link out": (lambda t: (_entry("a", tarfile.DIRTYPE)(t), _entry("a/up", tarfile.SYMTYPE, "../..")(t)),
                          "leaves the tree"),
    "write through a link": (lambda t: (_entry("l", tarfile.SYMTYPE, "d")(t), _entry("d", tarfile.DIRTYPE)(t),
                                        _file(t, "l/x")), "lies under a symlink"),
    "hard link": (lambda t: (_file(t, "a"), _entry("b", tarfile.LNKTYPE, "a")(t)), "hard link"),
    "device": (_entry("dev", tarfile.CHRTYPE), "device, FIFO or other special file"),
    "fifo": (_entry("fifo", tarfile.FIFOTYPE), "device, FIFO or other special file"),
    "twice": (lambda t: (_file(t, "a"), _file(t, "a", b"y")), "appears twice"),
    "too many entries": (lambda t: [_file(t, f"f{i}") for i in range(51)], "more than 50 entries"),
    "set-uid file": (lambda t: _file(t, "suid", mode=0o4755), None),
    "not a tar": (None, "not a tar archive"),
}


@pytest.mark.security
@pytest.mark.parametrize("case", sorted(EVIL))
def test_an_archive_pack_never_makes_is_refused(cp: ControlPlaneProcess, case: str) -> None:
    """Can fail: unpacked with tarfile's ``extractall`` and no filter, each of these writes where
    it names (seen with the checks of ``tree_pack.unpack`` removed in a throwaway copy)."""
    add, message = EVIL[case]
    if add is None:
        data = b"this is not a tar archive" * 40
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
    else:
        digest, data = evil_tar(add)
    status, body = put(cp, digest, data)
    objects = cp.state_dir / "uploads" / "sha256"
    if message is None:  # a set-uid bit is not refused: files get only 0644 or 0755
        assert status == 201, body
        assert stat.S_IMODE((objects / digest.split(":")[1] / "suid").stat().st_mode) == 0o755
        return
    assert status == 400 and message in body["message"], body
    assert not (objects / digest.split(":")[1]).exists() and missing(cp, digest) == [digest]
    assert not Path("/tmp/idegym-upload-escape").exists() and tmp_entries(cp) == []


def test_a_build_names_an_upload_and_reads_no_host_path(cp: ControlPlaneProcess, tmp_path: Path) -> None:
    """A build from an upload, with no build root; an unknown upload is a 404 that says what to do."""
    from idegym_env.client import IdeGymClient, NotFound

    root = make_tree(tmp_path / "project", "test_a_build_names_an_upload_and_reads_no_host_path")
    with IdeGymClient(cp.url) as client:
        digest = client.upload(root)
        with pytest.raises(NotFound, match="is not on this control plane: send it first"):
            client.build_images(json.dumps({"images": [{"tag": "t/unknown:1",
                                                        "project": {"upload": "sha256:" + "0" * 64}}]}))
        job, = client.build_images(json.dumps({"images": [{"tag": "t/uploaded:1", "project": {"upload": digest}}]}))
        assert job.status == "success", job.details
        with client.start("t/uploaded:1") as sandbox:
            assert sandbox.bash("./run.sh && cat link.py").stdout == "run\nVALUE = 1\n"
        # a path of this machine is sent as an upload: the control plane has no build root
        (root / "more.txt").write_text("more\n")
        job, = client.build_images(json.dumps({"images": [{"tag": "t/path:1", "project": {"path": str(root)}}]}))
        assert job.status == "success", job.details
        with pytest.raises(Exception, match="is not under a directory this control plane builds from"):
            client.build_images(json.dumps({"images": [{"tag": "t/p:2", "project": {"path": str(root)}}]}),
                                upload=False)


def test_uploads_unused_past_their_retention_are_deleted(tmp_path: Path) -> None:
    proc = ControlPlaneProcess(tmp_path / "state", ["--warm-pool", "0", "--ephemeral", "--upload-retention", "1"],
                               build_roots=[])
    try:
        digest, data = packed(make_tree(tmp_path / "t"))
        assert put(proc, digest, data)[0] == 201
        tree = proc.state_dir / "uploads" / "sha256" / digest.split(":")[1]
        assert tree.is_dir()
        assert wait_until(lambda: not tree.exists(), 15, interval=0.1)
        assert missing(proc, digest) == [digest]
    finally:
        proc.stop()


def test_packing_is_cached_by_the_trees_fingerprint(tmp_path: Path) -> None:
    from idegym_env.client._uploads import DIGESTS

    root = make_tree(tmp_path / "t")
    first = DIGESTS.tree(root)
    assert DIGESTS.tree(root).digest == first.digest
    (root / "run.sh").write_text("#!/bin/sh\necho changed\n")  # the same size: its times tell
    assert DIGESTS.tree(root).digest != first.digest
