"""The token ``idegym mcp serve`` requires over streamable HTTP (importable without the ``mcp`` SDK).

Made and kept like the control plane's (:mod:`control_plane.auth`): on first use
``<token dir>/token`` is created ``0600`` with a random token, and every later start uses it (a
token file others could read is refused). The directory is ``$XDG_STATE_HOME/idegym-mcp`` (else
``~/.local/state/idegym-mcp``), or ``--token-dir``. ``idegym mcp token`` prints it to its owner.

A client sends it as ``Authorization: Bearer <token>`` (what MCP clients let one configure) or as
HTTP Basic credentials, user ``idegym`` and the token as password (so a URL
``http://idegym:<token>@host:port/mcp`` works with clients that honour credentials in URLs).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from pathlib import Path

from control_plane.auth import ensure_token, token_path
from control_plane.constants import TOKEN_USER, default_state_dir

from ..settings import ClientSettings


def default_token_dir() -> Path:
    return default_state_dir(ClientSettings.from_env().xdg_state_home).parent / "idegym-mcp"


def ensure_mcp_token(directory: Path | None = None) -> tuple[Path, str]:
    """The token file and its token, made when there is none."""
    directory = Path(directory) if directory is not None else default_token_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return token_path(directory), ensure_token(directory)


def authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (Bearer, or Basic as user ``idegym``)."""
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.encode(), token.encode())
    if scheme.lower() == "basic":
        try:
            user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return bool(sep) and hmac.compare_digest(f"{user}:{password}".encode(), f"{TOKEN_USER}:{token}".encode())
    return False


__all__ = ["TOKEN_USER", "authorized", "default_token_dir", "ensure_mcp_token"]
