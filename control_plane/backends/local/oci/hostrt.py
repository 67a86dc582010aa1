"""The sandbox server's runtime in a sandbox of an OCI image: nothing of ours is in the image.

On the built-in image the server's interpreter finds its libraries in the host's ``/usr``
(which is that image's). An OCI image has its own ``/usr`` — another libc, maybe no libssl,
maybe no Python at all — so the server brings everything from outside, read-only under
``/opt/idegym``:

* ``/opt/idegym/lib``: the host's dynamic loader (as ``ld.so``) and every host library the
  interpreter and the server's extension modules load (found with ``ldd`` and by importing the
  server's modules once and reading ``/proc/self/maps``);
* ``/opt/idegym/python``: a small tree with a copy of the interpreter whose ELF interpreter is
  ``/opt/idegym/lib/ld.so`` and whose run path is ``/opt/idegym/lib`` (patched in place: both
  strings only get shorter), and the standard library bound at ``lib/pythonX.Y`` (its
  site-packages hidden, as on the built-in image);
* the server's closure at ``/opt/idegym/site``, as ``runtime`` binds it for every image.

Both are made once per content in ``<state>/runtime/oci``, by one start while any other waits
(``user_cache.fill_once``).

The server gets ``LD_LIBRARY_PATH=/opt/idegym/lib`` (never passed to tools), so extension
modules resolve the host libraries too; the tools run on the image's own loader and libraries.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

from ..runtime import INSIDE, PYTHON_INSIDE, TOOL_PATH, Runtime, hidden
from ..user_cache import fill_once

LIB_INSIDE = f"{INSIDE}/lib"
LOADER_INSIDE = f"{LIB_INSIDE}/ld.so"
# Libraries glibc opens at run time (dlopen), which neither ldd nor an import reveals.
DLOPENED = ("libgcc_s.so.1",)
PROBE = (
    "import importlib, pkgutil, sys\n"
    "import sandbox_server\n"
    "for m in pkgutil.walk_packages(sandbox_server.__path__, 'sandbox_server.'):\n"
    "    try:\n"
    "        importlib.import_module(m.name)\n"
    "    except Exception:\n"
    "        pass\n"
    "import ssl, sqlite3, ctypes, zlib, bz2, lzma, hashlib, json, asyncio, select, pty, termios, fcntl\n"
    "print(open('/proc/self/maps').read())\n"
)


@dataclass(frozen=True)
class Layout:
    lib_dir: Path  # host directory bound at /opt/idegym/lib
    python_dir: Path  # host directory bound at /opt/idegym/python
    stdlib: Path  # the interpreter's standard library, bound at /opt/idegym/python/lib/pythonX.Y
    exe_name: str


def oci_runtime(runtime: Runtime, state_dir: Path) -> Runtime:
    """``runtime`` (as ``runtime.detect`` and the server kind made it) for sandboxes whose /usr is
    an OCI image's: the same closure, the interpreter and host libraries brought along."""
    layout = prepare(state_dir / "runtime" / "oci")
    stdlib_inside = f"{PYTHON_INSIDE}/lib/{layout.stdlib.name}"
    binds: list[tuple[str, str]] = [(str(layout.python_dir), PYTHON_INSIDE), (str(layout.stdlib), stdlib_inside),
                                    *hidden(layout.stdlib, stdlib_inside, runtime.empty),
                                    (str(layout.lib_dir), LIB_INSIDE)]
    # The host interpreter's binds give way to these; the host's toolchains (rustup, cargo) stay
    # out: an OCI image brings its own.
    keep = [(h, i) for h, i in runtime.binds
            if i != PYTHON_INSIDE and not i.startswith((f"{PYTHON_INSIDE}/", f"{INSIDE}/toolchains/"))]
    server_env = {k: v for k, v in runtime.server_env.items() if k != "LD_LIBRARY_PATH"}
    server_env["LD_LIBRARY_PATH"] = LIB_INSIDE
    tool_env = {"PATH": TOOL_PATH, "LANG": "C.UTF-8"}  # the image's ENV comes on top
    return replace(runtime, python=f"{PYTHON_INSIDE}/bin/{layout.exe_name}", binds=[*binds, *keep],
                   server_env=server_env, tool_env=tool_env, skeletons=[])  # whole directories bound


def prepare(root: Path) -> Layout:
    """The loader, libraries and patched interpreter on the host (made once per content)."""
    exe = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    libs = _needed_libraries(exe, stdlib)
    digest = hashlib.sha256()
    for path in [exe, *libs.values()]:
        st = path.stat()
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())

    def fill(tmp: Path) -> None:
        (tmp / "lib").mkdir()
        loader = _interpreter(exe)
        shutil.copy2(os.path.realpath(loader), tmp / "lib" / "ld.so")
        for name, lib in libs.items():  # under the name the loader looks for
            shutil.copy2(lib, tmp / "lib" / name)
        bindir = tmp / "python" / "bin"
        bindir.mkdir(parents=True)
        shutil.copy2(exe, bindir / exe.name)
        patch_elf(bindir / exe.name, LOADER_INSIDE, LIB_INSIDE)
        for alias in ("python3", "python"):
            if alias != exe.name:
                os.symlink(exe.name, bindir / alias)
        (tmp / "python" / "lib" / stdlib.name).mkdir(parents=True)  # the standard library's mount point
        for path in [tmp, *tmp.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                os.chmod(path, 0o755)

    target = fill_once(root, digest.hexdigest()[:16], fill)
    return Layout(target / "lib", target / "python", stdlib, exe.name)


def _needed_libraries(exe: Path, stdlib: Path) -> dict[str, Path]:
    """Host libraries (outside the bound trees) the server's interpreter and modules load."""
    found: dict[str, Path] = {}
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    mapped = set(re.findall(r"\s(/\S+\.so(?:\.[\w.]+)?)$", probe.stdout, re.MULTILINE) if probe.returncode == 0 else ())
    dynload = [str(p) for p in (stdlib / "lib-dynload").glob("*.so") if not p.name.startswith("_tkinter")]
    objects = [str(exe), *mapped, *dynload]
    for chunk in range(0, len(objects), 64):
        ldd = subprocess.run(["ldd", *objects[chunk:chunk + 64]], capture_output=True, text=True, timeout=300).stdout
        for name, path in re.findall(r"^\s+(\S+) => (/\S+) \(", ldd, re.MULTILINE):
            found.setdefault(name, Path(path))
    for path in mapped:
        p = Path(path)
        if p.name.startswith("lib") and not p.is_relative_to(stdlib):
            found.setdefault(p.name, p)
    for name in DLOPENED:
        for directory in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
                          "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"):
            if os.path.exists(os.path.join(directory, name)):
                found.setdefault(name, Path(directory, name))
                break
    bound_trees = [Path(p).resolve() for p in _site_dirs()]
    out: dict[str, Path] = {}
    for name, path in sorted(found.items()):
        real = Path(os.path.realpath(path))
        if any(real.is_relative_to(tree) for tree in bound_trees) or name.startswith("ld-linux"):
            continue  # in the closure with its distribution (wheels' bundled .libs), or the loader itself
        out[name] = real
    return out


def _site_dirs() -> list[str]:
    import site

    return [p for p in site.getsitepackages() if os.path.isdir(p)]


# -- ELF --------------------------------------------------------------------------------------------

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 5, 15, 29


def _interpreter(exe: Path) -> str:
    data = exe.read_bytes()
    for ptype, offset, _vaddr, filesz in _program_headers(data):
        if ptype == PT_INTERP:
            return data[offset:offset + filesz].rstrip(b"\0").decode()
    raise RuntimeError(f"{exe} has no ELF interpreter (a static executable?)")


def _program_headers(data: bytes) -> list[tuple[int, int, int, int]]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise RuntimeError("not a little-endian 64-bit ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    out = []
    for index in range(phnum):
        ptype, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", data, phoff + index * phentsize)
        out.append((ptype, offset, vaddr, filesz))
    return out


def patch_elf(path: Path, interpreter: str, runpath: str) -> None:
    """Set the ELF interpreter and the run path in place (each must fit where the old one was)."""
    data = bytearray(path.read_bytes())
    headers = _program_headers(bytes(data))
    loads = [(vaddr, offset, filesz) for ptype, offset, vaddr, filesz in headers if ptype == PT_LOAD]

    def file_offset(vaddr: int) -> int:
        for start, offset, size in loads:
            if start <= vaddr < start + size:
                return offset + vaddr - start
        raise RuntimeError(f"address {vaddr:#x} is in no loadable segment")

    def put(offset: int, room: int, text: str) -> None:
        raw = text.encode() + b"\0"
        if len(raw) > room:
            raise RuntimeError(f"{text!r} does not fit in {room} bytes")
        data[offset:offset + room] = raw + b"\0" * (room - len(raw))

    for ptype, offset, _vaddr, filesz in headers:
        if ptype == PT_INTERP:
            put(offset, filesz, interpreter)
        elif ptype == PT_DYNAMIC:
            entries = []
            for pos in range(offset, offset + filesz, 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == DT_NULL:
                    break
                entries.append((tag, value))
            strtab = next((file_offset(v) for t, v in entries if t == DT_STRTAB), None)
            for tag, value in entries:
                if tag in (DT_RPATH, DT_RUNPATH) and strtab is not None:
                    start = strtab + value
                    end = data.index(b"\0", start)
                    if len(runpath) <= end - start:  # else LD_LIBRARY_PATH alone finds the libraries
                        put(start, end - start + 1, runpath)
    path.write_bytes(bytes(data))
