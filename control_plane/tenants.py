"""Tenants: trainers sharing one control plane, each seeing only its own work.

The operator keeps a tenants file (``--tenants FILE``), one tenant per line::

    # NAME   TOKEN HASH
    alice    sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
    bob      sha256:...

A name is a DNS label (``a-z``, ``0-9``, ``-``; at most 63). A token is stored only as the
SHA-256 of its UTF-8 text, so make tokens random (``idegym control-plane tenants add NAME``
makes one, prints it once and appends its line); a tenant may have several lines (a new token
before the old one is removed). Blank lines and ``#`` comments are ignored. The file must be a
regular file that only its owner can write (whoever can write it can make a tenant).

A client authenticates with HTTP Basic: its tenant's name as user, its token as password (for
``idegym-client``: ``IDEGYM_AUTH_USERNAME=alice IDEGYM_AUTH_PASSWORD=<token>``). The file is
read again when it changes (checked at every request) and on SIGHUP; a file that no longer
parses is logged and the tenants read before stay in force.

Without a tenants file the control plane has one tenant, ``SINGLE`` (``--auth`` says how it
authenticates): everything below works the same, with every client in it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

log = logging.getLogger(__name__)

SINGLE = ""  # the one tenant of a control plane without a tenants file (no tenant has this name)
TENANT = web.RequestKey("tenant", str)
NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
HASH = re.compile(r"sha256:([0-9a-f]{64})")
_DUMMY = bytes(32)  # compared against when the name is unknown: the same work either way


class TenantsFileError(ValueError):
    """The tenants file cannot be used; the message says what to change."""


def tenant_of(request: web.Request) -> str:
    """The tenant the request authenticated as (``SINGLE`` without a tenants file)."""
    return request.get(TENANT, SINGLE)


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def parse(text: str, where: str) -> dict[str, tuple[bytes, ...]]:
    """``{name: token digests}`` of a tenants file's ``text``; ``where`` names it in errors."""
    table: dict[str, list[bytes]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2:
            raise TenantsFileError(f"{where}:{number}: expected 'NAME sha256:HEX', got {len(fields)} fields")
        name, digest = fields
        if not NAME.fullmatch(name):
            raise TenantsFileError(f"{where}:{number}: {name!r} is not a tenant name (a-z, 0-9 and '-', "
                                   "at most 63, not starting or ending with '-')")
        match = HASH.fullmatch(digest)
        if match is None:
            raise TenantsFileError(f"{where}:{number}: the token of {name!r} must be stored as 'sha256:' and 64 "
                                   "lowercase hex digits (idegym control-plane tenants add makes the line)")
        table.setdefault(name, []).append(bytes.fromhex(match.group(1)))
    return {name: tuple(digests) for name, digests in table.items()}


StatKey = tuple[int, int, int, int, int, int]


def _stat_key(st: os.stat_result) -> StatKey:
    """What changes when the file is edited, replaced, chmod-ed or chown-ed."""
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode, st.st_uid


def read(path: Path) -> tuple[dict[str, tuple[bytes, ...]], StatKey]:
    """The tenants of the file at ``path`` and the identity of what was read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise TenantsFileError(f"cannot read the tenants file {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise TenantsFileError(f"the tenants file {path} is not a regular file")
        if st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid()):
            raise TenantsFileError(
                f"the tenants file {path} can be changed by others (owner uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):o}): whoever can write it can make a tenant; chown it to this user "
                "and chmod 600 it")
        text = fh.read().decode("utf-8", errors="replace")
    table = parse(text, str(path))
    if not table:
        raise TenantsFileError(f"the tenants file {path} names no tenant: add one with "
                               "'idegym control-plane tenants add NAME --file FILE'")
    return table, _stat_key(st)


@dataclass
class Tenants:
    """The tenants file in force; re-read when it changes."""

    path: Path

    def __post_init__(self) -> None:
        self._seen: StatKey | None
        self._table, self._seen = read(self.path)

    @property
    def names(self) -> list[str]:
        return sorted(self._table)

    def reload(self, force: bool = False) -> None:
        """Read the file again if it changed (or ``force``). A file that cannot be used is logged
        once (until it changes again) and the tenants read before stay in force."""
        try:
            key: StatKey | None = _stat_key(os.stat(self.path))
        except OSError:
            key = None
        if key == self._seen and not force:
            return
        self._seen = key
        try:
            self._table, self._seen = read(self.path)
        except TenantsFileError as exc:
            log.error("%s; the tenants read before stay in force (%s)", exc, ", ".join(self.names))
            return
        log.warning("tenants file %s read: %s", self.path, ", ".join(self.names))

    def authenticate(self, authorization: str) -> str | None:
        """The tenant whose name and token the ``Authorization`` header carries, else None."""
        self.reload()
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        digest = hashlib.sha256(password.encode()).digest()
        accepted = False
        for known in self._table.get(user, (_DUMMY,)):
            accepted |= hmac.compare_digest(digest, known)
        return user if sep and accepted and user in self._table else None


def authenticator(tenants: Tenants) -> Callable[[Mapping[str, str]], str]:
    """HTTP Basic auth against the tenants file: the tenant of a request's headers, or
    ``Unauthorized`` (``http.middleware`` and ``forward_protocol`` ask it on every route but
    ``/health``; the request then carries its tenant, ``tenant_of``)."""
    from .errors import Unauthorized

    def check(headers: Mapping[str, str]) -> str:
        tenant = tenants.authenticate(headers.get("Authorization", ""))
        if tenant is None:
            raise Unauthorized("missing or wrong credentials: send HTTP Basic auth, your tenant's name as user "
                               "and its token as password (idegym-client: IDEGYM_AUTH_USERNAME / "
                               "IDEGYM_AUTH_PASSWORD)")
        return tenant

    return check


def add(path: Path, name: str) -> str:
    """Make a token for tenant ``name``, append its line to the file at ``path`` (made ``0600``
    when missing) and return the token (shown once: only its hash is kept)."""
    if not NAME.fullmatch(name):
        raise TenantsFileError(f"{name!r} is not a tenant name (a-z, 0-9 and '-', at most 63, not starting or "
                               "ending with '-')")
    if path.exists():
        read(path)  # refuses a file others can change before adding to it
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(f"{name} {hash_token(token)}\n")
    return token


def remove(path: Path, name: str) -> int:
    """Remove every line of tenant ``name``; returns how many (its clients are refused at their
    next request)."""
    read(path)
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.split("#", 1)[0].split()[:1] != [name]]
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.writelines(kept)
    os.replace(tmp, path)
    return len(lines) - len(kept)
