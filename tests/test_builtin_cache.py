"""The built-in image is built once per state of the host and shared by every state directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from control_plane.backends.local import builtin_image
from control_plane.backends.local.builtin_image import BUILTIN_ID, materialize_builtin, source_key
from control_plane.backends.local.images import ImageStore
from control_plane.backends.local.user_cache import LOCK


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("IDEGYM_BUILTIN_CACHE", str(root))
    return root


def entries(cache: Path) -> list[str]:
    """The builds in the cache (not its lock file)."""
    return sorted(p.name for p in cache.iterdir() if p.name != LOCK)


def _tree(root: Path) -> dict[str, tuple[int, int, int, int, int]]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_nlink)
    return out


def test_a_second_state_directory_uses_the_shared_build(cache: Path, tmp_path: Path) -> None:
    first, second = ImageStore(tmp_path / "a" / "images"), ImageStore(tmp_path / "b" / "images")
    first.ensure()
    second.ensure()
    one, two = first.data / BUILTIN_ID, second.data / BUILTIN_ID
    shared = cache / source_key() / "image"
    assert one.resolve() == two.resolve() == shared.resolve()
    assert len(_tree(shared)) > 100 and (shared / "layers" / "etc" / "passwd").is_file()
    # No file gains a link per state directory: sandboxes see link counts.
    assert (shared / "layers" / "etc" / "passwd").stat().st_nlink == 1
    assert second.resolve("idegym/builtin:latest").id == BUILTIN_ID
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)  # its files are in every sandbox


def test_a_changed_source_gives_a_new_build(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "python3"
    source.write_text("one")
    monkeypatch.setattr(builtin_image, "SOURCE_PATHS", (*builtin_image.SOURCE_PATHS, str(source)))
    before = source_key()
    assert source_key() == before
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        assert materialize_builtin(tmp_path / name).startswith("shared")
    assert entries(cache) == [before]
    source.write_text("two!")
    assert source_key() != before
    (tmp_path / "z").mkdir()
    materialize_builtin(tmp_path / "z")
    assert entries(cache) == sorted([before, source_key()])
    assert (tmp_path / "z" / BUILTIN_ID).resolve() == (cache / source_key() / "image").resolve()


def test_a_pruned_build_is_replaced_at_the_next_start(cache: Path, tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "a" / "images")
    store.ensure()
    shutil.rmtree(cache / source_key())  # e.g. pruned, or the cache deleted
    assert not (store.data / BUILTIN_ID / "image.json").exists()
    store.ensure()
    assert (store.data / BUILTIN_ID / "image.json").is_file()


def test_a_cache_others_can_write_is_not_used(cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o777)
    (tmp_path / "x").mkdir()
    with caplog.at_level("WARNING"):
        assert materialize_builtin(tmp_path / "x") == "built for this state directory"
    assert "not using the shared cache" in caplog.text
    assert not (tmp_path / "x" / BUILTIN_ID).is_symlink() and entries(cache) == []
    assert (tmp_path / "x" / BUILTIN_ID / "layers" / "etc" / "passwd").is_file()
