"""IdeGym's in-sandbox server: tools, rewards, project reset and a code runner over HTTP.

Depends only on pydantic and diff-match-patch (uvloop when present), so it can be installed
alone in any image and starts fast. Importing the package loads nothing of the server: clients
import its wire models (``models``, ``routes``, ``errors``) without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .app import create_app
    from .config import ServerConfig


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "ServerConfig":
        from .config import ServerConfig

        return ServerConfig
    raise AttributeError(name)


__all__ = ["create_app", "ServerConfig", "__version__"]
