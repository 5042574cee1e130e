"""Variants: named, hashed settings of the spec's knobs. The baseline takes each knob's first option."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_cli.errors import UsageError
from agl_cli.spec import ExperimentSpec, KnobSpec

BASELINE = "baseline"


@dataclass(frozen=True)
class Variant:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)  # knob name -> chosen option (value or file path)
    hash: str = ""


def _option_label(knob: KnobSpec, option: Any) -> str:
    if knob.files is not None:
        return Path(str(option)).stem
    return json.dumps(option) if not isinstance(option, str) else option


def _fingerprint(spec: ExperimentSpec, settings: dict[str, Any]) -> str:
    """Hash of what the variant does: file-valued options hash by content, so editing a prompt is a new variant."""
    material: dict[str, Any] = {}
    for name, option in sorted(settings.items()):
        knob = spec.knobs[name]
        if knob.files is not None:
            content = spec.resolve(str(option)).read_bytes()
            material[name] = {"file": str(option), "sha256": hashlib.sha256(content).hexdigest()}
        else:
            material[name] = option
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:12]


def make_variant(spec: ExperimentSpec, settings: dict[str, Any]) -> Variant:
    differing = [
        f"{name}={_option_label(spec.knobs[name], option)}"
        for name, option in settings.items()
        if option != spec.knobs[name].options[0]
    ]
    name = ",".join(differing) if differing else BASELINE
    return Variant(name=name, settings=dict(settings), hash=_fingerprint(spec, settings))


def baseline(spec: ExperimentSpec) -> Variant:
    return make_variant(spec, {name: knob.options[0] for name, knob in spec.knobs.items()})


def grid(spec: ExperimentSpec) -> list[Variant]:
    names = list(spec.knobs)
    combos = itertools.product(*(spec.knobs[n].options for n in names))
    return [make_variant(spec, dict(zip(names, combo, strict=True))) for combo in combos]


def parse_variant(spec: ExperimentSpec, text: str) -> Variant:
    """`baseline`, or `knob=option[,knob=option]` where an option is a value or a file's path or stem."""
    if text == BASELINE:
        return baseline(spec)
    settings = {name: knob.options[0] for name, knob in spec.knobs.items()}
    for part in text.split(","):
        if "=" not in part:
            raise UsageError(f"--variant {text!r}: expected `baseline` or knob=value pairs joined by commas")
        name, raw = (s.strip() for s in part.split("=", 1))
        if name not in spec.knobs:
            known = ", ".join(spec.knobs) or "none"
            raise UsageError(f"--variant {text!r}: no knob named {name!r}; the spec's knobs are: {known}")
        knob = spec.knobs[name]
        match = [o for o in knob.options if raw in (str(o), _option_label(knob, o))]
        if not match:
            try:
                match = [o for o in knob.options if o == json.loads(raw)]
            except json.JSONDecodeError:
                match = []
        if not match:
            choices = ", ".join(_option_label(knob, o) for o in knob.options)
            raise UsageError(f"--variant {text!r}: {raw!r} is not an option of knob {name!r}; its options: {choices}")
        settings[name] = match[0]
    return make_variant(spec, settings)
