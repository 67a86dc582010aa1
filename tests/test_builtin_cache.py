"""The built-in image is built once per host state and linked into every new state directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from control_plane.backends.local import builtin_image
from control_plane.backends.local.builtin_image import materialize_builtin, source_key
from control_plane.backends.local.images import ImageStore


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("IDEGYM_BUILTIN_CACHE", str(root))
    return root


def _tree(root: Path) -> dict[str, tuple[int, int, int, int]]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, st.st_size)
    return out


def test_a_second_state_directory_links_the_shared_build(cache: Path, tmp_path: Path) -> None:
    first, second = ImageStore(tmp_path / "a" / "images"), ImageStore(tmp_path / "b" / "images")
    first.ensure()
    second.ensure()
    one = first.data / builtin_image.BUILTIN_ID
    two = second.data / builtin_image.BUILTIN_ID
    assert _tree(one) == _tree(two) and len(_tree(one)) > 100
    passwd = Path("layers/etc/passwd")
    assert (one / passwd).stat().st_ino == (two / passwd).stat().st_ino  # linked, not copied
    assert (one / passwd).stat().st_ino == (cache / source_key() / "image" / passwd).stat().st_ino
    assert second.resolve("idegym/builtin:latest").id == builtin_image.BUILTIN_ID
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)  # its files run in every sandbox


def test_a_changed_source_gives_a_new_build(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "python3"
    source.write_text("one")
    monkeypatch.setattr(builtin_image, "SOURCE_PATHS", (*builtin_image.SOURCE_PATHS, str(source)))
    before = source_key()
    assert source_key() == before
    assert materialize_builtin(tmp_path / "x") == "built"
    assert materialize_builtin(tmp_path / "y").startswith("linked")
    source.write_text("two!")
    assert source_key() != before
    assert materialize_builtin(tmp_path / "z") == "built"
    assert sorted(p.name for p in cache.iterdir()) == sorted([before, source_key()])


def test_a_cache_others_can_write_is_not_used(cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert materialize_builtin(tmp_path / "x") == "built"
    os.chmod(cache, 0o777)
    with caplog.at_level("WARNING"):
        assert materialize_builtin(tmp_path / "y") == "built"
    assert "not using the shared cache" in caplog.text
    assert (tmp_path / "y" / "layers" / "etc" / "passwd").stat().st_ino != \
        (tmp_path / "x" / "layers" / "etc" / "passwd").stat().st_ino
