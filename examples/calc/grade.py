"""Grade one calc answer: the last number in the output must equal the task's integer answer.

    python grade.py TASK_FILE OUTPUT_FILE     # prints {"score": 1.0 | 0.0, "expected": ..., "got": ...}

`grade(task, output)` does the same for agl's `entry: "grade:grade"` form.
"""

import json
import re
import sys
from pathlib import Path

NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def parse_number(text: str) -> float | None:
    """The last number in `text` (commas and a trailing .0 allowed), or None."""
    numbers = NUMBER.findall(text or "")
    return float(numbers[-1].replace(",", "")) if numbers else None


def grade(task: dict, output: str) -> dict:
    """Score 1.0 when the last number in `output` equals `task["answer"]`, else 0.0."""
    got = parse_number(output)
    expected = task["answer"]
    score = 1.0 if got is not None and abs(got - float(expected)) < 1e-6 else 0.0
    shown = int(got) if got is not None and got.is_integer() else got
    return {"score": score, "expected": expected, "got": shown}


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python grade.py TASK_FILE OUTPUT_FILE")
    task = json.loads(Path(sys.argv[1]).read_text())
    output_path = Path(sys.argv[2])
    output = output_path.read_text() if output_path.exists() else ""
    print(json.dumps(grade(task, output)))


if __name__ == "__main__":
    main()
