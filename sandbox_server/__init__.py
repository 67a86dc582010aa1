"""IdeGym's in-sandbox server: tools, rewards, project reset and a code runner over HTTP.

Depends only on h11, pydantic and diff-match-patch (uvloop when present), so it can be installed
alone in any image and starts fast.
"""

__version__ = "0.1.0"

from .app import create_app  # noqa: E402
from .config import ServerConfig  # noqa: E402

__all__ = ["create_app", "ServerConfig", "__version__"]
