"""The judge's wire format between the grader and a subject process: one JSON document a line.

A request names an operation (``import``, ``getattr``, ``setattr``, ``call``, ``callmethod``,
``release``); an answer is ``{"ok": value}`` or ``{"err": exception}``.
Values are data, never code: JSON's own types, plus tagged objects for the rest of Python's
plain data (``{"$t": "tuple", "v": [...]}``, ``set``, ``frozenset``, ``bytes``, ``dict`` —
always tagged, since its keys may be any value —, ``complex``), ``ref`` (an object that stays
in the subject, named by a number), ``exc`` (an exception: type name, the names of its
builtin bases, message) and ``exctype`` (an exception class). The grader never unpickles
or evaluates anything the subject sends: a compromised subject can only send wrong data.

Stdlib only, and Python 3.8 syntax: the subject side runs on whatever ``python3`` the image has.
"""

from __future__ import annotations

import base64
import json
import math

MAX_LINE = 64 << 20
MAX_DEPTH = 64
TAG = "$t"


class JudgeProtocolError(Exception):
    """A message that is not valid judge protocol (a broken or hostile peer)."""


def dumps(doc):
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def encode(value, make_ref=None, depth=0):
    """``value`` as a JSON-able document; objects that are not plain data go through
    ``make_ref(obj) -> document`` (the subject's handle table) or raise ``TypeError``."""
    if depth > MAX_DEPTH:
        raise TypeError(f"value nested more than {MAX_DEPTH} levels deep")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if -(1 << 53) < value < (1 << 53) else {TAG: "int", "v": str(value)}
    if kind is float:
        if math.isfinite(value):
            return value
        return {TAG: "float", "v": repr(value)}
    if kind is list:
        return [encode(v, make_ref, depth + 1) for v in value]
    if kind is tuple:
        return {TAG: "tuple", "v": [encode(v, make_ref, depth + 1) for v in value]}
    if kind is dict:
        return {TAG: "dict", "v": [[encode(k, make_ref, depth + 1), encode(v, make_ref, depth + 1)]
                                   for k, v in value.items()]}
    if kind is set or kind is frozenset:
        items = [encode(v, make_ref, depth + 1) for v in value]
        return {TAG: kind.__name__, "v": items}
    if kind is bytes or kind is bytearray:
        return {TAG: "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if kind is complex:
        return {TAG: "complex", "v": [value.real, value.imag]}
    # Subclasses of plain data (namedtuple, OrderedDict, IntEnum, str subclasses) travel as their
    # base type: equality with the base type is what tests compare.
    for base in (bool, int, float, str, tuple, list, dict, frozenset, set, bytes):
        if isinstance(value, base) and not isinstance(value, type):
            return encode(base(value), make_ref, depth)
    if make_ref is None:
        raise TypeError(f"cannot send a {kind.__name__} to the subject: only plain data (None, bool, int, float, str, "
                        "bytes, list, tuple, dict, set) and objects of the subject")
    return make_ref(value)


def decode(doc, resolve=None, depth=0):
    """The value a document stands for; ``ref``/``exc``/``exctype`` documents go through
    ``resolve(doc)`` (or raise ``JudgeProtocolError`` without it)."""
    if depth > MAX_DEPTH:
        raise JudgeProtocolError(f"document nested more than {MAX_DEPTH} levels deep")
    if doc is None or isinstance(doc, (bool, str)):
        return doc
    if isinstance(doc, (int, float)):
        return doc
    if isinstance(doc, list):
        return [decode(v, resolve, depth + 1) for v in doc]
    if not isinstance(doc, dict) or not isinstance(doc.get(TAG), str):
        raise JudgeProtocolError(f"not a judge value: {repr(doc)[:200]}")
    tag, v = doc[TAG], doc.get("v")
    try:
        if tag == "int":
            return int(v)
        if tag == "float":
            return float(v)
        if tag == "tuple":
            return tuple(decode(x, resolve, depth + 1) for x in v)
        if tag == "dict":
            return {decode(k, resolve, depth + 1): decode(x, resolve, depth + 1) for k, x in v}
        if tag == "set":
            return {decode(x, resolve, depth + 1) for x in v}
        if tag == "frozenset":
            return frozenset(decode(x, resolve, depth + 1) for x in v)
        if tag == "bytes":
            return base64.b64decode(v, validate=True)
        if tag == "complex":
            return complex(float(v[0]), float(v[1]))
    except JudgeProtocolError:
        raise
    except (TypeError, ValueError) as exc:  # a malformed payload, or an unhashable key or member
        raise JudgeProtocolError(f"bad {tag} value: {exc}") from None
    if tag in ("ref", "exc", "exctype") and resolve is not None:
        return resolve(doc)
    raise JudgeProtocolError(f"unknown value tag {tag!r}")


def write_message(stream, doc):
    """One message, one line (``stream`` is a binary file)."""
    stream.write(dumps(doc).encode("ascii") + b"\n")
    stream.flush()


def read_message(stream):
    """The next message, or ``None`` at end of stream."""
    line = stream.readline(MAX_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_LINE:
        raise JudgeProtocolError(f"message longer than {MAX_LINE} bytes")
    try:
        doc = json.loads(line)
    except RecursionError:
        raise JudgeProtocolError("message nested too deeply") from None
    except ValueError as exc:
        raise JudgeProtocolError(f"not JSON: {exc} ({repr(line)[:120]})") from None
    if not isinstance(doc, dict):
        raise JudgeProtocolError(f"a message must be a JSON object, got {repr(line)[:120]}")
    return doc
