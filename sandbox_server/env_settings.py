"""Settings read from environment variables: a pydantic model whose every field names its variable.

Each kind of process reads its variables in one place, ``Settings.from_env()``: the control
plane (``control_plane/settings.py``), the sandbox server (``sandbox_server/settings.py``), a
client, env or trainer (``idegym_env/settings.py``). Code below that layer takes values from the
settings it is given and never reads ``os.environ`` itself (``tests/test_configuration.py``
checks it); the table of variables in ``docs/configuration.md`` is made from these models.

A variable that is unset or empty is the field's default (``None``: not set); a value that does
not parse is a :class:`SettingsError` naming the variable. A field of a family (a name ending in
``*``: every variable of that prefix) holds the set variables of all its names, by name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class SettingsError(ValueError):
    """An environment variable whose value cannot be used; the message names it."""


def variable(env: str | tuple[str, ...], doc: str, default: Any = None, *, flag: str | None = None,
             shown: str | None = None, secret: bool = False) -> Any:
    """A field read from ``env`` (the first of several names that is set). ``doc`` says what it
    does (the docs' table), ``flag`` names the command-line flag it is the default of, and
    ``shown`` is the default as the docs say it when ``default`` is not it (``None``: computed)."""
    names = (env,) if isinstance(env, str) else env
    extra = {"env": list(names), "flag": flag, "shown": shown}
    return Field(default, description=doc, json_schema_extra=extra, repr=not secret)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Variable:
    """One row of the docs' table."""

    names: tuple[str, ...]
    doc: str
    default: str
    flag: str | None


class EnvSettings(BaseModel):
    """Base of the per-process settings models (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    error: ClassVar[type[ValueError]] = SettingsError  # what from_env raises (idegym_env: its own tree)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The settings this environment (default: the process's) gives."""
        environ = os.environ if environ is None else environ
        raw: dict[str, str] = {}
        for name, info in cls.model_fields.items():
            names = _names(info)
            if any(env.endswith("*") for env in names):  # a family: its variables by name
                family = {k: v for k, v in environ.items() if v.strip() and any(
                    k.startswith(env[:-1]) if env.endswith("*") else k == env for env in names)}
                if family:
                    raw[name] = family  # type: ignore[assignment]
                continue
            for env in names:
                value = environ.get(env)
                if value is not None and value.strip():
                    raw[name] = value.strip()
                    break
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = []
            for error in exc.errors(include_url=False):
                field = str(error["loc"][0]) if error["loc"] else ""
                names = _names(cls.model_fields[field]) if field in cls.model_fields else (field,)
                given = next((n for n in names if (environ.get(n) or "").strip()), names[0])
                problems.append(f"${given}={environ.get(given, '')!r}: {error['msg']}")
            raise cls.error("; ".join(problems)) from None

    @classmethod
    def variables(cls) -> list[Variable]:
        """Every variable of this model, for the docs' table."""
        rows = []
        for info in cls.model_fields.values():
            extra = info.json_schema_extra
            assert isinstance(extra, dict)
            shown = extra.get("shown")
            if shown is None:
                shown = "–" if info.default is None else _shown(info.default)
            rows.append(Variable(_names(info), info.description or "", str(shown),
                                 str(extra["flag"]) if extra.get("flag") else None))
        return rows


def _names(info: Any) -> tuple[str, ...]:
    extra = info.json_schema_extra
    return tuple(extra["env"]) if isinstance(extra, dict) and extra.get("env") else ()


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple | list):
        return ",".join(map(str, value)) or "–"
    return str(value)


def split_list(value: Any) -> Any:
    """A comma-separated variable as a tuple of its non-empty items (other values unchanged)."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value



def env_flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """A yes/no variable read as the settings models read one: unset or empty is ``default``."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    try:
        return default if not raw else TypeAdapter(bool).validate_python(raw)
    except ValidationError:
        raise SettingsError(f"${name}={raw!r}: expected a boolean (1/0, true/false, yes/no, on/off)") from None
