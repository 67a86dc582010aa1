"""Every exception class of ``idegym_env`` derives from ``IdeGymError``, and the tree drawn at the
top of ``idegym_env/errors.py`` is the real one: each class under its parent, with the builtins
it mixes in and the module it is defined in."""

from __future__ import annotations

import importlib
import pkgutil
import re

import idegym_env
from idegym_env import errors

SKIPPED = (".tasks.data", ".tasks.bundled", ".agents.drivers")  # task content and programs run in sandboxes


def _classes() -> list[type[BaseException]]:
    """Every exception class defined in a module of ``idegym_env`` that imports here (an
    integration whose framework is not installed is left out)."""
    for info in pkgutil.walk_packages(idegym_env.__path__, "idegym_env."):
        if info.name.endswith(SKIPPED) or any(part in info.name for part in SKIPPED):
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in ("idegym_env", "control_plane", "sandbox_server"):
                raise
    found: dict[str, type[BaseException]] = {}
    stack: list[type] = [BaseException]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__module__.startswith("idegym_env.") and issubclass(cls, BaseException):
            found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return list(found.values())


def _drawn() -> dict[str, tuple[str | None, list[str], str | None]]:
    """The drawing: class name → (parent, builtins in parentheses, module column)."""
    assert errors.__doc__ is not None
    tree: dict[str, tuple[str | None, list[str], str | None]] = {}
    parents: list[str] = []
    for line in errors.__doc__.splitlines():
        if line.strip() == "IdeGymError":
            tree["IdeGymError"] = (None, [], "errors")
            parents = ["IdeGymError"]
            continue
        found = re.match(r"^ {4}((?:│   |    )*)[├└]── (\w+)(?: \(([\w, ]+)\))?(.*)$", line)
        if not found:
            continue
        depth = len(found.group(1)) // 4 + 1
        name = found.group(2)
        mixed = [b.strip() for b in found.group(3).split(",")] if found.group(3) else []
        last = found.group(4).split()[-1:] if found.group(4).strip() else []
        module = last[0] if last and (last[0] == "errors" or last[0].endswith(".py")) else None
        parents = parents[:depth] + [name]
        tree[name] = (parents[depth - 1], mixed, module)
    return tree


def test_every_exception_of_idegym_env_derives_from_the_root() -> None:
    strays = [f"{c.__module__}.{c.__qualname__}" for c in _classes() if not issubclass(c, errors.IdeGymError)]
    assert not strays, f"exception classes outside the IdeGymError tree: {strays}"


def test_the_drawn_tree_is_the_tree() -> None:
    drawn = _drawn()
    public = {c.__name__: c for c in _classes() if not c.__name__.startswith("_")}
    public["IdeGymError"] = errors.IdeGymError
    assert set(drawn) == set(public), (f"drawn, not defined: {sorted(set(drawn) - set(public))}; "
                                       f"defined, not drawn: {sorted(set(public) - set(drawn))}")
    for name, (parent, mixed, module) in drawn.items():
        cls = public[name]
        ours = [b.__name__ for b in cls.__bases__ if issubclass(b, errors.IdeGymError)]
        others = [b.__name__ for b in cls.__bases__ if not issubclass(b, errors.IdeGymError) and b is not Exception]
        assert ours == ([parent] if parent else []), f"{name}: drawn under {parent}, derives from {ours}"
        assert others == mixed, f"{name}: drawn mixing {mixed}, mixes {others}"
        if module is not None:
            where = "errors" if module == "errors" else "idegym_env." + module.removesuffix(".py").replace("/", ".")
            assert cls.__module__ in (where, f"idegym_env.{where}"), \
                f"{name}: drawn in {module}, is in {cls.__module__}"


def test_the_tree_is_exported_once() -> None:
    from idegym_env import client, integrations

    assert idegym_env.IdeGymError is errors.IdeGymError
    for name in errors.__all__:
        assert getattr(client, name, getattr(errors, name)) is getattr(errors, name), name
    assert integrations.InfrastructureError is client.InfrastructureError is errors.InfrastructureError
    assert issubclass(errors.InfrastructureError, errors.ServiceError)  # one tree with the client's errors
