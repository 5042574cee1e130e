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
    # The split is 20/40/40 already: no advice to make it 20/40/40.
    assert "val has 60 tasks" in text and "20/40/40" not in text and "more tasks (not a larger share)" in text


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


def _fractions_project(folder: Path, tickets: list[dict[str, Any]], split: dict[str, Any]) -> Path:
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tickets))
    (folder / "agl.yaml").write_text(yaml.safe_dump({
        "agent": {"command": "python agent.py {task_file} {output_file}"},
        "tasks": {"path": "tasks.jsonl", "split": split},
        "grader": {"command": "python grade.py {task_file} {output_file}"}}))
    return folder / "agl.yaml"


def test_a_larger_share_is_advised_only_to_a_split_that_lacks_one(tmp_path: Path) -> None:
    tickets = [{k: v for k, v in t.items() if k != "split"} for t in _tickets(shared_subjects=0, near_copy=False)]
    usual = _fractions_project(tmp_path, tickets, {"fractions": {"train": 0.6, "val": 0.2, "test": 0.2}})
    assert "give val and test a larger share (e.g. 20/40/40" in _check(usual)["advice"]
    larger = _fractions_project(tmp_path, tickets, {"fractions": {"train": 0.2, "val": 0.4, "test": 0.4}})
    advice = _check(larger)["advice"]
    assert "larger share" not in advice.replace("not a larger share", "") and "20/40/40" not in advice
    assert "val and test already hold 40% and 40% of the tasks" in advice


def _dated_tickets() -> list[dict[str, Any]]:
    """48 different tickets that share what every ticket system adds: a date (12 days), a time, a customer id, an
    order number, a priority. Subjects and bodies are each ticket's own."""
    rng = random.Random(11)
    words = WORDS + ["broken", "screen", "late", "wrong", "size", "colour", "missing", "item", "box", "email",
                     "phone", "number", "update", "app", "crash", "slow", "payment", "failed", "twice", "bank"]
    tickets = []
    for i in range(48):
        day = 1 + i % 12
        tickets.append({
            "id": f"TCK-{1000 + i}", "created": f"2024-03-{day:02d} 09:{i:02d}",
            "received": f"Tuesday, March {day} 2024", "customer": f"CUST-{i % 7:05d}", "order": 48210 + i,
            "priority": rng.choice(["low", "normal", "high"]),
            "subject": " ".join(rng.sample(words, 4)), "body": " ".join(rng.choice(words) for _ in range(12)),
        })
    return tickets


def test_dates_ids_and_numbers_do_not_make_tickets_alike(tmp_path: Path) -> None:
    tickets = _dated_tickets()
    spec = _fractions_project(tmp_path, tickets, {"fractions": {"train": 0.6, "val": 0.2, "test": 0.2}, "seed": 3})
    found = _check(spec)["near_duplicates"]
    assert "created" not in found["fields_checked"] and "received" not in found["fields_checked"]
    assert found["tasks_with_a_near_duplicate"] == {} and found["similar_text_total"] == 0
    # Two tickets the same but for their numbers and dates are still alike: numbers tell apart, never match.
    from agl_cli.spec.near_duplicates import clusters
    from agl_cli.spec.schema import load_spec
    from agl_cli.spec.tasks import load_tasks

    copy = dict(tickets[0], id="TCK-2000", created="2024-04-30 17:55", received="Tuesday, April 30 2024", order=1)
    copy["body"] = tickets[0]["body"] + " order 99812 ref 2024/77"
    spec = _fractions_project(tmp_path, [*tickets, copy], {"fractions": {"train": 0.5, "val": 0.5}, "seed": 0})
    groups = clusters(load_tasks(load_spec(spec)), skip={"id"})
    assert [g for g in groups if len(g) > 1] == [["TCK-1000", "TCK-2000"]]


def _same_split(spec: Path, a: str, b: str) -> bool:
    from agl_cli.spec.schema import load_spec
    from agl_cli.spec.tasks import load_tasks

    split = {t.id: t.split for t in load_tasks(load_spec(spec))}
    return split[a] == split[b]


def test_a_split_grouped_by_a_field_keeps_each_value_in_one_split(tmp_path: Path) -> None:
    from agl_cli.spec.schema import load_spec
    from agl_cli.spec.tasks import load_tasks

    tickets = _dated_tickets()
    split = {"fractions": {"train": 0.5, "val": 0.25, "test": 0.25}, "seed": 1, "group_by": "customer"}
    spec = load_spec(_fractions_project(tmp_path, tickets, split))
    first = {t.id: t.split for t in load_tasks(spec)}
    by_customer: dict[str, set[str | None]] = {}
    for t in load_tasks(spec):
        by_customer.setdefault(t.data["customer"], set()).add(t.split)
    assert all(len(splits) == 1 for splits in by_customer.values()) and len(by_customer) == 7
    assert set(first.values()) == {"train", "val", "test"}
    assert first == {t.id: t.split for t in load_tasks(load_spec(tmp_path / "agl.yaml"))}  # the same every time
    reseeded = load_spec(_fractions_project(tmp_path, tickets, {**split, "seed": 2}))
    assert {t.id: t.split for t in load_tasks(reseeded)} != first
    # A task without the field: the file, the line and the fix.
    del tickets[5]["customer"]
    result = CliRunner().invoke(app, ["tasks", str(_fractions_project(tmp_path, tickets, split))])
    assert result.exit_code == 2 and "tasks.jsonl:6: task 'TCK-1005' has no 'customer' field" in result.output


def test_agl_tasks_offers_a_split_grouped_by_near_duplicates_that_removes_them(tmp_path: Path) -> None:
    spec = _project(tmp_path, _tickets(shared_subjects=42, near_copy=True))
    doc = _check(spec)
    offer = doc["grouped_split"]
    # The shares of the split field it replaces (20/40/40), drawn by cluster.
    assert offer["split"] == {"fractions": {"train": 0.2, "val": 0.4, "test": 0.4}, "seed": 0,
                              "group_by": "near_duplicates"}
    assert offer["near_duplicates_across_splits"] == 0
    text = run_agl(["tasks", str(spec)], cwd=tmp_path, check=True).stdout
    lines = text.split("in agl.yaml,\n", 1)[1].split("  with it:", 1)[0]
    assert "group_by: near_duplicates" in lines and lines.startswith("  tasks:\n")
    # Those lines, pasted into agl.yaml as they are, give what the offer said.
    config = yaml.safe_load(spec.read_text())
    config["tasks"] = yaml.safe_load(lines)["tasks"]
    spec.write_text(yaml.safe_dump(config, sort_keys=False))
    after = _check(spec)
    assert after["splits"] == offer["splits"] and after["near_duplicates"]["tasks_with_a_near_duplicate"] == {}
    assert after["grouped_split"] is None
    # Every subject shared by a val and a test ticket now sits in one split, and so does the copied body.
    assert _same_split(spec, "va7", "te7") and _same_split(spec, "tr0", "te59")
