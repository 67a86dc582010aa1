"""A test log read the way a SWE-family dataset names it, written as a JUnit XML report
(stdlib only, Python 3.8 syntax: it runs inside the task's image).

``python3 log_junit.py PARSER LOG REPORT`` — ``PARSER`` is the name a dataset row gives
(SWE-bench's ``MAP_REPO_TO_PARSER`` values, SWE-rebench's ``install_config.log_parser``): each
test the log reports becomes a ``<testcase name="<its id as the log writes it>">`` with its
outcome, so the report's ids are the dataset's FAIL_TO_PASS / PASS_TO_PASS ids. Exit code 0 when
the log reported at least one test, 2 otherwise.

The readers:

* pytest's ``-rA`` summary (``PASSED path::test``, ``FAILED path::test - message``) and its
  verbose lines (``path::test PASSED``), colours removed (``parse_log_pytest``,
  ``parse_log_pytest_options``, ``parse_log_pytest_v2`` and the projects that use it);
* unittest's and Django's verbose lines (``test_x (module.Class) ... ok``), a failure's
  ``FAIL: test_x (module.Class)`` header included (``parse_log_django``, ``parse_log_unittest``);
* SymPy's runner (``test_x ok`` / ``test_x F`` / ``test_x E``) (``parse_log_sympy``).
"""

import re
import sys
import xml.etree.ElementTree as ET

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
PYTEST_STATES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
                 "XFAIL": "passed", "XPASS": "failed"}


def parse_pytest(text):
    out = {}
    for raw in text.splitlines():
        line = ANSI.sub("", raw).strip()
        if not line:
            continue
        word = line.split(" ", 1)[0]
        if word in PYTEST_STATES and " " in line:  # the -rA summary: "FAILED path::test - message"
            test = line.split(" ", 1)[1]
            if word in ("FAILED", "ERROR") and " - " in test:
                test = test.split(" - ", 1)[0]
            out[test.strip()] = PYTEST_STATES[word]
            continue
        found = re.match(r"^(\S+::\S.*?)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)
        if found:  # a verbose line: "path::test PASSED [ 10%]"
            out.setdefault(found.group(1), PYTEST_STATES[found.group(2)])
    return out


UNITTEST_LINE = re.compile(r"^(\w+) \(([\w.]+)\)(?:\n?[^\n]*?)? \.\.\. (ok|FAIL|ERROR|skipped|expected failure"
                           r"|unexpected success)", re.MULTILINE)
UNITTEST_STATES = {"ok": "passed", "FAIL": "failed", "ERROR": "error", "skipped": "skipped",
                   "expected failure": "passed", "unexpected success": "failed"}


def parse_unittest(text):
    text = ANSI.sub("", text)
    out = {}
    for name, where, state in UNITTEST_LINE.findall(text):
        out[name + " (" + where + ")"] = UNITTEST_STATES[state]
    for kind, name, where in re.findall(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)", text, re.MULTILINE):
        out[name + " (" + where + ")"] = "failed" if kind == "FAIL" else "error"
    return out


def parse_sympy(text):
    text = ANSI.sub("", text)
    out = {}
    for name, state in re.findall(r"^(test_\w+)\s+(ok|F|E|f|s|w|X)\s*$", text, re.MULTILINE):
        out[name] = {"ok": "passed", "F": "failed", "E": "error", "f": "passed", "s": "skipped", "w": "skipped",
                     "X": "failed"}[state]
    return out


PARSERS = {"parse_log_pytest": parse_pytest, "parse_log_pytest_options": parse_pytest,
           "parse_log_pytest_v2": parse_pytest, "parse_log_astropy": parse_pytest,
           "parse_log_matplotlib": parse_pytest, "parse_log_seaborn": parse_pytest, "parse_log_sphinx": parse_pytest,
           "parse_log_requests": parse_pytest, "parse_log_xarray": parse_pytest, "parse_log_pylint": parse_pytest,
           "parse_log_django": parse_unittest, "parse_log_unittest": parse_unittest,
           "parse_log_sympy": parse_sympy}


def main(argv):
    if len(argv) != 3 or argv[0] not in PARSERS:
        sys.stderr.write("usage: log_junit.py {" + "|".join(sorted(PARSERS)) + "} LOG REPORT\n")
        return 2
    with open(argv[1], errors="replace") as fh:
        cases = PARSERS[argv[0]](fh.read())
    suite = ET.Element("testsuite", name=argv[0], tests=str(len(cases)))
    for name, outcome in sorted(cases.items()):
        case = ET.SubElement(suite, "testcase", name=name)
        if outcome in ("failed", "error"):
            ET.SubElement(case, "failure" if outcome == "failed" else "error", message="as the test log says")
        elif outcome == "skipped":
            ET.SubElement(case, "skipped")
    ET.ElementTree(suite).write(argv[2], encoding="utf-8", xml_declaration=True)
    return 0 if cases else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
