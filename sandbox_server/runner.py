"""The code runner (``POST /execute``): compile and run a program in a fresh temporary directory.

Languages are found on the machine (or in the sandbox image) when first needed;
``GET /execute/languages`` lists them with their versions. Runs are bounded by a semaphore:
extra requests wait their turn instead of failing. With isolated runs (``--isolated-runs``,
``jail.py``) the compile and the run each get namespaces of their own in which only the run's
directory is writable and no other run is visible: the control plane's runner sandboxes serve
many requests that way, each as isolated as in a sandbox of its own.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .errors import BadRequest, Unprocessable
from .isolated_runs import RunTemplate
from .jail import Isolation
from .models import ExecuteRequest, ExecuteResponse, ExecuteTimings, LanguageInfo
from .process import CALL_ENV, ProcessResult, Supervisor
from .users import UserSpec

MAX_OUTPUT = 1 << 20
COMPILE_TIMEOUT = 60.0
RUN_TMP_BYTES = 64 << 20  # an isolated run's own /tmp and /dev/shm (its directory is the sandbox's /tmp)


def _java_main(code: str) -> str:
    match = re.search(r"public\s+(?:final\s+|abstract\s+)*class\s+([A-Za-z_$][\w$]*)", code)
    return match.group(1) if match else "Main"


@dataclass(frozen=True)
class Language:
    name: str
    binary: str
    version_argv: tuple[str, ...]
    source: Callable[[str], str]
    compile: Callable[[str], list[str]] | None
    run: Callable[[str], list[str]]
    aliases: tuple[str, ...] = ()
    version_pattern: str = r"(\d+(?:\.\d+)+)"


def _const(name: str) -> Callable[[str], str]:
    return lambda _code: name


LANGUAGES: tuple[Language, ...] = (
    Language("python", "python3", ("python3", "--version"), _const("main.py"), None,
             lambda src: ["python3", "-u", src], ("py", "python3")),
    Language("javascript", "node", ("node", "--version"), _const("main.js"), None,
             lambda src: ["node", src], ("js", "node", "nodejs")),
    Language("typescript", "tsx", ("tsx", "--version"), _const("main.ts"), None,
             lambda src: ["tsx", src], ("ts",)),
    Language("c", "gcc", ("gcc", "-dumpfullversion"), _const("main.c"),
             lambda src: ["gcc", "-O2", "-std=gnu17", "-o", "main", src, "-lm"], lambda _s: ["./main"], ("gcc",)),
    Language("cpp", "g++", ("g++", "-dumpfullversion"), _const("main.cpp"),
             lambda src: ["g++", "-O2", "-std=gnu++17", "-o", "main", src], lambda _s: ["./main"],
             ("c++", "g++", "cxx")),
    Language("java", "javac", ("javac", "-version"), lambda code: f"{_java_main(code)}.java",
             lambda src: ["javac", "-encoding", "UTF-8", "-d", ".", src],
             lambda src: ["java", "-Xss64m", "-cp", ".", PurePosixPath(src).stem], ()),
    Language("rust", "rustc", ("rustc", "--version"), _const("main.rs"),
             lambda src: ["rustc", "-O", "-o", "main", src], lambda _s: ["./main"], ("rs",)),
    Language("go", "go", ("go", "version"), _const("main.go"),
             lambda src: ["go", "build", "-o", "main", src], lambda _s: ["./main"], ("golang",)),
    Language("bash", "bash", ("bash", "--version"), _const("main.sh"), None,
             lambda src: ["bash", src], ("sh", "shell")),
    Language("perl", "perl", ("perl", "-e", "print $^V"), _const("main.pl"), None,
             lambda src: ["perl", src], ("pl",)),
    Language("ruby", "ruby", ("ruby", "--version"), _const("main.rb"), None,
             lambda src: ["ruby", src], ("rb",)),
    Language("php", "php", ("php", "--version"), _const("main.php"), None,
             lambda src: ["php", src], ()),
)


@dataclass
class CodeRunner:
    supervisor: Supervisor
    user: UserSpec | None
    env: Mapping[str, str]
    concurrency: int
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    hidden: tuple[str, ...] = ()  # what an isolated run must not see even read-only (the server's own files)
    available: dict[str, tuple[Language, str]] = field(default_factory=dict)
    _slots: asyncio.Semaphore | None = None
    _detected: asyncio.Task | None = None
    _removals: set[asyncio.Future] = field(default_factory=set)  # run directories removed after their answers

    def start(self) -> None:
        self._slots = asyncio.Semaphore(max(self.concurrency, 1))

    @property
    def isolated(self) -> bool:
        """Whether each run gets namespaces of its own (the supervisor has a jail zygote)."""
        return self.supervisor.jails is not None

    def _isolation(self, run_dir: Path) -> Isolation | None:
        return Isolation(bind=str(run_dir), tmp_bytes=RUN_TMP_BYTES, hide=self.hidden) if self.isolated else None

    def _detection(self) -> asyncio.Task:
        # Probed on first use, not at start-up: a dozen version probes would slow a cold start.
        if self._detected is None:
            self._detected = asyncio.ensure_future(self._detect())
        return self._detected

    async def stop(self) -> None:
        """Stop probing; wait until every run directory is removed."""
        if self._detected is not None and not self._detected.done():
            self._detected.cancel()
        if self._removals:
            await asyncio.wait(list(self._removals))

    async def _detect(self) -> None:
        path = self.env.get("PATH", os.defpath)

        async def probe(lang: Language) -> None:
            if shutil.which(lang.binary, path=path) is None:
                return
            result = await self.supervisor.run(
                lang.version_argv, cwd="/", env=self.env, user=self.user, timeout=20, grace=1,
                max_output=4096,
            )
            text = result.stdout.text() + result.stderr.text()
            match = re.search(lang.version_pattern, text)
            if result.exit_code == 0 or match:
                self.available[lang.name] = (lang, match.group(1) if match else text.strip()[:40])

        await asyncio.gather(*(probe(lang) for lang in LANGUAGES), return_exceptions=True)

    async def languages(self) -> list[LanguageInfo]:
        await asyncio.shield(self._detection())
        return [
            LanguageInfo(language=name, version=version, aliases=list(lang.aliases), compiled=lang.compile is not None)
            for name, (lang, version) in sorted(self.available.items())
        ]

    async def _lookup(self, name: str) -> Language:
        await asyncio.shield(self._detection())
        key = name.strip().lower()
        for lang, _version in self.available.values():
            if key == lang.name or key in lang.aliases:
                return lang
        known = ", ".join(sorted(self.available)) or "none"
        raise Unprocessable.field(
            ["body", "language"], f"unknown or unavailable language {name!r}; available: {known}", name
        )

    async def execute(self, req: ExecuteRequest) -> ExecuteResponse:
        lang = await self._lookup(req.language)
        source_name = lang.source(req.code)
        files = [(source_name, req.code)] + [(f.path, f.content) for f in req.files]
        checked = [(_safe_relative(p, i), content) for i, (p, content) in enumerate(files)]
        assert self._slots is not None
        arrived = time.monotonic()
        async with self._slots:
            return await self._run_in_tempdir(lang, source_name, checked, req, arrived)

    async def _run_in_tempdir(self, lang: Language, source_name: str, files: list[tuple[PurePosixPath, str]],
                              req: ExecuteRequest, arrived: float) -> ExecuteResponse:
        started = time.monotonic()
        clock = _Clock(arrived, started)
        tmp = Path(tempfile.mkdtemp(prefix="idegym-run-", dir=self.workdir))
        try:
            for rel, content in files:
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(content, encoding="utf-8")
            if self.user is not None and os.geteuid() == 0:
                for path in [tmp, *tmp.rglob("*")]:
                    os.lchown(path, self.user.uid, self.user.gid)
            env = dict(self.env, HOME=str(tmp), TMPDIR=str(tmp), **_toolchain_homes(self.env))
            isolation = self._isolation(tmp)
            clock.prepared = time.monotonic()
            if lang.compile is not None:
                built = await self.supervisor.run(
                    lang.compile(source_name), cwd=str(tmp), env=env, user=self.user,
                    timeout=COMPILE_TIMEOUT, grace=1.0, max_output=MAX_OUTPUT, isolation=isolation,
                )
                clock.compiled = time.monotonic()
                if built.exit_code != 0:
                    return _response(built, "compile", clock)
            clock.handed = time.monotonic()
            ran = await self.supervisor.run(
                lang.run(source_name) + list(req.args), cwd=str(tmp), env=env, user=self.user,
                timeout=req.timeout, grace=0.5, max_output=MAX_OUTPUT,
                stdin=req.stdin.encode("utf-8") if req.stdin else None, isolation=isolation,
            )
            return _response(ran, "run", clock)
        except OSError as exc:
            raise BadRequest(f"could not prepare the run directory: {exc}") from exc
        finally:
            # After the answer: its processes are gone (an isolated run's with its pid namespace),
            # nobody waits for the removal; stop() does.
            removal = asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, tmp, True)
            self._removals.add(removal)
            removal.add_done_callback(self._removals.discard)


def forked_runs_template(env: Mapping[str, str]) -> RunTemplate | None:
    """The interpreter isolated Python runs are forked from (``run_template.py``): the
    ``python3`` a run would start, with the environment every run shares. HOME is a run's own
    (its directory): the template's does not exist, so that it has no user site-packages."""
    python = shutil.which("python3", path=env.get("PATH", os.defpath))
    if python is None:
        return None
    shared = {**env, **_toolchain_homes(env), "HOME": "/nonexistent"}
    shared.pop("TMPDIR", None)
    return RunTemplate(python, shared, ("HOME", "TMPDIR", CALL_ENV))


def _toolchain_homes(env: Mapping[str, str]) -> dict[str, str]:
    """rustup finds its toolchains through $HOME; keep them reachable with HOME moved."""
    home = env.get("HOME", "")
    found = {}
    for var, sub in (("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo")):
        if env.get(var):
            found[var] = env[var]
        elif home and os.path.isdir(os.path.join(home, sub)):
            found[var] = os.path.join(home, sub)
    return found


@dataclass
class _Clock:
    """The moments of one request (``time.monotonic``), for its ``ExecuteTimings``."""

    arrived: float
    started: float
    prepared: float = 0.0
    compiled: float | None = None
    handed: float = 0.0

    def timings(self, result: ProcessResult, stage: str) -> ExecuteTimings:
        now = time.monotonic()
        begun = self.prepared if stage == "compile" else self.handed  # the stage's process was asked for
        report = result.run_report
        spawned = report.spawned if report is not None and report.spawned >= begun else None
        return ExecuteTimings(
            queued=_ms(self.arrived, self.started), prepare=_ms(self.started, self.prepared),
            compile=_ms(self.prepared, self.compiled) if self.compiled is not None else None,
            start=_ms(begun, spawned) if spawned is not None else None,
            program=_ms(spawned if spawned is not None else begun, begun + result.duration),
            total=_ms(self.arrived, now),
            program_cpu=round(report.program_cpu * 1000, 3) if report is not None else None,
            isolation_cpu=round(report.init_cpu * 1000, 3) if report is not None else None)


def _ms(start: float, end: float) -> float:
    return round((end - start) * 1000, 3)


def _response(result: ProcessResult, stage: str, clock: _Clock) -> ExecuteResponse:
    return ExecuteResponse(
        stdout=result.stdout.text(), stderr=result.stderr.text(), exit_code=result.exit_code,
        timed_out=result.timed_out, stage=stage, duration_seconds=round(time.monotonic() - clock.started, 4),
        timings=clock.timings(result, stage),
    )


def _safe_relative(path: str, index: int) -> PurePosixPath:
    loc: list[str | int] = ["body", "files", index - 1, "path"] if index else ["body", "code"]
    if not path or "\x00" in path:
        raise Unprocessable.field(loc, "file path must be a non-empty string without NUL bytes", path)
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:  # "." has no parts: the directory itself
        raise Unprocessable.field(
            loc, f"file path {path!r} must stay inside the run directory: relative, without '..'", path
        )
    return pure
