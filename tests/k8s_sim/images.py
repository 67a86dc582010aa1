"""What the simulated container runtime runs for an image (the simulator has no images).

Stand-ins, chosen by the image reference, first match wins:

| image reference contains / is          | the container runs                                     |
|----------------------------------------|--------------------------------------------------------|
| ``does-not-exist``                     | nothing: the pull fails (``ErrImagePull`` NotFound)    |
| one of the builder images (``kaniko``) | ``tests.k8s_sim.fake_builder`` with the container args |
| ``pause``                              | ``sleep infinity`` (node holders)                      |
| ``crashloop``                          | a process that prints an error and exits 3             |
| ``never-ready``                        | a process that never listens (readiness never passes)  |
| ``openenv``                            | ``tests.k8s_sim.openenv_stub`` (serves ``/health``)    |
| anything else                          | ``python -m sandbox_server serve`` on the pod's IP     |

An image may also be given a project directory (``--image TAG=DIR``), which becomes the
sandbox server's ``--project-source`` (what the "image" holds in its project folder).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class PullError:
    reason: str
    message: str


@dataclass
class Program:
    argv: list[str]
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class ImageCatalog:
    builder_markers: tuple[str, ...] = ("kaniko", "executor", "idegym-builder")
    projects: dict[str, Path] = field(default_factory=dict)

    def resolve(self, image: str, *, ip: str, port: int | None, pod_dir: Path, args: list[str],
                command: list[str]) -> Program | PullError:
        py = sys.executable
        if "does-not-exist" in image:
            return PullError("ErrImagePull",
                             f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
                             f'failed to resolve reference "{image}": {image}: not found')
        if any(marker in image for marker in self.builder_markers):
            return Program([py, "-m", "tests.k8s_sim.fake_builder", *command[1:], *args])
        if "pause" in image.rsplit("/", 1)[-1]:
            return Program(["sleep", "infinity"])
        if "crashloop" in image:
            crash = "import sys; print('fatal: cannot open /etc/sandbox.conf', file=sys.stderr); sys.exit(3)"
            return Program([py, "-c", crash])
        if "never-ready" in image:
            return Program(["sleep", "infinity"])
        if "openenv" in image:
            return Program([py, "-m", "tests.k8s_sim.openenv_stub", "--host", ip, "--port", str(port or 8000)])
        argv = [py, "-m", "sandbox_server", "serve", "--host", ip, "--port", str(port or 8000),
                "--project", str(pod_dir / "project"), "--state-dir", str(pod_dir / "sandbox-state")]
        source = self.projects.get(image)
        if source is not None:
            argv += ["--project-source", str(source)]
        return Program(argv)
