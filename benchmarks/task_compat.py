"""Harbor task directories written by others, run unchanged: the compatibility table.

    python -m benchmarks.task_compat [--mirrors DIR] [--only TEXT] [--skip-validate] [--out FILE]

1. The corpus: each entry of ``benchmarks/task_corpus.json`` (repository, commit, path) is taken
   into ``.corpus/<owner>__<name>/<path>`` (git-ignored: the tasks are not ours to commit), with
   ``git archive`` from a local clone (``--mirrors DIR`` holding ``<owner>+<name>/repo``) or a
   clone of ``https://github.com/<repository>``.
2. One control plane on this machine (ephemeral, allowed to build from ``.corpus``).
3. Each task through Harbor's own CLI (``harbor run --agent oracle`` with the IdeGym environment
   provider) and through ``idegym tasks validate harbor:<dir>`` (the oracle and the untouched
   run): their rewards must agree.
4. The table (markdown, for ``benchmarks/REPORT.md``): reward, seconds, and for a task that does
   not score 1.0 its class — ``internet`` (it needs more than the package registries reachable
   here: the hosts are named), ``registry`` (a base image only a registry has), ``defect`` (the
   task itself: no oracle, a verifier that needs the network the task denies…) or ``ours`` — with
   the evidence, checked against the class the manifest expects (``expect``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "benchmarks" / "task_corpus.json"
CORPUS = REPO / ".corpus"
HARBOR = REPO / ".venv-harbor" / "bin" / "harbor"
IDEGYM = REPO / ".venv" / "bin" / "idegym"
IMPORT_PATH = "idegym_env.integrations.harbor:IdeGymEnvironment"
# Package registries this machine reaches (its other hosts are not reachable): a task that needs
# nothing beyond these must score 1.0 here.
REGISTRIES = ("pypi.org", "files.pythonhosted.org", "registry.npmjs.org", "deb.debian.org", "security.debian.org",
              "archive.ubuntu.com", "security.ubuntu.com")
# What tools print when a host does not answer (curl, wget, git, pip, go, cargo, npm, apt, maven).
_UNREACHED = [re.compile(p) for p in (
    r"Could not resolve host:? '?([\w.-]+)",
    r"Failed to connect to ([\w.-]+) port",
    r"curl: \(\d+\) [^\n]*?(?:https?://)?([\w-]+(?:\.[\w-]+)+)",
    r"unable to access '(?:https?|git)://([\w.-]+)/",
    r"Connecting to ([\w.-]+) \([\w.-]+\)\|[\d.:a-f]+\|:\d+\.\.\. failed",
    r"(?:dial tcp|Get \"https?://)(?:[^\n]*?lookup )?([a-z][\w-]*(?:\.[\w-]+)+)",
    r"failed to (?:download|get) [^\n]*?https?://([\w.-]+)",
    r"Could not transfer artifact [^\n]*?https?://([\w.-]+)",
    r"Temporary failure resolving '([\w.-]+)'",
    r"(?:Failed to fetch|Cannot initiate the connection to) (?:https?://)?([\w.-]+)",
    r"network request to https?://([\w.-]+)",
    r"Failed to resolve '([\w.-]+)'",
    r"HTTPS?ConnectionPool\(host='([\w.-]+)'",
    r"getaddrinfo (?:ENOTFOUND|EAI_AGAIN) ([\w.-]+)",
    r"thrown while requesting [A-Z]+ https?://([\w.-]+)",
)]

# The compose file itself is wrong (what the provider's reader says of a file docker compose would refuse
# as well): a service's Dockerfile that is not there, a dependency on no service, no build and no image.
_COMPOSE_DEFECT = re.compile(r"(docker-compose\.ya?ml): (service '[^'\n]+' (?:builds \S+, which does not exist"
                             r"|depends on '[^'\n]+', which is not a service|has neither build nor image)"
                             r"|not a readable compose file[^\n]*|services must be a mapping)")


@dataclass
class Entry:
    repo: str
    commit: str
    path: str
    kind: str
    expect: str | None = None  # "1.0", or "<class>: <why>" as judged by reading the task

    @property
    def directory(self) -> Path:
        return CORPUS / self.repo.replace("/", "__") / self.path

    @property
    def name(self) -> str:
        owner, repository = self.repo.split("/")
        return f"{owner}/{Path(self.path).name or repository}"  # a task at its repository's root: the repository

    @property
    def key(self) -> str:
        return f"{self.repo}:{self.path}"


@dataclass
class Outcome:
    entry: Entry
    reward: float | None = None
    seconds: float = 0.0
    cls: str | None = None  # None: scored 1.0
    why: str = ""
    validate: float | None = None  # idegym tasks validate: the oracle's reward
    validate_error: str | None = None
    notes: list[str] = field(default_factory=list)


def load_manifest(path: Path = MANIFEST) -> list[Entry]:
    return [Entry(**row) for row in json.loads(path.read_text())]


# -- the corpus --------------------------------------------------------------------------------------------


def fetch(entries: list[Entry], mirrors: Path | None) -> None:
    for entry in entries:
        if (entry.directory / "task.toml").is_file():
            continue
        git_dir = _clone(entry.repo, mirrors)
        target = CORPUS / entry.repo.replace("/", "__")
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(git_dir), "archive", entry.commit, entry.path],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "x", "-C", str(target)], input=archive, check=True)
        if not (entry.directory / "task.toml").is_file():
            raise SystemExit(f"{entry.repo}@{entry.commit}:{entry.path} has no task.toml")


def _clone(repo: str, mirrors: Path | None) -> Path:
    if mirrors is not None:
        local = mirrors / repo.replace("/", "+") / "repo"
        if local.exists():
            return local
    cache = CORPUS / ".git-cache" / repo.replace("/", "__")
    if not cache.exists():
        subprocess.run(["git", "clone", "--bare", "--filter=blob:none", f"https://github.com/{repo}.git", str(cache)],
                       check=True)
    return cache


# -- running -----------------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    # Harbor's LLM layer fetches a price list from the internet at start-up unless told not to.
    return {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONDONTWRITEBYTECODE": "1"}


def run_harbor(entry: Entry, url: str, jobs: Path) -> tuple[dict[str, Any] | None, Path | None, str]:
    job = f"job-{abs(hash(entry.key)) % 10**8}"
    argv = [str(HARBOR), "run", "--path", str(entry.directory), "--jobs-dir", str(jobs), "--yes", "--quiet",
            "--job-name", job, "--agent", "oracle", "--env", IMPORT_PATH, "--ek", f"control_plane_url={url}",
            "--n-concurrent", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=7200)
    trials = sorted((jobs / job).glob("*/result.json"))
    if not trials:
        return None, None, (proc.stdout + proc.stderr)[-3000:]
    return json.loads(trials[-1].read_text()), trials[-1].parent, ""


def run_validate(entry: Entry, url: str) -> tuple[float | None, str | None]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        proc = subprocess.run([str(IDEGYM), "tasks", "validate", f"harbor:{entry.directory}", "--control-plane-url",
                               url, "--json", out.name], capture_output=True, text=True, timeout=7200)
        try:
            rows = json.loads(Path(out.name).read_text() or "[]")
        except ValueError:
            rows = []
    if not rows:
        return None, (proc.stdout + proc.stderr)[-1500:]
    row = rows[0]
    return row.get("oracle"), row.get("error")


def classify(entry: Entry, result: dict[str, Any] | None, trial: Path | None, output: str) -> tuple[str | None, str]:
    """A task that did not score 1.0: its class and the evidence (first lines that show it)."""
    if result is None:
        return "ours", f"harbor run produced no trial: {output[-500:]}"
    rewards = (result.get("verifier_result") or {}).get("rewards") or {}
    reward = rewards.get("reward")
    if reward == 1.0 or (reward is None and rewards and all(v == 1.0 for v in rewards.values())):
        return None, ""
    exception = result.get("exception_info") or {}
    message = str(exception.get("exception_message") or "")
    texts = [message]
    if trial is not None:
        for name in ("verifier/test-stdout.txt", "verifier/test-stderr.txt", "agent/oracle.txt", "exception.txt"):
            path = trial / name
            if path.is_file():
                texts.append(path.read_text(errors="replace")[-20000:])
        steps = sorted(trial.glob("steps/*/verifier/test-stdout.txt"))
        texts += [p.read_text(errors="replace")[-20000:] for p in steps]
    blob = "\n".join(texts)
    hosts = unreachable_hosts(blob)
    # a download in a build step whose tool is silent (curl -s): the step's own URLs, when it ended as a
    # tool ends that could not connect (curl 6/7/28/35/56, wget 4)
    for step, status in re.findall(r'building at STEP "(.*?)": exit status (\d+)', blob):
        if (status in ("6", "7", "28", "35", "56") and "curl" in step) or (status == "4" and "wget" in step):
            hosts |= {h for h in re.findall(r"https?://([\w.-]+)", step) if h not in REGISTRIES}
    if "is not available: its registry" in blob:
        found = re.search(r"base image '([^']+)' is not available: its registry ([\w.-]+)", blob)
        return "registry", (f"{found.group(1)}: only its registry {found.group(2)} has it (not reachable here, no "
                            "mirror configured)") if found else _first(blob, "is not available")
    if hosts:
        return "internet", f"needs {', '.join(sorted(hosts))} (not a package registry reachable here)"
    newer = re.search(r"requires go >= ([\d.]+) \(running go ([\d.]+)|requires rustc ([\d.]+) or newer[^\n]*?"
                      r"rustc ([\d.]+)", blob)
    if newer:
        want, have = (newer.group(1), newer.group(2)) if newer.group(1) else (newer.group(3), newer.group(4))
        return "registry", (f"needs its official image's toolchain ({want}); the one built here is {have} (no Debian "
                            f"release packages {want}), and no registry is reachable to pull the image")
    compose = _COMPOSE_DEFECT.search(blob)
    if compose:
        what = compose.group(2).replace(f"{entry.directory}/", "")
        return "defect", f"its {compose.group(1)}: {what} (docker compose, and so Harbor, refuses it too)"
    solution = entry.directory / "solution" / "solve.sh"
    if not solution.is_file() and not list(entry.directory.glob("steps/*/solution/solve.sh")):
        return "defect", "no solution/solve.sh: the oracle has nothing to run"
    network = _network_mode(entry.directory)
    missing = re.search(r"No module named '?([\w.]+)|([\w.-]+): command not found", blob)
    if network == "no-network" and missing:
        what = missing.group(1) or missing.group(2)
        installs = re.search(r"pip3? install|uvx|uv pip|apt-get install", _verifier_text(entry.directory))
        return "defect", (f"the verifier needs {what}, which its image does not have, and "
                          + ("installs it from a package index although the task allows no network"
                             if installs else "the task allows no network to install it")
                          + " (so under Harbor's docker environment too)")
    silent = unreachable_referenced_hosts(entry.directory)
    if silent:  # a download whose failure left no trace (`curl -s … | sh` ends well; a later step fails)
        return "internet", (f"needs {', '.join(sorted(silent))}, which its files download from and which does not "
                            "answer here (not a package registry)")
    return "ours", _first(blob, "Error") or message[:300] or f"reward {reward}"


def unreachable_hosts(text: str) -> set[str]:
    hosts: set[str] = set()
    for pattern in _UNREACHED:
        for found in pattern.findall(text):
            host = found.strip(".'\"").lower()
            if "." in host and not re.fullmatch(r"[\d.]+", host) and host not in REGISTRIES \
                    and host not in ("localhost",) and not host.endswith((".local", ".svc", ".internal")):
                hosts.add(host)
    return hosts


def unreachable_referenced_hosts(task: Path) -> set[str]:
    """Hosts the task's Dockerfile and scripts download from that do not answer from here."""
    texts = [p.read_text(errors="replace") for pattern in ("environment/Dockerfile", "tests/*.sh", "solution/*.sh")
             for p in task.glob(pattern) if p.is_file()]
    hosts = {h.lower() for text in texts for h in re.findall(r"https?://([A-Za-z0-9.-]+\.[A-Za-z]{2,})", text)}
    return {h for h in hosts - set(REGISTRIES) if not _answers(h)}


def _answers(host: str) -> bool:
    import socket

    try:
        with socket.create_connection((host, 443), timeout=5):
            return True
    except OSError:
        return False


def _network_mode(task: Path) -> str:
    import tomllib

    doc = tomllib.loads((task / "task.toml").read_text())
    env = doc.get("environment") or {}
    if "network_mode" in env:
        return str(env["network_mode"])
    return "public" if env.get("allow_internet", True) else "no-network"


def _verifier_text(task: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (task / "tests").rglob("*.sh") if p.is_file())


def _first(text: str, word: str) -> str:
    for line in text.splitlines():
        if word.lower() in line.lower():
            return line.strip()[:300]
    return ""


# -- the table -----------------------------------------------------------------------------------------------


def table(outcomes: list[Outcome]) -> str:
    lines = ["| task | kind | reward (harbor run) | validate (oracle) | s | class | evidence | expected |",
             "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        reward = "—" if o.reward is None else f"{o.reward:g}"
        val = "—" if o.validate is None else f"{o.validate:g}"
        expected = o.entry.expect or "?"
        agrees = _agrees(o)
        why = o.why.replace("|", "\\|").replace("\n", " ")[:240]
        lines.append(f"| {o.entry.name} | {o.entry.kind} | {reward} | {val} | {o.seconds:.0f} | {o.cls or '1.0'} | "
                     f"{why} | {expected}{'' if agrees else ' **(differs)**'} |")
    return "\n".join(lines)


def _agrees(o: Outcome) -> bool:
    if o.entry.expect is None:
        return True
    if o.entry.expect == "1.0":
        return o.cls is None
    return o.cls is not None and o.entry.expect.split(":", 1)[0] == o.cls


def summary(outcomes: list[Outcome]) -> str:
    total = len(outcomes)
    passed = sum(o.cls is None for o in outcomes)
    classified = sum(o.cls not in (None, "ours") and _agrees(o) for o in outcomes)
    ours = sum(o.cls == "ours" for o in outcomes)
    mismatched = sum(not _agrees(o) for o in outcomes)
    disagree = sum(o.validate is not None and o.reward is not None and (o.validate == 1.0) != (o.reward == 1.0)
                   for o in outcomes)
    # what IdeGym's own loader does not run (compose, multi-step, a separate verifier), saying so
    refused = sum(o.validate is None and "run it with `harbor run`" in (o.validate_error or "") for o in outcomes)
    return (f"{total} tasks: {passed} score 1.0, {classified} fail and are classified as expected "
            f"({(passed + classified) / max(total, 1):.0%} of the corpus), {ours} fail for reasons of ours, "
            f"{mismatched} differ from the expected class; `harbor run` and `idegym tasks validate` disagree on "
            f"{disagree}; `idegym tasks validate` refuses {refused} (to be run with `harbor run`)")


# -- main --------------------------------------------------------------------------------------------------------


def start_control_plane(state: Path) -> tuple[subprocess.Popen, str]:
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-m", "control_plane", "--state-dir", str(state), "--port", "0", "--ephemeral",
            "--auth", "none", "--build-root", str(CORPUS), "--ready-fd", str(write_fd)]
    log = open(state.parent / "control-plane.log", "ab")  # noqa: SIM115 (kept open for the child)
    proc = subprocess.Popen(argv, pass_fds=(write_fd,), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    os.close(write_fd)
    line = os.read(read_fd, 64).decode()
    os.close(read_fd)
    if not line.startswith("ready"):
        proc.kill()
        raise SystemExit(f"the control plane did not start (see {state.parent / 'control-plane.log'})")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def report(path: Path) -> str:
    """The table and summary of a results file (every task of the manifest it has)."""
    saved = {f"{row['repo']}:{row['path']}": row for row in json.loads(path.read_text())}
    outcomes = []
    for entry in load_manifest():
        row = saved.get(entry.key)
        if row is not None:
            outcomes.append(Outcome(entry, row["reward"], row["seconds"], row["class"], row["why"], row["validate"],
                                    row.get("validate_error")))
    return table(outcomes) + "\n\n" + summary(outcomes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirrors", type=Path, help="local clones: <owner>+<name>/repo (else GitHub)")
    parser.add_argument("--only", action="append", default=[],
                        help="tasks whose <repository>:<path> contains this (repeatable)")
    parser.add_argument("--skip-validate", action="store_true", help="harbor run only")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "task_compat.json")
    parser.add_argument("--fetch-only", action="store_true")
    parser.add_argument("--report", action="store_true", help="print the table of --out and exit")
    parser.add_argument("--keep", action="store_true", help="keep the trials' directories (printed at the end)")
    args = parser.parse_args(argv)
    if args.report:
        print(report(args.out))
        return 0
    entries = [e for e in load_manifest() if not args.only or any(o in e.key for o in args.only)]
    fetch(entries, args.mirrors)
    if args.fetch_only:
        return 0
    work = Path(tempfile.mkdtemp(prefix="task-compat-"))
    (work / "state").parent.mkdir(exist_ok=True)
    proc, url = start_control_plane(work / "state")
    outcomes: list[Outcome] = []
    previous = {f"{o['repo']}:{o['path']}": o for o in (json.loads(args.out.read_text()) if args.out.is_file() else [])}
    try:
        for entry in entries:
            started = time.monotonic()
            result, trial, output = run_harbor(entry, url, work / "jobs")
            outcome = Outcome(entry, seconds=time.monotonic() - started)
            if result is not None:
                rewards = (result.get("verifier_result") or {}).get("rewards") or {}
                outcome.reward = rewards.get("reward", next(iter(rewards.values()), None) if rewards else None)
            outcome.cls, outcome.why = classify(entry, result, trial, output)
            if not args.skip_validate:
                outcome.validate, outcome.validate_error = run_validate(entry, url)
            outcomes.append(outcome)
            print(f"{entry.name}: reward {outcome.reward} validate {outcome.validate} ({outcome.seconds:.0f} s) "
                  f"{outcome.cls or ''} {outcome.why[:200]}", flush=True)
            previous[entry.key] = {"path": entry.path, "repo": entry.repo, "reward": outcome.reward,
                                    "validate": outcome.validate, "validate_error": outcome.validate_error,
                                    "seconds": round(outcome.seconds, 1), "class": outcome.cls, "why": outcome.why}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(list(previous.values()), indent=1) + "\n")
    finally:
        proc.terminate()
        proc.wait(120)
        if args.keep:
            print(f"trials kept in {work / 'jobs'}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(table(outcomes))
    print(summary(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
