"""The control plane's credentials: by default a random token in the state directory.

On first start ``<state dir>/token`` is created ``0600`` with a random token; every later start
on the same state directory uses it. Clients send it as HTTP Basic credentials, user
``idegym`` and the token as password (what the published ``idegym-client`` speaks:
``IDEGYM_AUTH_USERNAME=idegym IDEGYM_AUTH_PASSWORD=$(cat <state dir>/token)``). Explicit
``--auth USER:PASSWORD`` replaces the token; ``--auth none`` turns authentication off.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from .constants import TOKEN_FILE, TOKEN_USER

Credentials = tuple[str, str]


class TokenFileError(RuntimeError):
    """The token file cannot be used (unreadable, empty, or readable by others)."""


def token_path(state_dir: Path) -> Path:
    return Path(state_dir) / TOKEN_FILE


def ensure_token(state_dir: Path) -> str:
    """The state directory's token, created (``0600``, never replaced) when there is none."""
    path = token_path(state_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return read_token(path, strict=True)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(32) + "\n")
    return read_token(path, strict=True)


def read_token(path: Path, *, strict: bool = False) -> str:
    """The token in ``path``. ``strict`` (the control plane's own file) also refuses a file that
    is not a regular file or that another user could have read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise TokenFileError(f"cannot read the token file {path}: {exc.strerror}") from exc
    with os.fdopen(fd) as fh:
        st = os.fstat(fh.fileno())
        if strict and (not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077):
            raise TokenFileError(f"the token file {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                                 "remove it (a new token is made on start) or chmod 600 it")
        token = fh.read().strip()
    if not token:
        raise TokenFileError(f"the token file {path} is empty: remove it and a new token is made on start")
    return token


def token_credentials(state_dir: Path) -> Credentials:
    return TOKEN_USER, ensure_token(state_dir)
