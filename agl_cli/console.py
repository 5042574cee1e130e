"""Terminal output: data to stdout, progress and logs to stderr through rich; NO_COLOR and non-TTY honoured."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console


def stderr_console() -> Console:
    return Console(stderr=True, no_color="NO_COLOR" in os.environ, highlight=False, soft_wrap=True)


def stdout_console() -> Console:
    return Console(no_color="NO_COLOR" in os.environ, highlight=False, soft_wrap=True)


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
    sys.stdout.flush()


def fmt_ci(mean: float | None, ci: tuple[float, float] | list[float] | None, *, pct: bool = True) -> str:
    if mean is None:
        return "—"
    if pct:
        text = f"{100 * mean:.1f}%"
        return text if ci is None else f"{text} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    text = f"{mean:.3g}"
    return text if ci is None else f"{text} [{ci[0]:.3g}, {ci[1]:.3g}]"
