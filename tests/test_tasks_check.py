"""`agl tasks CONFIG`: split sizes and near-duplicate tasks across splits. The trial's task set: 150 tickets split
20/40/40, where 42 of the 60 test tickets share a subject line with a val ticket; plus a test ticket whose body
nearly copies a train ticket's. Labels, shared by design, are never counted."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.main import app
from tests.helpers import run_agl

WORDS = ["refund", "parcel", "login", "invoice", "password", "courier", "charge", "account", "address", "delivery",
         "card", "code"]


def _body(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(25))


def _tickets(shared_subjects: int, near_copy: bool) -> list[dict[str, Any]]:
    rng = random.Random(7)
    tickets = [{"id": f"tr{i}", "split": "train", "subject": f"Train question about topic {i}", "body": _body(rng)}
               for i in range(30)]
    tickets += [{"id": f"va{i}", "split": "val", "subject": f"Val ticket about issue {i}", "body": _body(rng)}
                for i in range(60)]
    for i in range(60):
        # A repeated subject differs only in case and punctuation, as forwarded tickets do.
        subject = f"VAL ticket about issue {i}!" if i < shared_subjects else f"Test ticket about case {i}"
        tickets.append({"id": f"te{i}", "split": "test", "subject": subject, "body": _body(rng)})
    if near_copy:
        words = tickets[0]["body"].split()
        tickets[-1]["body"] = " ".join(words[:-1] + ["zebra"])  # the train ticket's body, one word changed
    for t in tickets:
        t["label"] = rng.choice(["billing", "account_access", "shipping"])
    return tickets


def _project(folder: Path, tickets: list[dict[str, Any]]) -> Path:
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tickets))
    (folder / "agl.yaml").write_text(yaml.safe_dump({
        "agent": {"command": "python agent.py {task_file} {output_file}"},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"command": "python grade.py {task_file} {output_file}"}}))
    return folder / "agl.yaml"


def _check(spec: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["tasks", str(spec), "--json", *args])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_shared_subject_lines_and_near_copies_are_flagged(tmp_path: Path) -> None:
    spec = _project(tmp_path, _tickets(shared_subjects=42, near_copy=True))
    doc = _check(spec)
    assert doc["splits"] == {"test": 60, "train": 30, "val": 60}
    found = doc["near_duplicates"]
    assert "subject" in found["fields_checked"] and "label" not in found["fields_checked"]
    assert found["in_each_other_split"]["test"] == {"train": 1, "val": 42}
    assert found["tasks_with_a_near_duplicate"]["test"] == 43 and found["tasks_with_a_near_duplicate"]["val"] == 42
    (pair,) = found["similar_text"]
    assert {pair["a"], pair["b"]} == {"tr0", "te59"} and 0.8 <= pair["similarity"] < 1.0

    text = run_agl(["tasks", str(spec)], cwd=tmp_path, check=True).stdout  # piped, as an agent reads it
    assert "test: 43 of 60 tasks nearly repeat a task of another split (1 one of train, 42 one of val)" in text
    assert "val has 60 tasks" in text and "20/40/40" in text


def test_a_clean_task_set_has_no_near_duplicates(tmp_path: Path) -> None:
    found = _check(_project(tmp_path, _tickets(shared_subjects=0, near_copy=False)))["near_duplicates"]
    assert found["tasks_with_a_near_duplicate"] == {} and found["shared_values_total"] == 0
    assert found["similar_text_total"] == 0


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    spec = _project(tmp_path, _tickets(shared_subjects=0, near_copy=False))
    assert CliRunner().invoke(app, ["tasks", str(spec), "--threshold", "0"]).exit_code == 2
    assert CliRunner().invoke(app, ["tasks", str(tmp_path / "missing.yaml")]).exit_code == 2


@pytest.mark.parametrize("field", ["subject", "body"])
def test_field_restricts_the_shared_value_check(tmp_path: Path, field: str) -> None:
    found = _check(_project(tmp_path, _tickets(shared_subjects=42, near_copy=False)), "--field", field)
    assert found["near_duplicates"]["fields_checked"] == [field]
    assert found["near_duplicates"]["tasks_with_a_near_duplicate"].get("test", 0) == (42 if field == "subject" else 0)
