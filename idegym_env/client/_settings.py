"""Where the control plane is and how to authenticate: arguments, then the environment
(``idegym_env/settings.py`` reads it).

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

from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit, urlunsplit

from control_plane.auth import TokenFileError, read_token, token_path
from control_plane.constants import BUILTIN_IMAGE, TOKEN_USER

from ..errors import ConfigurationError
from ..settings import ClientSettings, chosen_control_plane
from ..urls import is_loopback_url

__all__ = ["BUILTIN_IMAGE", "Settings"]


@dataclass(frozen=True)
class Settings:
    """A client's connection: the control plane's URL (without credentials), its Unix socket if
    it is reached through one, and the credentials."""

    url: str  # without credentials
    unix_socket: str | None = None
    auth: tuple[str, str] | None = field(default=None, repr=False)

    @classmethod
    def resolve(cls, url: str | None = None, unix_socket: str | None = None,
                auth: tuple[str, str] | None = None, env: ClientSettings | None = None) -> Settings:
        """The connection these arguments, then the environment (``env``: read now if not given), say."""
        env = env or ClientSettings.from_env()
        url = chosen_control_plane(url, env) or ("http://control-plane" if unix_socket else None)
        if url is None:
            raise ConfigurationError("no control plane: pass url=..., set $IDEGYM_URL, or start the embedded one "
                                     "with IdeGymClient.embedded() (AsyncIdeGymClient.embedded())")
        if "://" not in url:
            url = f"http://{url}"
        url, in_url = _split_credentials(url)
        auth = auth or in_url
        if auth is None and env.auth_username:
            auth = (env.auth_username, env.auth_password)
        if auth is None:
            auth = _token_file_credentials(url, unix_socket, env)
        return cls(url.rstrip("/"), unix_socket, auth)


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    plain = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return plain, (unquote(parts.username or ""), unquote(parts.password or ""))


def _token_file_credentials(url: str, unix_socket: str | None, env: ClientSettings) -> tuple[str, str] | None:
    if env.token_file is not None:
        try:
            return TOKEN_USER, read_token(env.token_file.expanduser())
        except TokenFileError as exc:
            raise ConfigurationError(f"$IDEGYM_TOKEN_FILE: {exc}") from None
    if not (unix_socket or is_loopback_url(url)):
        return None  # the local token never goes to another machine
    try:
        return TOKEN_USER, read_token(token_path(env.default_state_dir()))
    except TokenFileError:
        return None  # no local control plane with a token: the server says 401 if it wants one
