"""Runs an agent given as `module:function` in its own process: `python -m agl_cli.evaluation.entry_agent MOD:FN TASK OUT`.

The function takes the task (a dict) and returns its output (a string, or anything JSON-serialisable).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m agl_cli.evaluation.entry_agent module:function TASK_FILE OUTPUT_FILE", file=sys.stderr)
        return 2
    entry, task_file, output_file = argv
    module_name, function_name = entry.split(":", 1)
    sys.path.insert(0, os.getcwd())
    function = getattr(importlib.import_module(module_name), function_name)
    task = json.loads(Path(task_file).read_text())
    result = function(task)
    text = result if isinstance(result, str) else json.dumps(result)
    Path(output_file).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
