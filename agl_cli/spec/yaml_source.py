"""YAML loading that remembers where each value came from, so config errors can name the line.

A spec is read defensively: it must be UTF-8, at most MAX_BYTES, nested at most MAX_DEPTH levels, expand (aliases
included) to at most MAX_VALUES values, and name no key twice in one mapping. Each limit is far above any real
agl.yaml and far below what would exhaust memory or Python's stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agl_cli.errors import ConfigError

Location = tuple[str | int, ...]

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 100_000
_MERGE_KEY = "<<"
_OPENING = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSING = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _key_of(node: yaml.Node) -> Any:
    """The key as the loaded data has it (`1:` is the integer 1, as pydantic reports it), else its text."""
    if isinstance(node, yaml.ScalarNode) and node.tag != "tag:yaml.org,2002:str":
        try:
            return yaml.constructor.SafeConstructor().construct_object(node)
        except yaml.YAMLError:
            return node.value
    if isinstance(node, yaml.ScalarNode):
        return node.value
    return f"<a {type(node).__name__} key on line {node.start_mark.line + 1}>"


class _Walker:
    """Records the line of every key path, counting each value it visits: an alias expands where it is used, so a
    few lines of aliases of aliases (a "billion laughs") would otherwise expand to billions of values."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: dict[Location, int] = {}
        self.visited = 0

    def walk(self, node: yaml.Node, location: Location) -> None:
        self.visited += 1
        if self.visited > MAX_VALUES:
            raise ConfigError(
                f"{self.path}:{node.start_mark.line + 1}: the file expands to more than {MAX_VALUES:,} values "
                "(YAML aliases that repeat other aliases)",
                hint="write the values out, or use fewer levels of `*alias` references",
            )
        self.lines[location] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                key = _key_of(key_node)
                line = key_node.start_mark.line + 1
                if key != _MERGE_KEY and key in seen:
                    where = ".".join(str(p) for p in (*location, key))
                    raise ConfigError(
                        f"{self.path}:{line}: `{where}` is given twice (first on line {seen[key]}); YAML would keep "
                        "only the second and silently drop the first",
                        hint="merge the two into one entry",
                    )
                seen[key] = line
                # A key's own line is where the user looks for it, even when its value starts below.
                self.walk(value_node, (*location, key))
                self.lines[(*location, key)] = line
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.walk(item, (*location, index))


def _check_depth(path: Path, text: str) -> None:
    """Refuse deep nesting from the event stream (which PyYAML parses without recursion), before composing a tree
    whose construction would recurse once per level."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, _OPENING):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else 1
                raise ConfigError(
                    f"{path}:{line}: nested more than {MAX_DEPTH} levels deep; an agl.yaml needs a handful",
                    hint="check the brackets and indentation around that line",
                )
        elif isinstance(event, _CLOSING):
            depth -= 1


def _read_text(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file", hint="pass the path of your agl.yaml (see `agl init`)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES // 1024} KiB; an agl.yaml is a short file",
                          hint="check that this is the right file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
            hint="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from None


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
        text = _read_text(path)
        try:
            _check_depth(path, text)
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            walker = _Walker(path)
            if node is not None:
                walker.walk(node, ())
            data = yaml.SafeLoader(text).construct_document(node) if node is not None else None
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
        return cls(path, data, walker.lines)
