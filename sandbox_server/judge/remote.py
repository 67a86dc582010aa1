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
    """A handle on an object that lives in the subject process: read and set its attributes,
    call it, call its methods (``call_method``; an operator by its name too,
    ``obj.call_method("__len__")``). Every answer is plain data, or another handle.

    Nothing else: arithmetic, comparison, hashing, truth, iteration, ``len``, indexing, ``str``
    and ``format`` on a handle raise ``TypeError`` here, without a word to the subject — an
    operator answered by the code under test would decide the test's assertion (a result whose
    ``__sub__`` answers 0 passes every ``abs(result - expected) < eps``). ``repr`` is local."""

    __slots__ = ("_subject", "_id", "_generation", "_type", "_repr", "__weakref__")

    def __init__(self, subject: Subject, doc: dict) -> None:
        object.__setattr__(self, "_subject", subject)
        object.__setattr__(self, "_id", doc.get("id"))
        object.__setattr__(self, "_generation", subject.generation)
        object.__setattr__(self, "_type", str(doc.get("type") or "object")[:200])
        object.__setattr__(self, "_repr", str(doc.get("repr") or "")[:200])

    def _rebind(self, other: RemoteObject) -> None:
        """Stand for ``other``'s object from now on (a root handle, after its subject restarted)."""
        object.__setattr__(self, "_id", other._id)
        object.__setattr__(self, "_generation", other._generation)

    def _send(self, op: str, **fields):
        doc = {"op": op, "ref": {protocol.TAG: "ref", "id": self._id}, **fields}
        return self._subject.request(doc, self._generation)

    def _args(self, args, kwargs) -> dict:
        return {"args": [encode_arg(self._subject, a) for a in args],
                "kwargs": encode_arg(self._subject, dict(kwargs))}

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._send("getattr", name=name)

    def __setattr__(self, name: str, value) -> None:
        self._send("setattr", name=name, value=encode_arg(self._subject, value))

    def __call__(self, *args, **kwargs):
        return self._send("call", **self._args(args, kwargs))

    def call_method(self, name: str, *args, **kwargs):
        """``obj.name(*args)`` in one request (``obj.name(...)`` takes two); ``name`` may be an
        operator's (``"__len__"``, ``"__contains__"``): its answer is data, checked like any."""
        return self._send("callmethod", name=name, **self._args(args, kwargs))

    def __repr__(self) -> str:
        return f"<object of the code under test: {self._type} {self._repr}>"


def _refused(name: str, what: str):
    def method(self, *args):
        raise TypeError(f"an object of the code under test ({self._type}) cannot take part in {what} in the "
                        f"grader: test the plain data its methods and attributes return, or call the operator by "
                        f"name (result.call_method({name!r}, ...))")
    method.__name__ = name
    return method


_REFUSED = {
    "arithmetic": ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow", "lshift",
                   "rshift", "and", "or", "xor"),
    "comparison": ("eq", "ne", "lt", "le", "gt", "ge"),
}
for _what, _names in _REFUSED.items():
    for _name in _names:
        setattr(RemoteObject, f"__{_name}__", _refused(f"__{_name}__", _what))
        if _what == "arithmetic":
            setattr(RemoteObject, f"__r{_name}__", _refused(f"__r{_name}__", _what))
for _name, _what in (("__neg__", "arithmetic"), ("__pos__", "arithmetic"), ("__abs__", "arithmetic"),
                     ("__invert__", "arithmetic"), ("__round__", "arithmetic"), ("__trunc__", "arithmetic"),
                     ("__floor__", "arithmetic"), ("__ceil__", "arithmetic"), ("__int__", "a conversion"),
                     ("__float__", "a conversion"), ("__complex__", "a conversion"), ("__index__", "a conversion"),
                     ("__bytes__", "a conversion"), ("__hash__", "hashing"), ("__bool__", "a truth test"),
                     ("__len__", "len()"), ("__iter__", "iteration"), ("__reversed__", "iteration"),
                     ("__contains__", "a membership test"), ("__getitem__", "indexing"),
                     ("__setitem__", "indexing"), ("__delitem__", "indexing"), ("__str__", "str()"),
                     ("__format__", "formatting")):
    setattr(RemoteObject, _name, _refused(_name, _what))
