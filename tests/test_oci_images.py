"""OCI images on the local backend (``docs/images.md``): Debian/Python bases, Dockerfile builds with buildah,
sandboxes on an image's own root filesystem.

The builds share one cached ``debian:bookworm`` (``tests.oci_fixtures``) and one control plane
(its own state directory and buildah store, reading the cache's as an additional store); the
done-when image is built once (``task_image``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.local.oci import catalog as bases
from control_plane.backends.local.oci.settings import OciError, find_debian_mirror
from control_plane.dockerfile import base_images
from tests.cp_helpers import ControlPlaneProcess, wait_job
from tests.side_venvs import CLIENT_VENV, side_venv

# -- the catalogue of bases (no builds) ------------------------------------------------------------


@pytest.mark.parametrize(("ref", "release", "slim"), [
    ("debian:bookworm", "bookworm", False), ("debian:12-slim", "bookworm", True), ("debian", "trixie", False),
    ("docker.io/library/debian:trixie-slim", "trixie", True), ("python:3.11", "bookworm", False),
    ("python:3.10-slim", "bookworm", True), ("python:3.12", "trixie", False), ("python:3.13-slim", "trixie", True),
    ("python:3.14", "trixie", False), ("python:3", "trixie", False), ("python:3.12-slim-bookworm", "bookworm", True),
])
def test_supported_bases_map_to_a_debian_release(ref: str, release: str, slim: bool) -> None:
    spec = bases.resolve(ref)
    assert spec is not None and spec.release.codename == release and spec.slim is slim, spec
    if ref.startswith("python"):
        assert spec.note and release in spec.note and "python3" in spec.note and "python3" in spec.packages
    assert spec.key("http://m") != spec.key("http://other")  # the mirror is part of the recipe


def test_python_tie_goes_to_the_newer_release_and_the_mapping_is_explained() -> None:
    spec = bases.resolve("python:3.12")
    assert spec is not None and spec.note == ("python:3.12 -> Debian trixie: its python3 3.13 is the closest to "
                                              "3.12 a Debian release here has")


@pytest.mark.parametrize("ref", ["python:3.8", "python:2.7", "python:3.12-alpine", "debian:buster"])
def test_unsupported_variants_fail_with_the_supported_list(ref: str) -> None:
    with pytest.raises(OciError) as err:
        bases.resolve(ref)
    assert "debian:bookworm" in err.value.message and "python:3.10 to python:3.14" in err.value.message


def test_other_families_are_not_bases() -> None:
    assert bases.resolve("ghcr.io/acme/debian:12") is None and bases.resolve("mcr.microsoft.com/dotnet/sdk:8") is None


def test_the_bases_a_dockerfile_names() -> None:
    text = ("# syntax=docker/dockerfile:1\nARG BASE=debian:bookworm\nFROM --platform=linux/amd64 ${BASE} AS build\n"
            "RUN echo \\\n  continued\nFROM build AS test\nFROM python:3.12-slim\nCOPY --from=build /a /b\n"
            "COPY --from=node:20 /usr/local/bin/node /usr/local/bin/\nFROM scratch\n")
    assert base_images(text) == ["debian:bookworm", "python:3.12-slim", "node:20"]
    assert base_images(text, {"BASE": "debian:trixie"})[0] == "debian:trixie"


def test_a_builds_output_reaches_its_log_whole_also_past_a_very_long_line() -> None:
    """Can fail: buildah's output was read with ``readline``, which drops what it buffered of a
    line past its limit (1 MiB): that much of the log was lost, and the next lines came glued to
    the rest of the long one."""
    import asyncio
    import sys

    from control_plane.backends.local.oci.buildah import output_lines

    script = ("import sys; w = sys.stdout.write; w('before\\n'); w('x' * (2_500_000) + '\\n'); "
              "w('after\\n\\n'); w('no newline at the end')")

    async def lines() -> list[str]:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        got = [line async for line in output_lines(proc.stdout, limit=1 << 20)]
        await proc.wait()
        return got

    got = asyncio.run(lines())
    assert got[0] == "before" and got[-3:] == ["after", "", "no newline at the end"], [x[:20] for x in got]
    assert [len(x) for x in got[1:-3]] == [1 << 20, 1 << 20, 2_500_000 - 2 * (1 << 20)]


def test_debian_mirror_comes_from_apts_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n")
    (tmp_path / "sources.list.d" / "vendor.list").write_text("deb https://vendor.example/apt stable-vendor main\n")
    mirror = find_debian_mirror(root=tmp_path)
    assert (mirror.archive, mirror.security) == ("http://mirror.example/debian", "http://mirror.example/debian-security")
    with pytest.raises(OciError, match="IDEGYM_DEBIAN_MIRROR"):
        find_debian_mirror(root=tmp_path / "nothing")


def test_a_base_being_built_holds_up_no_other_base(debian_base: str, image_cache: Path) -> None:
    """While one base is being built (here mmdebstrap waits on an archive that does not answer), a
    cached base is ready at once, in the same cache; the stalled build fails when the archive
    answers 404, and leaves nothing.

    Can fail: one lock over every base made a build whose base was cached wait for the whole build
    of another (a full ``python:3.13`` took 57 s on a fresh clone, during which every worker's
    builds waited)."""
    import asyncio
    import socket
    import threading

    from control_plane.backends.local.oci.bases import BaseCache
    from control_plane.backends.local.oci.settings import OciSettings

    archive = socket.create_server(("127.0.0.1", 0))  # takes connections (its backlog), answers none yet
    archive.settimeout(0.1)
    mirror = f"http://127.0.0.1:{archive.getsockname()[1]}/debian"
    stalled_lines: list[str] = []
    failed = threading.Event()

    def not_found() -> None:
        while not failed.is_set():
            try:
                conn, _ = archive.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    async def both() -> float:
        stalled = asyncio.create_task(BaseCache(OciSettings(cache_dir=image_cache, debian_mirror=mirror)).ensure(
            bases.resolve("debian:bookworm-slim"), stalled_lines.append, timeout=120))
        answering = threading.Thread(target=not_found)
        try:
            while not any("running apt-get update" in line for line in stalled_lines):  # under the base's lock
                assert not stalled.done(), stalled_lines
                await asyncio.sleep(0.05)
            started = time.monotonic()
            cached = await asyncio.wait_for(BaseCache(OciSettings(cache_dir=image_cache)).ensure(
                bases.resolve(debian_base), lambda line: None), 30)
            took = time.monotonic() - started
            assert cached.cached and not stalled.done(), stalled_lines
        finally:
            answering.start()
            try:
                with pytest.raises(OciError, match="mmdebstrap failed"):
                    await stalled
            finally:
                failed.set()
                answering.join()
                archive.close()
        return took

    assert asyncio.run(both()) < 10
    key = bases.resolve("debian:bookworm-slim").key(find_debian_mirror(mirror).archive)
    assert not list((image_cache / "bases").glob(f"tmp-{key}-*")), "the failed build left its work directory"


# -- builds through the control plane ---------------------------------------------------------------


def _wait_job(cp: ControlPlaneProcess, name: str, timeout: float = 600) -> dict:
    return wait_job(cp, name, timeout, 0.2)


def _build(cp: ControlPlaneProcess, yaml_text: str, timeout: float = 600) -> list[dict]:
    resp = cp.http.post("/api/build-push-images", json={"yaml_content": yaml_text})
    assert resp.status_code == 200, resp.text
    return [_wait_job(cp, name, timeout) for name in resp.json()["job_names"]]


def _buildah(home: Path, *args: str) -> str:
    """buildah on the store ``home`` (a state directory's is ``<state>/images/buildah``)."""
    env = {"PATH": os.environ["PATH"], "CONTAINERS_STORAGE_CONF": str(home / "storage.conf")}
    return subprocess.run(["buildah", *args], capture_output=True, text=True, env=env, check=True).stdout


def _mounts_under(path: Path) -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(path))]


def _task_context(root: Path) -> Path:
    ctx = root / "task"
    (ctx / "src").mkdir(parents=True)
    (ctx / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (ctx / "test_calc.py").write_text("from src.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
                                      "def test_add_negative():\n    assert add(-2, -3) == -5\n")
    (ctx / "Dockerfile").write_text(
        "FROM debian:bookworm\n"
        "RUN apt-get install -y python3-pytest\n"
        "COPY --chown=1000:1000 . /home/appuser/work/\n"
        "RUN echo from-the-dockerfile > /etc/idegym-marker\n")
    return ctx


@pytest.fixture(scope="module")
def oci_cp(debian_base: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneProcess]:
    """One control plane for this module's builds and sandboxes (a warm pool of 1 per image), with a
    build cache of its own (what its failed builds leave is looked for there)."""
    root = tmp_path_factory.mktemp("oci")
    proc = ControlPlaneProcess(root / "state", ["--warm-pool", "1", "--ephemeral"],
                               env={**os.environ, "IDEGYM_BUILD_CACHE_DIR": str(root / "build-cache")})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def task_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _task_context(tmp_path_factory.mktemp("context"))


@pytest.fixture(scope="module")
def task_image(oci_cp: ControlPlaneProcess, task_context: Path) -> dict:
    """The done-when image, built once: `FROM debian:bookworm`, `RUN apt-get install -y python3-pytest`,
    `COPY` (RUN may use the network)."""
    (built,) = _build(oci_cp, f"images:\n  - name: calc-task\n    dockerfile: Dockerfile\n    context: {task_context}\n"
                              "    network: true\n")
    assert built["status"] == "success", built["details"]
    return built


def test_dockerfile_builds_fail_clearly_and_leave_nothing(oci_cp: ControlPlaneProcess) -> None:
    cp = oci_cp
    bad, dotnet, failing = _build(cp, """
images:
  - name: bad-syntax
    dockerfile: |
      FROM debian:bookworm
      FOO bar
  - name: dotnet
    dockerfile: |
      FROM mcr.microsoft.com/dotnet/sdk:8.0
      RUN true
  - name: failing-run
    dockerfile: |
      FROM debian:bookworm
      RUN echo about to fail >&2; exit 7
""")
    assert bad["status"] == "failure" and 'Unknown instruction: "FOO"' in bad["details"], bad
    assert dotnet["status"] == "failure", dotnet
    assert "'mcr.microsoft.com/dotnet/sdk:8.0' is not available" in dotnet["details"] \
        and "mcr.microsoft.com is not reachable" in dotnet["details"] and "debian:bookworm" in dotnet["details"] \
        and "python:3.10 to python:3.14" in dotnet["details"] and "--image-registry" in dotnet["details"], dotnet
    assert failing["status"] == "failure" and "about to fail" in failing["details"] \
        and 'building at STEP "RUN echo about to fail >&2; exit 7": exit status 7' in failing["details"], failing
    # nothing left: no build containers (in its store, nor in the build cache's, where it builds), no mounts,
    # no work directories
    for home in (cp.state_dir / "images" / "buildah", cp.state_dir.parent / "build-cache" / "store"):
        assert _buildah(home, "containers", "--quiet").strip() == "", home
    assert _mounts_under(cp.state_dir) == []
    assert not any((cp.state_dir / "images" / "oci-work").iterdir())


def test_dockerfile_build_is_an_oci_image_and_rebuilds_from_cache(oci_cp: ControlPlaneProcess, task_image: dict,
                                                                  task_context: Path, tmp_path: Path) -> None:
    cp, built = oci_cp, task_image
    yaml_text = (f"images:\n  - name: calc-task\n    dockerfile: Dockerfile\n    context: {task_context}\n"
                 "    network: true\n")
    # the host's package configuration is named by one ARG step per stage (RUN has the network), and
    # what the base stands for by a LABEL step at the end
    assert "STEP 2/6: ARG SSL_CERT_FILE=/run/idegym-host-config/" in built["details"]
    assert "STEP 3/6: RUN apt-get install -y python3-pytest" in built["details"]
    assert 'STEP 6/6: LABEL "org.idegym.substituted.0"="debian:bookworm -> docker.io/library/debian:bookworm"' \
        in built["details"]
    meta = _image_meta(cp, built["tag"])
    assert meta["kind"] == "oci" and meta["project_dir"] == "/home/appuser/work"
    assert meta["bases"][0]["base"] == "docker.io/library/debian:bookworm" and meta["bases"][0]["debian_version"]
    assert sorted(p.name for p in (cp.state_dir / "images" / "data" / meta["id"] / "project").iterdir()) == \
        ["Dockerfile", "src", "test_calc.py"]
    # the shared base's layer is read from the cache, not copied into this state directory
    assert meta["oci"]["layers"][-1].startswith(str(Path(os.environ["IDEGYM_IMAGE_CACHE"])))
    # the same definition again: the tag is there
    (again,) = _build(cp, yaml_text)
    assert again["tag"] == built["tag"] and "already built" in again["details"]
    # rebuilt on purpose: buildah's layer cache makes it the same image, quickly
    started = time.monotonic()
    (rebuilt,) = _build(cp, yaml_text.replace("network: true", "network: true\n    rebuild: true"))
    assert rebuilt["status"] == "success" and "Using cache" in rebuilt["details"], rebuilt["details"]
    assert time.monotonic() - started < 30
    assert _image_meta(cp, rebuilt["tag"])["oci"]["image_id"] == meta["oci"]["image_id"]
    # a changed context is a new tag
    changed_context = tmp_path / "task"
    shutil.copytree(task_context, changed_context)
    (changed_context / "src" / "calc.py").write_text("def add(a, b):\n    return b + a\n")
    (changed,) = _build(cp, yaml_text.replace(str(task_context), str(changed_context)))
    assert changed["status"] == "success" and changed["tag"] != built["tag"]


def test_build_network_is_for_the_build_only_and_one_tag_builds_once(oci_cp: ControlPlaneProcess) -> None:
    cp = oci_cp
    dockerfile = ("    dockerfile: |\n      FROM debian:bookworm\n"
                  "      RUN apt-get install -y --no-install-recommends sqlite3\n")
    (offline,) = _build(cp, "images:\n  - name: needs-packages\n" + dockerfile)
    assert offline["status"] == "failure", offline  # RUN without network cannot fetch the package
    # build_network: RUN fetches it; the same entry twice at once is built once
    yaml_text = "images:\n" + 2 * ("  - name: needs-packages\n" + dockerfile + "    build_network: true\n")
    first, second = _build(cp, yaml_text)
    assert first["status"] == second["status"] == "success" and first["tag"] == second["tag"], (first, second)
    assert sum("was built meanwhile" in job["details"] for job in (first, second)) == 1, (first, second)
    assert _image_meta(cp, first["tag"])["network"] is False
    client = cp.register()
    sid = cp.start_server(client, image_tag=first["tag"])["server_id"]
    probe = cp.bash(client, sid, "sqlite3 -version >/dev/null && echo installed; "
                                 "tail -n +3 /proc/net/dev | cut -d: -f1")
    assert probe["stdout"].split() == ["installed", "lo"], probe  # the sandbox is offline
    resp = cp.http.post("/api/build-push-images", json={"yaml_content": "images:\n  - name: x\n    build_network: 1\n"})
    assert resp.status_code == 400 and "build_network must be true or false" in resp.text, resp.text


def _image_meta(cp: ControlPlaneProcess, tag: str) -> dict:
    from control_plane.backends.local.images import ImageStore

    store = ImageStore(cp.state_dir / "images")
    meta = store.meta(tag)
    assert meta is not None, tag
    return meta


def test_yaml_on_a_debian_base_is_built_with_buildah(oci_cp: ControlPlaneProcess, tmp_path: Path) -> None:
    project = tmp_path / "calc"
    project.mkdir()
    (project / "calc.py").write_text("x = 1\n")
    (built,) = _build(oci_cp, f"""
images:
  - name: yaml-on-debian
    base: debian:bookworm
    project: {{path: {project}}}
    commands:
      - echo yaml-commands > /opt/marker
      - chown -R appuser /home/appuser/work
    env: {{MODE: fast}}
""")
    assert built["status"] == "success", built["details"]
    assert "rendered Dockerfile" in built["details"] and "FROM debian:bookworm" in built["details"]
    meta = _image_meta(oci_cp, built["tag"])
    assert meta["kind"] == "oci" and meta["env"]["MODE"] == "fast"
    assert json.loads(json.dumps(meta["oci"]["config"]))["WorkingDir"] == "/home/appuser/work"


# -- the built-in image runs the API's default scripts ------------------------------------------

CLIENT_PYTHON = CLIENT_VENV / "bin" / "python"
REWARD_SCRIPT = Path(__file__).with_name("published_client_test_reward.py")
SEED_TEST_SCRIPT = "python -m pytest --junitxml=test-results.xml"  # specs/sandbox-server-api.yaml's default


def _published_test_reward(cp: ControlPlaneProcess, image: str, script: str, *, write_tests: bool) -> dict:
    side_venv(CLIENT_VENV)
    argv = [str(CLIENT_PYTHON), str(REWARD_SCRIPT), cp.address, image, script,
            *(["--write-tests"] if write_tests else [])]
    credentials = {"IDEGYM_AUTH_USERNAME": cp.auth[0], "IDEGYM_AUTH_PASSWORD": cp.auth[1]} if cp.auth else {}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, **credentials})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, proc.stdout
    return json.loads(lines[-1].removeprefix("REPORT "))


def test_builtin_image_runs_the_seeds_default_test_script(cp_local: ControlPlaneProcess) -> None:
    report = _published_test_reward(cp_local, "idegym/builtin:latest", SEED_TEST_SCRIPT, write_tests=True)
    assert report["status"] == "success" and report["scores"]["total"] == 2 and report["scores"]["passed"] == 2, report
    client = cp_local.register()
    sid = cp_local.start_server(client)["server_id"]
    out = cp_local.bash(client, sid, "python --version && pytest --version && python -c 'import pytest'")
    assert out["exit_code"] == 0 and out["stdout"].startswith("Python 3"), out


# -- registries: push, and bases pulled through a mirror ----------------------------------------


def test_push_to_a_registry_and_pull_through_a_mirror(oci_cp: ControlPlaneProcess, registry: str,
                                                      tmp_path: Path) -> None:
    import sys

    import httpx

    (built,) = _build(oci_cp, """
images:
  - name: pushed
    dockerfile: |
      FROM debian:bookworm
      RUN echo pushed-through-a-registry > /etc/pushed-marker
""")
    assert built["status"] == "success", built["details"]
    idegym = Path(sys.executable).with_name("idegym")
    for dest in (f"{registry}/tasks/pushed:1", f"{registry}/library/ubuntu:22.04"):
        proc = subprocess.run([str(idegym), "images", "push", built["tag"], dest, "--state-dir", str(oci_cp.state_dir),
                               "--tls-verify", "false"], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and f"pushed {built['tag']} to {dest}" in proc.stdout, proc.stdout + proc.stderr
    assert httpx.get(f"http://{registry}/v2/tasks/pushed/tags/list").json()["tags"] == ["1"]
    manifest = httpx.get(f"http://{registry}/v2/tasks/pushed/manifests/1",
                         headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}).json()
    assert len(manifest["layers"]) == 2, manifest  # the Debian base and the RUN step
    # a built-in (host userland) image cannot be pushed, and says why
    proc = subprocess.run([str(idegym), "images", "push", "idegym/builtin:latest", f"{registry}/x:1", "--state-dir",
                           str(oci_cp.state_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not an OCI image" in proc.stderr, proc.stderr
    # with the registry as a mirror, `FROM ubuntu:22.04` is pulled from it (the image pushed above)
    mirrored = ControlPlaneProcess(tmp_path / "mirrored", ["--ephemeral", "--image-registry", f"http://{registry}"])
    try:
        (pulled,) = _build(mirrored, """
images:
  - name: from-the-mirror
    dockerfile: |
      FROM ubuntu:22.04
      RUN grep pushed-through-a-registry /etc/pushed-marker
""")
        assert pulled["status"] == "success", pulled["details"]
        assert f"pulling docker.io/library/ubuntu:22.04 through the registry mirror {registry}" in pulled["details"]
        # pinned by digest, the digest is honoured: the image pulled is the one with that digest
        digest = httpx.head(f"http://{registry}/v2/library/ubuntu/manifests/22.04", headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json"}).headers["Docker-Content-Digest"]
        (pinned,) = _build(mirrored, f"""
images:
  - name: pinned-from-the-mirror
    dockerfile: |
      FROM public.ecr.aws/docker/library/ubuntu:22.04@{digest}
      RUN grep pushed-through-a-registry /etc/pushed-marker
""")
        assert pinned["status"] == "success", pinned["details"]
        assert f"pulling docker.io/library/ubuntu@{digest} through the registry mirror" \
            in pinned["details"] and "is not honoured" not in pinned["details"], pinned["details"]
    finally:
        mirrored.stop()


# -- sandboxes on an OCI image's root filesystem ------------------------------------------------


@pytest.fixture
def host_marker() -> Iterator[Path]:
    """A file in the host's /usr/local, which no sandbox of an OCI image may see."""
    marker = Path("/usr/local") / f"idegym-host-marker-{os.getpid()}-{time.monotonic_ns()}"
    marker.write_text("the host's /usr\n")
    yield marker
    marker.unlink()


def _sha(cp: ControlPlaneProcess, client: str, sid: int, paths: str) -> str:
    out = cp.bash(client, sid, f"sha256sum {paths}")
    assert out["exit_code"] == 0, out
    return out["stdout"]


def test_sandboxes_run_on_the_images_own_root(oci_cp: ControlPlaneProcess, task_image: dict,
                                             host_marker: Path) -> None:
    cp, tag = oci_cp, task_image["tag"]
    # the published client's test reward, on the image's own Python and pytest (Debian's python3-pytest)
    report = _published_test_reward(cp, tag, "python3 -m pytest --junitxml=test-results.xml", write_tests=False)
    assert report["status"] == "success" and report["scores"]["total"] == 2 and report["scores"]["passed"] == 2, report

    client = cp.register()
    sid = cp.start_server(client, image_tag=tag)["server_id"]
    probe = cp.bash(client, sid, f"id -un; pwd; cat /etc/debian_version /etc/idegym-marker; "
                                 f"command -v python3; ls {host_marker} 2>&1; "
                                 "ls /opt/idegym/toolchains 2>/dev/null | wc -l")
    lines = probe["stdout"].splitlines()
    assert lines[:3] == ["appuser", "/home/appuser/work", lines[2]] and lines[2].startswith("12."), probe
    assert lines[3:5] == ["from-the-dockerfile", "/usr/bin/python3"], probe
    assert "No such file" in lines[5] and lines[6] == "0", probe  # not the host's /usr, nor its toolchains
    assert cp.bash(client, sid, "touch /usr/bin/x 2>&1; echo $?")["stdout"].strip() != "0"  # appuser, as always

    # RESET: the project is the image's again, tool processes end, the rest stays
    pristine = _sha(cp, client, sid, "test_calc.py src/calc.py")
    cp.bash(client, sid, "echo broken > src/calc.py; rm test_calc.py; touch new.py; echo kept > /home/appuser/note; "
                         "(sleep 600 &)")
    resp = cp.forward(client, sid, "api/project/reset", {})
    assert resp.status_code == 200, resp.text
    assert _sha(cp, client, sid, "test_calc.py src/calc.py") == pristine
    after = cp.bash(client, sid, "ls new.py 2>&1; cat /home/appuser/note; pgrep -f 'sleep 600' || echo none")
    assert "No such file" in after["stdout"] and "kept" in after["stdout"] and "none" in after["stdout"], after

    # snapshot: the sandbox's layer (outside the project too) comes back in a new server
    cp.bash(client, sid, "echo snapshotted > state.txt; echo outside > /home/appuser/outside.txt")
    resp = cp.http.post("/api/idegym-servers/snapshot", json={"client_id": client, "server_id": sid})
    assert resp.status_code == 202, resp.text
    op = cp.wait_op(resp.json()["operation_id"])
    assert op["status"] == "SUCCEEDED", op
    snap = json.loads(op["result"])
    restored = cp.start_server(client, reuse_strategy="NONE", snapshot={"id": snap["snapshot_id"]})["server_id"]
    again = cp.bash(client, restored, "cat state.txt /home/appuser/outside.txt /etc/idegym-marker")
    assert again["stdout"].splitlines() == ["snapshotted", "outside", "from-the-dockerfile"], again

    # RESTART: as fresh as a new sandbox of the image
    resp = cp.http.post("/api/idegym-servers/restart", json={"client_id": client, "server_id": sid},
                        headers={"Prefer": "wait=60"})
    assert resp.status_code == 200, resp.text
    fresh = cp.bash(client, sid, "ls state.txt /home/appuser/outside.txt 2>&1 | grep -c 'No such file'; "
                                 "cat /etc/idegym-marker")
    assert fresh["stdout"].splitlines() == ["2", "from-the-dockerfile"], fresh

    # the warm pool keeps sandboxes of this image too (the control plane runs with --warm-pool 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready = [line for line in cp.http.get("/metrics").text.splitlines()
                 if line.startswith("idegym_warm_pool_ready{") and tag in line]
        if ready and float(ready[0].rsplit(" ", 1)[1]) >= 1:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"no warm sandbox of {tag}: {ready}")
    pooled = cp.start_server(client, image_tag=tag, reuse_strategy="NONE")["server_id"]
    assert cp.bash(client, pooled, "cat /etc/idegym-marker")["stdout"] == "from-the-dockerfile\n"


def test_an_images_device_nodes_open_nothing_and_host_paths_stay_hidden(oci_cp: ControlPlaneProcess,
                                                                       tmp_path: Path) -> None:
    """Image layers may hold device nodes (buildah's ADD unpacks archives as host root; pulled
    layers can have them): the sandbox's root is mounted nodev and the project copy drops them;
    /proc/mounts names no host path."""
    import io
    import tarfile

    context = tmp_path / "devices"
    context.mkdir()
    with tarfile.open(context / "devices.tar", "w") as tar:
        for name in ("null-copy", "home/appuser/work/dev"):
            node = tarfile.TarInfo(name)
            node.type, node.mode, node.devmajor, node.devminor = tarfile.CHRTYPE, 0o666, 1, 3
            tar.addfile(node)
        data = tarfile.TarInfo("home/appuser/work/file.txt")
        data.size, data.uid, data.gid = 5, 1000, 1000
        tar.addfile(data, io.BytesIO(b"data\n"))
    (built,) = _build(oci_cp, f"""
images:
  - name: with-devices
    dockerfile: |
      FROM debian:bookworm
      ADD devices.tar /
    context: {context}
""")
    assert built["status"] == "success", built["details"]
    client = oci_cp.register()
    for root in (False, True):
        sid = oci_cp.start_server(client, image_tag=built["tag"], run_as_root=root)["server_id"]
        out = oci_cp.bash(client, sid, "ls -l /null-copy; echo x > /null-copy && echo WROTE; ls; cat /proc/mounts")
        assert out["stdout"].startswith("crw-rw-rw-") and "WROTE" not in out["stdout"], out
        assert "Permission denied" in out["stderr"], out
        assert "file.txt" in out["stdout"] and "\ndev\n" not in out["stdout"], out
        assert os.environ["IDEGYM_IMAGE_CACHE"] not in out["stdout"] and str(oci_cp.state_dir) not in out["stdout"], out


def test_a_project_is_laid_over_an_oci_base_where_it_keeps_its_project(oci_cp: ControlPlaneProcess,
                                                                       tmp_path: Path) -> None:
    from control_plane.backends.local.images import ImageStore

    (base,) = _build(oci_cp, """
images:
  - name: app-base
    dockerfile: |
      FROM debian:bookworm
      WORKDIR /app
      RUN echo from-the-base > /app/base.txt && chown -R 1000:1000 /app
""")
    assert base["status"] == "success", base["details"]
    assert _image_meta(oci_cp, base["tag"])["project_dir"] == "/app"  # the final WORKDIR
    project = tmp_path / "calc"
    project.mkdir()
    (project / "calc.py").write_text("x = 1\n")
    # a YAML entry on that base: its project goes over /app
    (task,) = _build(oci_cp, f"images:\n  - name: over-the-base\n    base: {base['tag']}\n"
                             f"    project: {{path: {project}}}\n")
    assert task["status"] == "success", task["details"]
    # a registered project folder on that base: it is the project at /app
    ImageStore(oci_cp.state_dir / "images").register_project("registered-on-oci:1", project, base=base["tag"])
    client = oci_cp.register()
    for tag, files in ((task["tag"], ["base.txt", "calc.py"]), ("registered-on-oci:1", ["calc.py"])):
        sid = oci_cp.start_server(client, image_tag=tag)["server_id"]
        out = oci_cp.bash(client, sid, "pwd; ls; cat /etc/debian_version")
        assert out["stdout"].splitlines()[:-1] == ["/app", *files], (tag, out)


@pytest.mark.slow
def test_a_python_base_maps_to_the_closest_debian_python_and_says_so(oci_cp: ControlPlaneProcess) -> None:
    """python:3.12-slim -> trixie's python3 3.13 (a tie with bookworm's 3.11 goes to the newer): a
    second base build (trixie, slim), and the server's runtime on a newer libc than the host's."""
    (built,) = _build(oci_cp, """
images:
  - name: py312
    dockerfile: |
      FROM python:3.12-slim
      RUN python --version && pip --version && python -c "import sys; assert sys.version_info[:2] == (3, 13)"
""", timeout=1200)
    assert built["status"] == "success", built["details"]
    assert "python:3.12-slim -> Debian trixie: its python3 3.13 is the closest to 3.12" in built["details"]
    meta = _image_meta(oci_cp, built["tag"])
    assert meta["bases"][0]["debian"] == "trixie" and meta["bases"][0]["python"].startswith("3.13"), meta["bases"]
    assert meta["oci"]["config"]["Labels"]["org.idegym.base.python"].startswith("3.13")
    client = oci_cp.register()
    sid = oci_cp.start_server(client, image_tag=built["tag"])["server_id"]
    out = oci_cp.bash(client, sid, "python --version; cat /etc/debian_version")
    lines = out["stdout"].splitlines()
    assert lines[0].startswith("Python 3.13") and lines[1].startswith("13."), out


# -- the deploy/ images, built here ------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO / ".cache" / "wheels"


def _wheelhouse() -> Path:
    """The packages the deploy images install, for pip inside the build (RUN has no network):
    downloaded once with the host's own pip and its configured index."""
    import sys

    if not (WHEELS / ".complete").exists():
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "-d", str(WHEELS),
                               f"{REPO}[kubernetes]", "setuptools>=68", "wheel"], capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (WHEELS / ".complete").write_text("")
    return WHEELS


@pytest.mark.slow
def test_the_deploy_dockerfiles_build_and_hold_what_they_must(oci_cp: ControlPlaneProcess) -> None:
    cp = oci_cp
    wheels = _wheelhouse()
    options = f"--no-index --find-links /context/{wheels.relative_to(REPO)}"
    base, control = _build(cp, f"""
images:
  - name: sandbox-base
    dockerfile: deploy/sandbox-base.Dockerfile
    context: {REPO}
    build_args: {{PIP_INSTALL_OPTIONS: "{options}"}}
  - name: control-plane
    dockerfile: deploy/control-plane.Dockerfile
    context: {REPO}
    build_args: {{PIP_INSTALL_OPTIONS: "{options}"}}
""", timeout=1800)
    for job in (base, control):
        assert job["status"] == "success", job["details"][-3000:]
    assert "python:3.11-slim -> Debian bookworm (python3 3.11)" in base["details"]
    client = cp.register()
    # the sandbox base: its own server in its own virtualenv, appuser, the project directory
    sid = cp.start_server(client, image_tag=base["tag"])["server_id"]
    probe = cp.bash(client, sid, "id -u appuser; pwd; /usr/local/lib/idegym/venv/bin/python -c "
                                 "'import sandbox_server, aiohttp, pydantic, diff_match_patch; print(\"server ok\")'; "
                                 "python3 -c 'import aiohttp' 2>&1 | tail -1")
    assert probe["stdout"].splitlines()[:3] == ["1000", "/home/appuser/work", "server ok"], probe
    assert "No module named 'aiohttp'" in probe["stdout"]  # the task's Python stays the task's
    # ...and the image's own command serves the sandbox API, as a pod would run it
    served = cp.bash(client, sid, "IDEGYM_SERVER_HOST=127.0.0.1 IDEGYM_SERVER_PORT=18765 "
                                  "/usr/local/lib/idegym/venv/bin/python -m sandbox_server serve & "
                                  "for i in $(seq 100); do /usr/local/lib/idegym/venv/bin/python -c "
                                  "\"import urllib.request; "
                                  "print(urllib.request.urlopen('http://127.0.0.1:18765/api/health').status)\" "
                                  "2>/dev/null && break; sleep 0.2; done; kill %1", timeout=60)
    assert "200" in served["stdout"], served
    # the control plane image: idegym with the Kubernetes backend
    sid = cp.start_server(client, image_tag=control["tag"])["server_id"]
    probe = cp.bash(client, sid, "/usr/local/idegym/bin/idegym control-plane serve --help | head -1; "
                                 "/usr/local/idegym/bin/python -c 'import kubernetes, control_plane; print(\"cp ok\")'")
    assert probe["exit_code"] == 0 and "usage:" in probe["stdout"] and "cp ok" in probe["stdout"], probe
