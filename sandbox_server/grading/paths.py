"""Which project paths are the agent's to change: editable globs, and the names never exported.

Globs are project-relative POSIX patterns: ``*`` and ``?`` stay inside one path segment, ``**``
spans any number of segments, and a pattern without wildcards also names everything below it
(``src`` = ``src/**``). Some names configure a harness, a build or an interpreter rather than
hold code under test; they are left out whatever the globs say, unless a glob names the path
exactly (a task whose agent must edit its ``package.json`` says so).
"""

from __future__ import annotations

import fnmatch
import re
from functools import lru_cache

WILDCARDS = re.compile(r"[*?\[]")
# Directories that are caches, tool state or other people's code: never walked.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".pytest_cache", ".mypy_cache",
                       ".ruff_cache", ".tox", ".nox", ".venv", "venv", ".eggs", "META-INF"})
DENIED_NAMES = frozenset({
    "conftest.py", "sitecustomize.py", "usercustomize.py", "pytest.ini", "tox.ini", "setup.cfg", "noxfile.py",
    "pyproject.toml", "package.json", "package-lock.json", ".npmrc", ".yarnrc", ".pnpmfile.cjs", "jest.config.js",
    "Makefile", "GNUmakefile", "CMakeLists.txt", "pom.xml", "build.gradle", "build.gradle.kts",
    "settings.gradle", "settings.gradle.kts", ".bashrc", ".profile", ".bash_profile", ".envrc", ".env",
    "test-results.xml",
})
DENIED_PATTERNS = ("*.pth", "*.pyc", "*.pyo", "*.class", "*.jar", "*.so", "*.so.*", "*.o", "*.a", "*.dll",
                   "*.dylib", "*.node", ".*rc", "*.egg-info", "test-*.xml", "TEST-*.xml")


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


def denied(path: str, patterns: list[str] | tuple[str, ...] = ()) -> bool:
    """A harness or build configuration file (unless a pattern names ``path`` exactly)."""
    if path in patterns:
        return False
    parts = path.split("/")
    if any(part in SKIP_DIRS for part in parts[:-1]):
        return True
    name = parts[-1]
    return name in DENIED_NAMES or any(fnmatch.fnmatchcase(name, p) for p in DENIED_PATTERNS)


def under(path: str, prefixes: list[str] | tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)
