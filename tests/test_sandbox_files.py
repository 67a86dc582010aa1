"""File tools: create, edit, patch, chunked upload/download, listing, path confinement."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import pytest
from diff_match_patch import diff_match_patch

from tests.helpers import SandboxProcess


def make_patch(old: str, new: str) -> str:
    dmp = diff_match_patch()
    return dmp.patch_toText(dmp.patch_make(old, new))


def test_create_makes_parent_directories(any_server: SandboxProcess, project: Path) -> None:
    resp = any_server.post("/api/tools/file/create", {"file_path": "deep/er/new.txt", "content": "héllo"})
    assert resp.status_code == 200 and resp.json() == {"status": "success"}
    assert (project / "deep/er/new.txt").read_bytes() == "héllo".encode()


def test_create_on_a_directory_is_400(server: SandboxProcess) -> None:
    resp = server.post("/api/tools/file/create", {"file_path": "src", "content": "x"})
    assert resp.status_code == 400 and "directory" in resp.json()["message"]


@pytest.mark.parametrize(
    ("start", "end", "new", "expected"),
    [
        (2, 3, "X", "L1\nX\nL4\n"),
        (1, 1, "A\nB", "A\nB\nL2\nL3\nL4\n"),
        (3, 2, "I", "L1\nL2\nI\nL3\nL4\n"),  # insertion before line 3
        (2, 99, "Z", "L1\nZ\n"),  # through the end
        (2, 3, "", "L1\nL4\n"),  # empty content deletes the range
        (5, 4, "tail", "L1\nL2\nL3\nL4\ntail\n"),  # append
        (2, 2, "X\n", "L1\nX\nL3\nL4\n"),  # no doubled newline
    ],
)
def test_edit_replaces_inclusive_one_based_ranges(server: SandboxProcess, project: Path, start: int, end: int,
                                                  new: str, expected: str) -> None:
    (project / "f.txt").write_text("L1\nL2\nL3\nL4\n")
    resp = server.post("/api/tools/file/edit",
                       {"file_path": "f.txt", "start_line": start, "end_line": end, "new_content": new})
    assert resp.status_code == 200, resp.text
    assert (project / "f.txt").read_text() == expected


def test_edit_keeps_crlf_and_handles_missing_final_newline(server: SandboxProcess, project: Path) -> None:
    (project / "w.txt").write_bytes(b"a\r\nb\r\nc")
    server.post("/api/tools/file/edit", {"file_path": "w.txt", "start_line": 2, "end_line": 2, "new_content": "B"})
    assert (project / "w.txt").read_bytes() == b"a\r\nB\nc"
    (project / "n.txt").write_text("a\nb")
    server.post("/api/tools/file/edit", {"file_path": "n.txt", "start_line": 2, "end_line": 2, "new_content": "Y"})
    assert (project / "n.txt").read_text() == "a\nY\n"


@pytest.mark.parametrize(("start", "end"), [(0, 1), (3, 1), (10, 10)])
def test_bad_edit_ranges_are_422_and_leave_the_file(server: SandboxProcess, project: Path, start: int,
                                                    end: int) -> None:
    (project / "f.txt").write_text("L1\nL2\nL3\n")
    resp = server.post("/api/tools/file/edit",
                       {"file_path": "f.txt", "start_line": start, "end_line": end, "new_content": "X"})
    assert resp.status_code == 422
    assert (project / "f.txt").read_text() == "L1\nL2\nL3\n"


def test_edit_missing_file_is_404(server: SandboxProcess) -> None:
    resp = server.post("/api/tools/file/edit",
                       {"file_path": "nope.txt", "start_line": 1, "end_line": 1, "new_content": "X"})
    assert resp.status_code == 404


def test_patch_applies_dmp_patch_text(server: SandboxProcess, project: Path) -> None:
    old = "def f():\n    return 1\n\nprint(f())\n"
    new = "def f():\n    return 2  # changed\n\nprint(f())\nprint('done & ok')\n"
    (project / "p.py").write_text(old)
    resp = server.post("/api/tools/file/patch", {"file_path": "p.py", "patch": make_patch(old, new)})
    assert resp.status_code == 200, resp.text
    assert (project / "p.py").read_text() == new


def test_patch_wire_contract_example(server: SandboxProcess, project: Path) -> None:
    (project / "h.txt").write_text("Hello, world!")
    resp = server.post("/api/tools/file/patch",
                       {"file_path": "h.txt", "patch": "@@ -1,9 +1,11 @@\n-Hello\n+Bonjour\n , wo\n"})
    assert resp.status_code == 200
    assert (project / "h.txt").read_text() == "Bonjour, world!"


def test_patch_that_does_not_apply_is_409_and_file_unchanged(server: SandboxProcess, project: Path) -> None:
    patch = make_patch("alpha beta gamma delta\n" * 3, "alpha BETA gamma delta\n" * 3)
    original = "completely unrelated content that shares nothing\n" * 5
    (project / "u.txt").write_text(original)
    resp = server.post("/api/tools/file/patch", {"file_path": "u.txt", "patch": patch})
    assert resp.status_code == 409
    body = resp.json()
    assert body["details"]["failed_hunks"] and body["details"]["failed_hunks"][0]["header"].startswith("@@")
    assert (project / "u.txt").read_text() == original


@pytest.mark.parametrize("patch", ["", "   ", "this is not a patch", "@@ -1,2 +1,2 @@\n?bad\n"])
def test_empty_or_malformed_patch_is_422(server: SandboxProcess, project: Path, patch: str) -> None:
    (project / "x.txt").write_text("abc\n")
    resp = server.post("/api/tools/file/patch", {"file_path": "x.txt", "patch": patch})
    assert resp.status_code == 422
    assert (project / "x.txt").read_text() == "abc\n"


def _upload(server: SandboxProcess, path: str, data: bytes, chunk: int) -> int:
    offset, size = 0, -1
    while True:
        piece = data[offset: offset + chunk]
        resp = server.post("/api/tools/file/upload", {"file_path": path, "offset": offset, "truncate": True,
                                                      "content_base64": base64.b64encode(piece).decode()})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["bytes_written"] == len(piece)
        offset += body["bytes_written"]
        size = body["size"]
        if offset >= len(data):
            return size


def _download(server: SandboxProcess, path: str, chunk: int) -> bytes:
    parts, offset = [], 0
    while True:
        body = server.post("/api/tools/file/download", {"file_path": path, "offset": offset, "length": chunk}).json()
        piece = base64.b64decode(body["content_base64"], validate=True)
        assert body["bytes_read"] == len(piece) and body["offset"] == offset
        parts.append(piece)
        offset += len(piece)
        if body["eof"] or not piece:
            assert offset == body["size"]
            return b"".join(parts)


def test_fifty_megabytes_round_trip_byte_identical(any_server: SandboxProcess, project: Path) -> None:
    data = os.urandom(50 * 1024 * 1024)
    assert _upload(any_server, "blobs/big.bin", data, 1 << 20) == len(data)
    assert hashlib.sha256((project / "blobs/big.bin").read_bytes()).digest() == hashlib.sha256(data).digest()
    assert hashlib.sha256(_download(any_server, "blobs/big.bin", 1 << 20)).digest() == hashlib.sha256(data).digest()


def test_empty_upload_creates_an_empty_file(server: SandboxProcess, project: Path) -> None:
    (project / "e.bin").write_bytes(b"old content")
    resp = server.post("/api/tools/file/upload", {"file_path": "e.bin", "content_base64": ""})
    assert resp.json() == {"file_path": "e.bin", "bytes_written": 0, "size": 0}
    assert (project / "e.bin").read_bytes() == b""
    body = server.post("/api/tools/file/download", {"file_path": "e.bin"}).json()
    assert body == {"file_path": "e.bin", "offset": 0, "content_base64": "", "bytes_read": 0, "size": 0, "eof": True}


def test_upload_offset_truncate_and_zero_fill(server: SandboxProcess, project: Path) -> None:
    def up(data: bytes, offset: int, truncate: bool) -> dict:
        return server.post("/api/tools/file/upload", {"file_path": "o.bin", "offset": offset, "truncate": truncate,
                                                      "content_base64": base64.b64encode(data).decode()}).json()

    assert up(b"abcdef", 0, True)["size"] == 6
    assert up(b"XY", 2, False)["size"] == 6
    assert (project / "o.bin").read_bytes() == b"abXYef"
    assert up(b"Q", 1, True)["size"] == 2
    assert (project / "o.bin").read_bytes() == b"aQ"
    assert up(b"Z", 5, True)["size"] == 6
    assert (project / "o.bin").read_bytes() == b"aQ\0\0\0Z"


def test_upload_rejects_bad_base64(server: SandboxProcess) -> None:
    for bad in ("not base64!", "YWJj\nZGVm", "YWJjZA"):
        assert server.post("/api/tools/file/upload", {"file_path": "b.bin", "content_base64": bad}).status_code == 422


def test_download_past_eof_and_missing_file(server: SandboxProcess, project: Path) -> None:
    (project / "s.txt").write_bytes(b"0123456789")
    body = server.post("/api/tools/file/download", {"file_path": "s.txt", "offset": 8, "length": 100}).json()
    assert base64.b64decode(body["content_base64"]) == b"89" and body["eof"] and body["size"] == 10
    body = server.post("/api/tools/file/download", {"file_path": "s.txt", "offset": 50}).json()
    assert body["content_base64"] == "" and body["bytes_read"] == 0 and body["eof"] is True
    resp = server.post("/api/tools/file/download", {"file_path": "missing.bin"})
    assert resp.status_code == 404
    assert server.post("/api/tools/file/download", {"file_path": "s.txt", "length": 0}).status_code == 422


def listing(server: SandboxProcess, path: str = ".", **fields: int) -> dict:
    resp = server.post("/api/tools/file/list", {"file_path": path, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_list_sorts_by_name_with_kinds_sizes_and_depth(any_server: SandboxProcess, project: Path) -> None:
    (project / "src" / "pkg" / "deep").mkdir(parents=True)
    (project / "src" / "pkg" / "deep" / "x.txt").write_text("abc")
    (project / "src" / "pkg" / "m.py").write_text("")
    (project / ".hidden").write_text("h")
    (project / "src" / "to-readme").symlink_to("../README.md")
    os.mkfifo(project / "pipe")
    entries = listing(any_server)["entries"]
    assert [(e["path"], e["kind"], e["size"]) for e in entries] == [
        (".hidden", "file", 1), ("README.md", "file", 6), ("pipe", "other", None), ("src", "directory", None),
        ("src/app.py", "file", 32), ("src/pkg", "directory", None), ("src/to-readme", "symlink", None)]
    deeper = listing(any_server, "src", depth=3)
    assert deeper["file_path"] == "src" and not deeper["truncated"]
    assert [e["path"] for e in deeper["entries"]] == [
        "app.py", "pkg", "pkg/deep", "pkg/deep/x.txt", "pkg/m.py", "to-readme"]
    assert [e["path"] for e in listing(any_server, "src/pkg", depth=1)["entries"]] == ["deep", "m.py"]


def test_list_stops_at_max_entries_and_says_so(server: SandboxProcess, project: Path) -> None:
    many = project / "many"
    many.mkdir()
    for i in range(40):
        (many / f"f{i:02}").write_text("")
    (project / "a").mkdir()
    for i in range(5):
        (project / "a" / f"g{i}").write_text("")
    cut = listing(server, max_entries=8)
    assert cut["truncated"] and [e["path"] for e in cut["entries"]] == [
        "README.md", "a", "a/g0", "a/g1", "a/g2", "a/g3", "a/g4", "many"]
    inside = listing(server, "many", max_entries=10)
    assert inside["truncated"] and len(inside["entries"]) == 10
    whole = listing(server, "many", max_entries=40)
    assert not whole["truncated"] and len(whole["entries"]) == 40


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"file_path": "README.md"}, 400, "not a directory"),
    ({"file_path": "missing"}, 404, "no such file"),
    ({"file_path": "."}, 200, ""),
    ({"depth": 0}, 422, ""),
    ({"depth": 11}, 422, ""),
    ({"max_entries": 10_001}, 422, ""),
    ({"file_path": ""}, 422, ""),
])
def test_list_refusals(server: SandboxProcess, body: dict, status: int, message: str) -> None:
    resp = server.post("/api/tools/file/list", body)
    assert resp.status_code == status, resp.text
    assert message in resp.text


@pytest.mark.security
def test_list_never_follows_a_link_out_of_the_project(server: SandboxProcess, project: Path, tmp_path: Path) -> None:
    """Can fail: a walk that entered directories by name (``os.walk(followlinks=True)``, or
    ``os.open`` without ``O_NOFOLLOW``) lists what lies behind ``escape``."""
    secret = tmp_path / "secret-dir"
    secret.mkdir()
    (secret / "token.txt").write_text("secret\n")
    (project / "src" / "escape").symlink_to(secret)
    (project / "src" / "loop").symlink_to(project / "src")
    entries = listing(server, depth=10)["entries"]
    paths = [e["path"] for e in entries]
    assert ("src/escape", "symlink") in [(e["path"], e["kind"]) for e in entries]
    assert not [p for p in paths if "token" in p or p.startswith(("src/escape/", "src/loop/"))], paths


@pytest.mark.parametrize("endpoint", ["create", "edit", "patch", "upload", "download", "list"])
def test_paths_cannot_leave_the_project(server: SandboxProcess, project: Path, tmp_path: Path,
                                        endpoint: str) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    (project / "link").symlink_to(tmp_path)
    bodies = {
        "create": {"content": "pwned"},
        "edit": {"start_line": 1, "end_line": 1, "new_content": "pwned"},
        "patch": {"patch": make_patch("secret\n", "pwned\n")},
        "upload": {"content_base64": base64.b64encode(b"pwned").decode()},
        "download": {},
        "list": {},
    }
    for path in ("../outside.txt", "link/outside.txt", str(outside), "src/../../outside.txt", "link", ".."):
        resp = server.post(f"/api/tools/file/{endpoint}", {"file_path": path, **bodies[endpoint]})
        assert resp.status_code == 403, (path, resp.text)
    assert outside.read_text() == "secret\n"


def test_nul_byte_and_empty_path_are_422(server: SandboxProcess) -> None:
    for path in ("", "a\x00b"):
        assert server.post("/api/tools/file/create", {"file_path": path, "content": "x"}).status_code == 422


def test_file_tools_act_as_the_tool_user(tmp_path: Path) -> None:
    """A server running as root whose tools run as 'nobody' cannot write where nobody cannot."""
    import shutil
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    base = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path is not traversable by nobody
    os.chmod(base, 0o755)
    project = base / "project"
    project.mkdir(mode=0o777)
    os.chmod(project, 0o777)
    (project / "root-only").mkdir(mode=0o700)
    proc = SandboxProcess(project, "tcp", tmp_path, extra=["--tool-user", "nobody"])
    try:
        resp = proc.post("/api/tools/file/create", {"file_path": "root-only/x.txt", "content": "x"})
        assert resp.status_code == 403
        resp = proc.post("/api/tools/file/create", {"file_path": "mine.txt", "content": "x"})
        assert resp.status_code == 200
        assert (project / "mine.txt").stat().st_uid == 65534
        listed = proc.post("/api/tools/file/list", {"depth": 2}).json()["entries"]  # listed, not entered
        assert [e["path"] for e in listed] == ["mine.txt", "root-only"]
        assert proc.post("/api/tools/file/list", {"file_path": "root-only"}).status_code == 403
        assert proc.bash("id -un")["stdout"] == "nobody\n"
    finally:
        proc.stop()
        shutil.rmtree(base)
