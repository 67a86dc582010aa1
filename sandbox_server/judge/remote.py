"""What the grader holds of a subject process: handles on its objects (``RemoteObject``), whose
every use is a request, and local stand-ins for its exception classes, so that the test's
``assertRaises`` works on what the code under test raised. Stdlib only, Python 3.8 syntax.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from . import protocol

if TYPE_CHECKING:
    from .subject_process import Subject


class SubjectError(Exception):
    """The subject process failed to answer: it crashed, exited, hung or spoke garbage."""


class SubjectLost(SubjectError):
    """A handle on an object of a subject process that has since ended."""



class RemoteError(Exception):
    """Base of the exceptions raised by the code under test (re-raised here by name)."""

    remote_type = ""
    remote_traceback = ""


_EXCEPTION_CLASSES: dict[str, type] = {}
_EXIT_TYPES = {"SystemExit", "KeyboardInterrupt", "GeneratorExit"}


def _builtin_base(builtin: str | None) -> type:
    found = getattr(builtins, builtin or "", None)
    if builtin in _EXIT_TYPES or not (isinstance(found, type) and issubclass(found, Exception)):
        return RemoteError
    key = f"builtins.{builtin}"
    if key not in _EXCEPTION_CLASSES:
        _EXCEPTION_CLASSES[key] = type(found.__name__, (RemoteError, found), {"remote_type": key})
    return _EXCEPTION_CLASSES[key]


def exception_class(full_name: str, chain: tuple[str, ...] = (), builtin: str | None = None) -> type:
    """The local stand-in for the subject's exception class ``full_name``: one per name, so that
    ``assertRaises(mod.MyError)`` catches what the subject raises; it derives from the stand-ins
    of its bases and from the builtin exception they end in, so ``assertRaises(ValueError)``
    catches a subclass of ValueError too."""
    if builtin and full_name == f"builtins.{builtin}":
        return _builtin_base(builtin)
    if full_name not in _EXCEPTION_CLASSES:
        rest = chain[1:] if chain and chain[0] == full_name else chain
        base = exception_class(rest[0], rest[1:], builtin) if rest else _builtin_base(builtin)
        module_name, _, name = full_name.rpartition(".")
        cls = type(name or full_name, (base,), {"remote_type": full_name})
        cls.__module__ = module_name or "subject"
        _EXCEPTION_CLASSES[full_name] = cls
    return _EXCEPTION_CLASSES[full_name]


def remote_exception(doc: dict) -> BaseException:
    name = str(doc.get("type") or "Exception")
    builtin = doc.get("builtin")
    message = str(doc.get("message") or "")
    if name.rpartition(".")[2] in _EXIT_TYPES or builtin in _EXIT_TYPES:
        return SubjectError(f"the code under test raised {name} ({message}) instead of answering")
    exc = exception_class(name, tuple(map(str, doc.get("chain") or ())), builtin)(message)
    exc.remote_traceback = str(doc.get("traceback") or "")
    return exc


def encode_arg(subject: Subject, value):
    def make_ref(obj):
        if isinstance(obj, RemoteObject):
            if obj._subject is not subject:
                raise TypeError("an object of one subject cannot be passed to another")
            return {protocol.TAG: "ref", "id": obj._id}
        raise TypeError(f"cannot send a {type(obj).__name__} to the subject: only plain data and its own objects")
    return protocol.encode(value, make_ref)



class RemoteObject:
    """An object that lives in the subject process; using it sends requests there."""

    __slots__ = ("_subject", "_id", "_generation", "_type", "_repr", "__weakref__")

    def __init__(self, subject: Subject, doc: dict) -> None:
        object.__setattr__(self, "_subject", subject)
        object.__setattr__(self, "_id", doc.get("id"))
        object.__setattr__(self, "_generation", subject.generation)
        object.__setattr__(self, "_type", str(doc.get("type") or "object"))
        object.__setattr__(self, "_repr", str(doc.get("repr") or ""))

    def _send(self, op: str, **fields):
        doc = {"op": op, "ref": {protocol.TAG: "ref", "id": self._id}, **fields}
        return self._subject.request(doc, self._generation)

    def _args(self, args, kwargs) -> dict:
        return {"args": [encode_arg(self._subject, a) for a in args],
                "kwargs": encode_arg(self._subject, dict(kwargs))}

    def _dunder(self, name: str, *args):
        return self._send("dunder", name=name, args=[encode_arg(self._subject, a) for a in args])

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._send("getattr", name=name)

    def __setattr__(self, name: str, value) -> None:
        self._send("setattr", name=name, value=encode_arg(self._subject, value))

    def __call__(self, *args, **kwargs):
        return self._send("call", **self._args(args, kwargs))

    def call_method(self, name: str, *args, **kwargs):
        """``obj.name(*args)`` in one request (``obj.name(...)`` takes two)."""
        return self._send("callmethod", name=name, **self._args(args, kwargs))

    def __repr__(self) -> str:
        try:
            return self._dunder("__repr__")
        except SubjectError:
            return f"<remote {self._type} {self._repr}>"

    def __str__(self) -> str:
        return self._dunder("__str__")

    def __len__(self) -> int:
        return self._dunder("__len__")

    # Truth and hashing stay local (an object is true, hashed by identity): neither may be
    # decided by the code under test.
    def __bool__(self) -> bool:
        return True

    def __hash__(self) -> int:
        return id(self)

    def __iter__(self):
        return iter(self._dunder("__list__"))

    def __contains__(self, item) -> bool:
        return self._dunder("__contains__", item)

    def __getitem__(self, key):
        return self._dunder("__getitem__", key)

    def __setitem__(self, key, value) -> None:
        self._dunder("__setitem__", key, value)

    def __delitem__(self, key) -> None:
        self._dunder("__delitem__", key)

    def __int__(self) -> int:
        return self._dunder("__int__")

    def __float__(self) -> float:
        return self._dunder("__float__")

    def __index__(self) -> int:
        return self._dunder("__index__")

    def __neg__(self):
        return self._dunder("__neg__")

    def __abs__(self):
        return self._dunder("__abs__")


def _binary(name: str):
    def method(self, other):
        return self._dunder(name, other)
    method.__name__ = name
    return method


def _comparison(name: str):
    def method(self, other):
        # Only the subject's own objects are compared by the subject: an object that claims to
        # equal the expected string or number would otherwise decide the test ("always equal").
        if not isinstance(other, RemoteObject):
            return NotImplemented
        return self._dunder(name, other)
    method.__name__ = name
    return method


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(RemoteObject, _name, _comparison(_name))
for _name in ("__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__", "__and__",
              "__or__", "__xor__", "__matmul__"):
    setattr(RemoteObject, _name, _binary(_name))
