"""Runs an agent given as `module:function` in its own process: `python -m agl_cli.evaluation.entry_agent MOD:FN TASK OUT`.

The function takes the task (a dict) and returns its output (a string, or anything JSON-serialisable).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def import_entry(entry: str, folder: Path | str) -> Callable[..., Any]:
    """The function an `entry:` names (`module:function`), imported with `folder` (the project's) on sys.path: one
    loader for entry agents, entry graders in agl's process and entry graders in a process of their own."""
    module_name, _, function_name = entry.partition(":")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    function = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(function):
        raise AttributeError(f"{module_name} has no function {function_name!r}")
    return function


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m agl_cli.evaluation.entry_agent module:function TASK_FILE OUTPUT_FILE", file=sys.stderr)
        return 2
    entry, task_file, output_file = argv
    function = import_entry(entry, os.getcwd())
    task = json.loads(Path(task_file).read_text())
    result = function(task)
    text = result if isinstance(result, str) else json.dumps(result)
    Path(output_file).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
