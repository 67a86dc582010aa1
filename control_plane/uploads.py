"""Uploads: the trees a client sends for its builds (project files, Dockerfile build contexts).

A client packs a directory with ``tree_pack.pack`` (one deterministic tar, named by its
SHA-256), asks which of its digests the control plane lacks (``POST /api/uploads/missing``)
and sends only those (``PUT /api/uploads/{digest}``). A build YAML then names the upload
(``project: {upload: sha256:…}``, ``context: upload:sha256:…``): no host path of the client's
machine, and no ``--build-root``.

The body is streamed to a file while its digest is computed (a gzip ``Content-Encoding`` is
undone on the way), refused with 413 past ``--max-upload-bytes`` or the tenant's or client's quota, and with
400 when its bytes are not the digest it was sent as. It is then unpacked with
``tree_pack.unpack`` (relative paths only, links that stay inside, bounded entries and bytes)
into a temporary directory, and moved into place with one ``rename``: a reader sees a whole tree
or none. A PUT cut off leaves nothing; sent again, it starts over; sent twice, the second is
answered without a copy. Each tenant holds its own references (``uploads`` table): another
tenant's upload is still "missing" to it (so the answer says nothing about what others sent),
and it sends the bytes itself. An upload no build used for ``--upload-retention`` is dropped,
and its files once no tenant holds it.

On disk (``<state>/uploads``): ``sha256/<hex>/`` the tree, ``sha256/<hex>.tar`` the archive
(what a Kubernetes build Job gets as its context), ``tmp/`` uploads under way.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from . import tree_pack
from .config import SharingConfig
from .errors import BadRequest, NotFound, PayloadTooLarge
from .models import UploadResponse
from .store import SQLiteStore

log = logging.getLogger(__name__)

UPLOADS_DIR = "uploads"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class StoredUpload:
    digest: str
    tree: Path  # the unpacked directory
    archive: Path  # the tar it was sent as


class UploadMeter:
    """Bytes received per (tenant, client id), for quotas and ``/metrics``."""

    def __init__(self) -> None:
        self.bytes: dict[tuple[str, str], int] = {}
        self.count: dict[tuple[str, str, str], int] = {}  # (tenant, client, outcome)

    def add(self, tenant: str, client: str, size: int, outcome: str) -> None:
        self.bytes[(tenant, client)] = self.bytes.get((tenant, client), 0) + size
        key = (tenant, client, outcome)
        self.count[key] = self.count.get(key, 0) + 1


class UploadStore:
    def __init__(self, state_dir: Path, store: SQLiteStore, sharing: SharingConfig) -> None:
        self.root = state_dir / UPLOADS_DIR
        self.objects = self.root / "sha256"
        self.tmp = self.root / "tmp"
        self.store = store
        self.sharing = sharing
        self.meter = UploadMeter()
        self._incoming: dict[tuple[str, str], int] = {}  # bytes being received per (tenant, client)
        for path in (self.objects, self.tmp):
            path.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        for leftover in self.tmp.iterdir():  # uploads a previous run was receiving
            _remove(leftover)

    def _paths(self, digest: str) -> StoredUpload:
        hexdigest = digest.split(":", 1)[1]
        return StoredUpload(digest, self.objects / hexdigest, self.objects / f"{hexdigest}.tar")

    def missing(self, tenant: str, digests: list[str]) -> list[str]:
        """The digests ``tenant`` must send (in the order asked, once each)."""
        for digest in digests:
            _checked(digest)
        held = self.store.held_uploads(tenant, digests)
        out: list[str] = []
        for digest in digests:
            if digest not in held and digest not in out:
                out.append(digest)
            elif digest in held and not self._paths(digest).tree.is_dir():
                self.store.remove_uploads([(tenant, digest)])  # its files went missing: ask for them again
                out.append(digest)
        return out

    def resolve(self, tenant: str, digest: str) -> StoredUpload:
        """``tenant``'s upload ``digest`` (its use renewed); ``NotFound`` when it holds none."""
        _checked(digest)
        stored = self._paths(digest)
        if not self.store.touch_upload(tenant, digest) or not stored.tree.is_dir():
            raise NotFound(f"upload {digest} is not on this control plane: send it first (POST /api/uploads/missing, "
                           f"then PUT /api/uploads/{digest}; the client's build_images does both)")
        return stored

    def remove(self, tenant: str, digest: str) -> bool:
        _checked(digest)
        if digest not in self.store.held_uploads(tenant, [digest]):
            return False
        self._drop(self.store.remove_uploads([(tenant, digest)]))
        return True

    def expire(self, retention: float) -> int:
        """Drop the references no build used for ``retention`` seconds; delete unheld files."""
        unused = self.store.unused_uploads(int((time.time() - retention) * 1000))
        if unused:
            self._drop(self.store.remove_uploads(unused))
        return len(unused)

    def _drop(self, digests: list[str]) -> None:
        for digest in digests:
            stored = self._paths(digest)
            _remove(stored.tree)
            _remove(stored.archive)

    # -- receiving ----------------------------------------------------------------------------

    async def receive(self, request: web.Request, tenant: str, digest: str, client: str) -> UploadResponse:
        _checked(digest)
        stored = self._paths(digest)
        if digest in self.store.held_uploads(tenant, [digest]) and stored.tree.is_dir():
            self.store.touch_upload(tenant, digest)
            self.meter.add(tenant, client, 0, "held")
            return UploadResponse(digest=digest, stored=False, bytes=0)
        declared = request.content_length
        limit = self.sharing.max_upload_bytes
        if declared is not None and declared > limit:
            raise PayloadTooLarge(f"an upload of {declared} bytes is over this control plane's limit of {limit} "
                                  "bytes per upload (--max-upload-bytes)")
        quota = self._quota(tenant, client)
        if declared is not None:
            quota(declared, f"{declared}")
        work = self.tmp / secrets.token_hex(8)
        archive = work.with_suffix(".tar")
        key = (tenant, client)
        self._incoming.setdefault(key, 0)
        received = 0
        outcome = "failed"
        try:
            sha = hashlib.sha256()
            with open(archive, "wb") as out:
                # aiohttp undoes a gzip Content-Encoding as it reads: these are the tar's bytes
                async for chunk in request.content.iter_chunked(_CHUNK):
                    received += len(chunk)
                    self._incoming[key] += len(chunk)
                    if received > limit:
                        raise PayloadTooLarge(f"the upload {digest} is over this control plane's limit of {limit} "
                                              "bytes per upload (--max-upload-bytes)")
                    quota(0, f"more than {received}")
                    sha.update(chunk)
                    out.write(chunk)
            got = "sha256:" + sha.hexdigest()
            if got != digest:
                raise BadRequest(f"the body sent as {digest} is {got} ({received} bytes): it changed on the way or "
                                 "was cut short; send it again")
            files = await asyncio.to_thread(self._put_in_place, archive, work, stored)
            self.store.add_upload(tenant, digest, received, files)
            outcome = "sent"
            return UploadResponse(digest=digest, stored=True, bytes=received, files=files)
        finally:
            self.meter.add(tenant, client, received, outcome)
            self._incoming[key] -= received
            _remove(work)
            _remove(archive)

    def _quota(self, tenant: str, client: str) -> Callable[[int, str], None]:
        """A check of the tenant's and the client's upload quotas: ``check(more, size)`` raises 413
        when the bytes being received (the tenant's, all its uploads under way) and ``more``
        would pass one; ``size`` is how the refusal names this upload's size."""
        held = self.store.upload_bytes(tenant) if self.sharing.tenant_upload_bytes else 0
        sent = self.meter.bytes.get((tenant, client), 0) if client else 0

        def check(more: int, size: str) -> None:
            incoming = sum(n for (owner, _), n in self._incoming.items() if owner == tenant)
            limit = self.sharing.tenant_upload_bytes
            if limit and held + incoming + more > limit:
                raise PayloadTooLarge(
                    f"an upload of {size} bytes does not fit the tenant's upload quota: it holds {held} of {limit} "
                    "bytes (--tenant-upload-bytes); uploads no build used expire (--upload-retention), DELETE "
                    "/api/uploads/<digest> drops one now")
            limit = self.sharing.client_upload_bytes
            if limit and client and sent + self._incoming.get((tenant, client), 0) + more > limit:
                raise PayloadTooLarge(f"an upload of {size} bytes is over client {client}'s upload quota: it sent "
                                      f"{sent} of {limit} bytes (--client-upload-bytes)")

        return check

    def _put_in_place(self, archive: Path, work: Path, stored: StoredUpload) -> int:
        """Unpack into ``work``, then move archive and tree into place (unless another upload of
        the same bytes did first); the tree's entries."""
        if stored.tree.is_dir():
            return _count(stored.tree)
        work.mkdir(mode=0o700)
        limits = tree_pack.PackLimits(max_bytes=self.sharing.max_upload_bytes, max_files=self.sharing.max_upload_files)
        try:
            with open(archive, "rb") as f:
                files, _ = tree_pack.unpack(f, work, limits)
        except tree_pack.PackError as exc:
            raise BadRequest(f"upload {stored.digest} refused: {exc}") from None
        os.chmod(work, tree_pack.DIR_MODE)
        os.replace(archive, stored.archive)
        try:
            os.rename(work, stored.tree)
        except OSError:
            if not stored.tree.is_dir():
                raise
        return files


def _checked(digest: str) -> str:
    try:
        return tree_pack.check_digest(digest)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def _count(tree: Path) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(tree))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
