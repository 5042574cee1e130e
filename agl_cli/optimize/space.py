"""Which variants a study tries: the baseline, plus candidates from explicit `--variant`s, candidate files
(`--candidate prompts/v3.md` adds an option to a file-valued knob), the full grid, the grid of a few knobs with the
others at the baseline (`--across model,system_prompt`), or a seeded random sample of the grid.

The study's spec may differ from the file in two ways, both kept in the study's manifest: `--option knob=VALUE`
adds an option to a declared knob, and `--base knob=OPTION` makes a setting the study's baseline (the setting kept
so far), as if it were the knob's first option.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agl_cli.errors import UsageError
from agl_cli.spec.schema import ExperimentSpec, option_text
from agl_cli.spec.variants import Variant, baseline, grid, make_variant, parse_variant
from rl_backend.gateway.knobs import KNOBS


@dataclass(frozen=True)
class CandidateFile:
    knob: str
    path: str  # absolute

    def as_dict(self) -> dict[str, str]:
        return {"knob": self.knob, "path": self.path}


def parse_candidate(spec: ExperimentSpec, text: str, cwd: Path) -> CandidateFile:
    """`path` (the spec's only file-valued knob) or `knob=path`; the path is relative to where agl runs."""
    file_knobs = [name for name, knob in spec.knobs.items() if knob.files is not None]
    knob_name, _, raw = text.rpartition("=") if "=" in text else ("", "", text)
    if knob_name:
        if knob_name not in spec.knobs or spec.knobs[knob_name].files is None:
            raise UsageError(
                f"--candidate {text!r}: {knob_name!r} is not a file-valued knob of the spec",
                hint=f"file-valued knobs: {', '.join(file_knobs) or 'none'}",
            )
    elif len(file_knobs) == 1:
        knob_name = file_knobs[0]
    else:
        raise UsageError(
            f"--candidate {text!r}: the spec has {len(file_knobs)} file-valued knobs; say which: knob=path",
            hint=f"file-valued knobs: {', '.join(file_knobs) or 'none (declare one with `files:` in agl.yaml)'}",
        )
    path = Path(raw).expanduser()
    path = path if path.is_absolute() else cwd / path
    if not path.is_file():
        raise UsageError(f"--candidate {text!r}: {path} does not exist")
    return CandidateFile(knob_name, str(path.resolve()))


def with_candidates(spec: ExperimentSpec, candidates: list[CandidateFile]) -> ExperimentSpec:
    """A copy of the spec whose file-valued knobs also offer the candidate files (after their own options)."""
    working = spec.model_copy(deep=True)
    working.base_dir = spec.base_dir
    for candidate in candidates:
        knob = working.knobs[candidate.knob]
        assert knob.files is not None
        known = {str(working.resolve(f).resolve()) for f in knob.option_files()}
        if candidate.path not in known:
            knob.add_file(candidate.path)
    return working


@dataclass(frozen=True)
class ExtraOption:
    """An option `--option knob=VALUE` adds to a declared knob: a value, or a file's absolute path."""

    knob: str
    value: Any

    def as_dict(self) -> dict[str, Any]:
        return {"knob": self.knob, "value": self.value}


def parse_option(spec: ExperimentSpec, text: str, cwd: Path) -> ExtraOption:
    """`knob=VALUE`: a value read as YAML (`temperature=0.7` is a number) unless the knob's options are all strings,
    or for a file-valued knob a path relative to where agl runs; checked as the spec checks the knob's own options."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise UsageError(f"--option {text!r}: expected knob=VALUE, e.g. --option model=openai/gpt-4.1")
    if name not in spec.knobs:
        raise UsageError(f"--option {text!r}: no knob named {name!r}; the spec's knobs are: "
                         f"{', '.join(spec.knobs) or 'none'}", hint="declare the knob under `knobs:` in agl.yaml")
    knob = spec.knobs[name]
    if knob.files is not None:
        path = Path(raw).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.is_file():
            raise UsageError(f"--option {text!r}: {path} does not exist")
        return ExtraOption(name, str(path.resolve()))
    value: Any = raw
    if not all(isinstance(o, str) for o in knob.options):  # a knob of strings keeps `no` or `1.0` as typed
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
    if knob.via == "gateway" and name in KNOBS:
        try:
            value = KNOBS[name].check(value)
        except ValueError as exc:
            raise UsageError(f"--option {text!r}: {exc}") from None
    if name == "model" and knob.via == "gateway" and spec.upstreams:
        upstream = str(value).partition("/")[0]
        if upstream not in spec.upstreams:
            raise UsageError(f"--option {text!r}: upstream {upstream!r} is not declared under `upstreams:` "
                             f"({', '.join(spec.upstreams)})")
    return ExtraOption(name, value)


def with_options(spec: ExperimentSpec, extra: list[ExtraOption]) -> ExperimentSpec:
    """A copy of the spec whose knobs also offer the extra options (after their own)."""
    working = spec.model_copy(deep=True)
    working.base_dir = spec.base_dir
    for option in extra:
        knob = working.knobs[option.knob]
        if knob.files is not None:
            if option.value not in {str(working.resolve(f).resolve()) for f in knob.option_files()}:
                knob.add_file(option.value)
        elif knob.values is not None and option.value not in knob.options:
            if isinstance(knob.values, dict):  # short names: the extra option is named as it was typed
                knob.values[option_text(option.value)] = option.value
            else:
                knob.values.append(option.value)
    return working


def with_base(spec: ExperimentSpec, text: str | None) -> ExperimentSpec:
    """A copy of the spec whose knobs list the `--base` setting first, so it is the study's baseline (what the
    search is judged against and confirmed against) and variant names say what differs from it."""
    if not text:
        return spec
    try:
        chosen = parse_variant(spec, text)
    except UsageError as exc:
        raise UsageError(str(exc).replace("--variant", "--base", 1), hint=exc.hint) from None
    working = spec.model_copy(deep=True)
    working.base_dir = spec.base_dir
    for name, option in chosen.settings.items():
        knob = working.knobs[name]
        if knob.files is not None:
            knob.files = [option, *(f for f in knob.files if f != option)]
        elif knob.values is not None:
            knob.values = [option, *(v for v in knob.values if v != option)]
    return working


def across(spec: ExperimentSpec, knob_names: list[str]) -> list[Variant]:
    """Every combination of the named knobs' options, the other knobs at the baseline."""
    unknown = [k for k in knob_names if k not in spec.knobs]
    if unknown:
        raise UsageError(f"--across {','.join(knob_names)}: no knob named {unknown[0]!r}; the spec's knobs are: "
                         f"{', '.join(spec.knobs) or 'none'}")
    base = baseline(spec).settings
    combos = itertools.product(*(spec.knobs[n].options for n in knob_names))
    return [make_variant(spec, {**base, **dict(zip(knob_names, combo, strict=True))}) for combo in combos]


def _unique(variants: list[Variant]) -> list[Variant]:
    """One variant per hash, in order; two different variants that got the same name get a hash suffix."""
    by_hash: dict[str, Variant] = {}
    names: set[str] = set()
    for variant in variants:
        if variant.hash in by_hash:
            continue
        if variant.name in names:
            variant = Variant(f"{variant.name}@{variant.hash[:6]}", variant.settings, variant.hash)
        names.add(variant.name)
        by_hash[variant.hash] = variant
    return list(by_hash.values())


def build_variants(
    spec: ExperimentSpec,
    *,
    explicit: list[str],
    candidates: list[CandidateFile],
    use_grid: bool,
    sample: int | None,
    sample_seed: int,
    across_knobs: list[str] | None = None,
) -> list[Variant]:
    """The baseline first, then the candidates. With no source named, the spec's whole grid."""
    base = baseline(spec)
    chosen: list[Variant] = [base]
    if across_knobs:
        chosen += across(spec, across_knobs)
    chosen += [parse_variant(spec, text) for text in explicit]
    for candidate in candidates:
        settings = dict(base.settings)
        settings[candidate.knob] = candidate.path
        chosen.append(make_variant(spec, settings))
    if sample is not None:
        if sample < 1:
            raise UsageError(f"--sample must be at least 1, got {sample}")
        pool = [v for v in grid(spec) if v.hash != base.hash]
        chosen += random.Random(sample_seed).sample(pool, min(sample, len(pool)))
    if use_grid or not (explicit or candidates or sample is not None or across_knobs):
        chosen += grid(spec)
    return _unique(chosen)


def variants_from_manifest(spec: ExperimentSpec, recorded: list[dict[str, Any]]) -> list[Variant]:
    """The study's variants again, refusing any whose content changed (a prompt file edited since)."""
    variants = []
    for entry in recorded:
        variant = make_variant(spec, entry["settings"])
        if variant.hash != entry["hash"]:
            raise UsageError(
                f"variant {entry['name']} is no longer what it was (a prompt file or knob changed)",
                hint="resuming would mix two different variants; start a new study (finished rollouts that still "
                "apply are reused from the cache)",
            )
        variants.append(Variant(entry["name"], variant.settings, variant.hash))
    return variants
