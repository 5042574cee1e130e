"""Grade one extraction: the share of the six fields the agent got right (field-level accuracy, 0.0 to 1.0).

    python grade.py TASK_FILE OUTPUT_FILE     # prints {"score": 0.83, "fields": {"vendor": true, ...}, ...}

The output is the JSON object the agent submitted. Comparisons forgive what does not change meaning: case, spaces
and punctuation in names and invoice numbers, a number given as a string, cents below 0.005. Dates must be
ISO (YYYY-MM-DD); a due date that the document does not give must be null. `grade(task, output)` does the same
for agl's `entry:` form.
"""

import json
import re
import sys
from pathlib import Path

FIELDS = ("vendor", "invoice_number", "issue_date", "due_date", "total", "currency")


def _name(value: object) -> str:
    return " ".join(re.sub(r"[^\w&]+", " ", str(value)).lower().split())


def _number(value: object) -> float | None:
    try:
        return float(str(value).replace(",", "")) if value is not None else None
    except ValueError:
        return None


def same(field: str, got: object, expected: object) -> bool:
    """Whether one field is right."""
    if expected is None or got is None:
        return expected is None and got in (None, "", "null")
    if field == "total":
        number = _number(got)
        return number is not None and abs(number - float(expected)) < 0.005
    if field in ("vendor", "invoice_number"):
        return _name(got).replace(" ", "") == _name(expected).replace(" ", "")
    return str(got).strip().upper() == str(expected).upper()


def grade(task: dict, output: str) -> dict:
    """Field-level accuracy of `output` (a JSON object) against `task["expected"]`."""
    try:
        got = json.loads(output) if output.strip() else {}
    except ValueError:
        got = {}
    if not isinstance(got, dict):
        got = {}
    expected = task["expected"]
    fields = {f: same(f, got.get(f), expected.get(f)) for f in FIELDS}
    wrong = {f: {"got": got.get(f), "expected": expected.get(f)} for f, ok in fields.items() if not ok}
    return {"score": round(sum(fields.values()) / len(FIELDS), 4), "fields": fields, "wrong": wrong}


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python grade.py TASK_FILE OUTPUT_FILE")
    task = json.loads(Path(sys.argv[1]).read_text())
    output_path = Path(sys.argv[2])
    print(json.dumps(grade(task, output_path.read_text() if output_path.exists() else "")))


if __name__ == "__main__":
    main()
