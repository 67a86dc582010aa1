"""A build's local directories, sent to the control plane as uploads (``control_plane/uploads.py``).

``build_images`` (both clients) replaces every ``project.path`` and ``context`` of a build YAML
that names a directory on this machine with an upload of its files: the tree packed as one
deterministic tar (``control_plane.tree_pack``), named by its SHA-256, sent only when the
control plane says it lacks it. So the YAML carries no path of this machine, the control plane
needs no ``--build-root``, and a second env, trainer or run with the same files sends nothing.

A tree is packed once per change: the digest of a directory is kept against its fingerprint
(every entry's path, size, mode, times and inode), and the tar itself only until it is sent.
On the wire the tar is gzipped (level 1); a PUT cut off is sent again from the start.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from control_plane.models import MissingUploadsResponse, UploadResponse
from control_plane.tree_pack import REFERENCE_PREFIX, PackError, fingerprint, pack

from ._protocol import Call, Plan, _check, request

SPOOL_IN_MEMORY = 8 << 20  # a packed tree up to this size stays in memory
WIRE_RATE = 2 << 20  # bytes per second an upload's timeout assumes, at the least
UPLOAD_TRIES = 3
_CACHE_SIZE = 512


@dataclass
class LocalTree:
    """A directory of this machine and the name of its packed tree."""

    path: Path
    digest: str
    size: int  # bytes of the tar

    def wire_body(self) -> IO[bytes]:
        """The tree packed and gzipped, positioned at its start (a spooled temporary file)."""
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
        with gzip.GzipFile(fileobj=spool, mode="wb", compresslevel=1, mtime=0) as out:
            packed = pack(self.path, out)
        if packed.digest != self.digest:
            spool.close()
            raise PackError(f"{self.path} changed while it was being uploaded ({self.digest} before, "
                            f"{packed.digest} now); build again")
        spool.seek(0)
        return spool


class _Digests:
    """``directory -> (fingerprint, digest, size)``, shared by every client of the process."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, str, int]] = {}
        self._lock = threading.Lock()

    def tree(self, path: Path) -> LocalTree:
        path = path.resolve()
        seen = fingerprint(path)
        with self._lock:
            known = self._known.get(str(path))
        if known is not None and known[0] == seen:
            return LocalTree(path, known[1], known[2])
        packed = pack(path)  # named only: the bytes are made again if they must be sent
        with self._lock:
            if len(self._known) >= _CACHE_SIZE:
                self._known.pop(next(iter(self._known)))
            self._known[str(path)] = (seen, packed.digest, packed.size)
        return LocalTree(path, packed.digest, packed.size)


DIGESTS = _Digests()


def local_trees(yaml_text: str) -> tuple[str, list[LocalTree]]:
    """The build YAML with its local directories as upload references, and those trees. A YAML
    that names none (or does not parse: the control plane says why) comes back as it was."""
    import yaml  # only a build's definition needs it

    try:
        doc = yaml.safe_load(yaml_text)
    except yaml.YAMLError:
        return yaml_text, []
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        return yaml_text, []
    trees: dict[Path, LocalTree] = {}

    def upload_of(value: Any) -> str | None:
        if not isinstance(value, str) or value.startswith(REFERENCE_PREFIX) or not value.strip():
            return None
        path = Path(value).expanduser()
        if not path.is_dir():
            return None  # not here: a directory of the control plane's (under its --build-root)
        path = path.resolve()
        if path not in trees:
            trees[path] = DIGESTS.tree(path)
        return trees[path].digest

    for entry in doc["images"]:
        if not isinstance(entry, dict):
            continue
        project = entry.get("project")
        if isinstance(project, dict) and set(project) == {"path"}:
            digest = upload_of(project["path"])
            if digest is not None:
                entry["project"] = {"upload": digest}
        digest = upload_of(entry.get("context"))
        if digest is not None:
            entry["context"] = REFERENCE_PREFIX + digest
    if not trees:
        return yaml_text, []
    return json.dumps(doc), list(trees.values())


# -- plans ------------------------------------------------------------------------------------------


def missing(digests: list[str]) -> Plan[list[str]]:
    reply = _check((yield from request(Call("POST", "/api/uploads/missing", json={"digests": digests}))),
                   "control-plane")
    return MissingUploadsResponse.model_validate(reply.json()).missing


def put(tree: LocalTree, body: IO[bytes], client_id: str | None) -> Plan[UploadResponse]:
    length = body.seek(0, os.SEEK_END)
    body.seek(0)
    headers = {"Content-Type": "application/x-tar", "Content-Encoding": "gzip"}
    params = {"client_id": client_id} if client_id else None
    reply = yield from request(Call("PUT", f"/api/uploads/{tree.digest}", params=params, headers=headers,
                                    content=body, content_length=length, timeout=60 + length / WIRE_RATE))
    return UploadResponse.model_validate(_check(reply, "control-plane").json())


def chunks(body: IO[bytes], size: int = 1 << 20) -> Iterator[bytes]:
    body.seek(0)
    while chunk := body.read(size):
        yield chunk
