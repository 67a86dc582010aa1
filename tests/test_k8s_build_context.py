"""Kubernetes image builds get their build context (``docs/images.md``): a `project.path` or a `context`
directory travels with the build Job (``context.tar.gz`` in its ConfigMap, Kaniko's ``tar://``
context), so `COPY` in the Dockerfile finds the project. Runs on the simulator (tests/k8s_sim),
whose builder stand-in unpacks the context and fails a `COPY` of a file that is not in it."""

from __future__ import annotations

import asyncio
import base64
import io
import tarfile
from pathlib import Path

import pytest

from control_plane.backends.base import BackendError
from control_plane.backends.kubernetes import KubernetesBackend
from control_plane.backends.kubernetes.builds import MAX_CONTEXT_BYTES, build_context, parse_build_yaml
from control_plane.models import Status

pytestmark = pytest.mark.kubernetes


def _run(scenario, config) -> None:
    async def main() -> None:
        backend = KubernetesBackend(config)
        await backend.start()
        try:
            await asyncio.wait_for(scenario(backend), 90)
        finally:
            await backend.close()

    asyncio.run(main())


def test_a_project_path_is_the_build_jobs_context(k8s_config, tmp_path: Path) -> None:
    project = tmp_path / "calc"
    (project / "src").mkdir(parents=True)
    (project / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (project / "test_calc.py").write_text("def test_add():\n    pass\n")
    yaml_text = f"""
images:
  - name: calc-env
    base: python:3.12-slim
    project: {{path: {project}}}
    commands: ["pip install pytest"]
  - name: calc-dockerfile
    dockerfile: |
      FROM python:3.12-slim
      COPY --chown=1000:1000 src /home/appuser/work/src
      COPY test_calc.py /home/appuser/work/
    context: {project}
  - name: missing-file
    dockerfile: |
      FROM python:3.12-slim
      COPY not-in-the-context.txt /home/appuser/work/
    context: {project}
"""
    rendered, own, missing = parse_build_yaml(yaml_text, registry="registry.example.com/idegym")
    with tarfile.open(fileobj=io.BytesIO(build_context(rendered))) as tar:
        assert sorted(tar.getnames()) == ["src", "src/calc.py", "test_calc.py"]

    async def scenario(backend: KubernetesBackend) -> None:
        builder = backend.builder
        job = await builder.submit(rendered)
        configmap = await asyncio.to_thread(backend.core.read_namespaced_config_map, f"{job}-context", "idegym")
        assert "COPY --chown=1000:1000 . /home/appuser/work/" in configmap.data["Dockerfile"]
        assert base64.b64decode(configmap.binary_data["context.tar.gz"])[:2] == b"\x1f\x8b"
        done = await builder.wait(job, timeout=30)
        logs = await builder.logs(job)
        assert done.status == Status.SUCCESS, (done, logs)
        assert "Taking files from the build context: src/calc.py test_calc.py" in logs
        assert await builder.build(own, lambda line: None) == own.tag  # the user's Dockerfile, as written
        with pytest.raises(BackendError, match="not-in-the-context.txt: no such file or directory"):
            await builder.build(missing, lambda line: None)

    _run(scenario, k8s_config)


def test_a_context_too_big_for_a_configmap_is_refused_with_a_way_out(tmp_path: Path) -> None:
    import os

    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "blob.bin").write_bytes(os.urandom(MAX_CONTEXT_BYTES + 1024))  # does not compress
    (definition,) = parse_build_yaml(f"images:\n  - name: big\n    base: debian:bookworm\n"
                                     f"    project: {{path: {tmp_path / 'big'}}}\n")
    with pytest.raises(BackendError) as err:
        build_context(definition)
    assert err.value.status == 413 and "url" in err.value.message and "images push" in err.value.message


def test_kubernetes_build_yaml_needs_a_base_or_a_dockerfile() -> None:
    with pytest.raises(ValueError, match="'base' image \\(or a 'dockerfile'\\)"):
        parse_build_yaml("images:\n  - name: nothing\n    commands: [\"true\"]\n")
    (definition,) = parse_build_yaml("images:\n  - name: df\n    dockerfile: |\n      FROM debian:bookworm\n")
    assert definition.dockerfile and definition.base == "debian:bookworm" and definition.network


def test_an_upload_is_the_build_jobs_context_on_a_cluster(k8s_sim, tmp_path: Path) -> None:
    """A control plane on the cluster with no build root: the client uploads the context and the
    build Job gets the upload's own tar (the directory is gone by the time the Job runs).
    Can fail: on main the YAML named the client's path, refused with 403 without a build root."""
    import os
    import shutil

    from idegym_env.client import IdeGymClient
    from tests.cp_helpers import ControlPlaneProcess

    config = k8s_sim.backend_config()
    env = dict(os.environ, IDEGYM_CONTROL_PLANE_BACKEND="kubernetes")
    for key, value in (("KUBECONFIG", config.kubeconfig), ("IN_CLUSTER", "false"),
                       ("ADDRESSING", config.addressing), ("NAMESPACE", config.namespace),
                       ("INSTANCE", config.instance), ("READINESS_PERIOD_SECONDS", "1")):
        env[f"IDEGYM_K8S_{key}"] = str(value)
    cp = ControlPlaneProcess(tmp_path / "state", ["--backend", "kubernetes", "--ephemeral"], env=env,
                             backend="kubernetes", build_roots=[])
    project = tmp_path / "calc"
    (project / "src").mkdir(parents=True)
    (project / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (project / "test_calc.py").write_text("def test_add():\n    pass\n")
    try:
        with IdeGymClient(cp.url) as client:
            digest = client.upload(project)
            shutil.rmtree(project)
            job, = client.build_images(f"""
images:
  - name: calc-uploaded
    dockerfile: |
      FROM python:3.12-slim
      COPY --chown=1000:1000 src /home/appuser/work/src
      COPY test_calc.py /home/appuser/work/
    context: upload:{digest}
    rebuild: true
""")
        assert job.status == Status.SUCCESS, job.details
        assert "Taking files from the build context: src/calc.py test_calc.py" in job.details
    finally:
        cp.stop()
