"""Where the control plane is and how to authenticate: arguments, then environment variables.

Credentials, the first that applies:

1. ``auth=(user, password)``;
2. credentials in the URL, ``http://idegym:<token>@127.0.0.1:8000`` (the embedded control
   plane's ``url`` is such a URL);
3. ``$IDEGYM_AUTH_USERNAME`` / ``$IDEGYM_AUTH_PASSWORD`` (the published client's variables);
4. the token file ``$IDEGYM_TOKEN_FILE`` (user ``idegym``), else, for a control plane on this
   machine (a loopback URL or a Unix socket), the token of the default state directory
   (``$IDEGYM_CONTROL_PLANE_STATE_DIR/token``, else ``~/.local/state/idegym/token``) when it
   exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from control_plane.auth import TOKEN_USER, TokenFileError, read_token, token_path
from control_plane.config import default_state_dir
from control_plane.images import BUILTIN_IMAGE  # noqa: F401 - re-exported

from ..urls import is_loopback_url


@dataclass(frozen=True)
class Settings:
    url: str  # without credentials
    unix_socket: str | None = None
    auth: tuple[str, str] | None = field(default=None, repr=False)

    @classmethod
    def resolve(cls, url: str | None = None, unix_socket: str | None = None,
                auth: tuple[str, str] | None = None) -> Settings:
        url = url or os.environ.get("IDEGYM_URL") or ("http://control-plane" if unix_socket else None)
        if url is None:
            raise ValueError("no control plane: pass url=..., set $IDEGYM_URL, or start the embedded one "
                             "with IdeGymClient.embedded() (AsyncIdeGymClient.embedded())")
        if "://" not in url:
            url = f"http://{url}"
        url, in_url = _split_credentials(url)
        auth = auth or in_url
        if auth is None and os.environ.get("IDEGYM_AUTH_USERNAME"):
            auth = (os.environ["IDEGYM_AUTH_USERNAME"], os.environ.get("IDEGYM_AUTH_PASSWORD", ""))
        if auth is None:
            auth = _token_file_credentials(url, unix_socket)
        return cls(url.rstrip("/"), unix_socket, auth)


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    plain = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return plain, (unquote(parts.username or ""), unquote(parts.password or ""))


def _token_file_credentials(url: str, unix_socket: str | None) -> tuple[str, str] | None:
    explicit = os.environ.get("IDEGYM_TOKEN_FILE")
    if explicit:
        try:
            return TOKEN_USER, read_token(Path(explicit).expanduser())
        except TokenFileError as exc:
            raise ValueError(f"$IDEGYM_TOKEN_FILE: {exc}") from None
    if not (unix_socket or is_loopback_url(url)):
        return None  # the local token never goes to another machine
    state = os.environ.get("IDEGYM_CONTROL_PLANE_STATE_DIR")
    path = token_path(Path(state) if state else default_state_dir())
    try:
        return TOKEN_USER, read_token(path)
    except TokenFileError:
        return None  # no local control plane with a token: the server says 401 if it wants one
