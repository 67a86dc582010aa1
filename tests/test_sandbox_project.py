"""Project reset: byte-identical restore and no surviving tool process."""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
from pathlib import Path

from tests.helpers import SandboxProcess, process_alive, wait_until


def tree_digest(root: Path) -> dict[str, str]:
    """Relative path → content hash (or 'dir' / 'link:<target>') plus the mode of each entry."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                out[rel] = f"link:{os.readlink(path)}"
            elif path.is_dir():
                out[rel] = f"dir:{oct(st.st_mode)}"
            else:
                out[rel] = f"{hashlib.sha256(path.read_bytes()).hexdigest()}:{oct(st.st_mode)}"
    return out


def test_reset_restores_the_project_exactly(server: SandboxProcess, project: Path) -> None:
    before = tree_digest(project)
    server.bash(
        "echo changed >> src/app.py; rm README.md; mkdir -p new/dir; echo x > new/dir/f; "
        "chmod 600 src/app.py; ln -s /etc/passwd sneaky; rmdir src 2>/dev/null; true"
    )
    # Change content but restore the size and mtime: only ctime can tell.
    (project / "src" / "app.py").write_text("def add(a, b):\n    return a - b\n")
    os.utime(project / "src" / "app.py", (0, 0))
    assert tree_digest(project) != before
    body = server.post("/api/project/reset", {}).json()
    assert body["status"] == "success"
    assert re.fullmatch(r"Reset project in \d+\.\d{3} seconds\.", body["output"])
    assert tree_digest(project) == before


def test_reset_replaces_a_directory_turned_into_a_file(server: SandboxProcess, project: Path) -> None:
    before = tree_digest(project)
    server.bash("rm -rf src && echo oops > src")
    server.post("/api/project/reset", {})
    assert tree_digest(project) == before


def test_reset_ends_every_tool_process(server: SandboxProcess, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    server.bash(f"(sleep 300 & echo $! >> {pids}); (setsid sleep 300 & echo $! >> {pids}); "
                f"(nohup bash -c 'trap \"\" TERM; sleep 300' >/dev/null 2>&1 & echo $! >> {pids})")
    victims = [int(p) for p in pids.read_text().split()]
    assert all(process_alive(p) for p in victims)
    body = server.post("/api/project/reset", {"graceful_termination_timeout": 0.5}).json()
    assert body["killed_processes"] >= 3
    assert wait_until(lambda: not any(process_alive(p) for p in victims), 3)
    assert process_alive(server.pid)


def test_reset_from_an_archive_source(tmp_path: Path) -> None:
    src = tmp_path / "src-tree" / "proj-1.0"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    archive = tmp_path / "proj.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(src, arcname="proj-1.0")
    project = tmp_path / "work"
    proc = SandboxProcess(project, "unix", tmp_path, extra=["--project-source", str(archive)])
    try:
        assert (project / "pkg" / "mod.py").read_text() == "X = 1\n"  # populated, top dir stripped
        proc.bash("echo 'X = 2' > pkg/mod.py; touch extra")
        assert proc.post("/api/project/reset", {}).json()["status"] == "success"
        assert sorted(p.name for p in project.iterdir()) == ["pkg"]
        assert (project / "pkg" / "mod.py").read_text() == "X = 1\n"
    finally:
        proc.stop()


def test_reset_keeps_files_outside_the_project(server: SandboxProcess, tmp_path: Path) -> None:
    outside = tmp_path / "outside-note"
    server.bash(f"echo keep > {outside}")
    server.post("/api/project/reset", {})
    assert outside.read_text() == "keep\n"
