"""Importing ``openenv-core`` without its Gradio web UI, and a clear error when it is missing.

``openenv.core.env_server`` imports its Gradio web interface eagerly, which costs about three
seconds (of ~4.4 s) at every start of a server — and the OpenEnv server inside an ``openenv``
sandbox starts with every sandbox. The package itself treats a missing Gradio as "no web UI"
(``create_web_interface_app = None``), so while importing it we make ``gradio`` look absent,
then remove the marker again: later ``import gradio`` in the same process works as usual, and
``create_app`` still imports the web UI on demand when ``ENABLE_WEB_INTERFACE`` is set. Nothing
changes when Gradio was already imported or the web UI is asked for.
"""

from __future__ import annotations

import os
import sys

INSTALL_HINT = "the OpenEnv server and models need openenv-core: pip install 'idegym[openenv]'"


def _web_ui_wanted() -> bool:
    return os.getenv("ENABLE_WEB_INTERFACE", "false").lower() in ("true", "1", "yes")


def import_openenv() -> None:
    """Import ``openenv.core.env_server`` (once), skipping the Gradio web UI when it is not wanted."""
    if "openenv.core.env_server" in sys.modules:
        return
    block = "gradio" not in sys.modules and not _web_ui_wanted()
    if block:
        sys.modules["gradio"] = None  # type: ignore[assignment]  # import gradio -> ModuleNotFoundError
    try:
        import openenv.core.env_server  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("openenv", "fastapi", "uvicorn", "fastmcp"):
            raise ModuleNotFoundError(f"{INSTALL_HINT} ({exc})", name=exc.name) from exc
        raise
    finally:
        if block and "gradio" in sys.modules and sys.modules["gradio"] is None:
            del sys.modules["gradio"]
