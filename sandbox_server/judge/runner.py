"""The judge's test runner: unittest modules run in this (trusted) process, the code under test
in subject processes (``subject.py``); the JUnit report is written here.

Run as ``$IDEGYM_JUDGE [--junit FILE] [--pattern GLOB] PATH...`` (files or directories, relative
to the current directory). During grading the sandbox server runs it as root with
``IDEGYM_REPORT_DIR`` (a directory only root can write) and ``IDEGYM_SUBJECT_USER`` (the tool
user subjects run as); an agent runs it the same way to see how its code does.
Exit code: 0 when every test passed, 1 when one did not, 5 when no test was found.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import os
import sys
import time
import traceback
import unittest
import xml.etree.ElementTree as ET

from . import path_guard, subject

REPORT_NAME = "judge.xml"
NO_TESTS = 5
MAX_DETAIL = 8000


class Record:
    __slots__ = ("name", "classname", "outcome", "detail", "seconds")

    def __init__(self, classname: str, name: str, outcome: str, detail: str = "", seconds: float = 0.0) -> None:
        self.classname, self.name, self.outcome, self.detail, self.seconds = classname, name, outcome, detail, seconds

    @property
    def test_id(self) -> str:
        return f"{self.classname}.{self.name}"


class RecordingResult(unittest.TestResult):
    """One record per test method: its worst outcome, its subtests' failures included."""

    def __init__(self, stream) -> None:
        super().__init__()
        self.stream = stream
        self.records: list[Record] = []
        self._current: dict[str, Record] = {}
        self._started = 0.0

    def startTest(self, test) -> None:
        super().startTest(test)
        self._started = time.perf_counter()
        classname, _, name = test.id().rpartition(".")
        self._current[test.id()] = Record(classname, name, "passed")

    def stopTest(self, test) -> None:
        super().stopTest(test)
        record = self._current.pop(test.id())
        record.seconds = time.perf_counter() - self._started
        self.records.append(record)
        word = {"passed": "ok", "failure": "FAIL", "error": "ERROR", "skipped": "skipped"}[record.outcome]
        self.stream.write(f"{record.test_id} ... {word}\n")
        if record.detail and record.outcome in ("failure", "error"):
            self.stream.write(_indent(record.detail) + "\n")
        self.stream.flush()

    def _mark(self, test, outcome: str, err=None, note: str = "") -> None:
        record = self._current.get(test.id())
        if record is None:  # a subtest: charge its test
            record = self._current.get(getattr(test, "test_case", test).id())
        if record is None:
            return
        rank = {"passed": 0, "skipped": 1, "failure": 2, "error": 3}
        if rank[outcome] >= rank[record.outcome]:
            record.outcome = outcome
        detail = note or (_describe(err) if err is not None else "")
        if detail:
            record.detail = (record.detail + "\n" + detail).strip()[:MAX_DETAIL]

    def addFailure(self, test, err) -> None:
        super().addFailure(test, err)
        self._mark(test, "failure", err)

    def addError(self, test, err) -> None:
        super().addError(test, err)
        self._mark(test, "error", err)

    def addSkip(self, test, reason) -> None:
        super().addSkip(test, reason)
        self._mark(test, "skipped", note=str(reason))

    def addUnexpectedSuccess(self, test) -> None:
        super().addUnexpectedSuccess(test)
        self._mark(test, "failure", note="unexpected success")

    def addSubTest(self, test, subtest, err) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._mark(test, "failure" if issubclass(err[0], test.failureException) else "error", err)


def _describe(err) -> str:
    kind, value, tb = err
    text = "".join(traceback.format_exception(kind, value, tb))
    remote = getattr(value, "remote_traceback", "")
    if remote:
        text += "\nin the code under test:\n" + remote
    return text[-MAX_DETAIL:]


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def discover(paths: list[str], pattern: str) -> list[str]:
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            for dirpath, dirnames, filenames in os.walk(path):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
                files += [os.path.join(dirpath, f) for f in sorted(filenames) if fnmatch.fnmatch(f, pattern)]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise SystemExit(f"idegym-judge: {path}: no such test file or directory")
    return files


def load(path: str):
    """Import one test module by path (its directory first on sys.path, for its helpers)."""
    name = os.path.splitext(os.path.basename(path))[0]
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run(files: list[str], stream) -> list[Record]:
    result = RecordingResult(stream)
    loader = unittest.TestLoader()
    records: list[Record] = []
    for path in files:
        stem = os.path.splitext(os.path.basename(path))[0]
        try:
            module = load(path)
        except BaseException as exc:  # noqa: BLE001 - a test file that does not load is an error case
            if isinstance(exc, KeyboardInterrupt):
                raise
            records.append(Record(stem, "(import)", "error", _describe(sys.exc_info())))
            stream.write(f"{stem} ... ERROR (the test module did not load)\n{_indent(records[-1].detail)}\n")
            continue
        loader.loadTestsFromModule(module).run(result)
    return records + result.records


def write_report(records: list[Record], path: str) -> None:
    suite = ET.Element("testsuite", name="idegym-judge", tests=str(len(records)),
                       failures=str(sum(r.outcome == "failure" for r in records)),
                       errors=str(sum(r.outcome == "error" for r in records)),
                       skipped=str(sum(r.outcome == "skipped" for r in records)))
    for record in records:
        case = ET.SubElement(suite, "testcase", classname=record.classname, name=record.name,
                             time=f"{record.seconds:.4f}")
        if record.outcome != "passed":
            lines = record.detail.strip().splitlines()
            ET.SubElement(case, record.outcome, message=(lines[-1] if lines else "")[:300]).text = record.detail
    root = ET.Element("testsuites")
    root.append(suite)
    tmp = path + ".tmp"
    ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    # Before any test directory goes on sys.path: what the tests import from the standard library
    # or the interpreter's packages comes from there, not from a module planted beside them.
    path_guard.install(os.getcwd())
    parser = argparse.ArgumentParser(prog="idegym-judge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="test files or directories")
    parser.add_argument("--pattern", default="test*.py", help="file names to run in directories (default: %(default)s)")
    parser.add_argument("--junit", help="also write the JUnit XML report to this file")
    args = parser.parse_args(argv)
    stream = sys.stdout
    try:
        records = run(discover(args.paths, args.pattern), stream)
    finally:
        subject.close_all()
    targets = [args.junit] if args.junit else []
    if os.environ.get("IDEGYM_REPORT_DIR"):
        targets.append(os.path.join(os.environ["IDEGYM_REPORT_DIR"], REPORT_NAME))
    for target in targets:
        write_report(records, target)
    passed = sum(r.outcome == "passed" for r in records)
    stream.write(f"\n{passed} passed, {len(records) - passed} failed\n")
    if not records:
        stream.write("idegym-judge: no test found\n")
        return NO_TESTS
    ok = passed == len(records)
    stream.write("OK\n" if ok else "FAILED\n")  # unittest's last word, which agents look for
    return 0 if ok else 1
