"""HTTP/1.1 request heads and chunk lines, parsed strictly (RFC 9112) for ``web.py``.

h11 cost every call 60-90 us of the server's CPU (its event objects, state machine and
per-header validation; ``benchmarks/sandbox_http.py``); this is what the sandbox server needs of
it, and stricter where a server may be: a folded header line, a request with both Content-Length
and Transfer-Encoding (the makings of request smuggling) or a Host header too many is a 400, a
transfer coding other than ``chunked`` a 501, a version other than 1.0 and 1.1 a 505. Lines may
end in CRLF or LF, as h11 allowed; names are checked with h11's pattern, values with RFC 9110's
(stricter than h11's, which let control characters other than NUL and white space through).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import StatusError

HEAD_LIMIT = 64 << 10  # a request head, or a chunk's size line and the trailers
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/([0-9]\.[0-9])")
_VCHARS = rb"[\x21-\x7e\x80-\xff]+"  # RFC 9110's field-vchar: visible or obs-text, no control character
_HEADER_LINE = re.compile(rb"(" + _TOKEN + rb"):[ \t]*((?:" + _VCHARS + rb"(?:[ \t]+" + _VCHARS + rb")*)?)[ \t]*")
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;[^\r\n]*)?[ \t]*\r?\n")
_HEAD_END = re.compile(rb"\r?\n\r?\n")


class MalformedRequest(StatusError):
    """What the client sent is not a request this server takes; the connection ends after the
    answer (``status``: 400, or 431, 501, 505)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(f"malformed HTTP request: {message}", status)


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    headers: dict[str, str]  # names in lower case; of a repeated header, the last
    length: int | None  # the body's Content-Length; None: chunked
    keep_alive: bool  # the connection serves another request after this one's answer


def head_end(buf: bytes | bytearray, start: int = 0) -> tuple[int, int] | None:
    """Where the head that begins at ``start`` ends and where its body begins, once it is whole."""
    match = _HEAD_END.search(buf, start)
    return (match.start(), match.end()) if match else None


def parse_head(head: bytes) -> RequestHead:
    """The request line and header lines of one request (without the blank line that ends them)."""
    lines = [line[:-1] if line.endswith(b"\r") else line for line in head.split(b"\n")]
    first = _REQUEST_LINE.fullmatch(lines[0])
    if first is None:
        raise MalformedRequest(f"not an HTTP/1.x request line: {lines[0][:100]!r}")
    method, target, version = first.groups()
    if version not in (b"1.0", b"1.1"):
        raise MalformedRequest(f"HTTP/{version.decode()} is not served; use HTTP/1.1", 505)
    headers: dict[str, str] = {}
    lengths: set[bytes] = set()
    codings = hosts = 0
    close = version == b"1.0"
    for line in lines[1:]:
        field = _HEADER_LINE.fullmatch(line)
        if field is None:
            raise MalformedRequest(f"not a header line: {line[:100]!r}" + (" (folded lines are refused)"
                                                                            if line[:1] in (b" ", b"\t") else ""))
        name, value = field.group(1).lower(), field.group(2)
        if name == b"content-length":
            lengths.update(part.strip() for part in value.split(b","))
        elif name == b"transfer-encoding":
            codings += 1
            if value.lower() != b"chunked" or codings > 1:
                raise MalformedRequest("only Transfer-Encoding: chunked is supported", 501)
        elif name == b"host":
            hosts += 1
        elif name == b"connection" and b"close" in (token.strip().lower() for token in value.split(b",")):
            close = True
        headers[name.decode("ascii")] = value.decode("latin-1")
    if hosts > 1 or (hosts == 0 and version == b"1.1"):
        raise MalformedRequest("an HTTP/1.1 request needs exactly one Host header")
    length: int | None = 0
    if codings:
        if lengths:
            raise MalformedRequest("both Content-Length and Transfer-Encoding: send one")
        length = None
    elif lengths:
        value = lengths.pop()
        if lengths or not value.isdigit() or len(value) > 20:
            raise MalformedRequest("conflicting or invalid Content-Length")
        length = int(value)
    return RequestHead(method.decode("ascii"), target.decode("latin-1"), headers, length, not close)


def chunk_size(buf: bytes | bytearray, start: int) -> tuple[int, int] | None:
    """The size of the chunk whose size line begins at ``start`` and where its data begins, once
    the line is whole; None until then."""
    end = buf.find(b"\n", start)
    if end < 0:
        if len(buf) - start > HEAD_LIMIT:
            raise MalformedRequest("a chunk size line is too long")
        return None
    match = _CHUNK_LINE.fullmatch(buf, start, end + 1)
    if match is None:
        raise MalformedRequest(f"not a chunk size line: {bytes(buf[start:end + 1])[:100]!r}")
    return int(match.group(1), 16), end + 1


def trailers_end(buf: bytes | bytearray, start: int) -> int | None:
    """After the last chunk: where the trailer lines (checked, then dropped) and the blank line
    that ends them end; None until they are whole."""
    if buf[start:start + 2] == b"\r\n":
        return start + 2
    if buf[start:start + 1] == b"\n":
        return start + 1
    end = head_end(buf, start)
    if end is None:
        if len(buf) - start > HEAD_LIMIT:
            raise MalformedRequest("the trailers are too long", 431)
        return None
    for line in bytes(buf[start:end[0]]).split(b"\n"):
        if not _HEADER_LINE.fullmatch(line[:-1] if line.endswith(b"\r") else line):
            raise MalformedRequest(f"not a trailer line: {line[:100]!r}")
    return end[1]
