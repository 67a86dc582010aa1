"""IdeGym episodes over OpenEnv's protocol (``pip install 'idegym[openenv]'``).

* :mod:`.models` — ``IdeAction`` (one tool call), ``IdeObservation`` (every detail as a field:
  OpenEnv drops ``metadata``), ``IdeState``;
* :mod:`.environment` — ``IdeGymOpenEnv``, the OpenEnv ``Environment`` around one ``IdeGymEnv``
  per session;
* :mod:`.server` — ``create_app`` and ``idegym openenv serve``;
* :mod:`.inner` — the private sandbox server of a server running inside its own sandbox.

See ``docs/openenv.md``. Importing this package is cheap; the names below load openenv-core on
first use.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "IdeAction": ".models",
    "IdeObservation": ".models",
    "IdeState": ".models",
    "IdeGymOpenEnv": ".environment",
    "create_app": ".server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_LAZY)
