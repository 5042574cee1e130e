"""`${VAR}` and `${VAR:-default}` in the string values of agl.yaml, filled in from the environment.

A step of its own, applied to the parsed values (never to keys), so a missing variable is reported with the file,
line and field it appears in. `${VAR:-default}` takes the default when VAR is unset or empty, as a shell does, and
the default may itself refer to variables (`${A:-${B}}`); `$${` writes a literal `${` (so `$${HOME}` reaches the
shell as `${HOME}`). Nothing else is special: `$HOME` without braces stays as written.

In a shell command (`agent.command`, `grader.command`) a filled-in value is quoted for where it stands (bare, in
'single' or in "double" quotes), so it reaches the program as the text it is, one word, whatever it holds: a value
`x; touch PWNED` runs nothing. For words the shell should split or expand, write `$VAR` (no braces): the shell
reads it from the environment at run time, as any shell command does.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from agl_cli.errors import ConfigError
from agl_cli.spec.yaml_source import Location, YamlDocument

_NAME_AND_DEFAULT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?$", re.DOTALL)
HINT = "export the variable, or give a default: ${NAME:-value}; write $${ for a literal ${"
# The string values that are shell commands: what is filled into them is quoted for the shell.
COMMANDS: frozenset[Location] = frozenset({("agent", "command"), ("grader", "command")})


def _field(location: Location) -> str:
    return ".".join(str(p) for p in location) or "(top level)"


def _closing(text: str, start: int, where: str) -> int:
    """The index of the `}` that closes the reference whose `${` ends just before `start` (nested ones counted)."""
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ConfigError(f"{where}: `{text[start - 2 :][:60]}` has no closing brace", hint=HINT)


def _resolve(inner: str, environ: Mapping[str, str], where: str) -> str:
    parsed = _NAME_AND_DEFAULT.match(inner)
    if parsed is None:
        raise ConfigError(
            f"{where}: ${{{inner}}} is not a variable reference agl understands: write ${{NAME}} or "
            "${NAME:-default}",
            hint=HINT,
        )
    name, default = parsed.group(1), parsed.group(2)
    value = environ.get(name)
    if default is not None and not value:
        return _expand_text(default, environ, where)
    if value is None:
        raise ConfigError(f"{where}: ${{{name}}} is not set in the environment", hint=HINT)
    return value


def _quoted(value: str, context: str) -> str:
    """`value` written so that a POSIX shell reads it back exactly, at a place whose quoting is `context`."""
    if context == "'":
        return value.replace("'", "'\\''")
    if context == '"':
        return re.sub(r'([\\"$`])', r"\\\1", value)
    return shlex.quote(value)


def _expand_text(text: str, environ: Mapping[str, str], where: str, *, shell: bool = False) -> str:
    out: list[str] = []
    quote = ""  # the shell quoting in force at this point of a command: "", "'" or '"'
    i = 0
    while i < len(text):
        if text.startswith("$${", i):  # the escape: a literal ${, its contents left as written
            out.append("${")
            i += 3
            continue
        if text.startswith("${", i):
            end = _closing(text, i + 2, where)
            value = _resolve(text[i + 2 : end], environ, where)
            out.append(_quoted(value, quote) if shell else value)
            i = end + 1
            continue
        char = text[i]
        if shell:
            if char == "\\" and quote != "'" and text[i + 1 : i + 2] in ("\\", '"', "'"):
                out.append(text[i : i + 2])  # an escaped quote (or backslash) opens or closes nothing
                i += 2
                continue
            if char in "'\"" and quote in ("", char):
                quote = "" if quote == char else char
        out.append(char)
        i += 1
    return "".join(out)


def expand(doc: YamlDocument, environ: Mapping[str, str]) -> dict[str, Any]:
    """A copy of the document's data with every `${...}` in its string values filled in."""

    def walk(value: Any, location: Location) -> Any:
        if isinstance(value, str):
            if "${" not in value:
                return value
            line = doc.line_of(location)
            where = f"{doc.path}:{line}: `{_field(location)}`" if line else f"{doc.path}: `{_field(location)}`"
            return _expand_text(value, environ, where, shell=tuple(location) in COMMANDS)
        if isinstance(value, dict):
            return {key: walk(item, (*location, key)) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item, (*location, index)) for index, item in enumerate(value)]
        return value

    expanded: dict[str, Any] = walk(doc.data, ())
    return expanded
