"""The subject side of the judge for Python code: imports the code under test and answers calls.

Run as ``python3 -I python_subject.py PROJECT_DIR [EXTRA_PATH...]`` by the grader, as the tool
user. Requests come on stdin, answers go to the descriptor named by ``IDEGYM_ANSWER_FD`` (the code under test's own
output on stdout and stderr goes to the grader's log). Everything the code under test does
happens in this process, which holds nothing the verdict depends on: no expected value, no
report, no descriptor of the grader's but the two pipes.
"""

import importlib
import importlib.util
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_protocol():
    spec = importlib.util.spec_from_file_location("_idegym_judge_protocol", os.path.join(HERE, "..", "protocol.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


protocol = _load_protocol()

MAX_TEXT = 4000


class Handles:
    def __init__(self):
        self.objects = {}
        self.next_id = 1

    def ref(self, obj):
        if isinstance(obj, type) and issubclass(obj, BaseException):
            return {protocol.TAG: "exctype", **_exception_names(obj)}
        ref_id = self.next_id
        self.next_id += 1
        self.objects[ref_id] = obj
        return {protocol.TAG: "ref", "id": ref_id, "type": _qualname(type(obj)),
                "callable": callable(obj), "repr": _short_repr(obj)}

    def resolve(self, doc):
        if doc.get(protocol.TAG) != "ref" or doc.get("id") not in self.objects:
            raise protocol.JudgeProtocolError(f"unknown object reference {repr(doc)[:100]}")
        return self.objects[doc["id"]]


def _qualname(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _short_repr(obj):
    try:
        text = repr(obj)
    except BaseException:  # a repr of the code under test may raise anything
        text = f"<{type(obj).__name__}>"
    return text[:200]


def _exception_names(cls):
    chain, builtin = [], None
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            builtin = klass.__name__
            break
        chain.append(_qualname(klass))
    return {"type": _qualname(cls), "chain": chain, "builtin": builtin}


def _exception(exc):
    doc = {protocol.TAG: "exc", **_exception_names(type(exc))}
    try:
        message = str(exc)
    except BaseException:
        message = f"<unprintable {type(exc).__name__}>"
    doc["message"] = message[:MAX_TEXT]
    doc["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-MAX_TEXT:]
    return doc


def _arguments(request, handles):
    args = protocol.decode(request.get("args") or [], handles.resolve)
    kwargs = protocol.decode(request.get("kwargs") or {protocol.TAG: "dict", "v": []}, handles.resolve)
    return list(args), dict(kwargs)


def handle(request, handles):
    op = request.get("op")
    if op == "import":
        return importlib.import_module(str(request["name"]))
    if op == "release":
        for ref_id in request.get("ids") or []:
            handles.objects.pop(ref_id, None)
        return None
    target = handles.resolve(request.get("ref") or {})
    if op == "getattr":
        return getattr(target, str(request["name"]))
    if op == "setattr":
        setattr(target, str(request["name"]), protocol.decode(request.get("value"), handles.resolve))
        return None
    if op == "call":
        args, kwargs = _arguments(request, handles)
        return target(*args, **kwargs)
    if op == "callmethod":
        args, kwargs = _arguments(request, handles)
        return getattr(target, str(request["name"]))(*args, **kwargs)
    raise protocol.JudgeProtocolError(f"unknown request op {op!r}")


def main(argv):
    project = os.path.abspath(argv[0]) if argv else os.getcwd()
    extra = [os.path.join(project, p) for p in argv[1:]]
    # The code under test comes after the standard library (a planted json.py shadows nothing)
    # and before site-packages (an installed package of the same name does not shadow it).
    sites = [i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))]
    at = sites[0] if sites else len(sys.path)
    sys.path[at:at] = [project] + extra
    answers = os.fdopen(int(os.environ.pop("IDEGYM_ANSWER_FD", "3")), "wb", buffering=0)
    requests = sys.stdin.buffer
    handles = Handles()
    while True:
        try:
            request = protocol.read_message(requests)
        except protocol.JudgeProtocolError as exc:
            protocol.write_message(answers, {"err": {protocol.TAG: "exc", "type": "ProtocolError", "chain": [],
                                                    "builtin": None, "message": str(exc)}})
            return 2
        if request is None:
            return 0
        try:
            doc = {"ok": protocol.encode(handle(request, handles), handles.ref)}
        except BaseException as exc:  # SystemExit and KeyboardInterrupt of the code under test too
            doc = {"err": _exception(exc)}
        try:
            protocol.write_message(answers, doc)
        except (TypeError, ValueError) as exc:  # e.g. a str with lone surrogates
            protocol.write_message(answers, {"err": _exception(exc)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
