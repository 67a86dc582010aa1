"""Run the unittest suite in tests/ and write a JUnit XML report to test-results.xml.

The sandbox has the Python standard library only (no pytest), so this small runner records each
test's outcome and writes the report the test check reads. Exit code 0 iff every test passed.
"""

import sys
import time
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "test-results.xml"


class RecordingResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []  # (test id, outcome, detail, seconds)
        self._started = 0.0

    def startTest(self, test):
        self._started = time.perf_counter()
        super().startTest(test)

    def _record(self, test, outcome, detail=""):
        self.records.append((test.id(), outcome, detail, time.perf_counter() - self._started))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failure", "unexpected success")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            outcome = "failure" if issubclass(err[0], test.failureException) else "error"
            self._record(subtest, outcome, self._exc_info_to_string(err, test))


def write_report(records, path):
    suite = ET.Element("testsuite", name="unittest", tests=str(len(records)),
                       failures=str(sum(r[1] == "failure" for r in records)),
                       errors=str(sum(r[1] == "error" for r in records)),
                       skipped=str(sum(r[1] == "skipped" for r in records)))
    for test_id, outcome, detail, seconds in records:
        classname, _, name = test_id.rpartition(".")
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.4f}")
        if outcome != "passed":
            tag = {"failure": "failure", "error": "error", "skipped": "skipped"}[outcome]
            message = detail.strip().splitlines()[-1][:200] if detail.strip() else ""
            ET.SubElement(case, tag, message=message).text = detail
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def main():
    sys.path.insert(0, str(ROOT))
    loader = unittest.defaultTestLoader
    suite = loader.discover(str(ROOT / "tests"), pattern="test_*.py", top_level_dir=str(ROOT))
    result = unittest.TextTestRunner(resultclass=RecordingResult, verbosity=2, stream=sys.stdout).run(suite)
    write_report(result.records, REPORT)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
