"""Which variants a study tries: the baseline, plus candidates from explicit `--variant`s, candidate files
(`--candidate prompts/v3.md` adds an option to a file-valued knob), the full grid, or a seeded random sample of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_cli.errors import UsageError
from agl_cli.spec import ExperimentSpec
from agl_cli.variants import Variant, baseline, grid, make_variant, parse_variant


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
) -> list[Variant]:
    """The baseline first, then the candidates. With no source named, the spec's whole grid."""
    base = baseline(spec)
    chosen: list[Variant] = [base]
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
    if use_grid or not (explicit or candidates or sample is not None):
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
