"""Repositories of SWE-style instances: fetched once, cached, and made into git repositories
whose commits are deterministic, so an instance's ``base_commit`` names the same tree everywhere.

A repository comes from one of (``RepoSource``):

* ``sdist`` — a release's source distribution on PyPI, fetched with ``pip download`` and checked
  against a pinned sha256; its files become the *release commit*;
* ``archive`` — a local ``.tar.gz``/``.tgz``/``.tar``/``.zip``; its files become the release commit;
* ``git`` — a local path or a URL (the network permitting) of a git repository that already
  holds the instances' ``base_commit``\\ s.

For the first two, an instance's ``base_commit`` is built the SWE-smith way: the release commit
with the instance's ``patch`` (the fix) and ``test_patch`` (its hidden tests) applied in reverse,
committed with fixed author, committer, dates and message. ``materialize`` checks that the commit
it made is the ``base_commit`` the instance names, so data and build cannot drift apart.

Only a commit's *tree* ever reaches a sandbox (``export_tree``): no history, so no future commit
can be read with ``git log``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...settings import ClientSettings
from ..task import TaskError

FIXED_IDENTITY = {
    "GIT_AUTHOR_NAME": "IdeGym tasks", "GIT_AUTHOR_EMAIL": "tasks@idegym.invalid",
    "GIT_COMMITTER_NAME": "IdeGym tasks", "GIT_COMMITTER_EMAIL": "tasks@idegym.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
GIT_FLAGS = ["-c", "core.autocrlf=false", "-c", "core.fileMode=true", "-c", "core.symlinks=true",
             "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", "-c", "init.defaultBranch=release"]


def cache_root() -> Path:
    """Where fetched sources and built repositories live: ``$IDEGYM_TASK_CACHE`` or
    ``~/.cache/idegym/tasks``."""
    return ClientSettings.from_env().task_cache_dir()


class Sdist(BaseModel):
    """A pinned source distribution on PyPI."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class RepoSource(BaseModel):
    """Where a repository comes from; exactly one of ``sdist``, ``archive``, ``git``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sdist: Sdist | None = None
    archive: str | None = None
    git: str | None = None
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="of the archive, when pinned")

    @model_validator(mode="after")
    def _one(self) -> RepoSource:
        given = [k for k in ("sdist", "archive", "git") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a repository source needs exactly one of sdist, archive, git (got {given or 'none'})")
        return self

    @property
    def builds_commits(self) -> bool:
        """True when instance commits are made here from the release (sdist, archive)."""
        return self.git is None


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(FIXED_IDENTITY, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0",
               TZ="UTC", LC_ALL="C")
    return env


def git(*args: str, git_dir: Path | None = None, work_tree: Path | None = None, index: Path | None = None,
        input: bytes | None = None, timeout: float = 300, strip: bool = True) -> str:
    """Run git with a fixed identity and no user or system configuration; raise ``TaskError`` on failure."""
    cmd = ["git", *GIT_FLAGS]
    if git_dir is not None:
        cmd.append(f"--git-dir={git_dir}")
    if work_tree is not None:
        cmd.append(f"--work-tree={work_tree}")
    env = _git_env()
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    try:
        proc = subprocess.run(cmd + list(args), input=input, capture_output=True, env=env, timeout=timeout,
                              cwd=work_tree or git_dir or None)
    except FileNotFoundError as exc:
        raise TaskError("git is not installed; SWE-style instances need it (apt-get install git)") from exc
    if proc.returncode != 0:
        raise TaskError(f"git {' '.join(args[:3])} failed: {proc.stderr.decode(errors='replace').strip()[-2000:]}")
    out = proc.stdout.decode(errors="replace")
    return out.strip() if strip else out  # a diff keeps its trailing context lines (" \n")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def fetch_sdist(sdist: Sdist, cache: Path | None = None) -> Path:
    """The sdist archive in the cache, downloaded with ``pip download`` when missing; its sha256
    must be the pinned one (a mismatch is an error, never a silent re-download)."""
    directory = (cache or cache_root()) / "sdists" / f"{sdist.name}-{sdist.version}"
    with _locked(directory.parent / (directory.name + ".lock")):
        found = [p for p in directory.glob("*") if p.suffix in (".gz", ".zip", ".tar")] if directory.is_dir() else []
        if not found:
            with tempfile.TemporaryDirectory(prefix="idegym-sdist-") as tmp:
                cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                       "--disable-pip-version-check", "-q", "-d", tmp, f"{sdist.name}=={sdist.version}"]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                files = sorted(Path(tmp).iterdir())
                if proc.returncode != 0 or len(files) != 1:
                    raise TaskError(f"could not download the sdist of {sdist.name}=={sdist.version} with pip "
                                    f"(PyPI unreachable?): {proc.stderr.strip()[-1500:]}")
                directory.mkdir(parents=True, exist_ok=True)
                shutil.move(str(files[0]), directory / files[0].name)
            found = list(directory.iterdir())
        archive = found[0]
        actual = sha256_file(archive)
        if actual != sdist.sha256:
            raise TaskError(f"{archive}: sha256 {actual} is not the pinned {sdist.sha256}; delete it if the cache "
                            f"is corrupt, or fix the pin")
        return archive


def _safe_member(name: str) -> str | None:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise TaskError(f"archive member {name!r} escapes the archive")
    return path.as_posix() if str(path) not in ("", ".") else None


def unpack(archive: Path, dest: Path) -> None:
    """Unpack a tar or zip archive into ``dest``; a single top-level directory is stripped (as in
    sdists). Members that would escape ``dest`` are an error; only files, dirs and symlinks."""
    entries: list[tuple[str, bytes | None, int, str | None]] = []  # path, data (None: dir), mode, link
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                rel = _safe_member(info.filename)
                if rel is None:
                    continue
                mode = (info.external_attr >> 16) & 0o777 or 0o644
                entries.append((rel, None if info.is_dir() else zf.read(info), mode, None))
    else:
        with tarfile.open(archive) as tf:
            for member in tf.getmembers():
                rel = _safe_member(member.name)
                if rel is None:
                    continue
                if member.isdir():
                    entries.append((rel, None, member.mode, None))
                elif member.issym():
                    entries.append((rel, b"", member.mode, member.linkname))
                elif member.isfile():
                    handle = tf.extractfile(member)
                    entries.append((rel, handle.read() if handle else b"", member.mode, None))
    tops = {e[0].split("/", 1)[0] for e in entries}
    strip = len(tops) == 1 and any("/" in e[0] for e in entries)
    dest.mkdir(parents=True, exist_ok=True)
    for rel, data, mode, link in entries:
        if strip:
            rel = rel.split("/", 1)[1] if "/" in rel else ""
            if not rel:
                continue
        target = dest / rel
        if data is None:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if link is not None:
            if PurePosixPath(link).is_absolute() or ".." in PurePosixPath(link).parts:
                raise TaskError(f"archive symlink {rel!r} -> {link!r} points outside the archive")
            target.symlink_to(link)
        else:
            target.write_bytes(data)
            target.chmod(0o755 if mode & 0o111 else 0o644)


def _commit_tree(git_dir: Path, work: Path, message: str, parent: str | None) -> str:
    index = work.parent / "index"
    index.unlink(missing_ok=True)
    git("add", "-A", "-f", ".", git_dir=git_dir, work_tree=work, index=index)
    tree = git("write-tree", git_dir=git_dir, work_tree=work, index=index)
    args = ["commit-tree", tree, "-m", message] + (["-p", parent] if parent else [])
    return git(*args, git_dir=git_dir, work_tree=work, index=index)


def release_repo(name: str, source: RepoSource, *, base_dir: Path | None = None,
                 cache: Path | None = None) -> tuple[Path, str | None]:
    """The cached bare git repository of ``name`` and its release commit (``None`` for a ``git``
    source, whose commits are its own). Built on first use; later calls only read it."""
    cache = cache or cache_root()
    git_dir = cache / "repos" / f"{_slug(name)}.git"
    with _locked(git_dir.with_suffix(".lock")):
        if source.git is not None:
            url = source.git
            if not _is_url(url):
                url = str(_resolve(url, base_dir))
            if not git_dir.exists():
                tmp = git_dir.with_name(git_dir.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                git("clone", "--bare", "--quiet", url, str(tmp), timeout=1800)
                tmp.rename(git_dir)
            return git_dir, None
        if source.sdist is not None:
            archive = fetch_sdist(source.sdist, cache)
            message = f"{source.sdist.name} {source.sdist.version}: release sdist {archive.name}"
        else:
            assert source.archive is not None
            archive = _resolve(source.archive, base_dir)
            if not archive.is_file():
                raise TaskError(f"repository {name!r}: archive {archive} does not exist")
            if source.sha256 is not None and sha256_file(archive) != source.sha256:
                raise TaskError(f"{archive}: sha256 differs from the pinned {source.sha256}")
            message = f"{name}: release archive {archive.name}"
        ref = git_dir / "refs" / "heads" / "release"
        if not ref.is_file():
            if git_dir.exists():
                shutil.rmtree(git_dir)
            git("init", "--bare", "--quiet", str(git_dir))
            with tempfile.TemporaryDirectory(prefix="release-") as scratch:
                work = Path(scratch) / "tree"
                unpack(archive, work)
                commit = _commit_tree(git_dir, work, message, None)
            git("update-ref", "refs/heads/release", commit, git_dir=git_dir)
        return git_dir, ref.read_text().strip()


def instance_commit(git_dir: Path, release: str, instance_id: str, patch: str, test_patch: str) -> str:
    """The commit of an instance made SWE-smith style: ``release`` with ``test_patch`` and
    ``patch`` reverted, fixed identity and dates, message = the instance id. Cached as a branch."""
    # keyed by the patches too: an edited instance gets its own commit, never a stale one
    digest = hashlib.sha256(f"{release}\0{patch}\0{test_patch}".encode()).hexdigest()[:16]
    ref_name = f"refs/heads/instances/{_slug(instance_id)}/{digest}"
    with _locked(git_dir.with_suffix(".lock")):
        ref = git_dir / ref_name
        if ref.is_file():
            return ref.read_text().strip()
        with tempfile.TemporaryDirectory(prefix="instance-") as tmp:
            work = Path(tmp) / "tree"
            work.mkdir()
            index = Path(tmp) / "index"
            git("read-tree", release, git_dir=git_dir, work_tree=work, index=index)
            git("checkout-index", "-a", "-f", git_dir=git_dir, work_tree=work, index=index)
            for label, text in (("test_patch", test_patch), ("patch", patch)):
                if text.strip():
                    try:
                        git("apply", "-R", "--whitespace=nowarn", "-", git_dir=git_dir, work_tree=work,
                            index=index, input=text.encode())
                    except TaskError as exc:
                        raise TaskError(f"instance {instance_id!r}: its {label} does not revert cleanly on the "
                                        f"release: {exc}") from exc
            commit = _commit_tree(git_dir, work, instance_id, release)
        git("update-ref", ref_name, commit, git_dir=git_dir)
        return commit


def has_commit(git_dir: Path, commit: str) -> bool:
    try:
        return git("cat-file", "-t", commit, git_dir=git_dir) == "commit"
    except TaskError:
        return False


def export_tree(git_dir: Path, commit: str, dest: Path) -> Path:
    """Write the files of ``commit`` (no history, no ``.git``) into ``dest``, which must not exist."""
    if dest.exists():
        raise TaskError(f"{dest} exists already")
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        index = Path(tmp) / "index"
        git("read-tree", commit, git_dir=git_dir, work_tree=dest, index=index)
        git("checkout-index", "-a", "-f", git_dir=git_dir, work_tree=dest, index=index)
    return dest


def apply_patch(directory: Path, patch: str, *, reverse: bool = False) -> None:
    """``git apply`` a unified diff to a plain directory (no repository needed)."""
    if not patch.strip():
        return
    args = ["apply", "--whitespace=nowarn"] + (["-R"] if reverse else []) + ["-"]
    cmd = ["git", *GIT_FLAGS, *args]
    proc = subprocess.run(cmd, input=patch.encode(), cwd=directory, capture_output=True, env=_git_env())
    if proc.returncode != 0:
        raise TaskError(f"the patch does not apply in {directory}: {proc.stderr.decode(errors='replace')[-1500:]}")


def patched_files(patch: str) -> list[str]:
    """Project-relative paths a unified diff writes (its ``b/`` side; deletions give the ``a/`` side)."""
    out: list[str] = []
    old: str | None = None
    for line in patch.splitlines():
        if line.startswith("--- "):
            old = _diff_path(line[4:])
        elif line.startswith("+++ "):
            new = _diff_path(line[4:])
            path = new or old
            if path and path not in out:
                out.append(path)
    return out


def _diff_path(raw: str) -> str | None:
    raw = raw.split("\t", 1)[0].strip()
    if raw == "/dev/null":
        return None
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    return raw


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _is_url(value: str) -> bool:
    return "://" in value or value.startswith("git@")


def _resolve(value: str, base_dir: Path | None) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() or base_dir is None else (base_dir / path)


__all__ = ["RepoSource", "Sdist", "cache_root", "fetch_sdist", "release_repo", "instance_commit", "export_tree",
           "apply_patch", "patched_files", "has_commit", "unpack", "git"]
