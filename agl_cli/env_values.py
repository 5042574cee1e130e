"""`${VAR}` and `${VAR:-default}` in the string values of agl.yaml, filled in from the environment.

A step of its own, applied to the parsed values (never to keys), so a missing variable is reported with the file,
line and field it appears in. `${VAR:-default}` takes the default when VAR is unset or empty, as a shell does;
`$${` writes a literal `${`. Nothing else is special: `$HOME` without braces stays as written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agl_cli.errors import ConfigError
from agl_cli.yaml_source import Location, YamlDocument

_REFERENCE = re.compile(r"\$(\$?)\{([^{}]*)\}")
_NAME_AND_DEFAULT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?$", re.DOTALL)
HINT = "export the variable, or give a default: ${NAME:-value}; write $${ for a literal ${"


def _field(location: Location) -> str:
    return ".".join(str(p) for p in location) or "(top level)"


def _expand_text(text: str, environ: Mapping[str, str], where: str) -> str:
    def substitute(match: re.Match[str]) -> str:
        if match.group(1):  # $${...}: the escape, written back without its first $
            return match.group(0)[1:]
        inner = match.group(2)
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
            return default
        if value is None:
            raise ConfigError(f"{where}: ${{{name}}} is not set in the environment", hint=HINT)
        return value

    return _REFERENCE.sub(substitute, text)


def expand(doc: YamlDocument, environ: Mapping[str, str]) -> dict[str, Any]:
    """A copy of the document's data with every `${...}` in its string values filled in."""

    def walk(value: Any, location: Location) -> Any:
        if isinstance(value, str):
            if "${" not in value:
                return value
            line = doc.line_of(location)
            where = f"{doc.path}:{line}: `{_field(location)}`" if line else f"{doc.path}: `{_field(location)}`"
            return _expand_text(value, environ, where)
        if isinstance(value, dict):
            return {key: walk(item, (*location, key)) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item, (*location, index)) for index, item in enumerate(value)]
        return value

    expanded: dict[str, Any] = walk(doc.data, ())
    return expanded
