"""A virtualenv holding what a Dockerfile's install lines install, to run an image's commands without Docker.

The install lines are taken from the Dockerfile (tests/helpers/dockerfile.py), resolved with uv for Linux x86_64 and
Python 3.11 (what the images run), and installed at exactly the resolved versions. What only runs on a CUDA machine
cannot be installed here (vLLM's CUDA build, a CUDA torch with its `nvidia-*` libraries, kernels compiled against
that torch): those distributions are left out and listed in `excluded`. torch is the one everything imports, so the
venv borrows this interpreter's CPU torch through a `.pth` line placed after its own site-packages (the venv's own
packages always win, and only torch's files are visible there; nothing else of the test environment leaks in).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from tests.helpers.dockerfile import Image

# CUDA-only, or compiled against the CUDA torch 2.11 the GPU extra pins (a CPU torch 2.13 cannot load them).
_GPU_ONLY = re.compile(
    r"^(torch|vllm|triton|torchaudio|torchvision|torchcodec|torch-c-dlpack-ext|humming-kernels|quack-kernels|"
    r"tilelang|nvidia-.*|cuda-.*|flashinfer-.*|tokenspeed-.*|xformers)$"
)
# Borrowed from this interpreter when excluded: the CPU build of what the image has a CUDA build of.
_BORROWED = ("torch",)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
PLATFORM = ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"]


def gpu_only(name: str) -> bool:
    return bool(_GPU_ONLY.match(name.lower().replace("_", "-")))


@dataclass
class ImageVenv:
    root: Path
    resolved: dict[str, str] = field(default_factory=dict)  # every distribution the image's lines install
    excluded: dict[str, str] = field(default_factory=dict)  # of those, what this machine cannot install
    borrowed: dict[str, str] = field(default_factory=dict)  # stand-ins from this interpreter: name -> version

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        """An environment that finds the venv's commands first and nothing of the test's venv."""
        base = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
        path = [p for p in base.get("PATH", "").split(os.pathsep) if Path(sys.prefix) not in Path(p).parents]
        return {**base, "PATH": os.pathsep.join([str(self.bin), *path]), "VIRTUAL_ENV": str(self.root), **extra}


def _uv() -> list[str]:
    return [sys.executable, "-m", "uv"]


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def resolve(requirements: list[str], cwd: Path, *, no_deps: bool = False) -> dict[str, str]:
    """name -> version of everything `pip install [--no-deps] REQUIREMENTS` installs on the image's platform."""
    (cwd / "image.in").write_text("\n".join(requirements) + "\n")
    out = _run([*_uv(), "pip", "compile", *PLATFORM, "--no-header", "--no-annotate",
                *(["--no-deps"] if no_deps else []), "image.in"], cwd)
    pins: dict[str, str] = {}
    for line in out.splitlines():
        if (m := _PIN.match(line.strip())) is not None:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def build(image: Image, repo: Path, dest: Path) -> ImageVenv:
    """A venv at `dest` with what `image`'s install lines install (GPU-only distributions excepted)."""
    work = dest.parent / f"{dest.name}-build"
    work.mkdir(parents=True, exist_ok=True)
    context = image.stage_context(repo, work / "context")
    venv = ImageVenv(dest)
    local: list[str] = []  # the project itself, built from the copied context like the image builds it
    for install in image.pip_installs():
        args = [str(context / r[1:]) if r.startswith(".") else r for r in install.requirements]
        local += [a for a in args if a.startswith(str(context))]
        venv.resolved.update(resolve(args, work, no_deps=install.no_deps))
    venv.resolved.pop("agl", None)
    venv.excluded = {n: v for n, v in venv.resolved.items() if gpu_only(n)}
    pins = [f"{n}=={v}" for n, v in sorted(venv.resolved.items()) if n not in venv.excluded]
    _run([*_uv(), "venv", "--quiet", "--python", sys.executable, str(dest)], work)
    python = str(dest / "bin" / "python")
    _run([*_uv(), "pip", "install", "--quiet", "--python", python, "--no-deps", *pins,
          *{path.split("[")[0] for path in local}], work)
    _borrow(venv)
    return venv


def _borrow(venv: ImageVenv) -> None:
    """Make this interpreter's copy of each borrowed distribution (its files only) importable in the venv."""
    shelf = venv.root / "borrowed"
    shelf.mkdir(exist_ok=True)
    for name in _BORROWED:
        if name not in venv.excluded:
            continue
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        site = Path(str(dist.locate_file("")))
        for top in tops:
            link = shelf / top
            if not link.exists() and (site / top).exists():
                link.symlink_to(site / top)
        venv.borrowed[name] = dist.version
    site_packages = next((venv.root / "lib").glob("python3*/site-packages"))
    # A .pth line is appended to sys.path after site-packages: the venv's own distributions come first.
    (site_packages / "zz_borrowed.pth").write_text(str(shelf) + "\n")
