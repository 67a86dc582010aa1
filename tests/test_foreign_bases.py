"""Base images as other people's Dockerfiles write them: digests, registry-qualified names,
patch-version tags, Ubuntu and the official toolchain images, built here from distribution
archives when no registry answers, every substitution said in the log and the image's labels.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from control_plane.backends.local.oci import catalog, refs
from control_plane.backends.local.oci.settings import OciError
from control_plane.dockerfile import base_images, rewrite_bases
from tests.cp_helpers import ControlPlaneProcess, wait_job

DIGEST = "sha256:" + "5" * 64

# -- references ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ref", "registry", "path", "tag", "official"), [
    ("ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", "ubuntu"),
    ("docker.io/library/ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", "ubuntu"),
    ("index.docker.io/library/python:3.12", "docker.io", "library/python", "3.12", "python"),
    (f"public.ecr.aws/docker/library/rust:1.85-slim@{DIGEST}", "public.ecr.aws", "docker/library/rust", "1.85-slim",
     "rust"),
    ("mirror.gcr.io/library/node:20", "mirror.gcr.io", "library/node", "20", "node"),
    ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", "ghcr.io", "laude-institute/t-bench/ubuntu-24-04",
     "20250624", None),
    ("localhost:5000/team/image", "localhost:5000", "team/image", None, None),
    ("acme/tool:1", "docker.io", "acme/tool", "1", None),
])
def test_references_are_read_as_docker_reads_them(ref: str, registry: str, path: str, tag: str | None,
                                                  official: str | None) -> None:
    image = refs.parse(ref)
    assert (image.registry, image.path, image.tag, image.official) == (registry, path, tag, official)
    assert image.pull_name.endswith(DIGEST) == ("@" in ref)


@pytest.mark.parametrize("ref", ["", "Ubuntu:24.04", "ubuntu:24.04@sha256:abc", "a b"])
def test_what_is_not_a_reference_is_said(ref: str) -> None:
    with pytest.raises(refs.RefError):
        refs.parse(ref)


# -- what each name becomes -------------------------------------------------------------------------------


@pytest.mark.parametrize(("ref", "ubuntu", "release", "packages", "words"), [
    (f"ubuntu:24.04@{DIGEST}", True, "noble", ("apt", "ubuntu-keyring"), ["Ubuntu noble from the Ubuntu archive"]),
    (f"public.ecr.aws/docker/library/ubuntu:24.04@{DIGEST}", False, "trixie", (),
     ["nearest Debian release to Ubuntu 24.04", "IDEGYM_UBUNTU_MIRROR"]),
    ("ubuntu:jammy-20240911", True, "jammy", (), ["dated snapshot 20240911 is not reproduced"]),
    (f"python:3.13-slim-bookworm@{DIGEST}", False, "bookworm", ("python3-pip",), ["python3 is 3.11, not 3.13"]),
    ("python:3.12.4-slim", False, "trixie", ("python3",), ["closest to 3.12"]),
    ("golang:1.22.12-bookworm", False, "bookworm", ("golang-1.22-go", "git", "gcc"), ["bookworm-backports", "go 1.22"]),
    ("public.ecr.aws/docker/library/golang:1.26.2-bookworm", False, "trixie", ("golang-1.24-go",),
     ["go 1.24", "the closest to go 1.26.2", "bookworm's go is further behind"]),
    (f"public.ecr.aws/docker/library/rust:1.85-slim@{DIGEST}", False, "trixie", ("rustc", "cargo"), ["rustc 1.85"]),
    ("node:20.18.1-bookworm", False, "bookworm", ("nodejs", "npm"), ["node 18", "(the tag names bookworm)"]),
    ("node:22-bookworm", False, "trixie", ("nodejs", "npm"), ["node 20", "bookworm's node is further behind"]),
    ("gcc:13.3.0-bookworm", False, "bookworm", ("gcc-12", "g++-12"), ["gcc 12", "(the tag names bookworm)"]),
    ("rust:1.85-slim-bookworm", False, "trixie", ("rustc",), ["rustc 1.85", "bookworm's rustc is further behind"]),
    ("eclipse-temurin:21-jdk-jammy", False, "trixie", ("openjdk-21-jdk-headless",), ["java 21"]),
    ("eclipse-temurin:17.0.12_7-jdk-jammy", True, "jammy", ("openjdk-17-jdk-headless",), ["Ubuntu jammy: java 17"]),
    ("eclipse-temurin:17.0.12_7-jdk-jammy", False, "bookworm", ("openjdk-17-jdk-headless",),
     ["Debian instead of Ubuntu jammy"]),
    ("openjdk:21-jdk-slim", False, "trixie", ("openjdk-21-jdk-headless",), ["java 21"]),
    ("maven:3.9-eclipse-temurin-17", False, "bookworm", ("maven", "openjdk-17-jdk-headless"), ["maven 3.8 on java 17"]),
    ("ruby:3.3-slim", False, "trixie", ("ruby",), ["ruby 3.3"]),
    ("php:8.2-cli", False, "bookworm", ("php8.2-cli",), ["php 8.2"]),
    ("gradle:8.5-jdk17", False, "bookworm", ("gradle",), ["Debian packages only Gradle 4"]),
    ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", True, "noble", ("tmux", "asciinema"),
     ["its published recipe", "Ubuntu noble"]),
])
def test_each_form_maps_to_a_base_built_here_and_says_how(ref: str, ubuntu: bool, release: str,
                                                          packages: tuple[str, ...], words: list[str]) -> None:
    spec = catalog.resolve(ref, ubuntu=ubuntu)
    assert spec is not None and spec.release.codename == release, spec
    assert set(packages) <= set(spec.packages), spec.packages
    assert spec.note and spec.note.startswith(ref + " -> ") and all(w in spec.note for w in words), spec.note


@pytest.mark.parametrize(("ref", "words"), [
    ("node:20-alpine", "'alpine' variants are not built locally: use the Debian variant"),
    ("ubuntu:18.04", "ubuntu:18.04 is not built here (20.04 focal, 22.04 jammy, 24.04 noble)"),
    ("python:3.12-bullseye", "Debian/Ubuntu bullseye is not built here"),
    ("php:8.3-apache", "only the php -cli variant is built here"),
    ("golang:1.22-slim", "golang has no -slim variant"),
])
def test_forms_that_cannot_be_built_here_say_why(ref: str, words: str) -> None:
    with pytest.raises(OciError) as err:
        catalog.resolve(ref)
    assert words in err.value.message and "--image-registry" in err.value.message, err.value.message


def test_images_of_other_registries_are_not_substituted() -> None:
    assert catalog.resolve("mcr.microsoft.com/dotnet/sdk:8.0.405") is None
    assert catalog.resolve("ghcr.io/acme/ubuntu:24.04") is None


def test_a_dockerfile_is_rewritten_to_the_images_provided() -> None:
    text = ("ARG RUST_VERSION=1.85\nARG IMAGE=\"public.ecr.aws/docker/library/rust:${RUST_VERSION}-slim\"\n"
            f"FROM $IMAGE AS builder\nRUN cargo --version\nFROM --platform=linux/amd64 debian:bookworm@{DIGEST}\n"
            "COPY --from=builder /a /b\nCOPY --from=node:20 /usr/bin/node /usr/local/bin/node\n")
    found = base_images(text)
    assert found == ["public.ecr.aws/docker/library/rust:1.85-slim", f"debian:bookworm@{DIGEST}", "node:20"]
    rewritten = rewrite_bases(text, None, {found[0]: "a" * 64, found[1]: "b" * 64, "node:20": "c" * 64})
    assert rewritten.splitlines()[2] == f"FROM {'a' * 64} AS builder"
    assert rewritten.splitlines()[4] == f"FROM --platform=linux/amd64 {'b' * 64}"
    assert rewritten.splitlines()[5] == "COPY --from=builder /a /b"
    assert rewritten.splitlines()[6].startswith(f"COPY --from={'c' * 64} ")


# -- builds ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cp(debian_base: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneProcess]:
    proc = ControlPlaneProcess(tmp_path_factory.mktemp("foreign") / "state", ["--ephemeral"])
    yield proc
    proc.stop()


def _build(cp: ControlPlaneProcess, yaml_text: str, timeout: float = 900) -> list[dict]:
    resp = cp.http.post("/api/build-push-images", json={"yaml_content": yaml_text})
    assert resp.status_code == 200, resp.text
    return [wait_job(cp, name, timeout, 0.2) for name in resp.json()["job_names"]]


def _labels(cp: ControlPlaneProcess, tag: str) -> dict[str, str]:
    from control_plane.backends.local.images import ImageStore

    meta = ImageStore(cp.state_dir / "images").meta(tag)
    assert meta is not None
    return json.loads(json.dumps(meta["oci"]["config"].get("Labels") or {}))


def test_digest_pinned_and_registry_qualified_names_build_and_say_what_they_became(cp: ControlPlaneProcess) -> None:
    """Can fail: before, a digest-pinned name was refused and a registry-qualified Docker Hub name
    was 'not available'."""
    (built,) = _build(cp, f"""
images:
  - name: pinned
    dockerfile: |
      FROM public.ecr.aws/docker/library/debian:bookworm@{DIGEST} AS first
      RUN echo from-the-first-stage > /stage
      FROM docker.io/library/debian:12@{DIGEST}
      COPY --from=first /stage /stage
      RUN cat /stage /etc/debian_version
""")
    assert built["status"] == "success", built["details"]
    details = built["details"]
    assert f"its digest {DIGEST} is not honoured" in details, details
    assert "(built here from distribution archives)" in details and "from-the-first-stage" in details
    labels = _labels(cp, built["tag"])
    substituted = [v for k, v in labels.items() if k.startswith("org.idegym.substituted.")]
    assert len(substituted) == 2 and any("public.ecr.aws/docker/library/debian:bookworm" in v for v in substituted)
    assert all("docker.io/library/debian" in v for v in substituted), labels
    assert sorted(k for k in labels if k.startswith("org.idegym.digest-not-honoured.")) == \
        ["org.idegym.digest-not-honoured.0", "org.idegym.digest-not-honoured.1"], labels
    assert labels["org.idegym.base.debian"] == "bookworm"


@pytest.mark.slow
def test_ubuntu_and_a_toolchain_image_build_from_the_archives_and_run(cp: ControlPlaneProcess) -> None:
    """``ubuntu:24.04`` (pinned, ECR's name) from the Ubuntu archive when it answers, else Debian;
    ``golang:1.22-bookworm`` as bookworm with backports' go 1.22 where the official image keeps it.
    Two base builds the first time (about a minute each), cached afterwards."""
    ubuntu, go = _build(cp, f"""
images:
  - name: on-ubuntu
    dockerfile: |
      FROM public.ecr.aws/docker/library/ubuntu:24.04@{DIGEST}
      RUN . /etc/os-release && echo "running $ID $VERSION_ID" && id ubuntu && apt-get --version | head -1
  - name: on-go
    dockerfile: |
      FROM golang:1.22-bookworm
      WORKDIR /app
      RUN printf 'package main\\nimport "fmt"\\nfunc main() {{ fmt.Println("go-built") }}\\n' > main.go \\
       && go mod init example.com/hello && go build -o hello . && ./hello && go version
""", timeout=1800)
    assert go["status"] == "success", go["details"][-3000:]
    assert "go-built" in go["details"] and "go version go1.22" in go["details"]
    labels = _labels(cp, go["tag"])
    assert labels["org.idegym.base.go"].startswith("1.22") and "go 1.22" in labels["org.idegym.substituted.0"]
    assert ubuntu["status"] == "success", ubuntu["details"][-3000:]
    ubuntu_archive = "Ubuntu noble from the Ubuntu archive" in ubuntu["details"]
    assert ("running ubuntu 24.04" in ubuntu["details"]) == ubuntu_archive, ubuntu["details"][-3000:]
    client = cp.register()
    sid = cp.start_server(client, image_tag=go["tag"])["server_id"]
    out = cp.bash(client, sid, "go version && echo $GOPATH $GOTOOLCHAIN && ls /app")
    assert out["exit_code"] == 0 and "go1.22" in out["stdout"] and "/go local" in out["stdout"], out


def test_here_documents_are_said_in_the_exec_form_buildah_reads() -> None:
    """Can fail: buildah 1.28 reads `RUN python3 << 'PY'`'s document as instructions ("Unknown
    instruction: IMPORT")."""
    from control_plane.dockerfile import lower_heredocs

    text = ("FROM debian:bookworm\nRUN python3 << 'PY'\nimport json\nFROM = 1\nPY\nRUN <<EOF\nset -e\necho hi\nEOF\n"
            "COPY --chmod=755 <<EOF /usr/local/bin/hello\n#!/bin/sh\necho hello\nEOF\n"
            "SHELL [\"/bin/bash\", \"-c\"]\nRUN cat <<-A > /a\n\tindented\n\tA\nRUN echo $((1<<2)) <<< x\n")
    lowered, count = lower_heredocs(text)
    assert count == 4 and base_images(lowered) == ["debian:bookworm"]
    lines = lowered.splitlines()
    assert json.loads(lines[1][4:]) == ["/bin/sh", "-c", "python3 << 'PY'\nimport json\nFROM = 1\nPY"]
    assert json.loads(lines[2][4:]) == ["/bin/sh", "-c", "set -e\necho hi\n"]
    assert "cat > '/usr/local/bin/hello' <<'IDEGYM_HEREDOC'\n#!/bin/sh\necho hello\nIDEGYM_HEREDOC\nchmod 755" \
        in json.loads(lines[3][4:])[2]
    assert json.loads(lines[5][4:]) == ["/bin/bash", "-c", "cat <<-A > /a\n\tindented\n\tA"]
    assert lines[6] == "RUN echo $((1<<2)) <<< x"  # no here-document there
