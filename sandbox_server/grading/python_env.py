"""How a grading stage's Python starts: guarded against modules planted in the project.

Every stage runs with ``PYTHONPATH`` set to the judge's start-up hook alone
(``judge/site/sitecustomize.py``), which installs ``judge/path_guard.py`` in each ``python3`` the
stage starts: the standard library and the image's installed packages (pytest, its plugins,
what the tests import) resolve from where they are installed, never from a ``pytest.py`` or an
``argparse.py`` the agent left in the project, whatever the task's ``PYTHONPATH`` puts first. The
task's own ``PYTHONPATH`` goes to ``$IDEGYM_PYTHONPATH`` (the hook puts it first on ``sys.path``);
the names the pristine project provides at its roots (the project directory and its
``PYTHONPATH`` directories) are ``$IDEGYM_PROJECT_MODULES``, resolved as before (none without a
pristine copy of the project: then every installed name is the image's).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..judge import HOME as JUDGE_HOME
from ..judge.path_guard import modules_in

GUARD_SITE = os.path.join(JUDGE_HOME, "site")


def project_modules(pristine: Path, project: Path, pythonpath: str) -> set[str]:
    """Top-level module names the pristine project provides at the roots ``sys.path`` may hold:
    the project directory and the ``PYTHONPATH`` entries inside it (relative ones are the
    project's, as a stage runs in it)."""
    roots = [pristine]
    for entry in filter(None, pythonpath.split(os.pathsep)):
        path = Path(entry) if os.path.isabs(entry) else project / entry
        try:
            rel = Path(os.path.normpath(path)).relative_to(project)
        except ValueError:
            continue  # outside the project: the image's, trusted
        roots.append(pristine / rel)
    names: set[str] = set()
    for root in roots:
        names |= modules_in(str(root))
    return names


def guarded(env: dict[str, str], project: Path, pristine: Path | None) -> dict[str, str]:
    """``env`` for a stage whose every Python is guarded (see the module docstring)."""
    out = dict(env)
    task_path = out.pop("PYTHONPATH", "")
    out.pop("IDEGYM_PYTHONPATH", None)
    if task_path:
        out["IDEGYM_PYTHONPATH"] = task_path
    out.update(PYTHONPATH=GUARD_SITE, IDEGYM_PROJECT_DIR=str(project),
               IDEGYM_PROJECT_MODULES=",".join(sorted(project_modules(pristine, project, task_path)
                                                      if pristine is not None else ())))
    return out
