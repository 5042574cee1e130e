"""YAML loading that remembers where each value came from, so config errors can name the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agl_cli.errors import ConfigError

Location = tuple[str | int, ...]


def _walk(node: yaml.Node, path: Location, lines: dict[Location, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            # A key's own line is where the user looks for it, even when its value starts below.
            _walk(value_node, (*path, key), lines)
            lines[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), lines)


class YamlDocument:
    """A parsed YAML mapping plus the line of every key path in it."""

    def __init__(self, path: Path, data: dict[str, Any], lines: dict[Location, int]) -> None:
        self.path = path
        self.data = data
        self.lines = lines

    def line_of(self, location: Location) -> int | None:
        """The line of the deepest prefix of `location` that exists in the file."""
        loc = tuple(location)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return None

    @classmethod
    def load(cls, path: Path) -> YamlDocument:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file", hint="pass the path of your agl.yaml (see `agl init`)") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            data = yaml.safe_load(text)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
            opened = exc.context_mark
            context = f" ({exc.context} on line {opened.line + 1})" if exc.context and opened else ""
            raise ConfigError(f"{where}: not valid YAML: {exc.problem}{context}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict) or node is None:
            found = "an empty file" if data is None else f"a {type(data).__name__}"
            raise ConfigError(f"{path}:1: expected a mapping of keys (name:, agent:, tasks:, grader:, ...), found {found}")
        lines: dict[Location, int] = {}
        _walk(node, (), lines)
        return cls(path, data, lines)
