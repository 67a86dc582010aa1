"""Grading in a verifier sandbox of its own (Harbor's ``[verifier] environment_mode = "separate"``).

``grade_separately(client, agent, task)`` is what ``IdeGymEnv`` runs instead of grading the
agent's sandbox when the task has a ``verifier_environment``, in Harbor's order:

1. every process the agent started ends;
2. the task's ``artifacts`` (absolute paths in the agent's sandbox, and Harbor's convention
   directory ``/logs/artifacts``) are packed there and brought here through chunked downloads
   that stop at :data:`ARTIFACT_LIMIT` bytes — the agent is root in its sandbox and may have
   replaced ``tar`` and ``stat``, so nothing it says about sizes is believed — and extracted
   here with :mod:`tarfile`'s ``data`` filter (no absolute paths, no links out, no devices,
   no setuid bits), as Harbor re-materializes them;
3. a sandbox of the verifier's image starts (built from the task's ``tests/Dockerfile``,
   ``[verifier.environment] docker_image`` or the task's own environment), the artifacts are
   written back at their paths, and the checks run there (:func:`~idegym_env.grading.grade`,
   in place); the verifier's sandbox is stopped whatever happens.

Artifacts over the bound, or that cannot be packed or read, are the agent's doing: the episode
fails with that said (never an infrastructure error, which would drop it). A sandbox lost, or a
verifier image that does not build or start, is one.
"""

from __future__ import annotations

import base64
import io
import json
import shlex
import tarfile
import tempfile
from pathlib import Path

from sandbox_server import routes
from sandbox_server.models import DownloadFileChunkRequest

from ..client import BadRequest, IdeGymClient, NotFound, Sandbox, ServiceError
from ..integrations.bounded_tar import DownloadTooLarge, extract_within
from ..tasks import Task
from ..tasks.environment import environment_entry
from . import Graded, grade

ARTIFACT_LIMIT = 64 << 20
CONVENTION_DIR = "/logs/artifacts"  # Harbor's: collected whether or not the task lists it
# in the project directory (relative): the only place the file tools reach
_STAGED = ".idegym-artifacts.tgz"
_CHUNK = 1 << 20


def grade_separately(client: IdeGymClient, agent: Sandbox, task: Task, *, server_name: str, steps: int = 0,
                     submitted: bool = False) -> Graded:
    """Grade ``task`` in a verifier sandbox given the agent's artifacts (see the module docstring)."""
    assert task.verifier_environment is not None
    stage = "ending the agent's processes"
    verifier: Sandbox | None = None
    try:
        agent.terminate_processes()
        stage = "collecting the agent's artifacts"
        try:
            artifacts = collect_artifacts(agent, task.artifacts)
        except (DownloadTooLarge, RuntimeError, ValueError, tarfile.TarError, BadRequest, NotFound) as exc:
            # the agent's sandbox is the agent's (root there: its tar, its files): what fails here
            # is a failed episode, said, never an infrastructure error that would drop it
            return Graded(task.check_results({}, steps=steps, submitted=submitted,
                                             errors=[f"not graded: the agent's artifacts: {exc}"]))
        stage = "building the verifier's image"
        entry = environment_entry(task.verifier_environment, network=task.network)
        client.build_images(json.dumps({"images": [entry]}), timeout=3600)
        stage = "starting the verifier's sandbox"
        verifier = client.start(str(entry["tag"]), server_name=server_name, reuse="NONE", run_as_root=True)
        if artifacts:
            stage = "copying the artifacts into the verifier's sandbox"
            verifier.upload(_STAGED, artifacts)
            placed = verifier.bash(f"tar -xzf {_STAGED} -C / --no-same-owner && rm -f {_STAGED}", user="root",
                                   timeout=300)
            if placed.exit_code != 0:
                raise RuntimeError(f"tar exited {placed.exit_code}: {(placed.stderr or placed.stdout)[-500:]}")
        return grade(verifier, task, fresh=lambda: None, steps=steps, submitted=submitted)
    except (ServiceError, RuntimeError) as exc:
        problem = f"grading failed while {stage}: {getattr(exc, 'message', str(exc))}"
        return Graded(task.check_results({}, steps=steps, submitted=submitted, errors=[problem],
                                         infrastructure_error=problem))
    finally:
        if verifier is not None:
            try:
                verifier.stop()
            except ServiceError:
                pass  # already gone


def collect_artifacts(agent: Sandbox, paths: tuple[str, ...], limit: int = ARTIFACT_LIMIT) -> bytes:
    """The artifacts that exist in ``agent``, as a gzipped tar made here (rooted at ``/``) from
    what the agent's side sent, sanitized; empty when there are none."""
    wanted = " ".join(shlex.quote(p.lstrip("/")) for p in (*paths, CONVENTION_DIR))
    listed = "/tmp/.idegym-artifacts.list"
    packed = agent.bash(f"rm -f {_STAGED} && : > {listed} && for p in {wanted}; do if [ -e \"/$p\" ]; then "
                        f"printf '%s\\n' \"$p\" >> {listed}; fi; done && tar -C / -czf {_STAGED} -T {listed}",
                        user="root", timeout=300)
    if packed.exit_code != 0:
        raise RuntimeError(f"packing the artifacts failed (exit code {packed.exit_code}): "
                           f"{(packed.stderr or packed.stdout)[-500:]}")
    received = bytearray()
    while True:  # chunk by chunk, never past the bound, whatever the file's size claims
        answer = agent.call(routes.DOWNLOAD_FILE, DownloadFileChunkRequest(file_path=_STAGED, offset=len(received),
                                                                          length=_CHUNK))
        piece = base64.b64decode(answer.content_base64, validate=True)
        received += piece
        if len(received) > limit:
            raise DownloadTooLarge(f"the agent's artifacts are larger than {limit} bytes compressed")
        if answer.eof or not piece:
            break
    with tempfile.TemporaryDirectory(prefix="idegym-artifacts-") as scratch:
        archive, tree = Path(scratch) / "in.tgz", Path(scratch) / "tree"
        archive.write_bytes(bytes(received))
        tree.mkdir()
        extract_within(archive, tree, limit=limit, what="the agent's artifacts", setting="ARTIFACT_LIMIT",
                       tar_filter=tarfile.data_filter)
        if not any(tree.iterdir()):
            return b""
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            for child in sorted(tree.iterdir()):
                tar.add(child, arcname=child.name)
        return out.getvalue()


__all__ = ["grade_separately", "collect_artifacts", "ARTIFACT_LIMIT"]
