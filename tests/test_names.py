"""One name per concept: no two public classes of the product code share a name, so a reader (or an
import) never has to ask which ``Endpoint`` or ``Episode`` is meant. Can fail: two modules that
each define ``class Endpoint`` (as the control plane and the sandbox server once did)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("idegym_env", "control_plane", "sandbox_server")
SKIPPED = ("idegym_env/tasks/bundled/", "idegym_env/tasks/data/")  # task content, not product code

# Names shared on purpose, each with why.
SHARED = {
    # The client's exceptions are named after the HTTP answer they stand for, as the servers' errors
    # that produce that answer are; a module holds only one side.
    "BadRequest": {"idegym_env/errors.py", "sandbox_server/errors.py"},
    "Conflict": {"idegym_env/errors.py", "sandbox_server/errors.py"},
    "NotFound": {"idegym_env/errors.py", "sandbox_server/errors.py"},
    "Unauthorized": {"idegym_env/errors.py", "control_plane/errors.py"},
    # The class name each framework's configuration names (``environment_class``, a Harbor import path).
    "IdeGymEnvironment": {"idegym_env/integrations/mini_swe_agent.py", "idegym_env/integrations/harbor.py"},
    # A web framework's request and response objects, and the wire models' base classes.
    "Request": {"control_plane/models.py", "sandbox_server/web.py", "sandbox_server/models.py"},
    "Response": {"idegym_env/client/_http.py", "control_plane/models.py", "sandbox_server/web.py",
                 "sandbox_server/models.py"},
}


def _public_classes() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith(SKIPPED):
                continue
            for node in ast.parse(path.read_text(), rel).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    found[node.name].add(rel)
    return found


def test_no_two_public_classes_share_a_name() -> None:
    shared = {name: where for name, where in _public_classes().items() if len(where) > 1}
    unexplained = {name: sorted(where) for name, where in shared.items() if SHARED.get(name) != where}
    assert not unexplained, f"one name, several classes (rename one, or say why in SHARED): {unexplained}"


def test_the_shared_names_are_still_shared() -> None:
    """The allowance does not outlive its reason."""
    classes = _public_classes()
    stale = sorted(name for name, where in SHARED.items() if classes.get(name) != where)
    assert not stale, f"SHARED lists names no longer defined in exactly those modules: {stale}"
