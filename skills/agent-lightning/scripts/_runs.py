"""Shared by the skill's scripts: read agl runs through agl's own JSON output (never the run store's files, whose
format is agl's own), and print JSON. Standard library only; `agl` must be on PATH (the virtualenv agl is installed
in).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, NoReturn

TERMINAL = ("succeeded", "failed", "timed_out")


def fail(message: str, code: int = 2) -> NoReturn:
    """Errors go to stderr as JSON too, so a calling agent can parse every outcome."""
    sys.stderr.write(json.dumps({"error": message}) + "\n")
    raise SystemExit(code)


def _error_text(stderr: str) -> str:
    """agl's `error: ...` and `hint: ...` lines, as one message."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith(("error:", "hint:"))] or lines[-3:]
    return "; ".join(said).removeprefix("error:").strip()


def agl(*args: str) -> Any:
    """The JSON document agl prints for these arguments plus --json. agl's usage errors (a run that does not
    exist, an ambiguous prefix, a bad option value) are this script's (exit 2), with agl's message."""
    exe = shutil.which("agl")
    if exe is None:
        fail("agl is not on PATH: activate the virtualenv agl is installed in (or install agl) and run this again")
    result = subprocess.run([exe, *args, "--json"], capture_output=True, text=True, check=False,
                            env={**os.environ, "NO_COLOR": "1"})
    if result.returncode != 0:
        fail(_error_text(result.stderr) or f"agl {args[0]} exited with status {result.returncode}",
             2 if result.returncode == 2 else 1)
    try:
        return json.loads(result.stdout)
    except ValueError:
        fail(f"agl {args[0]} printed no JSON document", 1)


def runs_dir_args(runs_dir: str | None) -> list[str]:
    return ["--runs-dir", os.path.expanduser(runs_dir)] if runs_dir else []


def clip(text: Any, limit: int) -> Any:
    """Long text keeps its head and its tail, where errors and final answers usually are."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return text[:half] + f"\n... [{len(text) - 2 * half} characters cut] ...\n" + text[-half:]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def emit(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
