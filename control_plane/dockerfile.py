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


_HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)\s*([\"']?)([A-Za-z_][\w.-]*)\2")
_LEADING_FLAGS = re.compile(r"^((?:--\S+\s+)*)")


def lower_heredocs(text: str) -> tuple[str, int]:
    """``text`` with its here-documents (``RUN <<EOF``, ``RUN cmd <<'EOF'``, ``COPY <<EOF /path``,
    BuildKit's syntax, which buildah 1.28 does not read) said in the exec form buildah reads, and
    how many there were. ``RUN cmd <<EOF …`` is the shell's own here-document: the whole text
    goes to the stage's shell as one command; ``RUN <<EOF`` runs the document as the script (its
    ``#!`` line, if any, chooses the interpreter); ``COPY <<EOF /path`` writes the file."""
    lines = text.splitlines()
    out: list[str] = []
    shell = ["/bin/sh", "-c"]
    count = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        word = line.strip().split(" ", 1)[0].upper()
        if word == "FROM":
            shell = ["/bin/sh", "-c"]
        elif word == "SHELL":
            try:
                parsed = json.loads(line.strip()[len("SHELL"):].strip())
                if isinstance(parsed, list) and parsed:
                    shell = [str(p) for p in parsed]
            except ValueError:
                pass
        markers = _HEREDOC.findall(line) if word in ("RUN", "COPY", "ADD") else []
        if not markers:
            out.append(line)
            i += 1
            continue
        count += 1
        bodies: list[list[str]] = []
        raw = [line]
        i += 1
        for strip_tabs, _quote, name in markers:
            body: list[str] = []
            while i < len(lines):
                candidate = lines[i].lstrip("\t") if strip_tabs else lines[i]
                raw.append(lines[i])
                i += 1
                if candidate == name:
                    break
                body.append(candidate)
            bodies.append(body)
        head = line.strip()[len(word):].strip()
        flags = _LEADING_FLAGS.match(head).group(1)  # type: ignore[union-attr]
        rest = head[len(flags):]
        if word == "RUN" and rest.startswith("<<"):
            script = "\n".join(bodies[0]) + "\n"
            if script.startswith("#!"):
                argv = [*shell, "f=$(mktemp) && cat > \"$f\" <<'IDEGYM_HEREDOC'\n" + script + "IDEGYM_HEREDOC\n"
                        "chmod +x \"$f\" && \"$f\"; s=$?; rm -f \"$f\"; exit $s"]
            else:
                argv = [*shell, script]
            out.append(f"RUN {flags}{json.dumps(argv)}")
        elif word == "RUN":
            out.append(f"RUN {flags}{json.dumps([*shell, chr(10).join([rest, *raw[1:]])])}")
        else:  # COPY/ADD <<EOF [<<EOF2 …] /dest: each document a file
            parts = rest.split()
            dest = parts[-1]
            owner = re.search(r"--chown=(\S+)", flags)
            mode = re.search(r"--chmod=(\S+)", flags)
            steps: list[str] = []
            for (_s, _q, name), body in zip(markers, bodies, strict=False):
                target = dest if len(markers) == 1 and not dest.endswith("/") else dest.rstrip("/") + "/" + name
                steps += [f"mkdir -p \"$(dirname '{target}')\"", f"cat > '{target}' <<'IDEGYM_HEREDOC'",
                          *body, "IDEGYM_HEREDOC"]
                if owner:
                    steps.append(f"chown {owner.group(1)} '{target}'")
                if mode:
                    steps.append(f"chmod {mode.group(1)} '{target}'")
            out.append(f"RUN {json.dumps(['/bin/sh', '-c', chr(10).join(steps)])}")
    return "\n".join(out) + ("\n" if text.endswith("\n") else ""), count


def final_entrypoint(text: str) -> list[str] | None:
    """The ENTRYPOINT the Dockerfile's last stage ends with (inherited from an earlier stage it
    builds on), as an argv; None when it sets none (an image it builds on may still have one)."""
    return _final(text, "ENTRYPOINT")


def final_command(text: str) -> list[str] | None:
    """The CMD the Dockerfile's last stage ends with (as :func:`final_entrypoint`)."""
    return _final(text, "CMD")


def _final(text: str, instruction: str) -> list[str] | None:
    stages: dict[str, list[str] | None] = {}
    current: list[str] | None = None
    name: str | None = None
    for word, rest in instructions(text):
        if word == "FROM":
            parts = [p for p in _split(rest) if not p.startswith("--")]
            current = stages.get(parts[0].lower()) if parts else None
            name = parts[2].lower() if len(parts) >= 3 and parts[1].lower() == "as" else None
        elif word == instruction:
            current = _command(rest)
        if name is not None:
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
