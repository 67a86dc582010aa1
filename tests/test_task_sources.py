"""Task sources: HumanEval-style problems, SWE-style instances, Harbor directories.

Every shipped SWE instance and Harbor task is proven both ways (oracle → 1.0, untouched → not
1.0); HumanEval's oracle passes all 164 problems and the untouched project none. Proofs run on
this machine (SWE: a venv with pytest; Harbor: bubblewrap with the host's tools; problems: the
judge without a sandbox) and, where the backend can build the image, in sandboxes through the
env, where the exploits of issue 13 §1 are tried against the real grading.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

from idegym_env.tasks import TaskError, load_task
from idegym_env.tasks.sources import harbor, load_source_tasks, open_source, problems, repos, swe, swe_local
from idegym_env.tasks.sources.harbor_local import run_locally as harbor_run_locally
from idegym_env.tasks.sources.validate import format_table, validate

SHIPPED_SWE = swe.shipped_instances()
SWE_IDS = [json.loads(line)["instance_id"] for line in SHIPPED_SWE.read_text().splitlines() if line.strip()]
HARBOR_IDS = [d.name for d in harbor.harbor_dirs(harbor.shipped_tasks())]
SAMPLE = ["HumanEval/0", "HumanEval/10", "HumanEval/32", "HumanEval/38", "HumanEval/53", "HumanEval/81",
          "HumanEval/100", "HumanEval/129", "HumanEval/145", "HumanEval/163"]  # 32, 38: helpers from the prompt


def _has_pytest(python: str) -> bool:
    return subprocess.run([python, "-c", "import pytest"], capture_output=True).returncode == 0


SWE_PYTHON = swe_local.venv_python()
needs_pytest = pytest.mark.skipif(SWE_PYTHON is None or not _has_pytest(SWE_PYTHON),
                                  reason="a python with pytest runs the SWE suites (IDEGYM_SWE_PYTHON)")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="Harbor's local proof needs bubblewrap")


# -- SWE-style instances: the schema --------------------------------------------------------------


def _instance(**over: object) -> dict:
    row = {"instance_id": "Owner__Repo-1", "repo": "owner/repo", "base_commit": "a" * 40,
           "problem_statement": "It breaks.", "patch": "", "test_patch": "",
           "FAIL_TO_PASS": json.dumps(["tests/test_a.py::test_x"]), "PASS_TO_PASS": "[]"}
    row.update(over)
    return row


def test_swe_instances_read_from_json_and_jsonl_with_lists_as_json_strings(tmp_path: Path) -> None:
    jsonl = tmp_path / "set.jsonl"
    jsonl.write_text(json.dumps(_instance()) + "\n\n" + json.dumps(_instance(instance_id="b-2",
                                                                             PASS_TO_PASS=["t.py::y"])) + "\n")
    one = swe.read_instances(jsonl)
    assert [i.task_id for i in one] == ["owner__repo-1", "b-2"]
    assert one[0].FAIL_TO_PASS == ["tests/test_a.py::test_x"] and one[1].PASS_TO_PASS == ["t.py::y"]
    array = tmp_path / "set.json"
    array.write_text(json.dumps([_instance()]))
    assert swe.read_instances(array)[0].instance_id == "Owner__Repo-1"
    single = tmp_path / "one.json"
    single.write_text(json.dumps(_instance()))
    assert len(swe.read_instances(single)) == 1


def test_swe_bad_instances_say_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_instance()) + "\n{not json\n")
    with pytest.raises(TaskError, match=r"bad.jsonl:2: not JSON"):
        swe.read_instances(bad)
    bad.write_text(json.dumps(_instance(FAIL_TO_PASS="[oops")) + "\n")
    with pytest.raises(TaskError, match=r"bad.jsonl:1: not a SWE-style instance"):
        swe.read_instances(bad)
    bad.write_text(json.dumps(_instance()) + "\n" + json.dumps(_instance()) + "\n")
    with pytest.raises(TaskError, match="appears twice"):
        swe.read_instances(bad)


@pytest.mark.parametrize("test_id,framework,file", [
    ("tests/test_x.py::TestA::test_b[1-2]", "pytest", "tests/test_x.py"),
    ("test_inflection.py::test_ordinal[13-13th]", "pytest", "test_inflection.py"),
    ("tests.test_cache.CacheTest.test_clear", "unittest", "tests/test_cache.py"),
    ("test_clear (tests.test_cache.CacheTest)", "unittest", "tests/test_cache.py"),
    ("tests.test_keys.test_function", "unittest", "tests/test_keys.py"),
])
def test_test_ids_of_pytest_and_unittest_name_their_file(test_id: str, framework: str, file: str) -> None:
    assert swe.test_file(test_id, framework) == file


@pytest.mark.parametrize("test_id,canonical", [
    ("tests/test_x.py::TestA::test_b[1]", "tests.test_x.TestA.test_b[1]"),
    ("test_b (tests.test_x.TestA)", "tests.test_x.TestA.test_b"),
    ("test_b (tests.test_x.TestA.test_b)", "tests.test_x.TestA.test_b"),  # Python >= 3.11 spelling
    ("tests.test_x.TestA.test_b", "tests.test_x.TestA.test_b"),
])
def test_canonical_test_ids(test_id: str, canonical: str) -> None:
    assert swe_local.canonical_test_id(test_id) == canonical


def test_the_test_command_runs_exactly_the_listed_ids() -> None:
    script = swe.test_command(swe.Profile(), ["a.py::t[x y]", "a.py::u"])
    assert "'a.py::t[x y]' a.py::u" in script and "--junitxml=" in script and "IDEGYM_REPORT_DIR" in script
    unit = swe.test_command(swe.Profile(test_framework="unittest"), ["tests.t.C.test_a"])
    assert swe.UNITTEST_RUNNER in unit and unit.endswith("tests.t.C.test_a")


# -- repositories: deterministic commits ----------------------------------------------------------


def _archive(tmp_path: Path, body: str) -> Path:
    src = tmp_path / "src" / "pkg-1.0"
    (src / "pkg").mkdir(parents=True, exist_ok=True)
    (src / "pkg" / "__init__.py").write_text(body)
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    archive = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(src, arcname="pkg-1.0")
    return archive


PATCH = """\
diff --git a/pkg/__init__.py b/pkg/__init__.py
--- a/pkg/__init__.py
+++ b/pkg/__init__.py
@@ -1 +1 @@
-def add(a, b): return a - b
+def add(a, b): return a + b
"""


def test_release_and_instance_commits_are_the_same_in_every_fresh_cache(tmp_path: Path) -> None:
    archive = _archive(tmp_path, "def add(a, b): return a + b\n")
    source = repos.RepoSource(archive=str(archive))
    made = []
    for name in ("one", "two"):
        git_dir, release = repos.release_repo("pkg", source, cache=tmp_path / name)
        assert release is not None
        # PATCH is the fix (a - b → a + b): the instance's commit has it reverted, the bug.
        commit = repos.instance_commit(git_dir, release, "pkg-1", PATCH, "")
        made.append((release, commit))
        tree = repos.export_tree(git_dir, commit, tmp_path / name / "tree")
        assert (tree / "pkg" / "__init__.py").read_text() == "def add(a, b): return a - b\n"
        assert os.access(tree / "run.sh", os.X_OK) and not (tree / ".git").exists()
    assert made[0] == made[1]
    assert repos.instance_commit(git_dir, release, "pkg-1", PATCH, "") == made[1][1]  # cached


def test_a_pinned_archive_with_other_bytes_is_refused(tmp_path: Path) -> None:
    archive = _archive(tmp_path, "x = 1\n")
    with pytest.raises(TaskError, match="sha256"):
        repos.release_repo("pkg", repos.RepoSource(archive=str(archive), sha256="0" * 64), cache=tmp_path / "c")


def test_an_archive_member_escaping_the_tree_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tf:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 0
        tf.addfile(info)
    with pytest.raises(TaskError, match="escapes"):
        repos.unpack(evil, tmp_path / "dest")


def test_an_instance_whose_commit_differs_from_its_base_commit_is_refused(tmp_path: Path) -> None:
    archive = _archive(tmp_path, "def add(a, b): return a + b\n")
    (tmp_path / "repos.json").write_text(json.dumps({"pkg": {"source": {"archive": str(archive)}}}))
    (tmp_path / "set.jsonl").write_text(json.dumps(_instance(repo="pkg", patch=PATCH)) + "\n")
    sweset = swe.SweSet(tmp_path / "set.jsonl", cache=tmp_path / "cache")
    with pytest.raises(TaskError, match="data and repository disagree"):
        sweset.project(next(iter(sweset.instances.values())))


# -- the shipped SWE set ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swe_set() -> swe.SweSet:
    return swe.SweSet(SHIPPED_SWE)


def test_the_shipped_swe_set_has_twelve_instances_from_six_repositories(swe_set: swe.SweSet) -> None:
    assert len(SWE_IDS) >= 10
    assert len({i.repo for i in swe_set.instances.values()}) == 6
    frameworks = {swe_set.entry(i).profile.test_framework for i in swe_set.instances.values()}
    assert frameworks == {"pytest", "unittest"}
    for instance in swe_set.instances.values():
        assert instance.FAIL_TO_PASS and instance.PASS_TO_PASS and instance.patch and instance.test_patch
        assert len(instance.problem_statement) > 100


def test_a_shipped_swe_task_hides_its_tests_and_grades_the_listed_ones(swe_set: swe.SweSet) -> None:
    task = load_task("swe/six__add-metaclass-slots")
    assert task.id == "six__add-metaclass-slots" and task.reward.name == "all_tests_pass"
    assert not (task.project / "test_six.py").exists()  # added back only at grading
    assert "test_six.py" in task.grading.project and "test_six.py" in task.protected_paths
    assert task.test is not None and set(task.test.expected or ()) == set(
        task.metadata["FAIL_TO_PASS"]) | set(task.metadata["PASS_TO_PASS"])
    assert task.environment is not None and "python3-pytest" in task.environment.dockerfile
    assert task.solution[0].tool == "bash" and "git apply" in task.solution[0].arguments.command
    assert not list(task.project.rglob(".git"))


@needs_pytest
@pytest.mark.parametrize("instance_id", [pytest.param(i, marks=[] if i in (
    "inflection__ordinal-teens", "cachetools__typedkey-kwargs") else [pytest.mark.slow]) for i in SWE_IDS])
def test_shipped_swe_instance_is_proven_in_a_venv(instance_id: str) -> None:
    task = load_task(f"swe/{instance_id}")
    gold, gold_outcomes = swe_local.run_task_locally(task, oracle=True)
    untouched, outcomes = swe_local.run_task_locally(task, oracle=False)
    assert gold == 1.0, {t: o for t, o in gold_outcomes.items() if o != "passed"}
    assert untouched == 0.0
    assert all(outcomes[t] != "passed" for t in task.metadata["FAIL_TO_PASS"])
    assert all(outcomes[t] == "passed" for t in task.metadata["PASS_TO_PASS"])


# -- Harbor ----------------------------------------------------------------------------------------


def test_harbor_task_toml_is_honoured(tmp_path: Path) -> None:
    root = tmp_path / "My Task"
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\n")
    (root / "tests" / "test.sh").write_text("echo '{\"reward\": 1}' > /logs/verifier/reward.json\n")
    (root / "instruction.md").write_text("Do it.\n")
    os.environ["IDEGYM_TEST_TOKEN"] = "t0k"
    (root / "task.toml").write_text(
        '[verifier]\ntimeout_sec = 42\nuser = "agent"\nenv = { TOKEN = "${IDEGYM_TEST_TOKEN}", '
        'MODE = "${IDEGYM_UNSET_VAR:-fast}" }\n[agent]\ntimeout_sec = 300\n'
        '[environment]\ncpus = 2\nmemory = "2G"\nstorage = "512M"\nallow_internet = true\n')
    task = harbor.load_harbor_task(root)
    assert task.id == "my-task" and task.grade_in_place and task.network
    assert task.test is not None and task.test.timeout == 42 and task.test.user == "appuser"
    assert task.test.env == {"TOKEN": "t0k", "MODE": "fast"}
    assert task.test.reward_file == "/logs/verifier/reward.json"
    assert task.resources is not None and (task.resources.cpus, task.resources.memory_mb,
                                           task.resources.storage_mb) == (2, 2048, 512)
    assert task.agent_timeout == 300 and task.solution == []
    assert set(task.grading.hidden) == {"tests/test.sh"}  # the tests exist only at grading


def test_harbor_errors_name_the_problem(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    (root / "task.toml").write_text("[environment]\ndocker_image = 'ghcr.io/x/y:1'\n")
    (root / "instruction.md").write_text("x")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("true")
    with pytest.raises(TaskError, match="no registry is reachable"):
        harbor.load_harbor_task(root)
    (root / "task.toml").write_text("[verifier\n")
    with pytest.raises(TaskError, match="not a readable task.toml"):
        harbor.load_harbor_task(root)
    with pytest.raises(TaskError, match="no Harbor task"):
        harbor.harbor_dirs(tmp_path / "t" / "tests")


def test_shipped_harbor_tasks_cover_three_languages_or_more() -> None:
    tasks = load_source_tasks("harbor")
    assert len(tasks) >= 5 and len({t.language for t in tasks}) >= 3
    for task in tasks:
        assert task.solution and task.environment is not None
        assert task.environment.dockerfile.startswith("FROM debian:bookworm")


@needs_bwrap
@pytest.mark.parametrize("name", HARBOR_IDS)
def test_shipped_harbor_task_is_proven_locally(name: str) -> None:
    task = load_task(f"harbor/{name}")
    solved, out = harbor_run_locally(task, oracle=True)
    assert solved == 1.0, out
    untouched, out = harbor_run_locally(task, oracle=False)
    assert untouched is not None and untouched < 1.0, out


# -- problems (HumanEval) ----------------------------------------------------------------------------


def test_humaneval_tasks_are_addressed_by_set_id_and_by_task_id() -> None:
    by_set = load_task("humaneval/HumanEval/7")
    assert by_set.id == "humaneval-humaneval-7" and load_task("humaneval/humaneval-humaneval-7").id == by_set.id
    assert by_set.editable == ("solution.py",) and by_set.test is not None and by_set.test.harness == "judge"
    assert (by_set.project / "solution.py").read_text() == problems.humaneval().problems["HumanEval/7"].prompt
    assert set(by_set.grading.hidden) == {problems.TEST_FILE} and not by_set.grading.project
    assert len(open_source("humaneval").ids) == 164
    with pytest.raises(TaskError, match="no problem"):
        load_task("humaneval/HumanEval/999")


def test_an_mbpp_like_set_is_a_few_lines() -> None:
    row = {"task_id": 2, "text": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b\n",
           "test_list": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
    mbpp = problems.ProblemSet("mbpp", [problems.CodeProblem(
        task_id=str(row["task_id"]), prompt=f'def add(a, b):\n    """{row["text"]}"""\n', entry_point="add",
        test="\n".join(row["test_list"]), reference=row["code"], reference_is_complete=True)])
    task = mbpp.task("2")
    assert problems.run_locally(task, oracle=True)[0] == 1.0
    assert problems.run_locally(task, oracle=False)[0] == 0.0


@pytest.mark.parametrize("task_id", SAMPLE)
def test_humaneval_sample_on_the_judge(task_id: str) -> None:
    task = load_task(f"humaneval/{task_id}")
    assert problems.run_locally(task, oracle=True)[0] == 1.0
    assert problems.run_locally(task, oracle=False)[0] == 0.0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_humaneval_all_164_on_the_judge() -> None:
    tasks = load_source_tasks("humaneval")
    rows = validate(tasks, parallel=2, local=True, progress=False)
    assert len(rows) == 164
    assert sum(r.oracle == 1.0 for r in rows) == 164, format_table([r for r in rows if not r.valid])
    assert sum(r.untouched == 1.0 for r in rows) == 0


def test_unknown_sources_and_ambiguous_specs_are_clear_errors() -> None:
    with pytest.raises(TaskError, match="unknown task source"):
        open_source("humaneval:foo")
    with pytest.raises(TaskError, match="no such file"):
        open_source("swe:/nonexistent/x.jsonl")
    with pytest.raises(TaskError, match="names 5 tasks"):
        from idegym_env.tasks.sources import load_source_task

        load_source_task("harbor")


def test_the_tasks_cli_lists_shows_and_validates(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "idegym_env.cli", "tasks"]
    listed = subprocess.run(cli + ["list", "harbor"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and listed.stdout.split() == HARBOR_IDS
    shown = subprocess.run(cli + ["show", "humaneval/HumanEval/0"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "has_close_elements" in shown.stdout and "judge" in shown.stdout
    bad = subprocess.run(cli + ["list", "nope:x"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown task source" in bad.stderr
    out = tmp_path / "rows.json"
    valid = subprocess.run(cli + ["validate", "humaneval", "--local", "--limit", "3", "--json", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    assert "3/3 valid" in valid.stdout and len(json.loads(out.read_text())) == 3


def test_validate_fails_on_a_task_whose_oracle_does_not_solve_it() -> None:
    real = problems.humaneval().problems["HumanEval/0"]
    wrong = real.model_copy(update={"reference": "    return True\n"})
    broken = problems.ProblemSet("broken", [wrong]).task("HumanEval/0")
    rows = validate([broken], local=True, progress=False)
    assert not rows[0].valid and rows[0].oracle == 0.0 and "INVALID" in format_table(rows)


# -- in sandboxes, through the env -------------------------------------------------------------------


@pytest.fixture(scope="module")
def control_plane() -> Iterator[object]:
    from idegym_env.embedded import EmbeddedControlPlane

    cp = EmbeddedControlPlane(warm_pool=1)
    yield cp
    cp.close()


NO_DOCKERFILES = "cannot build Dockerfile environments"


def _episode(task_spec: str, calls: list[dict], url: str) -> tuple[float, dict]:
    try:
        env = gym.make("IdeGym-v0", task=task_spec, control_plane_url=url)
    except TaskError as exc:
        if NO_DOCKERFILES in str(exc):  # SWE and Harbor images: the images work of issue 15
            pytest.skip(str(exc))
        raise
    try:
        env.reset()
        for call in calls:
            env.step(call)
        _, reward, terminated, _, info = env.step({"tool": "submit"})
        assert terminated
        return float(reward), info
    finally:
        env.close()


@pytest.mark.parametrize("task_id", SAMPLE[:4])
def test_humaneval_in_sandboxes_oracle_and_untouched(task_id: str, control_plane) -> None:
    task = load_task(f"humaneval/{task_id}")
    solved, info = _episode(f"humaneval/{task_id}", [c.model_dump(mode="json") for c in task.solution],
                            control_plane.url)
    assert solved == 1.0, info.get("checks")
    untouched, _ = _episode(f"humaneval/{task_id}", [], control_plane.url)
    assert untouched == 0.0


@pytest.mark.slow
@pytest.mark.timeout(5400)  # 328 episodes
def test_humaneval_all_164_in_sandboxes(control_plane) -> None:
    rows = validate(load_source_tasks("humaneval"), parallel=4, progress=False,
                    env_kwargs={"control_plane_url": control_plane.url})
    assert all(r.valid for r in rows), format_table([r for r in rows if not r.valid])


HUMANEVAL_EXPLOITS = {
    "an object equal to everything": "class Anything:\n    def __eq__(self, other):\n        return True\n"
                                     "    __hash__ = object.__hash__\n\n"
                                     "def has_close_elements(numbers, threshold):\n    return Anything()\n",
    "exit 0 at import": "import os\nos._exit(0)\n",
    "a report of its own": "import os, pathlib\n"
                           "for d in (os.environ.get('IDEGYM_REPORT_DIR', ''), '.', '/tmp'):\n"
                           "    try:\n        pathlib.Path(d or '.', 'test-report.xml').write_text("
                           "'<testsuite tests=\"1\"><testcase classname=\"test_problem.Problem\" "
                           "name=\"test_solution\"/></testsuite>')\n    except OSError:\n        pass\n"
                           "def has_close_elements(numbers, threshold):\n    raise SystemExit(0)\n",
    "reading the hidden test": "import glob\n"
                               "def has_close_elements(numbers, threshold):\n"
                               "    for f in glob.glob('/**/test_problem.py', recursive=True):\n"
                               "        return open(f).read()\n    return None\n",
}


@pytest.mark.security
@pytest.mark.parametrize("exploit", list(HUMANEVAL_EXPLOITS))
def test_humaneval_exploits_do_not_raise_the_reward(exploit: str, control_plane) -> None:
    call = {"tool": "create_file", "arguments": {"path": "solution.py", "content": HUMANEVAL_EXPLOITS[exploit]}}
    reward, info = _episode("humaneval/HumanEval/0", [call], control_plane.url)
    assert reward == 0.0, (exploit, info.get("checks"))


@pytest.mark.security
def test_swe_exploits_do_not_raise_the_reward(control_plane) -> None:
    # The hidden test file replaced by one whose listed tests all pass, and a conftest that
    # turns every failure into a pass: both are overwritten or ignored at grading.
    fake = "import pytest\n" + "".join(f"def {n}():\n    pass\n" for n in ("test_add_metaclass",))
    conftest = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    calls = [{"tool": "create_file", "arguments": {"path": "test_six.py", "content": fake}},
             {"tool": "create_file", "arguments": {"path": "conftest.py", "content": conftest}}]
    reward, info = _episode("swe/six__add-metaclass-slots", calls, control_plane.url)
    assert reward == 0.0, info.get("checks")


# The unittest instances need only python3 >= 3.11: on the built-in image (the host's /usr) they
# run in sandboxes today, through the real grading (fresh sandbox, grading files, expected ids).
UNITTEST_INSTANCES = ["cachetools__typedkey-kwargs", "cachetools__getsizeof-replace"]


def _host_python_ok() -> bool:
    proc = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(sys.version_info >= (3, 11))"],
                          capture_output=True, text=True)
    return proc.stdout.strip() == "True"


needs_host_python = pytest.mark.skipif(not Path("/usr/bin/python3").exists() or not _host_python_ok(),
                                       reason="the built-in image's python3 must be >= 3.11 (cachetools)")


def _on_builtin_image(instance_id: str):
    task = load_task(f"swe/{instance_id}")
    return task.model_copy(update={"environment": None})  # keeps the grading files


def _task_episode(task, calls: list[dict], url: str) -> tuple[float, dict]:
    from idegym_env.env import IdeGymEnv

    env = IdeGymEnv(task, control_plane_url=url)
    try:
        env.reset()
        for call in calls:
            env.step(call)
        _, reward, _, _, info = env.step({"tool": "submit"})
        return float(reward), info
    finally:
        env.close()


@needs_host_python
@pytest.mark.parametrize("instance_id", UNITTEST_INSTANCES)
def test_swe_unittest_instances_in_sandboxes(instance_id: str, control_plane) -> None:
    task = _on_builtin_image(instance_id)
    solved, info = _task_episode(task, [c.model_dump(mode="json") for c in task.solution], control_plane.url)
    tests = info["checks"]["tests"]
    assert solved == 1.0, tests.get("output")
    assert tests["scores"]["passed"] == len(task.test.expected)
    untouched, info = _task_episode(task, [], control_plane.url)
    failed = {c["name"] for c in info["checks"]["tests"]["cases"] if c["outcome"] != "passed"}
    assert untouched == 0.0 and failed == set(task.metadata["FAIL_TO_PASS"])


SWE_EXPLOITS = {
    "the hidden tests, their package and the runner replaced": [
        ("tests/test_keys.py", "import unittest\nclass CacheKeysTest(unittest.TestCase):\n"
                               "    def test_typedkey(self):\n        pass\n"),
        ("tests/__init__.py", "import unittest\nunittest.TestCase.run = lambda self, result=None: None\n"),
        (".idegym/unittest_junit.py", "import sys\nsys.exit(0)\n")],
    "conftest, sitecustomize, usercustomize, a .pth and a report written before the run": [
        ("conftest.py", "raise SystemExit(0)\n"), ("sitecustomize.py", "import os\nos._exit(0)\n"),
        ("usercustomize.py", "import os\nos._exit(0)\n"), ("src/evil.pth", "import os; os._exit(0)\n"),
        ("swe-report.xml", '<testsuite tests="1"><testcase classname="tests.test_keys.CacheKeysTest" '
                           'name="test_typedkey"/></testsuite>\n')],
    "os._exit(0) when the code under test is imported": [
        ("src/cachetools/keys.py", "import os\nos._exit(0)\n")],
    "a syntax error that stops the tests from loading": [("src/cachetools/keys.py", "def (:\n")],
}


@needs_host_python
@pytest.mark.security
@pytest.mark.parametrize("exploit", list(SWE_EXPLOITS))
def test_swe_exploits_do_not_raise_the_reward_in_sandboxes(exploit: str, control_plane) -> None:
    task = _on_builtin_image("cachetools__typedkey-kwargs")
    calls = [{"tool": "create_file", "arguments": {"path": path, "content": content}}
             for path, content in SWE_EXPLOITS[exploit]]
    calls.append({"tool": "bash", "arguments": {
        "command": "echo 'alias python3=true' >> ~/.bashrc; mkdir -p ~/bin; printf '#!/bin/sh\\nexit 0\\n' "
                   "> ~/bin/python3; chmod +x ~/bin/python3; (setsid sleep 300 &) ; true"}})
    reward, info = _task_episode(task, calls, control_plane.url)
    assert reward == 0.0, (exploit, info.get("checks"))


@pytest.mark.parametrize("name", HARBOR_IDS[:2])
def test_harbor_in_sandboxes_oracle_and_untouched(name: str, control_plane) -> None:
    task = load_task(f"harbor/{name}")
    solved, info = _episode(f"harbor/{name}", [c.model_dump(mode="json") for c in task.solution], control_plane.url)
    assert solved == 1.0, info.get("checks")
    untouched, _ = _episode(f"harbor/{name}", [], control_plane.url)
    assert untouched < 1.0


@pytest.mark.security
def test_harbor_exploits_do_not_raise_the_reward(control_plane) -> None:
    # A reward planted where the verifier writes it, and a test.sh of the agent's own in /tests.
    plant = ("mkdir -p /logs/verifier /tests 2>/dev/null; echo 1 > /logs/verifier/reward.txt; "
             "printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; true")
    reward, info = _episode("harbor/bash-log-summary", [{"tool": "bash", "arguments": {"command": plant}}],
                            control_plane.url)
    assert reward == 0.0, info.get("checks")


def test_eval_resolves_source_specs_next_to_task_directories() -> None:
    from idegym_env.eval.manifest import resolve_tasks, task_set_hash

    tasks = resolve_tasks("humaneval/HumanEval/3,swe/six__add-metaclass-slots,harbor/js-slugify,python-lru-cache")
    assert [t.id for t in tasks] == ["humaneval-humaneval-3", "js-slugify", "python-lru-cache",
                                     "six__add-metaclass-slots"]
    assert len(task_set_hash(tasks)) == 64
    assert len(resolve_tasks("harbor")) == len(HARBOR_IDS)


def test_install_commands_bake_the_project_into_the_image(tmp_path: Path) -> None:
    archive = _archive(tmp_path, "def add(a, b): return a + b\n")
    (tmp_path / "repos.json").write_text(json.dumps({"pkg": {"source": {"archive": str(archive)},
                                                             "profile": {"install": ["python3 -m pip install -e ."]}}}))
    git_dir, release = repos.release_repo("pkg", repos.RepoSource(archive=str(archive)), cache=tmp_path / "cache")
    commit = repos.instance_commit(git_dir, release, "pkg-1", PATCH, "")
    (tmp_path / "set.jsonl").write_text(json.dumps(_instance(
        instance_id="pkg-1", repo="pkg", base_commit=commit, patch=PATCH,
        FAIL_TO_PASS=["tests/test_add.py::test_add"], hints_text="look at add")) + "\n")
    task = swe.SweSet(tmp_path / "set.jsonl", cache=tmp_path / "cache").task("pkg-1")
    assert task.project is None and task.environment is not None and task.environment.context is not None
    assert task.environment.dockerfile.endswith("WORKDIR /testbed\nCOPY . /testbed\nRUN python3 -m pip install -e .\n")
    assert (Path(task.environment.context) / "pkg" / "__init__.py").read_text() == "def add(a, b): return a - b\n"


def test_a_local_git_repository_is_a_source_and_only_its_tree_is_exported(tmp_path: Path) -> None:
    work = tmp_path / "upstream"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "__init__.py").write_text("def add(a, b): return a - b\n")
    repos.git("init", "--quiet", str(work))
    repos.git("add", "-A", work_tree=work, git_dir=work / ".git")
    repos.git("commit", "--quiet", "-m", "base", work_tree=work, git_dir=work / ".git")
    base = repos.git("rev-parse", "HEAD", git_dir=work / ".git")
    (work / "pkg" / "__init__.py").write_text("def add(a, b): return a + b\n")
    repos.git("commit", "--quiet", "-am", "the fix, a later commit", work_tree=work, git_dir=work / ".git")
    (tmp_path / "set.json").write_text(json.dumps([_instance(instance_id="local-1", repo=str(work),
                                                             base_commit=base, patch=PATCH)]))
    sweset = swe.SweSet(tmp_path / "set.json", cache=tmp_path / "cache")
    project = sweset.project(sweset.instances["local-1"])
    assert (project / "pkg" / "__init__.py").read_text() == "def add(a, b): return a - b\n"
    assert not (project / ".git").exists()  # the later commit (the fix) cannot be read
    (tmp_path / "plain").mkdir()
    (tmp_path / "set.json").write_text(json.dumps([_instance(instance_id="p", repo=str(tmp_path / "plain"))]))
    with pytest.raises(TaskError, match="not a git repository"):
        swe.SweSet(tmp_path / "set.json", cache=tmp_path / "cache").project(
            next(iter(swe.SweSet(tmp_path / "set.json").instances.values())))


def test_agent_timeout_truncates_and_resources_limit_the_sandbox(control_plane) -> None:
    from idegym_env.env import IdeGymEnv
    from idegym_env.tasks.task import TaskResources

    base = load_task("humaneval/HumanEval/0")
    task = base.model_copy(update={"agent_timeout": 0.5, "resources": TaskResources(memory_mb=128)})
    env = IdeGymEnv(task, control_plane_url=control_plane.url)
    try:
        env.reset()
        _, _, terminated, truncated, info = env.step({"tool": "bash", "arguments": {
            "command": "sleep 1; python3 -c 'x = bytearray(512 << 20); print(len(x))'"}})
        assert truncated and not terminated and info["truncated_by"] == "agent_timeout"
        assert info["exit_code"] != 0 and info.get("oom_killed"), info  # 512 MiB in a 128 MiB sandbox
        assert "checks" in info  # graded on truncation, like max_steps
    finally:
        env.close()
