"""The Python packages a sandbox server runs on: the closure of its own imports, assembled for it.

A sandbox sees no Python environment of the host: not the control plane's site-packages (they
hold other packages' data: HumanEval's problems and solutions, fixed releases of the packages
SWE instances are about, and, installed as a wheel, ``idegym_env``'s task data), nor the
interpreter's own. It sees one directory, bound read-only at ``/opt/idegym/site``, that holds

* the code of the server kind's own packages (``Closure.packages``: their modules; all files of
  ``Closure.resources``, e.g. ``sandbox_server``'s judge subjects and native helpers), however
  they are installed (editable or a wheel), never their data;
* every installed distribution a module comes from once the server's modules are imported
  (``Closure.imports``, in a probe process of the control plane's interpreter): the files its
  ``RECORD`` lists, found with ``importlib.metadata``; the standard library stays the
  interpreter's.

The copy is compiled (bound read-only, it could not cache bytecode: every start would compile
it again), checked by importing the same modules in it with nothing else on ``sys.path``, and
shared by every control plane of this user (``runtime_cache_dir()``) under a key of what it is
made of: the interpreter, the stat of every file of the first-party packages and of every entry
of the site directories (an install, upgrade or removal changes them).
"""

from __future__ import annotations

import compileall
import hashlib
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ...settings import ControlPlaneSettings
from .user_cache import fill_once, prune, user_cache_dir

FORMAT = "closure-v2"  # part of the key: a change to what a closure holds makes new ones
# A closure unused this long is removed (one in use is touched at every control plane start).
RETENTION = 7 * 86400.0
PROBE_TIMEOUT = 300.0
SITE = "site"  # the closure's importable tree, in its cache entry
EMPTY = "empty"  # an empty directory, bound over what a sandbox must not see (runtime.py's masks)

# Imports ``spec`` (a JSON list of Closure.imports) and prints, as JSON, the file of every module
# that importing them loaded. ``a.*`` walks a package; ``a.b:f`` calls ``f()`` of ``a.b`` (what a
# server imports lazily, as it starts).
PROBE = r"""
import importlib, json, pkgutil, sys
before = set(sys.modules)
def load(name):
    try:
        return importlib.import_module(name)
    except BaseException:
        return None
for item in json.loads(sys.argv[1]):
    if item.endswith(".*"):
        package = load(item[:-2])
        for info in pkgutil.walk_packages(getattr(package, "__path__", []), item[:-1],
                                          onerror=lambda name: None):
            if info.name.rsplit(".", 1)[-1] != "__main__":
                load(info.name)
    elif ":" in item:
        module, _, function = item.partition(":")
        try:
            getattr(importlib.import_module(module), function)()
        except BaseException:
            pass
    else:
        load(item)
files = {}
for name in set(sys.modules) - before:
    module = sys.modules.get(name)
    where = getattr(module, "__file__", None)
    if where:
        files[name] = where
print(json.dumps(files))
"""
# The check in the assembled tree: the interpreter without its site directories (-S), the tree
# first on sys.path.
VERIFY = "import sys\nsys.path.insert(0, sys.argv.pop(1))\n" + PROBE


@dataclass(frozen=True)
class Closure:
    """What one kind of server runs on."""

    name: str
    packages: tuple[str, ...]  # our packages: their modules are copied (``resources``: all their files)
    imports: tuple[str, ...]  # what the server imports: a module, ``pkg.*`` (all of it), ``mod:function`` (called)
    resources: tuple[str, ...] = ()


class ClosureError(RuntimeError):
    pass


def runtime_cache_dir() -> Path:
    """Where the closures live: shared by every state directory of this user
    (``$IDEGYM_RUNTIME_CACHE``, default ``~/.cache/idegym/runtime``), so that a control plane on a
    new state directory does not assemble them again (compiling alone is seconds)."""
    return user_cache_dir("runtime", ControlPlaneSettings.from_env().runtime_cache)


def assemble(closure: Closure, root: Path | None = None) -> Path:
    """The cache entry of ``closure`` (its tree in ``SITE``, an empty directory in ``EMPTY``),
    assembled now unless another start (or another control plane) made it before."""
    root = runtime_cache_dir() if root is None else root
    packages = {name: _package_dir(name) for name in closure.packages}
    key = _key(closure, packages)

    def fill(entry: Path) -> None:
        prune(root, RETENTION, spare=key)  # a closure in use is touched at every start: younger than RETENTION
        _fill(closure, packages, entry)

    return fill_once(root, key, fill)


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ClosureError(f"the sandbox runtime needs the {name} package installed next to the control plane")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _site_dirs() -> list[Path]:
    """The directories the probe's interpreter (``-I``) imports third-party packages from."""
    dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(Path(d).resolve() for d in dirs if os.path.isdir(d)))


def _package_files(package: Path, everything: bool) -> list[Path]:
    return sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".pyc", ".pyo") and (everything or p.suffix == ".py"))


def _key(closure: Closure, packages: dict[str, Path]) -> str:
    digest = hashlib.sha256(f"{FORMAT}\0{closure!r}\0{sys.version}\0{os.path.realpath(sys.executable)}\n".encode())
    for name, package in packages.items():
        for path in _package_files(package, everything=name in closure.resources):  # what is copied
            st = path.stat()
            digest.update(f"{name}\0{path.relative_to(package)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    for directory in _site_dirs():
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            digest.update(f"{directory}\0{entry.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"{closure.name}-{digest.hexdigest()[:16]}"


def _probe(command: list[str], imports: tuple[str, ...]) -> dict[str, str]:
    """The modules (name -> file) that importing ``imports`` loads in ``command``'s interpreter."""
    done = subprocess.run([*command, json.dumps(list(imports))], capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT, env={"PATH": os.environ.get("PATH", os.defpath)})
    if done.returncode != 0:
        raise ClosureError(f"probing the sandbox server's imports failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _standard_library() -> list[Path]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[k]).resolve() for k in ("stdlib", "platstdlib")))


def _under(path: Path, parents: list[Path]) -> bool:
    return any(path == p or p in path.parents for p in parents)


def _owners(modules: dict[str, Path], providers: Mapping[str, list[str]]
            ) -> tuple[dict[str, metadata.Distribution], dict[str, str], list[Path]]:
    """The installed distributions the files of ``modules`` (name -> file) belong to (by name),
    which of them each module's file belongs to, and the files no RECORD names. The distributions
    that provide a module's top-level package (``providers``, ``packages_distributions()``) are
    looked at first, every one only for what is left."""
    wanted = {os.path.realpath(file): module for module, file in modules.items()}
    found: dict[str, metadata.Distribution] = {}
    owner_of: dict[str, str] = {}
    named = {name for module in modules for name in providers.get(module.split(".")[0], ())}

    def claim(dists: Iterable[metadata.Distribution]) -> None:
        for dist in dists:
            name = (dist.metadata["Name"] or "").lower().replace("_", "-")
            if not wanted or name in found:  # an earlier entry of the path shadows it
                continue
            base = os.path.realpath(str(dist.locate_file("")))
            hits = {os.path.normpath(os.path.join(base, str(f))) for f in dist.files or ()} & wanted.keys()
            if hits:
                found[name] = dist
                for hit in hits:
                    owner_of[wanted.pop(hit)] = name

    claim(metadata.distribution(name) for name in sorted(named))
    claim(metadata.distributions())
    return found, owner_of, sorted(modules[module] for module in wanted.values())


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if ".so" in src.suffixes:
        # An extension module is linked where it can be: the sandboxes' servers then share its
        # pages with the control plane, which has it loaded too (a copy cost ~5 MiB of memory).
        try:
            os.link(src, dest)
            return
        except OSError:  # another filesystem
            pass
    shutil.copy2(src, dest)


def _fill(closure: Closure, packages: dict[str, Path], entry: Path) -> None:
    tree = entry / SITE
    tree.mkdir()
    (entry / EMPTY).mkdir()
    loaded = _probe([sys.executable, "-I", "-c", PROBE], closure.imports)
    stdlib, site_dirs = _standard_library(), _site_dirs()
    third_party = {}
    for name, file in loaded.items():
        path = Path(file).resolve()
        if name.split(".")[0] in packages or (_under(path, stdlib) and not _under(path, site_dirs)):
            continue  # our code (copied whole below) or the interpreter's own
        third_party[name] = path
    providers = metadata.packages_distributions()
    owners, owner_of, unowned = _owners(third_party, providers)
    if unowned:
        raise ClosureError("the sandbox server imports modules no installed distribution records: "
                           + ", ".join(map(str, unowned[:10])))
    ours = {d.lower().replace("_", "-") for name in packages for d in providers.get(name, ())}
    if shared := sorted(set(owners) & ours):
        # Copying that distribution's RECORD would bring all of it: installed as a wheel, the
        # task data (hidden tests, gold patches) next to our packages.
        tops = sorted({module.split(".")[0] for module, dist in owner_of.items() if dist in shared})
        raise ClosureError(f"the {closure.name} server imports {', '.join(tops)}, of the distribution that holds "
                           f"{', '.join(packages)} ({', '.join(shared)}); it would be copied whole, data included: "
                           "add those packages to the closure's packages (their modules are copied, not their data)")
    for dist in owners.values():
        base = Path(str(dist.locate_file(""))).resolve()
        for listed in dist.files or ():
            src = Path(str(dist.locate_file(listed))).resolve()
            if src.is_relative_to(base) and src.is_file() and "__pycache__" not in src.parts \
                    and src.suffix not in (".pyc", ".pyo"):  # (scripts in bin/ lie outside)
                _copy(src, tree / src.relative_to(base))
    for name, package in packages.items():
        for src in _package_files(package, everything=name in closure.resources):
            _copy(src, tree / name / src.relative_to(package))
    compileall.compile_dir(str(tree), quiet=2, workers=0)  # (what does not compile cannot be imported either)
    if "sandbox_server" in packages:
        from sandbox_server.judge import precompile

        precompile(tree / "sandbox_server" / "judge")  # the judge's Java subject: once here, not at every grading
    _verify(closure, tree, loaded, stdlib)
    for path in [entry, *entry.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, 0o755)  # bound into sandboxes: nothing in it is secret


def _verify(closure: Closure, tree: Path, loaded: dict[str, str], stdlib: list[Path]) -> None:
    """The same imports in ``tree`` with nothing but the standard library beside it load the same
    modules, each from ``tree`` or the standard library."""
    again = _probe([sys.executable, "-I", "-S", "-c", VERIFY, str(tree)], closure.imports)
    missing = sorted(set(loaded) - set(again))
    if missing:
        raise ClosureError(f"the assembled sandbox runtime {tree} lacks modules the server imports: "
                           + ", ".join(missing[:20]))
    outside = sorted(f for f in again.values() if not _under(Path(f).resolve(), [tree.resolve(), *stdlib]))
    if outside:
        raise ClosureError(f"the assembled sandbox runtime loaded modules from outside {tree}: {outside[:10]}")
