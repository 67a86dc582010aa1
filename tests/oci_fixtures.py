"""OCI image fixtures: ONE cached Debian base for the whole suite, reused across runs.

The base lives in the repository's ``.cache/images`` (git-ignored; ``IDEGYM_IMAGE_CACHE`` for
every control plane the tests start): the first run builds it with mmdebstrap (~40 s), later
runs find it there. The host's build cache (``IDEGYM_BUILD_CACHE_DIR``) is the run's own, shared
by its workers: an image is built once per run, and every run builds (what a test says of a
build holds whatever ran before).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO

CACHE = REPO / ".cache" / "images"


@pytest.fixture(scope="session", autouse=True)
def suite_image_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every control plane of the run, from its first test on, builds and finds its bases in the
    suite's cache: not in the user's (``~/.cache``), where a test that ran before any asked for
    ``image_cache`` built its own copy of a base (a fresh machine built ``debian:bookworm`` twice)."""
    base = tmp_path_factory.getbasetemp()
    run_root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common root
    settings = {"IDEGYM_IMAGE_CACHE": str(CACHE), "IDEGYM_BUILD_CACHE_DIR": str(run_root / "build-cache")}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    yield CACHE
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def image_cache(suite_image_cache: Path) -> Path:
    # Fails (not skips) without the tools: `make test` installs them (system-deps).
    for tool in ("buildah", "mmdebstrap"):
        assert shutil.which(tool), f"{tool} is missing: run `make system-deps` (Debian package {tool})"
    return suite_image_cache


@pytest.fixture(scope="session")
def debian_base(image_cache: Path) -> str:
    """``debian:bookworm`` in the shared cache (built once, ever, per checkout)."""
    from control_plane.backends.local.oci.bases import BaseCache
    from control_plane.backends.local.oci.catalog import resolve
    from control_plane.backends.local.oci.settings import OciSettings

    lines: list[str] = []
    built = asyncio.run(BaseCache(OciSettings(cache_dir=image_cache)).ensure(resolve("debian:bookworm"),
                                                                               lines.append))
    assert built.debian_version and built.debian_version.startswith("12"), lines
    return "debian:bookworm"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A real container registry (Debian's docker-registry) on a loopback port: ``host:port``."""
    import subprocess
    import time

    import httpx

    from tests.helpers import free_port

    binary = shutil.which("docker-registry")
    assert binary, "docker-registry is missing: run `make system-deps` (Debian package docker-registry)"
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: "
                      f"{tmp_path / 'registry'}}}\nhttp: {{addr: \"{address}\"}}\n")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://{address}/v2/", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the registry did not start"
            time.sleep(0.1)
        yield address
    finally:
        proc.terminate()
        proc.wait(10)
