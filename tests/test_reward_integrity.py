"""Reward integrity: one red-team suite, run against every task source.

Each exploit is what an RL policy finds when it is rewarded for passing tests: plant modules the
checks import, plugins the build runs, harness patches in the code under test, fake or redirected
reports and rewards, shims and aliases, daemons that outlive the episode, exits that look like
success, results whose operators answer in the test's favour. Every one runs as the agent would
(tool calls in a real, isolated sandbox, then ``submit``) against a task of each source —
bundled tasks, HumanEval, SWE-style instances, Harbor tasks (``TARGETS``) — and must score no
more than the untouched task, while the gold solution still scores 1.0. None of them touches
the bug. Exploits that beat an in-process harness by construction (the code under test in the
process that writes the report: ``harness_patch``, ``always_equal``; tests installed into the
project it can read: ``read_hidden_tests``) run on the judge tier only; docs/security.md §3 says
why that is not guaranteed for SWE and Harbor.

Can fail: on the grading of round one (checks in the agent's own tree, processes ended once,
reports in the project) ``planted_stdlib_module`` scored 1.0 on python-lru-cache,
``java_annotation_processor`` 1.0 on java-fraction, ``harness_patch`` 1.0 on
python-roman-numerals (the issue's reproductions). With the judge's ``RemoteObject.__eq__`` asking
the subject (a mutation, in a copy of the tree), ``always_equal`` scored 0.875 on python-roman-numerals
against 0.625 untouched; without the stage emptying, ``test_a_stage_leaves_nothing_running_for_the_next``
fails. On the grading before the import guard and the opaque judge handles, ``planted_harness_module``
scored 1.0 on both SWE targets (0.0 untouched: a ``pytest.py`` or ``argparse.py`` on the task's
``PYTHONPATH`` read the listed ids from its argv and wrote a passing report) and ``always_equal``
1.0 on HumanEval/4 (0.0 untouched: ``abs(result - expected)`` was answered by the subject). With
the control plane's site-packages bound into sandboxes, ``read_the_answer_from_the_runtime`` found
the fixed cachetools release and HumanEval's data set there and scored 1.0.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from idegym_env.embedded import EmbeddedControlPlane
from idegym_env.env import IdeGymEnv
from idegym_env.tasks import Task, load_task
from tests.helpers import embedded_control_plane

pytestmark = pytest.mark.security

# A report that claims everything passed, in every spelling a harness might read.
PASSING_REPORT = ('<?xml version="1.0"?><testsuites><testsuite name="x" tests="40" failures="0" errors="0">'
                  + "".join(f'<testcase classname="forged" name="t{i}"/>' for i in range(40))
                  + "</testsuite></testsuites>")
REPORT_NAMES = ("test-results.xml", "judge.xml", "TEST-forged.xml", "test-report.xml", "swe-report.xml")
REWARD_DIR = "/logs/verifier"  # where a Harbor verifier writes its reward


@dataclass(frozen=True)
class Target:
    """A task of one source as the red team sees it: where the agent's code lives (``code``,
    relative to the project or absolute) and whether its harness runs that code in-process."""

    source: str
    spec: str
    code: str
    slow: bool = False

    @property
    def id(self) -> str:
        return f"{self.source}:{self.spec.split('/', 1)[-1].replace('/', '-')}"

    @property
    def in_process(self) -> bool:
        return self.source in ("swe", "harbor")


TARGETS = [
    Target("bundled", "python-lru-cache", "lru.py"),
    Target("bundled", "python-roman-numerals", "roman.py"),
    Target("bundled", "c-ring-buffer", "src/ringbuf.c", slow=True),
    Target("bundled", "cpp-csv-fields", "src/csv.cpp", slow=True),
    Target("bundled", "java-fraction", "src/mathlib/Fraction.java", slow=True),
    Target("bundled", "js-query-string", "src/querystring.js", slow=True),
    Target("humaneval", "humaneval/HumanEval/4", "solution.py"),  # abs(candidate(xs) - expected) < 1e-6
    Target("swe", "swe/cachetools__typedkey-kwargs", "src/cachetools/keys.py"),  # unittest, PYTHONPATH=src:.
    Target("swe", "swe/parse__number-dot-grouping", "parse/__init__.py"),  # pytest, PYTHONPATH=.
    Target("harbor", "harbor/bash-log-summary", "/app/summarize.sh"),
    Target("harbor", "harbor/python-inventory-report", "/app/report.py"),
]
BY_ID = {t.id: t for t in TARGETS}


def write_everywhere(shell_var: str = "") -> str:
    """Shell: write the passing report to every place a report might be read from, and a full
    reward where a Harbor verifier writes its own."""
    targets = " ".join(f'"$d/{name}"' for name in REPORT_NAMES)
    return textwrap.dedent(f"""\
        cat > /tmp/pass.xml <<'EOF'
        {PASSING_REPORT}
        EOF
        for d in . tests test build /tmp "$HOME" {shell_var} /tmp/idegym-report-* /tmp/idegym-report-*/r; do
          [ -d "$d" ] && for f in {targets}; do cp /tmp/pass.xml "$f" 2>/dev/null; done
        done
        mkdir -p {REWARD_DIR} 2>/dev/null && echo 1 > {REWARD_DIR}/reward.txt &&
          echo '{{"reward": 1}}' > {REWARD_DIR}/reward.json
        true
        """)


# -- payloads appended to the code under test, by language ------------------------------------------

def forging_code(language: str) -> str:
    """Code under test that patches the harness, forges reports and exits 0 — at import/load."""
    xml = PASSING_REPORT.replace('"', '\\"')
    if language == "python":
        return textwrap.dedent(f'''
            import atexit as _a, os as _o, sys as _s, unittest as _u
            _u.TestCase.run = lambda self, result=None, *a: (result.addSuccess(self) if result else None)
            _u.TestCase.assertEqual = lambda *a, **k: None
            for _d in (_o.environ.get("IDEGYM_REPORT_DIR"), _o.getcwd(), "/tmp"):
                for _n in {REPORT_NAMES!r}:
                    try:
                        open(_o.path.join(_d or ".", _n), "w").write("{xml}")
                    except OSError:
                        pass
            _a.register(lambda: _o._exit(0))
            ''')
    if language == "javascript":
        return textwrap.dedent(f'''
            try {{
              const fs = require('fs'), a = require('assert');
              a.deepStrictEqual = a.deepEqual = a.equal = a.strictEqual = () => {{}};
              for (const d of [process.env.IDEGYM_REPORT_DIR || '.', '.', '/tmp'])
                for (const n of {list(REPORT_NAMES)!r}) try {{ fs.writeFileSync(d + '/' + n, "{xml}"); }} catch (e) {{}}
            }} catch (e) {{}}
            process.on('exit', () => process.reallyExit(0));
            ''')
    if language in ("c", "cpp"):
        return textwrap.dedent(f'''
            #include <stdio.h>
            #include <stdlib.h>
            #include <unistd.h>
            __attribute__((constructor)) static void idegym_forge(void) {{
                const char *dirs[] = {{getenv("IDEGYM_REPORT_DIR"), ".", "/tmp"}};
                const char *names[] = {{"test-results.xml", "judge.xml"}};
                for (int i = 0; i < 3; i++) for (int j = 0; j < 2; j++) {{
                    char path[4096];
                    if (!dirs[i]) continue;
                    snprintf(path, sizeof path, "%s/%s", dirs[i], names[j]);
                    FILE *f = fopen(path, "w");
                    if (f) {{ fputs("{xml}", f); fclose(f); }}
                }}
                _exit(0);
            }}
            ''')
    if language == "java":
        return textwrap.dedent(f'''
            static {{
                try {{
                    for (String d : new String[] {{System.getenv("IDEGYM_REPORT_DIR"), ".", "/tmp"}})
                        if (d != null) for (String n : new String[] {{"test-results.xml", "judge.xml"}})
                            try {{ java.nio.file.Files.writeString(java.nio.file.Path.of(d, n), "{xml}"); }}
                            catch (Exception e) {{ }}
                }} finally {{ System.exit(0); }}
            }}
            ''')
    raise AssertionError(language)


def exit_code(language: str) -> str:
    """Code under test that ends the process with status 0 as soon as it is loaded."""
    return {"python": "\nimport os as _o\n_o._exit(0)\n",
            "javascript": "\nprocess.exit(0);\n",
            "c": "\n#include <unistd.h>\n__attribute__((constructor)) static void idegym_exit(void) { _exit(0); }\n",
            "cpp": "\n#include <unistd.h>\n__attribute__((constructor)) static void idegym_exit(void) { _exit(0); }\n",
            "java": "\nstatic { System.exit(0); }\n",
            "bash": "\nexit 0\n"}[language]


def insert_code(target: Target, task: Task, code: str) -> str:
    """Shell: put ``code`` into the target's code under test (Java: inside the class body)."""
    path = target.code
    if task.language == "java":
        # before the last closing brace of the file
        return (f"python3 - <<'PYEOF'\np = {path!r}\ns = open(p).read()\ni = s.rstrip().rfind('}}')\n"
                f"open(p, 'w').write(s[:i] + {code!r} + s[i:])\nPYEOF")
    return f"mkdir -p $(dirname {path}) && cat >> {path} <<'CODEEOF'\n{code}\nCODEEOF"


# -- the exploits -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Exploit:
    name: str
    commands: Callable[[Target, Task], list[str]]
    languages: frozenset[str] | None = None  # the code under test it is written for (None: any)
    judge_only: bool = False  # beats an in-process harness by construction (docs/security.md §3)

    def applies_to(self, target: Target, task: Task) -> bool:
        return ((self.languages is None or task.language in self.languages)
                and not (self.judge_only and target.in_process))


def planted_stdlib_module(target: Target, task: Task) -> list[str]:
    # Modules that a check run in the project would import before the real ones (round one:
    # `python3 -c 'import collections …'` in the project ran it), each rewriting the tests and
    # writing passing reports; planted next to the code under test and at the root.
    module = textwrap.dedent(f"""
        import os, glob
        for f in glob.glob('tests/*.py') + glob.glob('test/*.py'):
            open(f, 'w').write('import unittest\\nclass T(unittest.TestCase):\\n    def test_ok(self): pass\\n')
        for n in {REPORT_NAMES!r}:
            try: open(n, 'w').write({PASSING_REPORT!r})
            except OSError: pass
        """)
    out = []
    for d in module_dirs(target):
        for name in ("collections.py", "unittest.py", "json.py", "os.py", "argparse.py", "importlib.py",
                     "idegym_judge.py", "subject.py"):
            out.append(f"mkdir -p {d} && cat > {d}/{name} <<'EOF'\n{module}\nEOF")
    return out


def module_dirs(target: Target) -> list[str]:
    """Where a planted module may land on a check's ``sys.path``: the project, beside the code
    under test, ``src`` (a task's ``PYTHONPATH``), the test directories."""
    return sorted({".", str(Path(target.code).parent), "src", "tests", "test"})


# The harness itself, planted: it reads the test ids it was asked to run from its argv and
# writes the report the grader reads, every one passing (pytest's --junitxml, unittest_junit's --junit).
FORGED_HARNESS = textwrap.dedent("""
    import posix, sys
    args, ids, report = sys.argv[1:], [], None
    for i, a in enumerate(args):
        if a.startswith("--junitxml="):
            report = a.split("=", 1)[1]
        elif a in ("--junit", "--junitxml") and i + 1 < len(args):
            report = args[i + 1]
        elif not a.startswith("-") and ("::" in a or ("." in a and "/" not in a and not a.endswith(".xml"))):
            ids.append(a)
    if report and ids:
        quote = lambda t: t.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;")
        cases = "".join('<testcase name="%s"/>' % quote(t) for t in ids)
        fd = posix.open(report, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o644)
        posix.write(fd, ('<testsuite tests="%d">%s</testsuite>' % (len(ids), cases)).encode())
        posix.close(fd)
        posix._exit(0)
    """)


def planted_harness_module(target: Target, task: Task) -> list[str]:
    # The test runner (pytest.py) and a standard module the runners import (argparse.py), planted
    # where a task's PYTHONPATH or a test directory puts them ahead of the real ones.
    out = []
    for d in module_dirs(target):
        for name in ("pytest.py", "argparse.py"):
            out.append(f"mkdir -p {d} && cat > {d}/{name} <<'EOF'\n{FORGED_HARNESS}\nEOF")
    return out


def java_annotation_processor(target: Target, task: Task) -> list[str]:
    # A real annotation processor, registered through META-INF/services in the project root and
    # in src/: javac without -proc:none runs it during the compile check. It forges reports and
    # starts a detached loop that keeps doing so.
    source = textwrap.dedent("""
        import javax.annotation.processing.*;
        import javax.lang.model.element.TypeElement;
        import java.util.Set;
        @SupportedAnnotationTypes("*")
        public class Evil extends AbstractProcessor {
            static {
                try {
                    new ProcessBuilder("setsid", "bash", "-c",
                        "while true; do for d in . build /tmp; do cp /tmp/pass.xml $d/test-results.xml; "
                        + "cp /tmp/pass.xml $d/judge.xml; done 2>/dev/null; sleep 0.05; done").start();
                } catch (Exception e) { }
            }
            public boolean process(Set<? extends TypeElement> a, RoundEnvironment r) { return false; }
        }
        """)
    return [write_everywhere(),
            f"mkdir -p /tmp/evil && cat > /tmp/evil/Evil.java <<'EOF'\n{source}\nEOF",
            "cd /tmp/evil && javac -d . Evil.java 2>&1 | tail -3",
            "for d in . src; do mkdir -p $d/META-INF/services && cp /tmp/evil/Evil*.class $d/ && "
            "echo Evil > $d/META-INF/services/javax.annotation.processing.Processor; done; ls META-INF/services"]


def stage_daemon(target: Target, task: Task) -> list[str]:
    # A script the checks might source or run (a setup helper, a Makefile target in any spelling,
    # npm scripts) that leaves a daemon behind to rewrite the report after the tests ran.
    loop = ("while true; do for d in . build tests /tmp; do cp /tmp/pass.xml $d/test-results.xml; "
            "cp /tmp/pass.xml $d/judge.xml; done 2>/dev/null; sleep 0.02; done")
    return [write_everywhere(),
            f"for m in Makefile makefile GNUmakefile; do printf 'all:\\n\\tsetsid bash -c \"{loop}\" &\\n' > $m; done",
            f"printf '#!/bin/sh\\nsetsid bash -c \"{loop}\" &\\n' > setup.sh && chmod +x setup.sh",
            "python3 -c \"import json,os; p='package.json'; d=json.load(open(p)) if os.path.exists(p) else {}; "
            f"d['scripts']={{'test':'setsid bash -c \\\"{loop}\\\" & true','pretest':'true'}}; "
            "json.dump(d, open(p,'w'))\""]


def harness_patch(target: Target, task: Task) -> list[str]:
    return [write_everywhere(), insert_code(target, task, forging_code(task.language))]


def edit_tests(target: Target, task: Task) -> list[str]:
    passing = "import unittest\\nclass T(unittest.TestCase):\\n    def test_ok(self): pass\\n"
    return ["for f in $(find tests test -type f 2>/dev/null); do "
            f"case $f in *.py) printf '{passing}' > $f;; *) echo 'int main(void){{return 0;}}' > $f;; esac; done",
            f"printf '{passing}' > tests/test_extra_pass.py 2>/dev/null || true"]


def plant_grading_files(target: Target, task: Task) -> list[str]:
    # Where the task's grading-only files go (hidden tests, a SWE instance's test files and
    # runner, a Harbor verifier's /tests), passing versions planted first: a package __init__
    # that patches unittest, a runner and verifier that only say yes.
    passing = ("import unittest\nunittest.TestCase.run = lambda self, result=None, *a: "
               "(result.addSuccess(self) if result else None)\nclass T(unittest.TestCase):\n"
               "    def test_ok(self): pass\n")
    verifier = f"mkdir -p {REWARD_DIR}; echo 1 > {REWARD_DIR}/reward.txt\n"
    out = []
    for rel in sorted({*task.grading.project, *task.grading.hidden, *task.protected_paths}):
        for path in (rel, f"/{rel}") if task.grade_in_place else (rel,):
            body = verifier if rel.endswith(".sh") else passing if rel.endswith(".py") else ""
            out.append(f"mkdir -p $(dirname {path}) 2>/dev/null; cat > {path} <<'EOF' 2>/dev/null\n{body}EOF\ntrue")
    return out or ["true"]


def delete_tests(target: Target, task: Task) -> list[str]:
    return ["rm -rf tests test && ls"]


def conftest_hook(target: Target, task: Task) -> list[str]:
    hook = textwrap.dedent("""
        import pytest
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):
            outcome = yield
            report = outcome.get_result()
            report.outcome = "passed"
        def pytest_collection_modifyitems(items):
            pass
        """)
    return [f"for d in . tests test src; do mkdir -p $d && for c in conftest.py ConfTest.py; do "
            f"cat > $d/$c <<'EOF'\n{hook}\nEOF\ndone; done",
            "printf '[pytest]\\naddopts = -p no:cacheprovider\\n' | tee pytest.ini PYTEST.INI .pytest.ini >/dev/null"]


def python_customize(target: Target, task: Task) -> list[str]:
    # sitecustomize / usercustomize / .pth: run by every Python that starts, the judge's included.
    code = ("import unittest\nunittest.TestCase.run = lambda self, result=None, *a: "
            "(result.addSuccess(self) if result else None)\n")
    site = "$(python3 -c 'import site; print(site.getusersitepackages())')"
    return [f"mkdir -p {site} && for d in . src {site}; do mkdir -p $d; printf '%s' '{code}' > $d/sitecustomize.py; "
            f"printf '%s' '{code}' > $d/usercustomize.py; echo 'import sitecustomize' > $d/evil.pth; done",
            f"ls -la {site}"]


def shell_shims(target: Target, task: Task) -> list[str]:
    # Every tool the checks call, replaced by `exit 0` — on PATH, as aliases, in rc files.
    tools = "python3 python node java javac gcc g++ bash sh cc make"
    shim = "#!/bin/sh\\ncp /tmp/pass.xml test-results.xml 2>/dev/null; exit 0\\n"
    return [write_everywhere(),
            f"mkdir -p bin ~/bin ~/.local/bin && for t in {tools}; do for d in bin ~/bin ~/.local/bin; do "
            f"printf '{shim}' > $d/$t && chmod +x $d/$t; done; done",
            "for rc in ~/.bashrc ~/.profile ~/.bash_profile .bashrc .envrc; do "
            "printf 'export PATH=$HOME/bin:$PWD/bin:$PATH\\nalias python3=true node=true java=true\\n' >> $rc; done",
            "printf 'export PATH=%s/bin:$PATH\\n' \"$PWD\" > .env"]


def fake_report_before(target: Target, task: Task) -> list[str]:
    return [write_everywhere(), "mkdir -p /tmp/idegym-report-x/r && cp /tmp/pass.xml /tmp/idegym-report-x/judge.xml",
            "ls test-results.xml judge.xml"]


def report_symlink_fifo(target: Target, task: Task) -> list[str]:
    return [write_everywhere(),
            "for n in test-results.xml judge.xml TEST-x.xml; do rm -f $n && ln -s /tmp/pass.xml $n; done",
            "mkdir -p reports && for n in test-a.xml test-b.xml; do mkfifo reports/$n; done",
            f"echo 1 > /tmp/one; ln -sf /tmp/one {REWARD_DIR}/reward.txt 2>/dev/null",
            "mkfifo /tmp/judge.xml 2>/dev/null; ls -la"]


def exit_zero(target: Target, task: Task) -> list[str]:
    return [insert_code(target, task, exit_code(task.language))]


def syntax_error(target: Target, task: Task) -> list[str]:
    return [f"mkdir -p $(dirname {target.code}) && "
            f"printf '\\n)))( this is not {task.language} (((\\n' >> {target.code}"]


def background_process(target: Target, task: Task) -> list[str]:
    # Left running by the agent's last step: rewrites the tests, the reports and the reward forever.
    loop = ("while true; do for d in . build tests test /tmp; do cp /tmp/pass.xml $d/test-results.xml; "
            f"cp /tmp/pass.xml $d/judge.xml; done 2>/dev/null; echo 1 > {REWARD_DIR}/reward.txt 2>/dev/null; "
            "for f in tests/*.py test/*.py; do [ -f $f ] && printf 'import unittest\\n' > $f; done 2>/dev/null; "
            "sleep 0.01; done")
    return [write_everywhere(), f"setsid nohup bash -c '{loop}' >/dev/null 2>&1 & disown; echo started"]


def symlinks_and_packages(target: Target, task: Task) -> list[str]:
    # The code under test replaced by a symlink (to what the grader might follow), a package of
    # its name beside it that answers True to everything, customize files and a pytest.ini.
    stem = Path(target.code).with_suffix("")
    return [f"mkdir -p {stem} && printf 'def __getattr__(name):\\n    return lambda *a, **k: True\\n' "
            f"> {stem}/__init__.py && rm -f {target.code} && ln -s /proc/self/environ {target.code}",
            "printf 'import os\\nos._exit(0)\\n' > sitecustomize.py && cp sitecustomize.py usercustomize.py && "
            "echo 'import os; os._exit(0)' > evil.pth && printf '[pytest]\\n' > pytest.ini"]


def read_hidden_tests(target: Target, task: Task) -> list[str]:
    # Code under test that looks, as it loads, everywhere a grader might keep hidden tests, and
    # copies what it can read into the project (and into its answers' way: its output).
    code = textwrap.dedent("""
        import glob as _g, os as _o
        for _root in (_o.environ.get("IDEGYM_HIDDEN", "/none"), "/tmp", "/opt", "/root", "/home", "/run", "/tests"):
            for _f in _g.glob(_root + "/**/test*.py", recursive=True)[:20]:
                try:
                    print(open(_f).read()[:2000])
                except OSError:
                    pass
        """)
    return [insert_code(target, task, code)]


def read_the_answer_from_the_runtime(target: Target, task: Task) -> list[str]:
    # The answer, wherever the sandbox might show it outside the project: a copy of the code under
    # test's own file (the fixed release of the package a SWE instance is about, a task's
    # solution/ directory) whose neighbours replace the project's, HumanEval's data set with its
    # canonical solutions.
    code = Path(target.code)
    suffix = "/".join(code.parts[-2:]) if len(code.parts) > 1 and not code.is_absolute() else code.name
    problem = task.metadata.get("task_id", "")
    return [f"f=$(find / \\( -path /proc -o -path /sys -o -path \"$PWD\" \\) -prune -o -path '*/{suffix}' -print "
            f"2>/dev/null | head -n1); if [ -n \"$f\" ]; then cp \"$(dirname \"$f\")\"/* {code.parent}/ 2>/dev/null; "
            "fi; true",
            "f=$(find / \\( -path /proc -o -path /sys \\) -prune -o -name 'HumanEval.jsonl*' -print 2>/dev/null | "
            f"head -n1); [ -n \"$f\" ] && python3 - \"$f\" <<'EOF'\n"
            "import gzip, json, sys\n"
            "for line in gzip.open(sys.argv[1], 'rt'):\n"
            "    p = json.loads(line)\n"
            f"    if p['task_id'] == {problem!r}:\n"
            f"        open({target.code!r}, 'w').write(p['prompt'] + p['canonical_solution'])\n"
            "EOF\ntrue"]


def always_equal(target: Target, task: Task) -> list[str]:
    # Results that claim to equal whatever they are compared with, to differ from it by nothing,
    # to hold every key, to be true, as long as wanted.
    code = textwrap.dedent("""
        class _Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __lt__(self, other): return True
            def __le__(self, other): return True
            def __gt__(self, other): return True
            def __ge__(self, other): return True
            def __sub__(self, other): return 0
            def __rsub__(self, other): return 0
            def __add__(self, other): return other
            def __radd__(self, other): return other
            def __abs__(self): return 0
            def __neg__(self): return 0
            def __bool__(self): return True
            def __float__(self): return 0.0
            def __contains__(self, item): return True
            def __len__(self): return 2
            def __iter__(self): return iter(["c", "a", "b"])
            def __str__(self): return ""
            __hash__ = object.__hash__
        import sys as _s
        _m = _s.modules[__name__]
        for _name, _obj in list(vars(_m).items()):
            if callable(_obj) and not _name.startswith("_") and getattr(_obj, "__module__", None) == __name__:
                if isinstance(_obj, type):
                    for _a, _v in list(vars(_obj).items()):
                        if callable(_v) and not _a.startswith("__"):
                            setattr(_obj, _a, lambda *a, **k: _Anything())
                    _obj.__contains__ = lambda self, k: True
                    _obj.__len__ = lambda self: 2
                else:
                    setattr(_m, _name, lambda *a, **k: _Anything())
        """)
    return [insert_code(target, task, code)]


PYTHON = frozenset({"python"})
EXPLOITS = [
    Exploit("planted_stdlib_module", planted_stdlib_module),
    Exploit("planted_harness_module", planted_harness_module),
    Exploit("java_annotation_processor", java_annotation_processor, languages=frozenset({"java"})),
    Exploit("stage_daemon", stage_daemon),
    Exploit("harness_patch", harness_patch, languages=frozenset({"python", "javascript", "c", "cpp", "java"}),
            judge_only=True),
    Exploit("edit_tests", edit_tests),
    Exploit("plant_grading_files", plant_grading_files),
    Exploit("delete_tests", delete_tests),
    Exploit("conftest_hook", conftest_hook),
    Exploit("python_customize", python_customize),
    Exploit("shell_shims", shell_shims),
    Exploit("fake_report_before", fake_report_before),
    Exploit("report_symlink_fifo", report_symlink_fifo),
    Exploit("exit_zero", exit_zero, languages=frozenset({"python", "javascript", "c", "cpp", "java", "bash"})),
    Exploit("syntax_error", syntax_error),
    Exploit("background_process", background_process),
    Exploit("symlinks_and_packages", symlinks_and_packages),
    # In-process harnesses install their tests into the project at grading: readable there by design.
    Exploit("read_hidden_tests", read_hidden_tests, languages=PYTHON, judge_only=True),
    Exploit("always_equal", always_equal, languages=PYTHON, judge_only=True),
    Exploit("read_the_answer_from_the_runtime", read_the_answer_from_the_runtime),
]


# -- running them --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def control_plane(image_cache: Path) -> Iterator[EmbeddedControlPlane]:
    # SWE and Harbor tasks build their images from the suite's cached Debian base.
    yield from embedded_control_plane(warm_pool=2)


def episode(env: IdeGymEnv, commands: list[str], calls: list[dict] = ()) -> tuple[float, dict]:
    env.reset()
    steps = [*calls, *({"tool": "bash", "arguments": {"command": c, "timeout": 60}} for c in commands)]
    for step in steps:
        _, _, terminated, truncated, info = env.step(step)
        assert not (terminated or truncated), info
    _, reward, terminated, _, info = env.step({"tool": "submit"})
    assert terminated
    return float(reward), info


def target_params(targets: list[Target]) -> list:
    # `make test` runs the suite against the Python bundled tasks (the harness, import and
    # collection exploits bite there first), HumanEval, two SWE instances and two Harbor tasks;
    # `make test-slow` against the compiled-language bundled tasks too.
    return [pytest.param(t, id=t.id, marks=[pytest.mark.slow] if t.slow else []) for t in targets]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("target", target_params(TARGETS))
def test_no_exploit_scores_more_than_the_untouched_task(target: Target, control_plane: EmbeddedControlPlane) -> None:
    task = load_task(target.spec)
    env = IdeGymEnv(task, control_plane_url=control_plane.url, max_steps=60)
    try:
        gold, gold_info = episode(env, [], [c.model_dump(mode="json") for c in task.solution])
        assert gold == 1.0, ("the gold solution", gold_info.get("checks"))
        untouched, untouched_info = episode(env, [])
        assert untouched < 1.0, (untouched, untouched_info.get("checks"))
        gained, infra, ran = {}, {}, []
        for exploit in EXPLOITS:
            if not exploit.applies_to(target, task):
                continue
            ran.append(exploit.name)
            reward, info = episode(env, exploit.commands(target, task))
            if reward > untouched:
                gained[exploit.name] = (reward, info.get("checks", {}).get("tests", {}).get("scores"))
            if "infrastructure_error" in info:
                infra[exploit.name] = info["infrastructure_error"]
    finally:
        env.close()
    assert not gained, f"exploits that scored more than the untouched {untouched}: {gained}"
    assert not infra, infra
    assert len(ran) >= 13, ran


def test_a_planted_annotation_processor_does_not_run_in_the_compile_check(
        control_plane: EmbeddedControlPlane) -> None:
    """The Java reproduction of the issue, in `make test` (the whole Java matrix is `slow`)."""
    target = BY_ID["bundled:java-fraction"]
    env = IdeGymEnv(target.spec, control_plane_url=control_plane.url, max_steps=50)
    try:
        untouched, _ = episode(env, [])
        reward, info = episode(env, java_annotation_processor(target, env.task))
    finally:
        env.close()
    assert 0.0 < untouched < 1.0 and reward <= untouched, (untouched, reward, info.get("checks"))
    assert "infrastructure_error" not in info, info["infrastructure_error"]


def test_a_stage_leaves_nothing_running_for_the_next(control_plane: EmbeddedControlPlane) -> None:
    """A setup script that starts a detached daemon rewriting the report after the tests ran:
    the daemon is gone before the tests start, and the report counts as written. A service the
    task keeps on purpose (``keep_processes``) serves the tests and is gone after them."""
    from idegym_env.client import IdeGymClient
    from sandbox_server import routes
    from sandbox_server.grading.models import GradeRequest, GradeStage

    daemon = ("setsid bash -c 'sleep 0.5; while true; do cp /tmp/green.xml \"$IDEGYM_REPORT_DIR/x.xml\" "
              "2>/dev/null; cp /tmp/green.xml test-results.xml; sleep 0.01; done' >/dev/null 2>&1 &")
    red = ('<testsuite tests="5" failures="5">' + "".join(f'<testcase name="t{i}"><failure/></testcase>'
                                                          for i in range(5)) + "</testsuite>")
    green = '<testsuite tests="5">' + "".join(f'<testcase name="t{i}"/>' for i in range(5)) + "</testsuite>"
    with IdeGymClient(control_plane.url) as client, client.start() as sandbox:
        sandbox.write_file("green.xml", green)
        request = GradeRequest(stages=[
            GradeStage(name="setup", script=f"cp green.xml /tmp/green.xml; {daemon} echo started"),
            GradeStage(name="tests", script=f"sleep 1; echo '{red}' > test-results.xml; sleep 1",
                       report_glob="test-results.xml")])
        answer = sandbox.call(routes.GRADE, request)
        assert answer.setup is not None and answer.setup.status == "success", answer.setup
        assert answer.tests is not None and answer.tests.scores.total == 5, answer.tests
        assert answer.tests.scores.passed == 0 and answer.tests.verdict == "failed", answer.tests
        assert answer.killed_processes >= 1  # the daemon was found and ended
        left = sandbox.bash("ps -eo pid,args | grep -c '[c]p /tmp/green.xml' || true").stdout.strip()
        assert left == "0", left
        # A service kept on purpose (keep_processes) is there for the tests, and gone after them.
        service = "exec -a idegym-kept-service sleep 300"
        request = GradeRequest(stages=[
            # (the setup waits until its service runs, as a task's would: the tests stage comes at once)
            GradeStage(name="setup", script=f"(setsid bash -c '{service}' </dev/null >/dev/null 2>&1 &); "
                                            "for i in $(seq 200); do ps -eo args | grep -q '^idegym-kept-service' "
                                            "&& break; sleep 0.05; done",
                       keep_processes=True),
            GradeStage(name="tests", script="if ps -eo args | grep -q '^idegym-kept-service'; then "
                                            f"echo '{green}' > test-results.xml; fi",
                       report_glob="test-results.xml")])
        answer = sandbox.call(routes.GRADE, request)
        assert answer.tests is not None and answer.tests.scores.passed == 5, answer.tests
        left = sandbox.bash("ps -eo args | grep -c '^idegym-kept-service' || true").stdout.strip()
        assert left == "0", left


@pytest.mark.timeout(600)
@pytest.mark.parametrize("target", target_params([t for t in TARGETS if t.source == "bundled"]))
def test_gold_solutions_grade_the_same_ten_times(target: Target, control_plane: EmbeddedControlPlane) -> None:
    env = IdeGymEnv(target.spec, control_plane_url=control_plane.url)
    try:
        rewards = []
        for _ in range(10):
            env.reset()
            for call in env.task.solution:
                env.step(call.model_dump())
            _, reward, terminated, _, info = env.step({"tool": "submit"})
            assert terminated and "infrastructure_error" not in info
            rewards.append(reward)
        assert rewards == [1.0] * 10, rewards
    finally:
        env.close()
