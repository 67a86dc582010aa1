"""The operator's package sources reach builds and networked sandboxes: a private HTTPS index
whose CA only the host's configuration trusts, with credentials, used by ``RUN pip install`` and
by a networked sandbox's ``pip``; the credentials in no image layer; ``--no-host-package-config``
turns it off; a sandbox without the network is not given it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.backends.local import hostconfig
from tests.cp_helpers import ControlPlaneProcess, wait_job
from tests.package_index import MARK, PACKAGE, PrivateIndex, private_index  # noqa: F401 (the fixture)

# pip's truststore (its default since 24.2) refuses an index named by an IP address ("check_hostname
# requires server_hostname"); the test's index has no name, so its pip uses the configured bundle directly.
PIP = "pip --use-deprecated=legacy-certs"
DOCKERFILE = f"""\
FROM python:3.13-slim
RUN {PIP} install --no-cache-dir {PACKAGE} && python -c "import idegym_probe; print('imported', idegym_probe.MARK)"
"""


def _host_files(tmp_path: Path, index: PrivateIndex) -> dict[str, str]:
    """The host's configuration as a control plane started with this environment sees it."""
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text(f"[global]\nindex-url = {index.url}\ncert = {index.ca}\n")
    ca_variables = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")  # they outrank pip.conf
    return {**{k: v for k, v in os.environ.items() if k not in ca_variables}, "PIP_CONFIG_FILE": str(pip_conf)}


def _build(cp: ControlPlaneProcess, name: str, network_key: str = "network") -> dict:
    text = "".join(f"      {line}\n" for line in DOCKERFILE.splitlines())
    resp = cp.http.post("/api/build-push-images", json={
        "yaml_content": f"images:\n  - name: {name}\n    {network_key}: true\n    dockerfile: |\n{text}"})
    assert resp.status_code == 200, resp.text
    (job,) = [wait_job(cp, n, 1200, 0.5) for n in resp.json()["job_names"]]
    return job


@pytest.fixture
def cp(debian_base: str, private_index: PrivateIndex, tmp_path: Path) -> Iterator[ControlPlaneProcess]:  # noqa: F811
    proc = ControlPlaneProcess(tmp_path / "state", ["--ephemeral"], env=_host_files(tmp_path, private_index))
    yield proc
    proc.stop()


def test_collect_takes_pip_and_the_ca_and_leaves_host_paths_out(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    etc, home = tmp_path / "etc", tmp_path / "home"
    (etc / "apt" / "apt.conf.d").mkdir(parents=True)
    (etc / "apt" / "apt.conf.d" / "90proxy").write_text('Acquire::http::Proxy "http://proxy.example:3128";\n')
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text(
        f"[global]\nindex-url = https://u:p@pypi.example/simple\nextra-index-url = file:///opt/local "
        f"https://extra.example/simple\nfind-links = /opt/wheels\ncert = {ca}\n")
    (home / ".npmrc").write_text("registry=https://npm.example/\n//npm.example/:_authToken=${NPM_TOKEN}\n"
                                 "cafile=/host/only.pem\nprefix=/host/prefix\n")
    found = hostconfig.collect(tmp_path / "out", {"NPM_TOKEN": "tok", "HTTPS_PROXY": "http://p:3128"}, home, etc)
    files = {p.name: p.read_text() for p in found.directory.iterdir()}
    assert files["ca-certificates.crt"] == ca.read_text()
    assert "index-url = https://u:p@pypi.example/simple" in files["pip.conf"]
    assert "https://extra.example/simple" in files["pip.conf"] and "file://" not in files["pip.conf"]
    assert "/opt/wheels" not in files["pip.conf"]
    assert f"cert = {hostconfig.MOUNT}/ca-certificates.crt" in files["pip.conf"]
    assert 'index-url = "https://u:p@pypi.example/simple"' in files["uv.toml"]
    assert "//npm.example/:_authToken=tok" in files["npmrc"] and "/host/" not in files["npmrc"]
    assert f"cafile={hostconfig.MOUNT}/ca-certificates.crt" in files["npmrc"]
    assert 'Acquire::http::Proxy "http://proxy.example:3128";' in files["apt.conf"]
    assert found.proxies == {"HTTPS_PROXY": "http://p:3128"}
    # what the RUN steps' ARG line and the sandboxes' variables carry: paths, never a credential
    assert all(v.startswith(hostconfig.MOUNT) for v in found.env.values()) and "u:p" not in json.dumps(found.env)
    # the same configuration is the same directory (sandboxes bind it: it never changes under them)
    again = hostconfig.collect(tmp_path / "out", {"NPM_TOKEN": "tok", "HTTPS_PROXY": "http://p:3128"}, home, etc)
    assert again.directory == found.directory


@pytest.mark.security
def test_a_private_https_index_reaches_run_steps_and_networked_sandboxes(
        cp: ControlPlaneProcess, private_index: PrivateIndex, tmp_path: Path) -> None:  # noqa: F811
    """Can fail: before, the image had only Debian's CA bundle and no index settings — the RUN
    step's pip could not verify the index (or found no such package on PyPI)."""
    built = _build(cp, "private-index")
    assert built["status"] == "success", built["details"][-4000:]
    assert f"imported {MARK}" in built["details"], built["details"][-4000:]
    assert "the host's package configuration reaches RUN steps" in built["details"], built["details"][-4000:]
    assert private_index.password not in built["details"]
    from control_plane.backends.local.images import ImageStore

    meta = ImageStore(cp.state_dir / "images").meta(built["tag"])
    assert meta is not None
    # the credentials (in the bound pip.conf) are in no layer, nor in the image's config or history
    secret = private_index.password.encode()
    for layer in meta["oci"]["layers"]:
        for root, _dirs, files in os.walk(layer):
            for name in files:
                path = os.path.join(root, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    with open(path, "rb") as fh:
                        assert secret not in fh.read(), path
    assert private_index.password not in json.dumps(meta)
    # a sandbox of the image (it has the network) uses the index too; its variables name the files
    client = cp.register()
    sid = cp.start_server(client, image_tag=built["tag"])["server_id"]
    out = cp.bash(client, sid, f"{PIP} download --no-deps --no-cache-dir -d /tmp/dl {PACKAGE} >/dev/null && ls /tmp/dl "
                                "&& echo $PIP_CONFIG_FILE")
    assert out["exit_code"] == 0 and "idegym_probe-1.0-py3-none-any.whl" in out["stdout"], out
    assert f"{hostconfig.MOUNT}/pip.conf" in out["stdout"]


def test_no_host_package_config_and_sandboxes_without_network_go_without(
        debian_base: str, private_index: PrivateIndex, tmp_path: Path) -> None:  # noqa: F811
    cp = ControlPlaneProcess(tmp_path / "state", ["--ephemeral", "--no-host-package-config"],
                             env=_host_files(tmp_path, private_index))
    try:
        failed = _build(cp, "no-host-config")
        assert failed["status"] == "failure", failed["details"][-3000:]
        assert "the host's package configuration" not in failed["details"]
        assert "No matching distribution found for idegym-probe" in failed["details"], failed["details"][-3000:]
    finally:
        cp.stop()
    cp = ControlPlaneProcess(tmp_path / "state2", ["--ephemeral"], env=_host_files(tmp_path, private_index))
    try:
        resp = cp.http.post("/api/build-push-images", json={
            "yaml_content": "images:\n  - name: offline\n    build_network: true\n    dockerfile: |\n"
                            "      FROM debian:bookworm\n      RUN true\n"})
        (job,) = [wait_job(cp, n, 600, 0.2) for n in resp.json()["job_names"]]
        assert job["status"] == "success", job["details"]
        client = cp.register()
        sid = cp.start_server(client, image_tag=job["tag"])["server_id"]
        # (the build's RUN steps had it: their mount point stays in the image, empty)
        out = cp.bash(client, sid, f"ls -A {hostconfig.MOUNT} 2>&1; echo \"[$PIP_CONFIG_FILE]\"")
        assert out["stdout"] == "[]\n", out
    finally:
        cp.stop()
