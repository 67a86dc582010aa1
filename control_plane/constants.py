"""Names and defaults the control plane shares with its clients, in one module that imports nothing.

The client (``idegym_env.client``), the embedded control plane's owner (``idegym_env.embedded``)
and the control plane read these; importing this module loads no server code
(``tests/test_client_imports.py``).
"""

from __future__ import annotations

from pathlib import Path

# -- HTTP ----------------------------------------------------------------------------------------

#: Set to ``sandbox`` on a forward's answer that the sandbox server gave (not the control plane).
SANDBOX_HEADER = "X-IdeGym-Forwarded"
#: The id of the asynchronous operation behind an answer (202, or one that waited for it).
OPERATION_HEADER = "X-IdeGym-Operation-Id"
#: ``Prefer: wait=<seconds>`` (RFC 7240): answer within that time instead of 202-and-poll.
PREFER_HEADER = "Prefer"
PREFERENCE_APPLIED_HEADER = "Preference-Applied"
#: How a forward that did not reach the sandbox, or got no usable answer, starts its body: the
#: marker the published ``idegym-client`` reads (``tests/test_published_client.py``).
FORWARD_FAILED = "Failed to forward request"

# -- credentials ---------------------------------------------------------------------------------

TOKEN_FILE = "token"  # in the state directory, 0600: the control plane's token (``control_plane/auth.py``)
TOKEN_USER = "idegym"  # the HTTP Basic user that goes with the token

# -- defaults ------------------------------------------------------------------------------------

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
BUILTIN_IMAGE = "idegym/builtin:latest"  # the host's toolchains and an empty project
STATE_DIR_NAME = "idegym"  # under $XDG_STATE_HOME (default ~/.local/state)
DEFAULT_ORPHAN_TTL = 600.0  # seconds a local sandbox outlives the last renewal of its lease
DEFAULT_DELETE_TIMEOUT = 20.0  # seconds a local sandbox's stop or delete may take before it fails
LEASE_FILE = "lease"  # in the state directory: the lease local sandboxes end by
DEFAULT_STORAGE_BYTES = 8 << 30  # what a local sandbox may write when its request says nothing
DEFAULT_STORAGE_INODES = 262_144


def default_state_dir(xdg_state_home: str | None = None) -> Path:
    """The control plane's state directory when none is given: ``$XDG_STATE_HOME/idegym``, else
    ``~/.local/state/idegym`` (the settings layers pass ``$XDG_STATE_HOME``)."""
    base = Path(xdg_state_home) if xdg_state_home else Path.home() / ".local" / "state"
    return base / STATE_DIR_NAME
