"""JUnit XML reports (pytest, Maven Surefire, Gradle, jest-junit) → test counts.

Which reports count: only those the test run itself wrote. ``find_reports`` stamps every
matching file with its (device, inode, mtime) before and after the run; ``fresh_reports`` keeps
the files whose content changed (a new inode or a new mtime) and counts each file once, however
many names (hard links, symlinks) it has. Neither a planted report nor a hard link to the place
the real one will be written adds anything: a changed *ctime* (a rename over one of its names, a
chmod) is not a write. Reports are read without following a FIFO or a device into a hang.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import xml.etree.ElementTree as ET
from collections.abc import Callable
from contextlib import AbstractContextManager
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


def _read_xml(path: Path, follow: bool = True) -> ET.Element:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)  # O_NONBLOCK: a FIFO must not block us
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file")
        if st.st_size > MAX_REPORT_BYTES:
            raise ValueError(f"{path}: larger than {MAX_REPORT_BYTES} bytes")
        data = os.read(fd, MAX_REPORT_BYTES + 1)
    finally:
        os.close(fd)
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise ValueError(f"{path}: not well-formed XML ({exc})") from exc
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"{path}: root element <{root.tag}> is not <testsuites> or <testsuite>")
    return root


def _outcome(case: ET.Element) -> str:
    if case.find("error") is not None:
        return "error"
    if case.find("failure") is not None:
        return "failed"
    if case.find("skipped") is not None:
        return "skipped"
    return "passed"


def parse_report(path: Path) -> Counts:
    """Count one report. Raises ``ValueError`` when it is not a JUnit XML document.

    Counts ``<testcase>`` elements when there are any (robust across producers and nesting):
    a case with ``<failure>`` or ``<error>`` failed, with ``<skipped>`` was skipped, else passed.
    A report with suites but no cases falls back to the suites' own attributes.
    """
    root = _read_xml(path)
    counts = Counts()
    cases = list(root.iter("testcase"))
    if cases:
        for case in cases:
            outcome = _outcome(case)
            counts.total += 1
            counts.failed += outcome in ("failed", "error")
            counts.skipped += outcome == "skipped"
            counts.passed += outcome == "passed"
        return counts
    suites = [root] if root.tag == "testsuite" else [s for s in root if s.tag == "testsuite"]
    for suite in suites:
        tests = _int(suite.get("tests"))
        failed = _int(suite.get("failures")) + _int(suite.get("errors"))
        skipped = _int(suite.get("skipped")) + _int(suite.get("disabled"))
        counts += Counts(tests, max(tests - failed - skipped, 0), failed, skipped)
    return counts


@dataclass
class Case:
    name: str  # canonical test id (see ``canonical_test_id``)
    outcome: str  # passed, failed, error, skipped
    message: str = ""


def parse_cases(path: Path) -> list[Case]:
    """The ``<testcase>`` elements of one report, without following a symlink at ``path``."""
    out = []
    for case in _read_xml(path, follow=False).iter("testcase"):
        name = case.get("name") or ""
        classname = case.get("classname") or ""
        outcome = _outcome(case)
        detail = case.find({"failed": "failure", "error": "error", "skipped": "skipped"}.get(outcome, "-"))
        message = (detail.get("message") or "") if detail is not None else ""
        out.append(Case(canonical_test_id(f"{classname}.{name}" if classname else name), outcome, message[:500]))
    return out


_UNITTEST_ID = re.compile(r"^(\w+) \(([\w.]+)\)$")


def canonical_test_id(test_id: str) -> str:
    """One spelling for a test id written as pytest (``tests/test_x.py::TestA::test_b[1]``),
    unittest/Django (``test_b (tests.test_x.TestA)``) or JUnit (``tests.test_x.TestA.test_b[1]``)."""
    test_id = test_id.strip()
    found = _UNITTEST_ID.match(test_id)
    if found:  # Python >= 3.11 writes the whole qualified name in the parentheses
        name, where = found.group(1), found.group(2)
        return where if where.endswith(f".{name}") else f"{where}.{name}"
    if "::" in test_id:
        file, _, rest = test_id.partition("::")
        module = file.removesuffix(".py").replace("/", ".").strip(".")
        return ".".join([module, *rest.split("::")])
    return test_id


Stamp = tuple[int, int, int]  # (device, inode, mtime_ns) of the file a name leads to


def parse_reports(paths: list[Path], identity: Callable[[], AbstractContextManager[None]]
                  ) -> list[tuple[Path, Counts | Exception]]:
    """``parse_report`` for each path, read with ``identity`` (the tool user's, so that a report
    symlinked to a file the tools cannot read stays unread); failures are returned, not raised."""
    out: list[tuple[Path, Counts | Exception]] = []
    with identity():
        for path in paths:
            try:
                out.append((path, parse_report(path)))
            except (ValueError, OSError) as exc:
                out.append((path, exc))
    return out


def find_reports(root: Path, pattern: str) -> dict[Path, Stamp]:
    """Report files under ``root`` whose name matches ``pattern`` (case-insensitive), with their
    stamp so that a caller can tell which ones a run wrote (``fresh_reports``)."""
    found: dict[Path, Stamp] = {}
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
                found[path] = (st.st_dev, st.st_ino, st.st_mtime_ns)
    return found


def fresh_reports(before: dict[Path, Stamp], after: dict[Path, Stamp]) -> list[Path]:
    """The reports written between the two scans, one name per file (sorted)."""
    seen: set[tuple[int, int]] = set()
    fresh = []
    for path in sorted(after):
        stamp = after[path]
        if before.get(path) == stamp or stamp[:2] in seen:
            continue
        seen.add(stamp[:2])
        fresh.append(path)
    return fresh
