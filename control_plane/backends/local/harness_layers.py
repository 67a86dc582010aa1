"""Agent harnesses' layers (``idegym_env.agents.layers``) in every local sandbox.

A harness (mini-swe-agent and its packages, an agent CLI from npm) is installed once into a
directory of its own under the harness root, named by the hash of what it holds; the root is
bound read-only at ``/opt/idegym/harness`` in every sandbox, so a task image never has to contain
one, and a layer installed after a sandbox started is there too (the bind shows the directory as
it is). The layers hold public packages and IdeGym's own driver scripts: nothing secret.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ...settings import ControlPlaneSettings
from .runtime import INSIDE, Runtime
from .user_cache import user_cache_dir

HARNESS_INSIDE = f"{INSIDE}/harness"


def harness_root() -> Path:
    """Where the layers live on the host (``$IDEGYM_HARNESS_CACHE``, default ``~/.cache/idegym/harness``)."""
    return user_cache_dir("harness", ControlPlaneSettings.from_env().harness_cache)


def with_harness_layers(runtime: Runtime) -> Runtime:
    """``runtime`` with the harness root bound read-only at ``HARNESS_INSIDE``."""
    root = harness_root()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # the sandbox's users read it; nothing in it is secret
    return replace(runtime, binds=[*runtime.binds, (str(root.resolve()), HARNESS_INSIDE)])
