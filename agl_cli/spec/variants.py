"""Variants: named, hashed settings of the spec's knobs. The baseline takes each knob's first option.

A variant's name lists the knobs it sets differently from the baseline, each by its option's label (a short name, a
file's stem, a value as written, `unset` for `null`). Its hash is what it does to the agent (`effective_settings`):
a knob left alone (`null`) is not part of it, nor is a knob limited to models that the variant's `model` never
reaches, and a file counts by its content. So adding a knob whose first option is `null` keeps the baseline's hash,
and with it the baseline's cached rollouts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from agl_cli.errors import UsageError
from agl_cli.spec.schema import ExperimentSpec, KnobSpec
from rl_backend.gateway.knobs import model_matches

BASELINE = "baseline"
NO_KNOBS = "no-knobs"  # every knob left alone: the agent exactly as it is, whatever the spec's baseline sets


@dataclass(frozen=True)
class Variant:
    name: str
    settings: dict[str, Any] = field(default_factory=dict)  # knob name -> chosen option (value, file path or None)
    hash: str = ""


def _routed_model(spec: ExperimentSpec, settings: dict[str, Any]) -> tuple[str, str] | None:
    """(upstream, model) every call of the variant goes to, when its `model` knob says so; None when the agent's
    own model names decide."""
    knob = spec.knobs.get("model")
    value = settings.get("model")
    if knob is None or knob.via != "gateway" or not isinstance(value, str) or "/" not in value:
        return None
    upstream, _, model = value.partition("/")
    return upstream, model


def effective_settings(spec: ExperimentSpec, settings: dict[str, Any]) -> dict[str, Any]:
    """What the variant changes, as hashed: each applied knob's value (a file by its content), with what decides
    how it applies when that is not the default (system_prompt's `prepend`, `models` when the calls' model is not
    fixed by the `model` knob). Knobs left alone, and knobs whose `models` the variant's model is not among, are
    left out: they change nothing."""
    routed = _routed_model(spec, settings)
    material: dict[str, Any] = {}
    for name, option in sorted(settings.items()):
        if option is None:
            continue
        knob = spec.knobs[name]
        entry: Any = option
        if knob.files is not None:
            content = spec.resolve(str(option)).read_bytes()
            entry = {"file": str(option), "sha256": hashlib.sha256(content).hexdigest()}
        if knob.via == "gateway" and knob.mode != "replace":
            entry = {"value": entry, "mode": knob.mode}
        if knob.models is not None:
            if routed is not None:
                if not model_matches(knob.models, *routed):
                    continue
            else:
                entry = {"value": entry, "models": sorted(knob.models)}
        material[name] = entry
    return material


def _fingerprint(spec: ExperimentSpec, settings: dict[str, Any]) -> str:
    material = effective_settings(spec, settings)
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:12]


def make_variant(spec: ExperimentSpec, settings: dict[str, Any]) -> Variant:
    knobs = spec.knobs
    if settings and all(o is None for o in settings.values()) and any(None not in knobs[n].options for n in settings):
        name = NO_KNOBS
    else:
        differing = [f"{n}={knobs[n].label(o)}" for n, o in settings.items() if o != knobs[n].options[0]]
        name = ",".join(differing) if differing else BASELINE
    return Variant(name=name, settings=dict(settings), hash=_fingerprint(spec, settings))


def baseline(spec: ExperimentSpec) -> Variant:
    return make_variant(spec, {name: knob.options[0] for name, knob in spec.knobs.items()})


def no_knobs(spec: ExperimentSpec) -> Variant:
    """Every knob left alone: the agent as it runs without agl's knobs (the baseline, when every knob starts with
    `null`)."""
    return make_variant(spec, dict.fromkeys(spec.knobs))


def grid(spec: ExperimentSpec) -> list[Variant]:
    names = list(spec.knobs)
    combos = itertools.product(*(spec.knobs[n].options for n in names))
    return [make_variant(spec, dict(zip(names, combo, strict=True))) for combo in combos]


def distinct(variants: list[Variant]) -> tuple[list[Variant], list[tuple[Variant, Variant]]]:
    """The variants with one per hash, in order, and each one left out with the variant that does the same (a knob
    that applies to none of its models, an option that repeats the baseline's)."""
    kept: dict[str, Variant] = {}
    same: list[tuple[Variant, Variant]] = []
    for variant in variants:
        if variant.hash in kept:
            if variant.name != kept[variant.hash].name:
                same.append((variant, kept[variant.hash]))
            continue
        kept[variant.hash] = variant
    return list(kept.values()), same


def _shown(label: str) -> str:
    return json.dumps(label) if any(c in label for c in ", =") or not label else label


def _pairs(spec: ExperimentSpec, text: str) -> list[tuple[str, str]]:
    """`knob=option[,knob=option]` split at the commas that start another `knob=`, so an option may hold commas."""
    starts = [0] + [i + 1 for i, ch in enumerate(text)
                    if ch == "," and any(text.startswith(f"{knob}=", i + 1) for knob in spec.knobs)]
    parts = [text[a:b - 1] for a, b in zip(starts, starts[1:], strict=False)] + [text[starts[-1]:]]
    pairs = []
    for part in parts:
        if "=" not in part:
            raise UsageError(f"--variant {text!r}: expected `baseline`, `{NO_KNOBS}` or knob=option pairs joined by "
                             "commas")
        name, raw = (s.strip() for s in part.split("=", 1))
        if name not in spec.knobs:
            known = ", ".join(spec.knobs) or "none"
            raise UsageError(f"--variant {text!r}: no knob named {name!r}; the spec's knobs are: {known}")
        pairs.append((name, raw))
    return pairs


def _option(knob: KnobSpec, raw: str) -> tuple[bool, Any]:
    """(found, option) for what was typed: a label, `null`/`unset` for the knob left alone, a value or a path."""
    for option, label in zip(knob.options, knob.labels(), strict=True):
        if raw == label:
            return True, option
    if raw in ("null", "unset") and None in knob.options:
        return True, None
    for option in knob.options:
        if option is not None and raw == str(option):
            return True, option
    try:
        typed = json.loads(raw)
    except json.JSONDecodeError:
        return False, None
    same = [o for o in knob.options if o is not None and o == typed]
    return (True, same[0]) if same else (False, None)


def parse_variant(spec: ExperimentSpec, text: str) -> Variant:
    """`baseline`, `no-knobs`, or `knob=option[,knob=option]` where an option is named by its label (short name,
    file stem, value as written, `unset`), its value or its file's path."""
    if text == BASELINE:
        return baseline(spec)
    if text == NO_KNOBS:
        return no_knobs(spec)
    settings = {name: knob.options[0] for name, knob in spec.knobs.items()}
    chosen: set[str] = set()
    for name, raw in _pairs(spec, text):
        if name in chosen:
            raise UsageError(f"--variant {text!r}: knob {name!r} is set twice")
        chosen.add(name)
        knob = spec.knobs[name]
        found, option = _option(knob, raw)
        if not found:
            stray = [p.split("=", 1)[0].strip() for p in raw.split(",") if "=" in p]
            unknown = [s for s in stray if s not in spec.knobs]
            if unknown:
                raise UsageError(f"--variant {text!r}: no knob named {unknown[0]!r}; the spec's knobs are: "
                                 + ", ".join(spec.knobs))
            choices = ", ".join(_shown(label) for label in knob.labels())
            raise UsageError(
                f"--variant {text!r}: {raw!r} is not an option of knob {name!r}; its options are named: {choices}",
                hint="an option is named by its short name, its file's stem or its value as written (`unset` for "
                "`null`); give options short names in agl.yaml, e.g. values: {vote3: \"a,b,c\"}",
            )
        settings[name] = option
    return make_variant(spec, settings)
