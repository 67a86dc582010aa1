"""The judge: what crosses from the code under test into the grader's assertions.

These run the judge for real on this machine (``python -I run.py``, its subject a process of its
own), without a sandbox: the verdict must not depend on anything the code under test decides
but the plain data it returns.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from idegym_env.tasks import load_task
from idegym_env.tasks.sources import problems
from sandbox_server.judge import ENTRY

# A result that answers every operator in the test's favour: the difference from any expected
# value is 0, it is true, as long as wanted, holds everything, prints as wanted.
FORGER = textwrap.dedent("""\
    class Forged:
        def __sub__(self, other): return 0
        def __rsub__(self, other): return 0
        def __add__(self, other): return 2
        def __mul__(self, other): return 2
        def __truediv__(self, other): return 2
        def __pow__(self, other): return 4
        def __neg__(self): return 0
        def __abs__(self): return 0
        def __eq__(self, other): return True
        def __ne__(self, other): return False
        def __lt__(self, other): return True
        def __hash__(self): return 5
        def __bool__(self): return True
        def __len__(self): return 3
        def __iter__(self): return iter([1, 2])
        def __contains__(self, item): return True
        def __getitem__(self, key): return 1
        def __int__(self): return 3
        def __float__(self): return 3.0
        def __index__(self): return 3
        def __str__(self): return "wanted"
        def __repr__(self): return "wanted"
        def __format__(self, spec): return "wanted"

    def forged():
        return Forged()

    class Box:
        def __init__(self, *items): self.items = list(items)
        def __len__(self): return len(self.items)
        def __contains__(self, item): return item in self.items
        def size(self): return len(self.items)
    """)

# Each test passes if the operator it uses is answered by the code under test.
TESTS = textwrap.dedent("""\
    import unittest
    from idegym_judge import subject

    mod = subject.module("forger")

    class Operators(unittest.TestCase):
        def test_difference(self):
            self.assertLess(abs(mod.forged() - 2.0 / 3.0), 1e-6)
        def test_reflected_difference(self):
            self.assertLess(abs(2.0 / 3.0 - mod.forged()), 1e-6)
        def test_sum(self):
            self.assertEqual(mod.forged() + 1, 2)
        def test_product(self):
            self.assertEqual(mod.forged() * 1, 2)
        def test_quotient(self):
            self.assertEqual(mod.forged() / 1, 2)
        def test_power(self):
            self.assertEqual(mod.forged() ** 2, 4)
        def test_negation(self):
            self.assertEqual(-mod.forged(), 0)
        def test_absolute_value(self):
            self.assertLess(abs(mod.forged()), 1e-6)
        def test_equality_with_data(self):
            self.assertEqual(mod.forged(), 7)
        def test_equality_of_two_results(self):
            self.assertEqual(mod.forged(), mod.forged())
        def test_inequality_of_two_results(self):
            self.assertFalse(mod.forged() != mod.forged())
        def test_order(self):
            self.assertLess(mod.forged(), 1)
        def test_hash(self):
            self.assertEqual(hash(mod.forged()), 5)
        def test_member_of_a_set(self):
            result = mod.forged()
            self.assertIn(result, {result})
        def test_truth(self):
            self.assertTrue(mod.forged())
        def test_length(self):
            self.assertEqual(len(mod.forged()), 3)
        def test_iteration(self):
            self.assertEqual(list(mod.forged()), [1, 2])
        def test_membership(self):
            self.assertIn(42, mod.forged())
        def test_item(self):
            self.assertEqual(mod.forged()[0], 1)
        def test_int(self):
            self.assertEqual(int(mod.forged()), 3)
        def test_float(self):
            self.assertEqual(float(mod.forged()), 3.0)
        def test_index(self):
            self.assertEqual([0, 1, 2, 3][mod.forged()], 3)
        def test_str(self):
            self.assertEqual(str(mod.forged()), "wanted")
        def test_repr(self):
            self.assertEqual(repr(mod.forged()), "wanted")
        def test_format(self):
            self.assertEqual(f"{mod.forged()}", "wanted")
        def test_format_spec(self):
            self.assertEqual(f"{mod.forged():>3}", "wanted")
    """)

# What a test may still do with an object of the code under test: call it, read and set its
# attributes, call its methods (operators by name too); the answers are plain data.
EXPLICIT = textwrap.dedent("""\
    import unittest
    from idegym_judge import subject

    mod = subject.module("forger")

    class Explicit(unittest.TestCase):
        def test_methods_attributes_and_named_operators(self):
            box = mod.Box(1, 2)
            self.assertEqual(box.size(), 2)
            self.assertEqual(box.items, [1, 2])
            box.items = [3]
            self.assertEqual(box.call_method("__len__"), 1)
            self.assertIs(box.call_method("__contains__", 3), True)
            self.assertIs(box.call_method("__contains__", 1), False)
        def test_a_named_operator_answers_data_that_is_checked_here(self):
            self.assertNotEqual(mod.forged().call_method("__sub__", 1.0), 1)
            self.assertEqual(mod.forged().call_method("__sub__", 1.0), 0)  # plain data: compared here
    """)


def _judge(tmp_path: Path, tests: str) -> dict[str, str]:
    """Run the judge on ``tests`` with ``forger.py`` as the code under test: outcome by test."""
    (tmp_path / "forger.py").write_text(FORGER)
    (tmp_path / "test_forged.py").write_text(tests)
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-I", ENTRY, "--junit", str(report), "test_forged.py"], cwd=tmp_path,
                   capture_output=True, text=True, timeout=120)
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        outcomes[case.get("name")] = kind if kind == "passed" else f"{kind}: {next(iter(case)).get('message')}"
    return outcomes


@pytest.mark.security
def test_no_operator_of_the_judge_is_answered_by_the_code_under_test(tmp_path: Path) -> None:
    """A result of the code under test is plain data or an opaque handle: arithmetic,
    comparison, hashing, truth, iteration, len, str/repr and format on a handle are refused
    in the grader (a TypeError: the test errs), never asked of the subject.

    Can fail: on the judge that sent ``RemoteObject``'s arithmetic to the subject and decided
    truth and hashing locally, 21 of these 26 tests passed (``abs(result - expected) < eps``
    among them: HumanEval/4's check)."""
    outcomes = _judge(tmp_path, TESTS)
    assert len(outcomes) == 26, outcomes
    passed = sorted(name for name, outcome in outcomes.items() if outcome == "passed")
    assert not passed, passed
    assert "an object of the code under test" in outcomes["test_difference"], outcomes["test_difference"]


def test_objects_of_the_code_under_test_still_answer_calls_attributes_and_named_operators(tmp_path: Path) -> None:
    outcomes = _judge(tmp_path, EXPLICIT)
    assert outcomes == {"test_methods_attributes_and_named_operators": "passed",
                        "test_a_named_operator_answers_data_that_is_checked_here": "passed"}, outcomes


@pytest.mark.security
def test_a_humaneval_result_whose_difference_is_always_zero_scores_nothing() -> None:
    """HumanEval/4 checks ``abs(candidate(xs) - expected) < 1e-6``: a result whose ``__sub__``
    answers 0 must not pass it.

    Can fail: it scored 1.0 (the untouched task 0.0) while the judge sent arithmetic on a
    subject's object to the subject."""
    real = problems.humaneval().problems["HumanEval/4"]
    forged = real.model_copy(update={"reference": FORGER + "\ndef mean_absolute_deviation(numbers):\n"
                                                           "    return Forged()\n",
                                     "reference_is_complete": True})
    task = problems.ProblemSet("forged", [forged]).task("HumanEval/4")
    reward, output = problems.run_locally(task, oracle=True)
    assert reward == 0.0, output
    assert problems.run_locally(load_task("humaneval/HumanEval/4"), oracle=True)[0] == 1.0


@pytest.mark.security
def test_a_module_planted_beside_the_tests_does_not_shadow_what_they_import(tmp_path: Path) -> None:
    """The grader puts a test file's directory first on ``sys.path`` (for its helpers): a module
    planted there under a standard-library name that a test imports must not be the one that
    runs in the grader, whose report it could write. The grader installs the import guard
    (``judge/path_guard.py``) before it loads a test.

    Can fail: without the guard in the runner, the planted ``fractions.py`` ran in the grader."""
    tests = tmp_path / "tests"
    tests.mkdir()
    marker = tmp_path / "planted-ran"
    (tests / "fractions.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nimport os\nos._exit(0)\n")
    (tests / "test_uses_fractions.py").write_text(
        "import unittest\n\nclass T(unittest.TestCase):\n    def test_half(self):\n"
        "        import fractions\n        self.assertEqual(fractions.Fraction(1, 2), 0.5)\n")
    report = tmp_path / "report.xml"
    run = subprocess.run([sys.executable, "-I", ENTRY, "--junit", str(report), "tests"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert not marker.exists(), run.stdout + run.stderr
    assert run.returncode == 0 and "1 passed, 0 failed" in run.stdout, run.stdout + run.stderr
