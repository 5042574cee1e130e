"""`python -m agl_cli.evaluation.grade_entry MODULE:FUNCTION TASK_FILE OUTPUT_FILE`: an `entry:` grader in a process of its own.

In a cluster the trainer's process holds the controller's credentials (the gateway's admin token, the policy
servers' key, the ServiceAccount's token the Kubernetes client read): a grader imported into it could read them from
`os.environ` or its memory, and a grader that runs the agent's code (a coding task's tests) would hand them to the
agent. So there an `entry:` grader runs here instead, like a `command:` grader: with the environment agl gives
graders (its credentials removed), in the project's folder, printing what the function returned as JSON on stdout,
which agl reads as it reads a command grader's output (agl_cli/evaluation/grading.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agl_cli.evaluation.entry_agent import import_entry


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m agl_cli.evaluation.grade_entry MODULE:FUNCTION TASK_FILE OUTPUT_FILE", file=sys.stderr)
        return 2
    entry, task_file, output_file = argv
    try:
        function = import_entry(entry, Path.cwd())
    except AttributeError as exc:
        print(exc, file=sys.stderr)
        return 2
    task = json.loads(Path(task_file).read_text(encoding="utf-8"))
    output = Path(output_file).read_text(encoding="utf-8", errors="replace")
    result = function(task, output)
    sys.stdout.write("\n" + json.dumps(result, allow_nan=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
