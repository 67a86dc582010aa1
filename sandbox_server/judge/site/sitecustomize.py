"""The start-up hook of every Python a grading stage runs: this directory, alone, is the stage's
``PYTHONPATH``, so that nothing of the project is on ``sys.path`` while the interpreter starts
(``encodings``, ``site`` and this hook are the standard library's). It guards the interpreter
(``../path_guard.py``: the standard library and installed packages are imported from where they
are installed), then puts the task's own ``PYTHONPATH`` (``$IDEGYM_PYTHONPATH``) first on
``sys.path``, where ``PYTHONPATH`` would have put it, and runs the image's own ``sitecustomize``.
Stdlib only, Python 3.8 syntax.
"""

import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main():
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    guard = _load("_idegym_path_guard", os.path.join(os.path.dirname(HERE), "path_guard.py"))
    exempt = [n for n in os.environ.get("IDEGYM_PROJECT_MODULES", "").split(",") if n]
    installed = guard.install(os.environ.get("IDEGYM_PROJECT_DIR") or None, exempt)
    own = importlib.machinery.PathFinder.find_spec("sitecustomize", installed.trusted)
    if own is not None and own.origin and os.path.dirname(os.path.abspath(own.origin)) != HERE:
        try:
            _load("_image_sitecustomize", own.origin)
        except Exception as exc:  # as site.py reports its own sitecustomize's failure
            sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")
    extra = os.environ.get("IDEGYM_PYTHONPATH")
    if extra:
        sys.path[0:0] = [os.path.abspath(p) for p in extra.split(os.pathsep)]


_main()
