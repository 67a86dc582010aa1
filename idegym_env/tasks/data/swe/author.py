"""Make ``instances.jsonl`` from ``bugs.yaml`` and ``repos.json``, SWE-smith style, and prove each.

    python idegym_env/tasks/data/swe/author.py --python /path/to/venv/bin/python

For each bug: the release's suite runs on the pristine release and on the release with the bug;
FAIL_TO_PASS = tests that pass on the release and not with the bug, PASS_TO_PASS = tests that
pass on both; test_patch = the test files holding FAIL_TO_PASS (the instance's tree lacks them
until grading); patch = the fix; base_commit = the commit ``repos.instance_commit`` makes. Then
every instance is proven as the grader runs it: untouched → every FAIL_TO_PASS fails and every
PASS_TO_PASS passes; gold patch → all pass. A bug that breaks no test, or a proof that fails,
stops the script. ``--python`` should match the image's versions (Debian bookworm: Python 3.11,
pytest 7.2).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from idegym_env.tasks.sources import repos, swe, swe_local

HERE = Path(__file__).resolve().parent
BUGGY_RUNS = 4
# Modules the tasks' image (Debian's python3, no python3-tk) lacks: a test that needs one passes
# where this script runs and is skipped at grading, so it is never listed.
IMAGE_LACKS = ("tkinter",)


def _suite(tree: Path, framework: str) -> list[str]:
    if framework == "pytest":
        return []  # pytest collects the suite by the project's own configuration
    return sorted(swe.test_module(p.relative_to(tree).as_posix()) for p in tree.rglob("test_*.py")
                  if "docs" not in p.parts)


def _outcomes(tree: Path, profile: swe.Profile, python: str) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="author-") as tmp:
        work = Path(tmp) / "tree"
        shutil.copytree(tree, work, symlinks=True)
        if profile.test_framework == "unittest":
            (work / swe.UNITTEST_RUNNER).parent.mkdir(parents=True, exist_ok=True)
            (work / swe.UNITTEST_RUNNER).write_bytes(swe.unittest_runner_source())
        script = swe.test_command(profile, _suite(work, profile.test_framework))
        outcomes, output = swe_local.run_tests(work, script, python=python, env=profile.env)
    if not outcomes:
        raise SystemExit(f"no test ran in {tree}:\n{output}")
    return outcomes


def _diff(before: Path, after: Path) -> str:
    """``git diff`` from tree ``before`` to tree ``after`` (a/ b/ prefixes, as SWE-bench's)."""
    with tempfile.TemporaryDirectory(prefix="diff-") as tmp:
        git_dir = Path(tmp) / "g.git"
        repos.git("init", "--bare", "--quiet", str(git_dir))
        trees = []
        for tree in (before, after):
            index = Path(tmp) / "index"
            index.unlink(missing_ok=True)
            repos.git("add", "-A", "-f", ".", git_dir=git_dir, work_tree=tree, index=index)
            trees.append(repos.git("write-tree", git_dir=git_dir, work_tree=tree, index=index))
        return repos.git("diff", "--no-color", "--full-index", trees[0], trees[1], git_dir=git_dir, strip=False)


def _id_for(test: str, framework: str, tree: Path) -> str:
    """The id as an instance lists it: pytest node ids, dotted unittest ids."""
    if framework == "unittest":
        return test
    # canonical "pkg.mod.Class.test[p]" -> "pkg/mod.py::Class::test[p]": find the longest module path
    head, bracket, param = test.partition("[")
    parts = head.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        file = "/".join(parts[:cut]) + ".py"
        if (tree / file).is_file():
            return file + "::" + "::".join(parts[cut:]) + bracket + param
    raise SystemExit(f"cannot find the file of test {test!r} under {tree}")


def author(python: str, only: set[str] | None) -> list[dict]:
    repo_entries = swe.read_repos(HERE / "repos.json")
    bugs = yaml.safe_load((HERE / "bugs.yaml").read_text())
    out = []
    baseline: dict[str, dict[str, str]] = {}
    for bug in bugs:
        if only and bug["instance_id"] not in only:
            continue
        entry = repo_entries[bug["repo"]]
        profile = entry.profile
        git_dir, release = repos.release_repo(bug["repo"], entry.source)
        with tempfile.TemporaryDirectory(prefix="bug-") as tmp:
            pristine = repos.export_tree(git_dir, release, Path(tmp) / "pristine")
            if bug["repo"] not in baseline:
                # Two runs: an id that differs between processes (a parameter's order from a set
                # hashing None by address, say) cannot be listed.
                first, second = (_outcomes(pristine, profile, python) for _ in range(2))
                unstable = {t.split("[", 1)[0] for t in set(first) ^ set(second)}  # whole functions
                baseline[bug["repo"]] = {t: o for t, o in first.items()
                                         if second.get(t) == o and t.split("[", 1)[0] not in unstable}
                if unstable:
                    print(f"{bug['repo']}: ids of {sorted(unstable)} differ between runs; not listed", flush=True)
            before = baseline[bug["repo"]]
            buggy = Path(tmp) / "buggy"
            shutil.copytree(pristine, buggy, symlinks=True)
            source = buggy / bug["file"]
            text = source.read_text()
            if text.count(bug["old"]) != 1:
                raise SystemExit(f"{bug['instance_id']}: `old` occurs {text.count(bug['old'])} times in {bug['file']}")
            source.write_text(text.replace(bug["old"], bug["new"]))
            # Several runs with the bug: a test whose outcome varies (RRCache evicts at random)
            # is neither FAIL_TO_PASS nor PASS_TO_PASS.
            runs = [_outcomes(buggy, profile, python) for _ in range(BUGGY_RUNS)]
            passed = {t for t, o in before.items() if o == "passed"}
            f2p = sorted(t for t in passed if all(r.get(t) in ("failed", "error") for r in runs))
            p2p = sorted(t for t in passed if all(r.get(t) == "passed" for r in runs)
                         and not any(module in t for module in IMAGE_LACKS))
            flaky = len(passed) - len(f2p) - len(p2p)
            if flaky:
                print(f"{bug['instance_id']}: {flaky} tests vary between runs with the bug; not listed", flush=True)
            if not f2p:
                raise SystemExit(f"{bug['instance_id']}: the bug breaks no test")
            f2p_ids = [_id_for(t, profile.test_framework, pristine) for t in f2p]
            p2p_ids = [_id_for(t, profile.test_framework, pristine) for t in p2p]
            hidden = sorted({swe.test_file(t, profile.test_framework) for t in f2p_ids})
            base = Path(tmp) / "base"
            shutil.copytree(buggy, base, symlinks=True)
            for rel in hidden:
                (base / rel).unlink()
            patch = _diff(base, _with(base, pristine, [bug["file"]], Path(tmp) / "fixed"))
            test_patch = _diff(base, _with(base, pristine, hidden, Path(tmp) / "tested"))
            commit = repos.instance_commit(git_dir, release, bug["instance_id"], patch, test_patch)
        instance = {
            "instance_id": bug["instance_id"], "repo": bug["repo"], "base_commit": commit,
            "problem_statement": bug["problem_statement"], "hints_text": "", "patch": patch,
            "test_patch": test_patch, "FAIL_TO_PASS": f2p_ids, "PASS_TO_PASS": p2p_ids,
            "version": bug["repo"].rsplit("-", 1)[1], "created_at": "2000-01-01T00:00:00Z",
        }
        out.append(instance)
        print(f"{bug['instance_id']}: {len(f2p_ids)} FAIL_TO_PASS, {len(p2p_ids)} PASS_TO_PASS, "
              f"hidden {hidden}, base_commit {commit[:12]}", flush=True)
    return out


def _with(base: Path, pristine: Path, files: list[str], dest: Path) -> Path:
    shutil.copytree(base, dest, symlinks=True)
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(pristine / rel, dest / rel)
    return dest


def prove_all(path: Path, python: str, only: set[str] | None) -> bool:
    sweset = swe.SweSet(path)
    ok = True
    for task_id, instance in sweset.instances.items():
        if only and instance.instance_id not in only:
            continue
        profile = instance.profile(sweset.entry(instance).profile)
        project = sweset.project(instance)
        grading = sweset.grading_project_files(instance, project, profile)
        script = swe.test_command(profile, instance.FAIL_TO_PASS + instance.PASS_TO_PASS)
        untouched = swe_local.prove(project, grading, script, instance.FAIL_TO_PASS, instance.PASS_TO_PASS,
                                    python=python, env=profile.env)
        gold = swe_local.prove(project, grading, script, instance.FAIL_TO_PASS, instance.PASS_TO_PASS,
                               python=python, env=profile.env, patch=instance.patch)
        f2p_failing = all(untouched[t] != "passed" for t in instance.FAIL_TO_PASS)
        p2p_passing = all(untouched[t] == "passed" for t in instance.PASS_TO_PASS)
        gold_ok = all(o == "passed" for o in gold.values())
        good = f2p_failing and p2p_passing and gold_ok
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} {task_id}: untouched F2P failing={f2p_failing} P2P passing={p2p_passing}; "
              f"gold all passing={gold_ok} ({len(gold)} tests)", flush=True)
        if not good:
            print("   ", {t: o for t, o in gold.items() if o != "passed"} or
                  {t: o for t, o in untouched.items() if (o == "passed") == (t in instance.FAIL_TO_PASS)})
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter with pytest to run the suites")
    parser.add_argument("--only", nargs="*", help="instance ids to (re)make")
    parser.add_argument("--prove-only", action="store_true", help="prove instances.jsonl as it is")
    args = parser.parse_args()
    only = set(args.only) if args.only else None
    target = HERE / "instances.jsonl"
    if not args.prove_only:
        made = author(args.python, only)
        if only and target.exists():
            kept = [json.loads(line) for line in target.read_text().splitlines() if line.strip()]
            by_id = {i["instance_id"]: i for i in kept} | {i["instance_id"]: i for i in made}
            order = [b["instance_id"] for b in yaml.safe_load((HERE / "bugs.yaml").read_text())]
            made = [by_id[i] for i in order if i in by_id]
        target.write_text("".join(json.dumps(i, sort_keys=True) + "\n" for i in made))
    return 0 if prove_all(target, args.python, only) else 1


if __name__ == "__main__":
    sys.exit(main())
