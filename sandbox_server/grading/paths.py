"""Which project paths are the agent's to change: editable globs, and the names never exported.

Globs are project-relative POSIX patterns: ``*`` and ``?`` stay inside one path segment, ``**``
spans any number of segments, and a pattern without wildcards also names everything below it
(``src`` = ``src/**``). Some names configure a harness, a build or an interpreter rather than
hold code under test; they are left out whatever the globs say, unless a glob names the path
exactly (a task whose agent must edit its ``package.json`` says so). Names are compared without
regard to case (``makefile``, ``CONFTEST.PY``). Two rules stand beside the list:

* the configuration files of JavaScript tools, ``<tool>.config.<js|cjs|mjs|ts|cts|mts|json>``
  (jest, vitest, babel, …), and every ``.<tool>rc`` (with or without an extension);
* a *new* Python module (``X.py``, ``X/__init__.py``) outside a package of the graded tree,
  whose name is a module of the standard library or of the image's installed packages: on
  ``sys.path`` it would shadow what the harness imports (``pytest.py``, ``argparse.py``).
  Files the pristine project has are the task's, whatever their names.
"""

from __future__ import annotations

import fnmatch
import glob
import re
import sys
from functools import lru_cache

from ..judge.path_guard import modules_in

WILDCARDS = re.compile(r"[*?\[]")
# Directories that are caches, tool state, other people's code or tool configuration: never walked.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".pytest_cache", ".mypy_cache",
                       ".ruff_cache", ".tox", ".nox", ".venv", "venv", ".eggs", "meta-inf", ".mvn", ".cargo"})
DENIED_NAMES = frozenset({
    "conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", ".pytest.ini", "pytest.toml",
    ".pytest.toml", "tox.ini", "setup.cfg", "setup.py", "noxfile.py", "pyproject.toml", "package.json",
    "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "pnpm-workspace.yaml",
    ".pnpmfile.cjs", ".yarnrc.yml", "tsconfig.json", "makefile", "gnumakefile", "cmakelists.txt",
    "cmakepresets.json", "meson.build", "build.ninja", "pom.xml", "build.gradle", "build.gradle.kts",
    "settings.gradle", "settings.gradle.kts", "gradle.properties", "gradlew", "build.rs", "cargo.toml",
    "rust-toolchain", "rust-toolchain.toml", ".bashrc", ".profile", ".bash_profile", ".bash_login",
    ".bash_logout", ".envrc", ".env", "test-results.xml",
})
DENIED_PATTERNS = ("*.pth", "*.pyc", "*.pyo", "*.class", "*.jar", "*.so", "*.so.*", "*.o", "*.a", "*.dll",
                   "*.dylib", "*.node", "*.cmake", "*.egg-info", "test-*.xml", ".*rc", ".*rc.*",
                   "*.config.js", "*.config.cjs", "*.config.mjs", "*.config.ts", "*.config.cts", "*.config.mts",
                   "*.config.json")
# Where an image's Python keeps its installed packages (what a check's harness imports).
SITE_GLOBS = ("/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages", "/usr/lib/python3*/dist-packages",
              "/usr/local/lib/python3*/site-packages", "/usr/local/lib/python3*/dist-packages")


@lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    parts = pattern.strip("/").split("/")
    out = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            out += ".*" if last else "(?:[^/]+/)*"
            continue
        out += _segment(part) + ("" if last else "/")
    if not WILDCARDS.search(pattern):
        out += "(?:/.*)?"
    return re.compile(out + r"\Z")


def _segment(part: str) -> str:
    out, i = "", 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = part.find("]", i + 2)
            if end < 0:
                out += re.escape(c)
            else:
                body = part[i + 1:end].replace("\\", "\\\\")
                out += "[" + ("^" + body[1:] if body.startswith("!") else body) + "]"
                i = end
        else:
            out += re.escape(c)
        i += 1
    return out


def matches(path: str, patterns: list[str] | tuple[str, ...]) -> bool:
    return any(compile_glob(p).match(path) for p in patterns)


def skipped_dir(name: str) -> bool:
    return name.lower() in SKIP_DIRS


def denied(path: str, patterns: list[str] | tuple[str, ...] = ()) -> bool:
    """A harness or build configuration file (unless a pattern names ``path`` exactly)."""
    if path in patterns:
        return False
    parts = path.lower().split("/")
    if any(part in SKIP_DIRS for part in parts[:-1]):
        return True
    name = parts[-1]
    return name in DENIED_NAMES or any(fnmatch.fnmatchcase(name, p) for p in DENIED_PATTERNS)


@lru_cache(maxsize=1)
def protected_modules() -> frozenset[str]:
    """Top-level module names a planted module must not take: the standard library's and those of
    the packages installed for the image's Python (read in this sandbox: a name added there only
    makes the export stricter; the grading's own guard is ``judge/path_guard.py``)."""
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    for pattern in SITE_GLOBS:
        for directory in glob.glob(pattern):
            names |= modules_in(directory)
    return frozenset(names)


def module_name(path: str, graded: set[str]) -> str | None:
    """The top-level module ``path`` would be with its directory on ``sys.path``: ``X`` for
    ``X.py`` and ``X/__init__.py``, unless that directory is a package of ``graded`` (then it is
    a submodule, reached through its package)."""
    parts = path.split("/")
    if parts[-1] == "__init__.py" and len(parts) > 1:
        module, parent = parts[-2], parts[:-2]
    elif parts[-1].endswith(".py"):
        module, parent = parts[-1][:-3], parts[:-1]
    else:
        return None
    if parent and "/".join([*parent, "__init__.py"]) in graded:
        return None
    return module if module.isidentifier() else None


def under(path: str, prefixes: list[str] | tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)
