"""Where the control plane is and how to authenticate: arguments, then environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass

from control_plane.images import BUILTIN_IMAGE  # noqa: F401 - re-exported


@dataclass(frozen=True)
class Settings:
    url: str
    unix_socket: str | None = None
    auth: tuple[str, str] | None = None

    @classmethod
    def resolve(cls, url: str | None = None, unix_socket: str | None = None,
                auth: tuple[str, str] | None = None) -> Settings:
        url = url or os.environ.get("IDEGYM_URL") or ("http://control-plane" if unix_socket else None)
        if url is None:
            raise ValueError("no control plane: pass url=..., set $IDEGYM_URL, or use the embedded one "
                             "(idegym_env.client.embedded())")
        if "://" not in url:
            url = f"http://{url}"
        if auth is None and os.environ.get("IDEGYM_AUTH_USERNAME"):
            auth = (os.environ["IDEGYM_AUTH_USERNAME"], os.environ.get("IDEGYM_AUTH_PASSWORD", ""))
        return cls(url.rstrip("/"), unix_socket, auth)
