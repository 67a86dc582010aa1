"""The host's build cache (``control_plane/backends/local/oci/build_cache.py``): an OCI image one
control plane built is taken, not built again, by another control plane of the host with the same
inputs; its layers stay in the cache's store.

Real buildah, real control planes (two state directories), one build cache of the test's own
(``IDEGYM_BUILD_CACHE_DIR``), so what the suite's other tests published does not count; the
bases are the suite's (``tests.oci_fixtures``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cp_helpers import REPO, ControlPlaneProcess, wait_job

if TYPE_CHECKING:
    from control_plane.backends.local.oci.build_cache import BuildCache

HIT = "image from the host's build cache"
BUILT = "buildah bud"


# -- the key (no builds) ---------------------------------------------------------------------------


def _context(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("A = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "link").symlink_to("src/a.py")
    return root


def test_the_key_differs_for_every_input_and_not_for_times(tmp_path: Path) -> None:
    """Varies, one at a time: the Dockerfile, a file's content, a file's mode, a file's name, a
    link's target, a new empty directory, the build arguments, the labels, the bases' ids, the
    RUN network, the host configuration's files and proxies, buildah's version."""
    from control_plane.backends.local.oci.build_cache import BuildInputs, build_key

    ctx = _context(tmp_path / "ctx")
    host = tmp_path / "host"
    host.mkdir()
    (host / "pip.conf").write_text("[global]\nindex-url = http://mirror/simple\n")
    inputs = BuildInputs("FROM 0123\nRUN true\n", ctx, {"V": "1"}, {"l": "x"}, ("0123",), False, None, None)
    keys = {"as is": build_key(inputs, "buildah 1.28")}

    def vary(name: str, change: object) -> None:
        keys[name] = build_key(change if isinstance(change, BuildInputs) else inputs, "buildah 1.28")

    def edited(name: str, edit) -> None:  # type: ignore[no-untyped-def]
        copy = tmp_path / f"ctx-{name}"
        shutil.copytree(ctx, copy, symlinks=True)
        edit(copy)
        keys[name] = build_key(BuildInputs(**{**inputs.__dict__, "context": copy}), "buildah 1.28")

    vary("dockerfile", BuildInputs(**{**inputs.__dict__, "dockerfile": "FROM 0123\nRUN true \n"}))
    edited("content", lambda c: (c / "src" / "a.py").write_text("A = 2\n"))
    edited("mode", lambda c: os.chmod(c / "run.sh", 0o644))
    edited("name", lambda c: (c / "src" / "a.py").rename(c / "src" / "b.py"))
    edited("link", lambda c: ((c / "link").unlink(), (c / "link").symlink_to("run.sh")))
    edited("empty dir", lambda c: (c / "new").mkdir())
    vary("build args", BuildInputs(**{**inputs.__dict__, "build_args": {"V": "2"}}))
    vary("labels", BuildInputs(**{**inputs.__dict__, "labels": {"l": "y"}}))
    vary("bases", BuildInputs(**{**inputs.__dict__, "bases": ("4567",)}))
    vary("network", BuildInputs(**{**inputs.__dict__, "network": True}))
    networked = BuildInputs(**{**inputs.__dict__, "network": True, "host_files": host, "host_proxies": {}})
    vary("host files", networked)
    other_host = tmp_path / "host2"
    shutil.copytree(host, other_host)
    (other_host / "pip.conf").write_text("[global]\nindex-url = http://other/simple\n")
    vary("other host files", BuildInputs(**{**networked.__dict__, "host_files": other_host}))
    vary("proxies", BuildInputs(**{**networked.__dict__, "host_proxies": {"http_proxy": "http://p:3128"}}))
    keys["buildah"] = build_key(inputs, "buildah 1.33")
    assert len(set(keys.values())) == len(keys), keys
    # the same inputs: the same key, whenever the files were written
    os.utime(ctx / "src" / "a.py", (1, 1))
    twin = tmp_path / "twin"
    shutil.copytree(ctx, twin, symlinks=True)
    assert build_key(BuildInputs(**{**inputs.__dict__, "context": twin}), "buildah 1.28") == keys["as is"]


# -- real control planes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory, debian_base: str) -> Path:
    return tmp_path_factory.mktemp("build-cache")


def _cp(root: Path, name: str, cache: Path, **env: str) -> ControlPlaneProcess:
    environment = {**os.environ, "IDEGYM_BUILD_CACHE_DIR": str(cache), **env}
    (root / name).mkdir()
    return ControlPlaneProcess(root / name / "state", ["--warm-pool", "0", "--ephemeral"], env=environment)


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory,
        build_cache: Path) -> Iterator[tuple[ControlPlaneProcess, ControlPlaneProcess]]:
    """Two control planes of the module sharing its build cache (each test builds contexts of its own)."""
    root = tmp_path_factory.mktemp("cps")
    first, second = _cp(root, "a", build_cache), _cp(root, "b", build_cache)
    yield first, second
    for cp in (first, second):
        cp.stop()


def _image_context(root: Path, text: str) -> Path:
    (root / "files").mkdir(parents=True)
    (root / "files" / "data.txt").write_text(text + "\n")
    (root / "Dockerfile").write_text(
        "FROM debian:bookworm\n"
        "COPY files/ /opt/files/\n"
        # a RUN step whose result differs with every build (a fresh random token): a sandbox of
        # the cached image sees the same token as the one built, not one of a second build
        "RUN head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /opt/built-token\n"
        "WORKDIR /opt/files\n")
    return root


def _yaml(name: str, context: Path) -> str:
    return f"images:\n  - name: {name}\n    dockerfile: Dockerfile\n    context: {context}\n"


def _build(cp: ControlPlaneProcess, yaml_text: str) -> list[dict]:
    resp = cp.http.post("/api/build-push-images", json={"yaml_content": yaml_text})
    assert resp.status_code == 200, resp.text
    return [wait_job(cp, name, 600, 0.2) for name in resp.json()["job_names"]]


def _built(job: dict) -> bool:
    """Whether the job built its image (True) or took it from the build cache (False)."""
    assert job["status"] == "success", job["details"]
    assert (BUILT in job["details"]) != (HIT in job["details"]), job["details"]
    return BUILT in job["details"]


def _run(cp: ControlPlaneProcess, tag: str, command: str) -> str:
    client = cp.register()
    sid = cp.start_server(client, image_tag=tag)["server_id"]
    out = cp.bash(client, sid, command)
    assert out["exit_code"] == 0, out
    return str(out["stdout"])


def _layers(cp: ControlPlaneProcess, tag: str) -> list[str]:
    from control_plane.backends.local.images import ImageStore

    meta = ImageStore(cp.state_dir / "images").meta(tag)
    assert meta is not None, tag
    return list(meta["oci"]["layers"])


COMMAND = "cat /opt/built-token; echo; cat data.txt; sha256sum /usr/bin/bash /etc/debian_version"


def test_another_control_plane_takes_the_image_and_outlives_the_first(
        two: tuple[ControlPlaneProcess, ControlPlaneProcess], build_cache: Path, tmp_path: Path) -> None:
    _, second = two
    context = _image_context(tmp_path / "ctx", "one")
    first = _cp(tmp_path, "first", build_cache)
    try:
        (built,) = _build(first, _yaml("cached-one", context))
        assert _built(built) and "published to the host's build cache" in built["details"], built["details"]
        seen = _run(first, built["tag"], COMMAND)
    finally:
        first.stop()
    (taken,) = _build(second, _yaml("cached-one", context))
    assert not _built(taken)
    # its layers are the caches' (the base's may be read from the bases' store), none in its state directory
    layers = _layers(second, taken["tag"])
    assert layers[0].startswith(str(build_cache)) and not any(str(second.state_dir) in p for p in layers), layers
    # the first control plane and its state directory gone: the second's sandbox is the same image
    shutil.rmtree(first.state_dir)
    assert _run(second, taken["tag"], COMMAND) == seen
    # another context (one byte): built, not taken
    (changed,) = _build(second, _yaml("cached-two", _image_context(tmp_path / "ctx2", "two")))
    assert _built(changed)
    assert _run(second, changed["tag"], "cat data.txt").strip() == "two"


def test_builds_of_one_key_at_once_build_it_once(two: tuple[ControlPlaneProcess, ControlPlaneProcess],
                                                 tmp_path: Path) -> None:
    context = _image_context(tmp_path / "ctx", "at once")
    jobs: dict[int, dict] = {}

    def build(index: int) -> None:
        (jobs[index],) = _build(two[index], _yaml(f"at-once-{index}", context))

    threads = [threading.Thread(target=build, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(_built(job) for job in jobs.values()) == [False, True], jobs
    tokens = {_run(two[i], jobs[i]["tag"], "cat /opt/built-token") for i in (0, 1)}
    assert len(tokens) == 1, tokens


def test_a_partial_entry_is_not_taken(two: tuple[ControlPlaneProcess, ControlPlaneProcess], build_cache: Path,
                                      tmp_path: Path) -> None:
    """What a control plane killed while building leaves: the image in the cache's store without
    its record (killed after buildah's commit, before the rename), or a record whose image is not
    there (removed by hand)."""
    first, second = two
    context = _image_context(tmp_path / "ctx", "partial")
    before = set(build_cache.glob("*.json"))
    (built,) = _build(first, _yaml("partial", context))
    assert _built(built)
    (record,) = set(build_cache.glob("*.json")) - before
    kept = json.loads(record.read_text())
    record.unlink()  # the image is in the store, its record is not
    (again,) = _build(second, _yaml("partial", context))
    assert _built(again)
    record.write_text(json.dumps({**kept, "image_id": "0" * 64}))  # a record naming an image the store lacks
    (fresh,) = _build(first, _yaml("partial-again", context))  # another tag: not in its image store
    assert _built(fresh)
    assert json.loads(record.read_text())["image_id"] != "0" * 64  # the build published itself again


def test_sharing_off_builds(two: tuple[ControlPlaneProcess, ControlPlaneProcess], build_cache: Path,
                            tmp_path: Path) -> None:
    context = _image_context(tmp_path / "ctx", "off")
    (built,) = _build(two[0], _yaml("shared", context))
    assert _built(built) and "published to the host's build cache" in built["details"], built["details"]
    off = _cp(tmp_path, "off", build_cache, IDEGYM_BUILD_CACHE="0")
    try:
        (again,) = _build(off, _yaml("shared", context))
        assert _built(again) and "published" not in again["details"], again["details"]
    finally:
        off.stop()


def test_prune_removes_what_no_state_directory_reads(two: tuple[ControlPlaneProcess, ControlPlaneProcess],
                                                     build_cache: Path, tmp_path: Path) -> None:
    """``idegym images prune-builds``: an unused image no image store reads goes (its builder's
    state directory is gone; a builder reads its own copy anyway); one a live control plane took
    from the cache stays, however long unused, and still starts."""
    first, second = two
    gone = _cp(tmp_path, "gone", build_cache)
    try:
        (orphan,) = _build(gone, _yaml("orphan", _image_context(tmp_path / "ctx", "orphan")))
        assert _built(orphan)
    finally:
        gone.stop()
    (orphan_id,) = _image_ids(gone)
    shutil.rmtree(gone.state_dir)
    context = _image_context(tmp_path / "ctx2", "kept")
    (made,) = _build(first, _yaml("kept", context))
    (kept,) = _build(second, _yaml("kept", context))
    assert _built(made) and not _built(kept)
    kept_id = _image_meta_id(second, kept["tag"])
    for path in build_cache.glob("*.json"):
        os.utime(path, (1, 1))  # unused for decades
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "idegym"), "images", "prune-builds", "--unused-days", "1"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "IDEGYM_BUILD_CACHE_DIR": str(build_cache)})
    assert proc.returncode == 0, proc.stderr
    removed = [json.loads(line)["removed"]["image_id"] for line in proc.stdout.splitlines()]
    assert orphan_id in removed and kept_id not in removed, (removed, proc.stderr)
    assert kept_id in {json.loads(p.read_text())["image_id"] for p in build_cache.glob("*.json")}
    assert _run(second, kept["tag"], "cat data.txt").strip() == "kept"
    (again,) = _build(second, _yaml("orphan-again", _image_context(tmp_path / "ctx3", "orphan")))
    assert _built(again)  # the orphan's inputs: its record went with it, built again


def test_a_killed_builds_working_container_goes_with_the_next_build_none_runs_beside(
        two: tuple[ControlPlaneProcess, ControlPlaneProcess], build_cache: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A build killed mid-way leaves its working container in the cache's store (buildah removes its
    own unless it is killed; here one made with ``buildah from`` in that store). The next build that
    finds no other build running removes it; one that runs beside another build (here: the test
    holds the lock as a running build does) leaves it, since it could be that build's."""
    import fcntl

    from control_plane.backends.local.oci.bases import BaseCache
    from control_plane.backends.local.oci.build_cache import BuildCache
    from control_plane.backends.local.oci.settings import OciSettings

    first, _ = two
    monkeypatch.setenv("IDEGYM_BUILD_CACHE_DIR", str(build_cache))
    settings = OciSettings.from_env()
    cache = BuildCache(settings, BaseCache(settings).store_home)
    (job,) = _build(first, _yaml("leftover-base", _image_context(tmp_path / "ctx", "base")))
    assert _built(job)
    image = _image_meta_id(first, job["tag"])
    leftover = cache.buildah.query(["from", "--pull=never", "--signature-policy", cache.buildah.policy,
                                    image]).strip()
    assert leftover in {name for name in _container_names(cache)}, leftover
    fd = os.open(build_cache / ".builds.lock", os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a build running beside
        (beside,) = _build(first, _yaml("leftover-beside", _image_context(tmp_path / "ctx2", "beside")))
        assert _built(beside)
        assert leftover in _container_names(cache)
    finally:
        os.close(fd)
    (alone,) = _build(first, _yaml("leftover-alone", _image_context(tmp_path / "ctx3", "alone")))
    assert _built(alone)
    assert _container_names(cache) == set()


def _container_names(cache: BuildCache) -> set[str]:
    data = json.loads(cache.buildah.query(["containers", "--json"]) or "null") or []
    return {c["containername"] for c in data}


def _image_meta_id(cp: ControlPlaneProcess, tag: str) -> str:
    from control_plane.backends.local.images import ImageStore

    meta = ImageStore(cp.state_dir / "images").meta(tag)
    assert meta is not None, tag
    return str(meta["oci"]["image_id"])


def _image_ids(cp: ControlPlaneProcess) -> set[str]:
    from control_plane.backends.local.images import ImageStore

    store = ImageStore(cp.state_dir / "images")
    return {meta["oci"]["image_id"] for tag in store.tags() if (meta := store.meta(tag) or {}).get("kind") == "oci"}
