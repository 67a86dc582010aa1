"""Where the caches shared by every state directory of this user live."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(name: str, override_env: str | None = None) -> Path:
    """``$<override_env>`` when set, else ``$XDG_CACHE_HOME/idegym/<name>`` (default ``~/.cache``)."""
    explicit = os.environ.get(override_env) if override_env else None
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "idegym" / name
