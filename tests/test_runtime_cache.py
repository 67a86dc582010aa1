"""The compiled package copies bound into sandboxes: shared by every state directory, pruned."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from control_plane.backends.local import runtime
from control_plane.backends.local.runtime import COPY_RETENTION, sync_package


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("IDEGYM_RUNTIME_CACHE", str(tmp_path / "cache"))
    pkg = tmp_path / "src" / "demo_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    return pkg


def test_a_copy_is_made_once_for_every_state_directory(package: Path, tmp_path: Path) -> None:
    first = sync_package(package)
    assert first.parent == tmp_path / "cache"
    assert (first / "demo_pkg" / "__init__.py").read_text() == "VALUE = 1\n"
    assert list((first / "demo_pkg" / "__pycache__").glob("__init__.*.pyc"))  # compiled once, here
    marker = first / ".complete"
    os.utime(marker, (time.time() - 3600, time.time() - 3600))
    again = sync_package(package)
    assert again == first and (again / "demo_pkg").stat().st_ino == (first / "demo_pkg").stat().st_ino
    assert marker.stat().st_mtime > time.time() - 60  # in use: kept from pruning


def test_a_changed_package_gets_a_new_copy_and_stale_ones_are_pruned(package: Path, tmp_path: Path) -> None:
    old = sync_package(package)
    stale = time.time() - COPY_RETENTION - 60
    os.utime(old / ".complete", (stale, stale))
    killed = tmp_path / "cache" / ".tmp-0123456789abcdef-1"  # what a killed copy leaves
    killed.mkdir()
    os.utime(killed, (time.time() - 7200, time.time() - 7200))
    (package / "__init__.py").write_text("VALUE = 22\n")
    new = sync_package(package)
    assert new != old and (new / "demo_pkg" / "__init__.py").read_text() == "VALUE = 22\n"
    assert not old.exists() and not killed.exists()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [new.name]


def test_the_cache_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("IDEGYM_RUNTIME_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert runtime.runtime_cache_dir() == tmp_path / "idegym" / "runtime"


def test_server_dependencies_without_bytecode_are_named_in_a_warning(
        package: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Sandbox servers import these from a read-only bind: without bytecode every start compiles them.
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setattr(runtime, "SERVER_DEPENDENCIES", ("demo_pkg",))
    with caplog.at_level("WARNING", logger=runtime.__name__):
        runtime._warn_without_bytecode()
    assert "demo_pkg installed without bytecode" in caplog.text
    import compileall

    compileall.compile_dir(str(package), quiet=2)
    caplog.clear()
    with caplog.at_level("WARNING", logger=runtime.__name__):
        runtime._warn_without_bytecode()
    assert caplog.text == ""
