"""JUnit XML reports (pytest, Maven Surefire, Gradle, jest-junit) → test counts."""

from __future__ import annotations

import fnmatch
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

MAX_REPORT_BYTES = 64 << 20
SKIP_DIRS = {".git", "node_modules", ".venv", "venv", "__pycache__", ".mypy_cache", ".tox"}
MAX_DEPTH = 10


@dataclass
class Counts:
    total: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def __iadd__(self, other: Counts) -> Counts:
        self.total += other.total
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        return self


def _int(value: str | None) -> int:
    try:
        return max(int(float(value or 0)), 0)
    except ValueError:
        return 0


def parse_report(path: Path) -> Counts:
    """Count one report. Raises ``ValueError`` when it is not a JUnit XML document.

    Counts ``<testcase>`` elements when there are any (robust across producers and nesting):
    a case with ``<failure>`` or ``<error>`` failed, with ``<skipped>`` was skipped, else passed.
    A report with suites but no cases falls back to the suites' own attributes.
    """
    if path.stat().st_size > MAX_REPORT_BYTES:
        raise ValueError(f"{path}: larger than {MAX_REPORT_BYTES} bytes")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise ValueError(f"{path}: not well-formed XML ({exc})") from exc
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"{path}: root element <{root.tag}> is not <testsuites> or <testsuite>")
    counts = Counts()
    cases = list(root.iter("testcase"))
    if cases:
        for case in cases:
            counts.total += 1
            if case.find("failure") is not None or case.find("error") is not None:
                counts.failed += 1
            elif case.find("skipped") is not None:
                counts.skipped += 1
            else:
                counts.passed += 1
        return counts
    suites = [root] if root.tag == "testsuite" else [s for s in root if s.tag == "testsuite"]
    for suite in suites:
        tests = _int(suite.get("tests"))
        failed = _int(suite.get("failures")) + _int(suite.get("errors"))
        skipped = _int(suite.get("skipped")) + _int(suite.get("disabled"))
        counts += Counts(tests, max(tests - failed - skipped, 0), failed, skipped)
    return counts


def find_reports(root: Path, pattern: str) -> dict[Path, tuple[int, int]]:
    """Report files under ``root`` whose name matches ``pattern`` (case-insensitive), with their
    (inode, ctime) so that a caller can tell which ones a run wrote."""
    found: dict[Path, tuple[int, int]] = {}
    pattern = pattern.lower()
    root_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        if len(Path(dirpath).parts) - root_depth >= MAX_DEPTH:
            dirnames[:] = []
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            if fnmatch.fnmatchcase(name.lower(), pattern):
                path = Path(dirpath, name)
                try:
                    st = path.stat()
                except OSError:
                    continue
                found[path] = (st.st_ino, st.st_ctime_ns)
    return found
