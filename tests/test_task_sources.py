"""Task sources: HumanEval-style problems, SWE-style instances, Harbor directories.

Every shipped SWE instance and Harbor task is proven both ways (oracle → 1.0, untouched → not
1.0); HumanEval's oracle passes all 164 problems and the untouched project none. Proofs run on
this machine (SWE: a venv with pytest; Harbor: bubblewrap with the host's tools; problems: the
judge without a sandbox) and in sandboxes through the env (SWE and Harbor images built from their
Dockerfiles with buildah, HumanEval on the built-in image). The red-team exploits run against a
task of every source in tests/test_reward_integrity.py.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

from idegym_env.client import BUILTIN_IMAGE
from idegym_env.grading import grade_request
from idegym_env.tasks import TaskError, environment, load_task
from idegym_env.tasks.sources import harbor, load_source_tasks, open_source, problems, repos, swe, swe_local
from idegym_env.tasks.sources.harbor_local import run_locally as harbor_run_locally
from idegym_env.tasks.sources.validate import format_table, validate
from sandbox_server.grading import paths
from sandbox_server.grading.export import export
from sandbox_server.grading.models import ExportedFile, ExportRequest, ExportResponse
from tests.answer_needles import needles, shipped_tasks
from tests.answer_scan import identity

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
    # a prebuilt image without a Dockerfile: the environment is that image (pulled, or built here)
    assert harbor.load_harbor_task(root).environment.dockerfile == "FROM ghcr.io/x/y:1\n"
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
    assert by_set.files == {"solution.py": problems.humaneval().problems["HumanEval/7"].prompt}
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
    assert listed.returncode == 0 and listed.stdout.split() == [f"harbor/{i}" for i in HARBOR_IDS]
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


# -- starting files and content hashes (no sandbox) ----------------------------------------------------


def _exported(files: dict[str, str], deleted: list[str] = ()) -> ExportResponse:
    return ExportResponse(files=[ExportedFile(path=p, content_base64=base64.b64encode(c.encode()).decode())
                                 for p, c in files.items()], deleted=list(deleted))


def _written(request) -> dict[str, str]:
    return {f.path: base64.b64decode(f.content_base64).decode() for f in request.files}


def test_starting_files_are_graded_from_the_task_and_the_agent_only_changes_editable_ones() -> None:
    task = load_task("humaneval/HumanEval/0").model_copy(update={"files": {
        "solution.py": "PROMPT\n", "helper.py": "TASK'S HELPER\n"}})
    # the agent's editable solution.py wins; helper.py is the task's whatever the sandbox held
    request = grade_request(task, _exported({"solution.py": "MINE\n"}))
    assert _written(request) == {"solution.py": "MINE\n", "helper.py": "TASK'S HELPER\n"}
    # a starting file the agent removed is not written back from the task
    request = grade_request(task, _exported({}, deleted=["solution.py"]))
    assert "solution.py" not in _written(request) and request.delete == ["solution.py"]
    # graded in place (Harbor), the sandbox's files are the agent's: none are written from the task
    assert _written(grade_request(task.model_copy(update={"grade_in_place": True}), None)) == {}


def test_the_export_counts_starting_files_as_pristine(tmp_path: Path) -> None:
    project, pristine = tmp_path / "project", tmp_path / "pristine"
    project.mkdir()
    pristine.mkdir()
    (pristine / "lib.py").write_text("x = 1\n")
    (project / "lib.py").write_text("x = 2\n")
    (project / "solution.py").write_text("changed\n")
    (project / "planted.py").write_text("evil\n")
    (project / "conftest.py").write_text("evil\n")
    out = export(project, pristine, ExportRequest(starting=["solution.py", "notes.txt", "conftest.py"]))
    # without globs: the pristine files and the starting ones; never a planted file or harness config
    assert [f.path for f in out.files] == ["lib.py", "solution.py"]
    assert out.deleted == ["notes.txt"]  # a starting file the agent removed
    with pytest.raises(ValueError, match="relative path"):
        ExportRequest(starting=["../x"])


@pytest.mark.security
def test_the_export_leaves_out_config_in_any_spelling_and_new_modules_that_shadow(tmp_path: Path) -> None:
    """With ``editable: ['**']`` (the SWE tasks'), harness and build configuration is not exported
    whatever its case or tool (``makefile``, ``jest.config.ts``, ``.mocharc.yml``), nor a new
    module that would shadow the standard library or an installed package from a directory that
    is not a package (``pytest.py``, ``src/argparse.py``, ``json/__init__.py``, a module left in a
    package whose ``__init__.py`` the agent deleted). A module inside a package, and the pristine
    project's own files whatever their names, are graded.

    Can fail: on the name list of before (exact case, ``jest.config.js`` only, no module rule)
    every one of the 11 left-out files was exported."""
    project, pristine = tmp_path / "project", tmp_path / "pristine"
    for root in (project, pristine):
        (root / "src" / "pkg").mkdir(parents=True)
        (root / "src" / "pkg" / "__init__.py").write_text("")
        (root / "src" / "gone").mkdir()
        (root / "src" / "gone" / "__init__.py").write_text("")
        (root / "calendar.py").write_text("# the project's own module of that name\n")
    (project / "calendar.py").write_text("# edited\n")
    (project / "src" / "gone" / "__init__.py").unlink()
    # A package the system Python has (in the SWE image: pytest; on this host: whatever it is).
    installed = sorted(paths.protected_modules() - set(sys.stdlib_module_names))
    assert installed, "the system Python of this host has no package under /usr/lib/python3*"
    left_out = ["makefile", "MAKEFILE", "ConfTest.py", "jest.config.ts", "vitest.config.mjs", ".mocharc.yml",
                f"{installed[0]}.py", "src/argparse.py", "json/__init__.py", "src/gone/decimal.py",
                f"src/{installed[-1]}/__init__.py"]
    graded = ["calendar.py", "src/pkg/json.py", "src/pkg/util.py", "src/newmod.py"]
    for rel in left_out + graded:
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text("import os\nos._exit(0)\n")
    out = export(project, pristine, ExportRequest(editable=["**"]))
    exported = {f.path for f in out.files}
    assert exported == set(graded) | {"src/pkg/__init__.py"}, exported
    assert out.deleted == ["src/gone/__init__.py"]
    reasons = {s.path: s.reason for s in out.skipped}
    assert "shadow" in reasons[f"{installed[0]}.py"] and "shadow" in reasons["src/gone/decimal.py"], reasons
    assert not set(left_out) & exported


def test_content_hashes_do_not_depend_on_where_a_set_lies_and_follow_its_content(tmp_path: Path) -> None:
    copies = []
    for name in ("a", "b"):
        shutil.copytree(harbor.shipped_tasks() / "js-slugify", tmp_path / name / "js-slugify")
        copies.append(harbor.load_harbor_task(tmp_path / name / "js-slugify"))
    first = copies[0].content_hash()
    assert first == copies[1].content_hash() == load_task("harbor/js-slugify").content_hash()
    (tmp_path / "b" / "js-slugify" / "tests" / "test.js").write_text("// other hidden tests\n")
    other_tests = harbor.load_harbor_task(tmp_path / "b" / "js-slugify").content_hash()
    (tmp_path / "a" / "js-slugify" / "environment" / "slugify.js").write_text("// other project\n")
    other_context = harbor.load_harbor_task(tmp_path / "a" / "js-slugify").content_hash()
    assert len({first, other_tests, other_context}) == 3
    swe_task = load_task("swe/six__add-metaclass-slots")
    changed = swe_task.model_copy().with_grading(swe_task.grading.model_copy(update={
        "project": {**swe_task.grading.project, "test_six.py": b"def test_other():\n    pass\n"}}))
    assert changed.content_hash() != swe_task.content_hash()
    problem = load_task("humaneval/HumanEval/0")
    assert problem.model_copy(update={"files": {"solution.py": "other"}}).content_hash() != problem.content_hash()


def test_every_shipped_swe_task_shares_one_environment_image_and_harbor_tasks_build_offline_images() -> None:
    from idegym_env.env import task_image_tag

    tasks = load_source_tasks("swe")
    environments = {environment.image_entries(t)[0]["tag"] for t in tasks}
    assert len(environments) == 1 and environments.pop().startswith("idegym-env:")
    assert len({task_image_tag(t) for t in tasks}) == len(tasks)  # the project over it: one per instance
    for task in load_source_tasks("harbor"):
        (entry,) = environment.image_entries(task)
        assert entry["build_network"] is True and entry["network"] is False  # allow_internet = false
        assert entry["context"] == str(harbor.shipped_tasks() / task.id / "environment")
    problems_ = [load_task(f"humaneval/{i}") for i in SAMPLE]
    assert {t.image for t in problems_} == {BUILTIN_IMAGE} and all(t.project is None for t in problems_)


# -- in sandboxes, through the env -------------------------------------------------------------------


@pytest.fixture(scope="module")
def control_plane(image_cache: Path) -> Iterator[object]:
    from idegym_env.embedded import EmbeddedControlPlane

    # Its builds use the suite's cached Debian base; INFO logs say when it builds an image.
    level = os.environ.get("IDEGYM_LOG_LEVEL")
    os.environ["IDEGYM_LOG_LEVEL"] = "INFO"
    try:
        cp = EmbeddedControlPlane(warm_pool=1)
    finally:
        if level is None:
            os.environ.pop("IDEGYM_LOG_LEVEL")
        else:
            os.environ["IDEGYM_LOG_LEVEL"] = level
    yield cp
    cp.close()


def _task_episode(task, calls: list[dict], url: str) -> tuple[float, dict]:
    env = gym.make("IdeGym-v0", task=task, control_plane_url=url)  # a Task or a task spec
    try:
        env.reset()
        for call in calls:
            env.step(call)
        _, reward, terminated, _, info = env.step({"tool": "submit"})
        assert terminated
        return float(reward), info
    finally:
        env.close()


def _episode(task_spec: str, calls: list[dict], url: str) -> tuple[float, dict]:
    return _task_episode(task_spec, calls, url)


def _solution(task) -> list[dict]:
    return [c.model_dump(mode="json") for c in task.solution]


def _image_refs(cp, prefix: str) -> list[str]:
    refs = cp.state_dir / "images" / "refs"
    return sorted(json.loads(p.read_text())["tag"] for p in refs.glob("*.json")
                  if json.loads(p.read_text())["tag"].startswith(prefix))


@pytest.mark.parametrize("task_id", SAMPLE[:4])
def test_humaneval_in_sandboxes_oracle_and_untouched(task_id: str, control_plane) -> None:
    task = load_task(f"humaneval/{task_id}")
    solved, info = _episode(f"humaneval/{task_id}", _solution(task), control_plane.url)
    assert solved == 1.0, info.get("checks")
    untouched, _ = _episode(f"humaneval/{task_id}", [], control_plane.url)
    assert untouched == 0.0


def test_humaneval_problems_share_the_builtin_image_with_their_prompt_written_at_reset(control_plane) -> None:
    from idegym_env.env import IdeGymEnv

    before = _image_refs(control_plane, "idegym-task/")
    task = load_task("humaneval/HumanEval/2")
    env = IdeGymEnv(task, control_plane_url=control_plane.url, reuse="RESET")
    try:
        env.reset()
        shown, *_ = env.step({"tool": "bash", "arguments": {"command": "cat solution.py; ls -a"}})
        assert task.files["solution.py"].strip() in shown and "truncate_number" in shown
        env.step({"tool": "create_file", "arguments": {"path": "solution.py", "content": "broken\n"}})
        env.reset()  # RESET: the image's project, and the starting file again
        shown, *_ = env.step({"tool": "read_file", "arguments": {"path": "solution.py"}})
        assert shown == task.files["solution.py"]
    finally:
        env.close()
    assert _image_refs(control_plane, "idegym-task/") == before  # no image per problem


@pytest.mark.slow
@pytest.mark.timeout(5400)  # 328 episodes
def test_humaneval_all_164_in_sandboxes(control_plane) -> None:
    rows = validate(load_source_tasks("humaneval"), parallel=4, progress=False,
                    env_kwargs={"control_plane_url": control_plane.url})
    assert all(r.valid for r in rows), format_table([r for r in rows if not r.valid])


SWE_SAMPLE = ("inflection__ordinal-teens", "cachetools__typedkey-kwargs")  # pytest, unittest


@pytest.mark.timeout(1800)  # the first one builds the set's environment (apt-get in a Debian image)
@pytest.mark.parametrize("instance_id", [pytest.param(i, marks=[] if i in SWE_SAMPLE else [pytest.mark.slow])
                                         for i in SWE_IDS])
def test_shipped_swe_instance_in_sandboxes(instance_id: str, control_plane) -> None:
    task = load_task(f"swe/{instance_id}")
    solved, info = _task_episode(task, _solution(task), control_plane.url)
    tests = info["checks"]["tests"]
    assert solved == 1.0, tests.get("output")
    assert tests["scores"]["passed"] == len(task.test.expected)
    untouched, info = _task_episode(task, [], control_plane.url)
    outcomes = {c["name"]: c["outcome"] for c in info["checks"]["tests"]["cases"]}
    failed = {name for name, outcome in outcomes.items() if outcome != "passed"}
    assert untouched == 0.0 and len(outcomes) == len(task.test.expected)
    assert len(failed) == len(task.metadata["FAIL_TO_PASS"])  # the PASS_TO_PASS ones still pass


@pytest.mark.timeout(1800)
def test_a_second_env_finds_the_environment_image_without_building(control_plane) -> None:
    from idegym_env.env import IdeGymEnv

    task = load_task(f"swe/{SWE_SAMPLE[0]}")
    IdeGymEnv(task, control_plane_url=control_plane.url).close()  # built here or by an earlier test
    assert "image build:" in control_plane.log_path.read_text(errors="replace")  # (it logs builds, or cache hits)
    tags = [e["tag"] for e in environment.image_entries(task)]
    images = control_plane.state_dir / "images"
    created = {tag: _store_meta(images, tag)["created"] for tag in tags}
    log_size = control_plane.log_path.stat().st_size
    started = time.monotonic()
    env = IdeGymEnv(task, control_plane_url=control_plane.url)
    took = time.monotonic() - started
    env.close()
    assert {tag: _store_meta(images, tag)["created"] for tag in tags} == created
    log = control_plane.log_path.read_bytes()[log_size:].decode(errors="replace")
    assert "image build:" not in log, log[-2000:]  # the environment and the project image: cache hits
    assert took < 30, took


def _store_meta(images: Path, tag: str) -> dict:
    from control_plane.backends.local.images import slug

    ident = json.loads((images / "refs" / f"{slug(tag)}.json").read_text())["id"]
    return json.loads((images / "data" / ident / "image.json").read_text())


HARBOR_SAMPLE = ("bash-log-summary", "sql-top-customers")


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in HARBOR_SAMPLE else [pytest.mark.slow])
                                  for n in HARBOR_IDS])
def test_shipped_harbor_task_in_sandboxes(name: str, control_plane) -> None:
    task = load_task(f"harbor/{name}")
    solved, info = _episode(f"harbor/{name}", _solution(task), control_plane.url)
    assert solved == 1.0, info.get("checks")
    untouched, info = _episode(f"harbor/{name}", [], control_plane.url)
    assert untouched < 1.0, info.get("checks")


@pytest.mark.timeout(1800)
def test_a_harbor_image_installs_packages_at_build_and_its_sandboxes_are_offline(control_plane) -> None:
    from idegym_env.env import IdeGymEnv

    task = load_task("harbor/sql-top-customers")  # RUN apt-get install sqlite3; allow_internet = false
    env = IdeGymEnv(task, control_plane_url=control_plane.url)
    try:
        env.reset()
        out, _, _, _, info = env.step({"tool": "bash", "arguments": {
            "command": "sqlite3 -version >/dev/null && echo sqlite-ok; tail -n +3 /proc/net/dev | cut -d: -f1"}})
    finally:
        env.close()
    assert info["exit_code"] == 0 and "sqlite-ok" in out, out
    interfaces = out.split("sqlite-ok", 1)[1].split("[exit code")[0].split()
    assert interfaces == ["lo"], out  # no network in the sandbox


# -- no answer in any sandbox ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def answer_needles() -> bytes:
    """Distinctive lines of every shipped task's solution and hidden tests (``answer_needles.py``)."""
    return "\n".join(sorted(needles(shipped_tasks()))).encode()


@pytest.fixture(scope="module")
def hosts_own() -> bytes:
    """The ``answer_scan.identity`` of every file a sandbox of the built-in image shows as the
    host has it: the host's /usr (the image's), its Rust toolchains (bound for the tools)."""
    home = Path.home()
    rustup = Path(os.environ.get("RUSTUP_HOME") or home / ".rustup")
    cargo = Path(os.environ.get("CARGO_HOME") or home / ".cargo")
    trees = [("/usr", "/usr"), (str(rustup / "toolchains"), "/opt/idegym/toolchains/rustup/toolchains"),
             (str(cargo / "bin"), "/opt/idegym/toolchains/cargo/bin")]
    out = []
    for host, inside in trees:
        host = os.path.realpath(host)
        for directory, _, names in os.walk(host):
            for name in names:
                path = os.path.join(directory, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.append(identity(inside + path[len(host):], st.st_size, st.st_mtime_ns))
    return b"".join(out)


def _scan(sandbox, needles: bytes, hosts_own: bytes | None) -> list[str]:
    """Every answer found in a readable file of ``sandbox`` (as its tool user) by one scanning
    process (``answer_scan.py``); a planted answer (a .jsonl.gz in /tmp, a diff) must be found,
    so a scanner that reads nothing fails here. ``hosts_own``: the host's files a sandbox of the
    built-in image shows (``hosts_own``), which, unchanged, are the host's userland and are not read."""
    plain = needles.split(b"\n")[0].decode()
    planted = json.dumps({"canonical_solution": f"    {plain}\n    pass\n"})
    token = os.urandom(6).hex()
    sandbox.upload(f".scan-{token}.py", (Path(__file__).parent / "answer_scan.py").read_bytes())
    sandbox.upload(f".needles-{token}", needles)
    own = ""
    if hosts_own is not None:
        sandbox.upload(f".own-{token}", hosts_own)
        own = f" .own-{token}"
    command = (f"printf '%s\\n' {_shell(planted)} | gzip > /tmp/planted-{token}.jsonl.gz && "
               f"printf '+  %s\\n' {_shell(plain)} > /tmp/planted-{token}.diff && "
               "PY=$(ls /opt/idegym/python/bin/python3* 2>/dev/null | head -n1); "
               f"${{PY:-python3}} -I -S .scan-{token}.py .needles-{token}{own}; rm -f /tmp/planted-{token}.*")
    started = time.monotonic()
    done = sandbox.bash(command, timeout=240, max_output_bytes=4 << 20)
    lines = done.stdout.splitlines()
    assert done.exit_code == 0 and lines and lines[-1].startswith("SCANNED"), (done.stdout[-2000:], done.stderr)
    print(f"{lines[-1]} (files, bytes read, the host's own skipped) in {time.monotonic() - started:.1f} s")
    hits = [line for line in lines if line.startswith("HIT\t")]
    assert {h.split("\t")[1] for h in hits if token in h} == {f"/tmp/planted-{token}.jsonl.gz",
                                                          f"/tmp/planted-{token}.diff"}, hits
    return [h for h in hits if token not in h]


def _shell(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


SCANNED = {  # every task source; the built-in image and OCI images; the tool user, and root
    "bundled (built-in image)": "python-roman-numerals",
    "HumanEval (built-in image)": "humaneval/HumanEval/0",
    "SWE (OCI image)": "swe/cachetools__typedkey-kwargs",
    "Harbor (OCI image, run_as_root)": "harbor/bash-log-summary",
}


@pytest.mark.security
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("case", list(SCANNED))
def test_no_sandbox_holds_an_answer_of_any_shipped_task(case: str, control_plane, answer_needles: bytes,
                                                       hosts_own: bytes) -> None:
    """A sandbox of each task source, scanned from inside (every readable file but /proc and
    /sys, gzip and zip files decompressed) for the solutions and hidden tests of every shipped
    task, finds none of them: the server's runtime holds only what it imports. (The built-in
    image's /usr and the toolchains are the host's: their files, unchanged, are not read.)

    Can fail: on a runtime that binds the control plane's site-packages, the HumanEval data set
    (canonical solutions, tests) and the fixed cachetools release are found in every sandbox.
    """
    from idegym_env.env import IdeGymEnv

    task = load_task(SCANNED[case])
    env = IdeGymEnv(task, control_plane_url=control_plane.url)
    try:
        env.reset()
        assert env.sandbox is not None
        who = env.sandbox.bash("id -un").stdout.strip()
        assert who == ("root" if task.run_as_root else "appuser"), who
        leaks = _scan(env.sandbox, answer_needles, hosts_own if task.environment is None else None)
    finally:
        env.close()
    assert not leaks, "\n".join(leaks[:40])


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
    task = base.model_copy(update={"agent_timeout": 3, "resources": TaskResources(memory_mb=128)})
    env = IdeGymEnv(task, control_plane_url=control_plane.url)
    try:
        env.reset()
        _, _, terminated, truncated, info = env.step({"tool": "bash", "arguments": {
            "command": "python3 -c 'x = bytearray(512 << 20); print(len(x))'; sleep 30"}})
        assert truncated and not terminated and info["truncated_by"] == "agent_timeout"
        assert info["exit_code"] != 0 and info.get("oom_killed"), info  # 512 MiB in a 128 MiB sandbox
        assert info["timed_out"] and env.last_step_seconds < 10  # the call ends with the episode's time
        assert "checks" in info  # graded on truncation, like max_steps
    finally:
        env.close()
