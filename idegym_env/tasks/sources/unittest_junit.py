"""Run unittest modules and write a JUnit XML report (stdlib only, Python 3.8 syntax).

``python3 unittest_junit.py --junit REPORT MODULE...`` — each test is a ``<testcase>`` with
``classname`` = ``package.module.Class`` and ``name`` = the method, so the report's ids are the
dotted unittest ids (``package.module.Class.test_x``). A module that does not import becomes one
erroring case named after it, so the tests it holds are missing from the report (and count as
failed). Exit code 0 when every test passed, 1 otherwise.
"""

import argparse
import sys
import time
import traceback
import unittest
import xml.etree.ElementTree as ET


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.cases = []  # (classname, name, outcome, message, seconds)
        self._started = {}

    def _split(self, test):
        ident = test.id()
        classname, _, name = ident.rpartition(".")
        return classname, name

    def startTest(self, test):
        super().startTest(test)
        self._started[test.id()] = time.perf_counter()

    def _record(self, test, outcome, message=""):
        classname, name = self._split(test)
        seconds = time.perf_counter() - self._started.get(test.id(), time.perf_counter())
        self.cases.append((classname, name, outcome, message, seconds))

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
        if err is not None:  # a failing subtest fails its test
            outcome = "failure" if issubclass(err[0], test.failureException) else "error"
            self._record(test, outcome, self._exc_info_to_string(err, test))


def _write(path, cases):
    suite = ET.Element("testsuite", name="unittest", tests=str(len(cases)),
                       failures=str(sum(c[2] == "failure" for c in cases)),
                       errors=str(sum(c[2] == "error" for c in cases)),
                       skipped=str(sum(c[2] == "skipped" for c in cases)))
    seen = {}
    for classname, name, outcome, message, seconds in cases:
        key = (classname, name)
        if key in seen:  # a test with failing subtests is recorded once, failed
            if outcome != "passed":
                case = seen[key]
                for child in list(case):
                    case.remove(child)
                ET.SubElement(case, outcome, message=message[:200]).text = message
            continue
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.3f}")
        seen[key] = case
        if outcome != "passed":
            ET.SubElement(case, outcome, message=message[:200]).text = message
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", required=True, help="where to write the JUnit XML report")
    parser.add_argument("modules", nargs="+", help="dotted module names, e.g. tests.test_cache")
    args = parser.parse_args(argv)
    result = _Result()
    loader = unittest.TestLoader()
    for module in args.modules:
        try:
            suite = loader.loadTestsFromName(module)
        except Exception:  # noqa: BLE001 - an import error is a result, not a crash
            result.cases.append((module, "<import>", "error", traceback.format_exc(), 0.0))
            continue
        suite.run(result)
    _write(args.junit, result.cases)
    bad = [c for c in result.cases if c[2] in ("failure", "error")]
    print(f"{sum(c[2] == 'passed' for c in result.cases)} passed, {len(bad)} failed")
    return 1 if bad or not result.cases else 0


if __name__ == "__main__":
    sys.exit(main())
