"""What IdeGym reads of a Dockerfile without buildah (stdlib only: task loaders import it too).

The images it builds on (its ``FROM`` and ``COPY --from`` references), so that they are provided
before buildah runs and the build itself needs no registry: line continuations, comments,
``ARG`` defaults before the first ``FROM`` (and ``--build-arg`` values) substituted into
references, stage names told apart from images; those references rewritten to the images they
became; an ``ARG`` line per stage; the ENTRYPOINT its last stage ends with. Everything else is
buildah's to read.
"""

from __future__ import annotations

import json
import re
import shlex

_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_]\w*)(?::?[-+](?P<default>[^}]*))?\}|(?P<plain>[A-Za-z_]\w*))")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuations joined, comments dropped."""
    escape = "\\"
    lines = text.splitlines()
    for line in lines:  # parser directives come first
        match = re.match(r"^\s*#\s*escape\s*=\s*(\S)\s*$", line, re.IGNORECASE)
        if match:
            escape = match.group(1)
            break
        if not re.match(r"^\s*#\s*\w+\s*=", line):
            break
    out: list[tuple[str, str]] = []
    current = ""
    for line in lines:
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # comments inside a continued instruction
        if stripped.endswith(escape):
            current += stripped[:-1] + " "
            continue
        current += stripped
        word, _, rest = current.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        current = ""
    if current.strip():
        word, _, rest = current.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _substitute(value: str, args: dict[str, str]) -> str:
    def repl(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("plain")
        if name in args and args[name] != "":
            return args[name]
        return match.group("default") or ""

    return _VAR.sub(repl, value)


def base_images(text: str, build_args: dict[str, str] | None = None) -> list[str]:
    """External images the Dockerfile needs, in order of first use (no stage names, no scratch)."""
    build_args = dict(build_args or {})
    global_args: dict[str, str] = {}
    stages: set[str] = set()
    found: list[str] = []
    seen_from = False

    def add(ref: str) -> None:
        if ref and ref.lower() not in stages and ref != "scratch" and ref not in found and not ref.isdigit():
            found.append(ref)

    for word, rest in instructions(text):
        if word == "ARG" and not seen_from:
            for item in _split(rest):
                name, eq, default = item.partition("=")
                global_args[name] = build_args.get(name, _substitute(default, global_args) if eq else "")
        elif word == "FROM":
            seen_from = True
            parts = [p for p in _split(rest) if not p.startswith("--")]
            if not parts:
                continue
            ref = _substitute(parts[0], {**global_args, **{k: v for k, v in build_args.items() if k in global_args}})
            add(ref)
            if len(parts) >= 3 and parts[1].lower() == "as":
                stages.add(parts[2].lower())
        elif word in ("COPY", "ADD"):
            for part in _split(rest):
                if part.startswith("--from="):
                    add(_substitute(part[len("--from="):], global_args))
                elif not part.startswith("--"):
                    break
    return found


def final_entrypoint(text: str) -> list[str] | None:
    """The ENTRYPOINT the Dockerfile's last stage ends with (inherited from an earlier stage it
    builds on), as an argv; None when it sets none (an image it builds on may still have one)."""
    stages: dict[str, list[str] | None] = {}
    current: list[str] | None = None
    name: str | None = None
    for word, rest in instructions(text):
        if word == "FROM":
            parts = [p for p in _split(rest) if not p.startswith("--")]
            current = stages.get(parts[0].lower()) if parts else None
            if len(parts) >= 3 and parts[1].lower() == "as":
                stages[parts[2].lower()] = current
                name = parts[2].lower()
            else:
                name = None
        elif word == "ENTRYPOINT":
            current = _command(rest)
            if name is not None:
                stages[name] = current
        if word != "FROM" and name is not None:
            stages[name] = current
    return current or None


def _command(rest: str) -> list[str]:
    """An exec-form (JSON array) or shell-form instruction's argv."""
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except ValueError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return ["/bin/sh", "-c", rest] if rest else []


def rewrite_bases(text: str, build_args: dict[str, str] | None, images: dict[str, str]) -> str:
    """``text`` with each ``FROM`` / ``COPY --from`` reference that ``images`` maps (as
    :func:`base_images` reads it, ARGs substituted) replaced by its image (an id). Lines keep
    their place; a reference split over continuation lines is left as it is."""
    build_args = dict(build_args or {})
    global_args: dict[str, str] = {}
    seen_from = False
    out = []
    for line in text.splitlines(keepends=True):
        arg = re.match(r"^\s*ARG\s+(.*)$", line, re.IGNORECASE)
        if arg and not seen_from:
            for item in _split(arg.group(1)):
                name, eq, default = item.partition("=")
                global_args[name] = build_args.get(name, _substitute(default, global_args) if eq else "")
        found = re.match(r"^(\s*FROM\s+(?:--\S+\s+)*)(\S+)(.*)$", line, re.IGNORECASE | re.DOTALL)
        if found:
            seen_from = True
            ref = _substitute(found.group(2), {**global_args, **{k: v for k, v in build_args.items()
                                                                  if k in global_args}})
            if ref in images:
                line = found.group(1) + images[ref] + found.group(3)
        elif re.match(r"^\s*(COPY|ADD)\s", line, re.IGNORECASE):
            def repl(m: re.Match[str]) -> str:
                ref = _substitute(m.group(2), global_args)
                return m.group(1) + images.get(ref, m.group(2))

            line = re.sub(r"(--from=)(\S+)", repl, line)
        out.append(line)
    return "".join(out)


def add_stage_args(text: str, args: dict[str, str]) -> str:
    """``text`` with one ``ARG`` line declaring ``args`` (values without spaces) after each
    ``FROM``: their values reach that stage's RUN steps as variables, not the image's config."""
    if not args:
        return text
    escape = "\\"
    found = re.search(r"^\s*#\s*escape\s*=\s*(\S)\s*$", text, re.IGNORECASE | re.MULTILINE)
    if found:
        escape = found.group(1)
    declaration = "ARG " + " ".join(f"{k}={v}" for k, v in args.items()) + "\n"
    out: list[str] = []
    in_from = False
    for line in text.splitlines(keepends=True):
        if not in_from and re.match(r"^\s*FROM\s", line, re.IGNORECASE):
            in_from = True
        out.append(line)
        if in_from and not line.rstrip("\r\n").rstrip().endswith(escape):
            if not line.endswith("\n"):
                out.append("\n")
            out.append(declaration)
            in_from = False
    return "".join(out)


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text, posix=True)
    except ValueError:
        return text.split()
