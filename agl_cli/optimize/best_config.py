"""The winner as a ready config: `agl.best.yaml` next to the spec, the spec with each knob's winning option moved
first (so the winner is the new baseline and the other options stay to search later), and its diff."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import yaml

from agl_cli.spec import ExperimentSpec
from agl_cli.variants import Variant

BEST_NAME = "agl.best.yaml"


def _as_written(spec: ExperimentSpec, option: Any, is_file: bool) -> Any:
    if not is_file:
        return option
    path = spec.resolve(str(option)).resolve()
    try:
        return path.relative_to(spec.base_dir.resolve()).as_posix()
    except ValueError:
        return str(path)  # a candidate file from outside the spec's folder keeps its absolute path


def _same(spec: ExperimentSpec, a: Any, b: Any, is_file: bool) -> bool:
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


def render_best(spec_path: Path, spec: ExperimentSpec, winner: Variant, *, header: str) -> tuple[str, str]:
    """(the new config's text, its unified diff against the spec file)."""
    original = spec_path.read_text()
    raw = yaml.safe_load(original)
    for name, option in winner.settings.items():
        knob = raw["knobs"][name]
        is_file = "files" in knob
        key = "files" if is_file else "values"
        options = list(knob.get(key) or [])
        written = _as_written(spec, option, is_file)
        options = [o for o in options if not _same(spec, o, option, is_file)]
        knob[key] = [written, *options]
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    text = comment + yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
    diff = "".join(difflib.unified_diff(
        original.splitlines(keepends=True), text.splitlines(keepends=True),
        fromfile=spec_path.name, tofile=BEST_NAME,
    ))
    return text, diff


def write_best(spec_path: Path, spec: ExperimentSpec, winner: Variant, *, header: str) -> tuple[Path, str]:
    text, diff = render_best(spec_path, spec, winner, header=header)
    target = spec_path.parent / BEST_NAME
    tmp = target.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(target)
    return target, diff


def describe_settings(changes: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{k}: {json.dumps(v['baseline'])} -> {json.dumps(v['winner'])}" for k, v in changes.items())
