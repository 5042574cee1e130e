"""The winner as a ready config: `agl.best.yaml` next to the spec, the spec with each knob's winning option moved
first (so the winner is the new baseline and the other options stay to search later), and its diff."""

from __future__ import annotations

import difflib
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from agl_cli.spec.schema import ExperimentSpec
from agl_cli.spec.variants import Variant

BEST_NAME = "agl.best.yaml"
BEST_FILES = "agl.best"  # the winner's files that came from a study's folder, copied beside agl.best.yaml


def _as_written(spec: ExperimentSpec, option: Any, is_file: bool) -> Any:
    if not is_file or option is None:
        return option
    path = spec.resolve(str(option)).resolve()
    try:
        return path.relative_to(spec.base_dir.resolve()).as_posix()
    except ValueError:
        return str(path)  # a candidate file from outside the spec's folder keeps its absolute path


def _same(spec: ExperimentSpec, a: Any, b: Any, is_file: bool) -> bool:
    if a is None or b is None:
        return a is b  # `null`, the knob left alone, is the same only as itself
    if is_file:
        return spec.resolve(str(a)).resolve() == spec.resolve(str(b)).resolve()
    return bool(a == b)


def knob_changes(spec: ExperimentSpec, base: Variant, winner: Variant) -> dict[str, dict[str, Any]]:
    """knob -> {baseline, winner} for the knobs the winner sets differently."""
    changes = {}
    for name, option in winner.settings.items():
        is_file = spec.knobs[name].files is not None
        if not _same(spec, base.settings.get(name), option, is_file):
            changes[name] = {
                "baseline": _as_written(spec, base.settings.get(name), is_file),
                "winner": _as_written(spec, option, is_file),
            }
    return changes


def _option_spans(text: str, names: list[str]) -> dict[str, tuple[int, int, int | None]]:
    """Where in the spec's text each named knob's option list sits (character offsets), and for a block list the
    column its items start at (None for a flow list)."""
    spans: dict[str, tuple[int, int, int | None]] = {}
    root = yaml.compose(text)
    knobs = next((v for k, v in root.value if k.value == "knobs"), None) if isinstance(root, yaml.MappingNode) else None
    for key, knob in knobs.value if isinstance(knobs, yaml.MappingNode) else []:
        if key.value not in names or not isinstance(knob, yaml.MappingNode):
            continue
        for field, options in knob.value:
            if field.value in ("files", "values") and isinstance(options, yaml.SequenceNode | yaml.MappingNode):
                start, end = options.start_mark.index, options.end_mark.index
                # A block list's end mark can run into the next key's indentation: keep that whitespace.
                column = None if options.flow_style else options.start_mark.column
                spans[key.value] = (start, start + len(text[start:end].rstrip()), column)
    return spans


def _reordered(spec: ExperimentSpec, raw: dict[str, Any], winner: Variant) -> dict[str, list[Any] | dict[str, Any]]:
    """knob -> its options with the winner's first, as the spec writes them (a mapping of short names stays one)."""
    lists: dict[str, list[Any] | dict[str, Any]] = {}
    for name, option in winner.settings.items():
        knob = raw["knobs"][name]
        is_file = "files" in knob
        written = knob.get("files" if is_file else "values") or []
        if isinstance(written, dict):
            first = {k: v for k, v in written.items() if _same(spec, v, option, is_file)}
            if not first:  # a candidate file the spec did not list: named by its stem
                first = {Path(str(option)).stem: _as_written(spec, option, is_file)}
            lists[name] = {**first, **{k: v for k, v in written.items() if k not in first}}
            continue
        rest = [o for o in written if not _same(spec, o, option, is_file)]
        lists[name] = [_as_written(spec, option, is_file), *rest]
    return lists


def _render_list(options: list[Any] | dict[str, Any], column: int | None) -> str:
    """The list (or mapping) in the style it was written in: `[a, b]`, or block items `- a` at the original
    column."""
    def dump(data: Any, flow: bool) -> str:
        return yaml.safe_dump(data, default_flow_style=flow, allow_unicode=True, width=10**6, sort_keys=False).strip()

    if column is None:
        return dump(options, True)
    pieces = [{k: v} for k, v in options.items()] if isinstance(options, dict) else [[o] for o in options]
    items = [dump(piece, False) for piece in pieces]
    return ("\n" + " " * column).join(items)


def _with_lists(raw: dict[str, Any], lists: dict[str, list[Any] | dict[str, Any]]) -> dict[str, Any]:
    for name, options in lists.items():
        raw["knobs"][name]["files" if "files" in raw["knobs"][name] else "values"] = options
    return raw


def render_best(spec_path: Path, spec: ExperimentSpec, winner: Variant, *, header: str) -> tuple[str, str]:
    """(the new config's text, its unified diff against the spec file).

    The spec's own text is kept — comments, layout, quoting — and only the reordered option lists are rewritten,
    so the diff shows what changed and nothing else. A spec whose layout defeats that (anchors, say) is dumped
    whole instead."""
    original = spec_path.read_text()
    raw = yaml.safe_load(original)
    lists = _reordered(spec, raw, winner)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    try:
        spans = _option_spans(original, list(lists))
        if set(spans) != set(lists):
            raise ValueError("an option list was not found in the text")
        body = original
        for name, (start, end, column) in sorted(spans.items(), key=lambda item: item[1][0], reverse=True):
            body = body[:start] + _render_list(lists[name], column) + body[end:]
        if yaml.safe_load(body) != _with_lists(yaml.safe_load(original), lists):
            raise ValueError("the edited text does not read back as intended")
    except (yaml.YAMLError, ValueError, KeyError, AttributeError, TypeError):
        body = yaml.safe_dump(_with_lists(raw, lists), sort_keys=False, allow_unicode=True)
    text = comment + body
    diff = "".join(difflib.unified_diff(
        original.splitlines(keepends=True), text.splitlines(keepends=True),
        fromfile=spec_path.name, tofile=BEST_NAME,
    ))
    return text, diff


def _keep_files(spec_path: Path, spec: ExperimentSpec, winner: Variant, inside: Path) -> Variant:
    """The winner with its file options that live under `inside` (a study's own folder, such as reflect's
    proposals) copied next to the config, so agl.best.yaml outlives the study's folder."""
    settings = dict(winner.settings)
    for name, option in winner.settings.items():
        if spec.knobs[name].files is None or option is None:
            continue
        source = spec.resolve(str(option)).resolve()
        if not source.is_relative_to(inside.resolve()):
            continue
        target = spec_path.parent / BEST_FILES / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        settings[name] = f"{BEST_FILES}/{source.name}"
    return Variant(winner.name, settings, winner.hash)


def write_best(spec_path: Path, spec: ExperimentSpec, winner: Variant, *, header: str,
               study_dir: Path | None = None) -> tuple[Path, str]:
    if study_dir is not None:
        winner = _keep_files(spec_path, spec, winner, study_dir)
    text, diff = render_best(spec_path, spec, winner, header=header)
    target = spec_path.parent / BEST_NAME
    tmp = target.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(target)
    return target, diff


def describe_settings(changes: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{k}: {json.dumps(v['baseline'])} -> {json.dumps(v['winner'])}" for k, v in changes.items())
