"""Looks for answers in every readable file of the machine it runs on (a sandbox): one process.

``python3 answer_scan.py NEEDLES [HOSTS_OWN]``: NEEDLES holds one needle a line (a distinctive
line of a hidden test or a solution, normalized as ``line`` does); HOSTS_OWN (optional) the
8-byte ``identity`` of each file of the host's /usr, which the built-in image is: such a file,
found unchanged (same path, size and modification time), is the host's own userland and is not
read. The scanner reads both, deletes them and itself (so that none is found), walks ``/``
without following symlinks or entering ``/proc`` and ``/sys``, and prints
``HIT<tab><path><tab><needle>`` for every needle a file holds, then ``SCANNED <files> <bytes>
<skipped>``.

A file is searched line by line, as text and as JSON-escaped text (``\\n`` between lines and
string boundaries, as in a ``.jsonl`` data set); gzip files and zip archives (wheels, jars) are
searched decompressed; any other file with a NUL byte in its first block is binary and skipped.
Stdlib only.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import operator
import os
import stat
import sys
import zipfile
import zlib

BLOCK = 8192
MAX_EXPANDED = 512 << 20  # a decompressed file is read up to this much
SKIP = ("/proc", "/sys")
STRIP = b" \t\r+-\"',;{}"  # around a line: indentation, a diff's marker, quotes and delimiters
JSON_BOUNDARIES = (b'": "', b'":"', b'", "', b'","')
line = operator.methodcaller("strip", STRIP)


def identity(path: str, size: int, mtime_ns: int) -> bytes:
    return hashlib.sha256(f"{path}\0{size}\0{mtime_ns}".encode(errors="surrogateescape")).digest()[:8]


def search(data: bytes, needles: set[bytes]) -> set[bytes]:
    if b"\\n" in data:  # JSON-escaped text (a .jsonl data set): one line per line again
        for boundary in JSON_BOUNDARIES:
            data = data.replace(boundary, b"\n")
        data = data.replace(b"\\n", b"\n").replace(b'\\"', b'"').replace(b"\\t", b"\t")
    return needles.intersection(map(line, data.split(b"\n")))


def expand(path: str, head: bytes) -> list[bytes]:
    """The text of ``path`` to search: itself, its decompressed content, or nothing (binary)."""
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path) as fh:
                return [fh.read(MAX_EXPANDED)]
        except (OSError, EOFError, zlib.error):
            return []
    if head[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as archive:
                return [archive.read(info)[:MAX_EXPANDED] for info in archive.infolist() if not info.is_dir()]
        except (OSError, zipfile.BadZipFile, RuntimeError, NotImplementedError, EOFError, zlib.error):
            return []
    if b"\0" in head:
        return []
    with open(path, "rb") as fh:
        return [fh.read()]


def main() -> None:
    with open(sys.argv[1], "rb") as fh:
        needles = {n for n in fh.read().split(b"\n") if n}
    own: set[bytes] = set()
    if len(sys.argv) > 2:
        with open(sys.argv[2], "rb") as fh:
            raw = fh.read()
        own = {raw[i:i + 8] for i in range(0, len(raw), 8)}
    for path in [os.path.abspath(__file__), *sys.argv[1:]]:
        os.unlink(path)
    files = size = skipped = 0
    out = io.StringIO()
    stack = ["/"]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            path = entry.path
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if path not in SKIP:
                    stack.append(path)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if own and identity(path, st.st_size, st.st_mtime_ns) in own:
                skipped += 1
                continue
            try:
                with open(path, "rb") as fh:
                    head = fh.read(BLOCK)
                texts = expand(path, head)
            except OSError:
                continue
            files += 1
            for text in texts:
                size += len(text)
                for needle in sorted(search(text, needles)):
                    out.write(f"HIT\t{path}\t{needle[:120].decode(errors='replace')}\n")
    sys.stdout.write(out.getvalue())
    print(f"SCANNED {files} {size} {skipped}")


if __name__ == "__main__":
    main()
