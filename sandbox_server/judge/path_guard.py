"""The standard library and installed packages come first, whatever ``sys.path`` says.

A Python that grades — the judge's grader, the ``python3`` of every check stage — may have the
project ahead of the standard library on ``sys.path``: a task's ``PYTHONPATH`` (``src``, ``.``),
pytest's insertion of test directories, a script's own directory. A module planted there under a
name the harness imports (``pytest.py``, ``argparse.py``, ``json/__init__.py``) would run in the
grader and write its report. ``install`` puts a finder before the path finder: a top-level module
that the standard library or an installed package provides — a name found in the interpreter's
own ``sys.path`` entries outside the project (``trusted``) — is imported from those entries and
nowhere else; a standard-library name that is not installed is not found at all. Names the
pristine project itself provides at its roots (``exempt``: a project that is also installed,
``six.py`` beside Debian's ``python3-six``, a ``test/`` package) resolve as before: only a module
the agent added can be kept out this way, and the export leaves those out already.

Stdlib only, Python 3.8 syntax: it runs on whatever ``python3`` an image has.
"""

import importlib.machinery
import os
import sys
import sysconfig

EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def modules_in(directory):
    """The top-level module names a directory on ``sys.path`` provides (modules, packages,
    namespace portions, extension modules, sourceless modules)."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return set()
    names = set()
    for entry in entries:
        stem = entry.partition(".")[0]
        if not stem.isidentifier():
            continue
        if entry == stem:
            if os.path.isdir(os.path.join(directory, entry)):
                names.add(stem)
        elif entry.endswith((".py", ".pyc")) and entry.count(".") == 1 or entry.endswith(EXTENSION_SUFFIXES):
            names.add(stem)
    return names


def stdlib_names():
    """The standard library's top-level module names (listed from its directories before 3.10)."""
    names = set(sys.builtin_module_names)
    listed = getattr(sys, "stdlib_module_names", None)
    if listed:
        return names | set(listed)
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib"):
        if paths.get(key):
            names |= modules_in(paths[key]) | modules_in(os.path.join(paths[key], "lib-dynload"))
    return names - {"site-packages", "dist-packages"}


def _under(path, root):
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class PathGuard:
    """A meta path finder: protected top-level names only from the trusted entries."""

    def __init__(self, trusted, protected):
        self.trusted = list(trusted)
        self.protected = frozenset(protected)

    def find_spec(self, name, path=None, target=None):
        if path is not None or name not in self.protected:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, self.trusted)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r} (idegym: the standard library and installed "
                                      "packages are imported only from where they are installed)", name=name)
        return spec

    def invalidate_caches(self):
        pass


def install(project=None, exempt=()):
    """Guard this interpreter: the ``sys.path`` entries now outside ``project`` are trusted, and
    every name they or the standard library provide is imported from them alone (but the
    ``exempt`` names). Returns the guard (installed once)."""
    for finder in sys.meta_path:
        if isinstance(finder, PathGuard):
            return finder
    root = os.path.realpath(project) if project else None
    trusted = [p for p in sys.path if p and (root is None or not _under(os.path.realpath(p), root))]
    installed = set()
    for entry in trusted:
        installed |= modules_in(entry)
    guard = PathGuard(trusted, (stdlib_names() | installed) - set(exempt))
    at = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), len(sys.meta_path))
    sys.meta_path.insert(at, guard)
    return guard
