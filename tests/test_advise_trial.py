"""`agl advise` on what two trials ran into: a text readable at 100 columns and in a pipe; the chain of kept
baselines that left out an earlier kept gain; seeds advised for an API that returns the same reply on every repeat;
training called for when the failures left were missing knowledge; an undecided change that leaned better and was
dropped; and the projection against what an experiment budget has left. Fixture stores (RunStore), real `agl`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agl_cli.main import app
from tests.helpers import run_agl
from tests.test_advise import R1, R2, R3, _journal, _plateau, _rewrite, add_run, advise_json, ready, statuses

__all__ = ["ready"]  # the fixture, used by name


def criterion(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in doc["criteria"] if c["id"] == name)
    return found


def test_the_text_fits_100_columns_in_a_pipe_and_on_a_narrow_terminal(ready: Path) -> None:
    piped = run_agl(["advise", str(ready)], cwd=ready.parent, env={"COLUMNS": "300"})
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert "verdict: train" in piped.stdout and "measured: " in piped.stdout and "needs: " in piped.stdout
    # Every measured value is there in full, only wrapped: the words of one criterion's detail, in order.
    detail = criterion(advise_json(str(ready)), "open_weight_model")["detail"]
    assert " ".join(detail.split()) in " ".join(piped.stdout.split())
    narrow = CliRunner().invoke(app, ["advise", str(ready)], env={"COLUMNS": "60"}, terminal_width=60)
    assert narrow.exit_code == 0 and max(len(line) for line in narrow.stdout.splitlines()) <= 100


def test_the_chain_keeps_an_earlier_kept_gain(ready: Path) -> None:
    # +12.5 kept (v2 on R1); +5 kept on top of it (R2); then +28.6 kept, measured against v2 on R1 again: that chain
    # is +12.5 then +28.6, not +28.6 alone because the attempt before it was measured elsewhere.
    _journal(ready.parent, [(0.125, R1, "baseline", R1, "system_prompt=v2"), (0.05, R1, "system_prompt=v2", R2, "baseline"),
                            (0.286, R1, "system_prompt=v2", R3, "baseline")])
    plateau = _plateau(ready)
    assert plateau["status"] == "fail" and plateau["value"] == pytest.approx(0.411)
    assert "they gained +41.1 points along the chain of kept baselines" in plateau["detail"]
    assert "since the first baseline +41.1 points along it (+12.5 points journal: attempt 0, +28.6 points journal: " \
           "attempt 2)" in plateau["detail"]


def test_a_gain_before_the_window_is_part_of_the_chain_not_of_the_plateau(ready: Path) -> None:
    entries: list[tuple[float, str, str, str, str]] = [(0.125, R1, "baseline", R1, "v2")]
    entries += [(0.005, R2, "baseline", R2, f"v{i}") for i in (3, 4, 5)]  # small gains, each on the new default
    _journal(ready.parent, entries)
    plateau = _plateau(ready)
    assert plateau["value"] == pytest.approx(0.005)  # the last 3 gained +0.5 each, measured on the same baseline
    assert "since the first baseline +13.0 points" in plateau["detail"]


def test_no_seeds_advised_for_an_api_that_repeats_itself(ready: Path) -> None:
    """The trial's API returned the same reply on every repeat: more seeds would buy the same answers again."""
    root = ready.parent / ".agl" / "runs"
    for run in root.iterdir():
        if json.loads((run / "manifest.json").read_text())["kind"] == "eval":
            (run / "store.sqlite").unlink()
    add_run(root, ready, rewards={f"t{i}": [float(i % 2)] * 4 for i in range(5)},
            output=lambda task, seed, reward: f"the same reply to {task}")
    headroom = criterion(advise_json(str(ready)), "headroom")
    assert headroom["status"] == "fail"
    assert "returned the same output every time" in headroom["detail"]
    assert "--seeds" not in headroom["hint"] and "deterministic" in headroom["hint"]


def test_with_no_repeats_the_advice_is_to_check_that_they_vary_first(ready: Path) -> None:
    root = ready.parent / ".agl" / "runs"
    for run in root.iterdir():
        if json.loads((run / "manifest.json").read_text())["kind"] == "eval":
            (run / "store.sqlite").unlink()
    add_run(root, ready, rewards={f"t{i}": [float(i % 2)] for i in range(30)})
    headroom = criterion(advise_json(str(ready)), "headroom")
    assert headroom["status"] == "unknown"
    assert headroom["hint"].startswith("check that repeats of a task vary first") and "--seeds 2" in headroom["hint"]
    assert "temperature: {values: [0.0, 0.7], via: gateway}" in headroom["hint"]  # the spec has no such knob yet


def test_missing_knowledge_is_not_what_training_fixes(ready: Path) -> None:
    """The embedded trial: the failures left under the best prompt were one-word answers, well-formed, wrong, on
    words the model never got right in any sample."""
    root = ready.parent / ".agl" / "runs"
    add_run(root, ready, created_at=1300.0, split="val",
            rewards={f"v{i}": [1.0 if i < 30 else 0.0] for i in range(40)},
            output=lambda task, seed, reward: "apple" if reward else "pear")
    doc = advise_json(str(ready))
    failures = criterion(doc, "remaining_failures")
    assert failures["status"] == "fail" and doc["verdict"] == "not yet"
    assert failures["value"]["wrong_content"] == 10 and failures["value"]["pass_rate"] == 0.75
    assert failures["value"]["trainable_share"] == 0.0
    assert "does not add facts" in failures["hint"] and "retrieval" in failures["hint"]


def test_behaviour_failures_are_what_training_can_fix(ready: Path) -> None:
    root = ready.parent / ".agl" / "runs"
    add_run(root, ready, created_at=1300.0, split="val",
            rewards={f"v{i}": [1.0 if i < 30 else 0.0] for i in range(40)},
            output=lambda task, seed, reward: "apple" if reward else "The answer is probably a fruit of some kind.")
    failures = criterion(advise_json(str(ready)), "remaining_failures")
    assert failures["status"] == "pass" and failures["value"]["another_form"] == 10


def test_an_undecided_change_that_leans_better_is_listed_not_dropped(ready: Path) -> None:
    entry = {"time": 3000.0, "change": "prompt v3: examples from train", "lever": "prompt", "levers": ["prompt"],
             "verdict": "no detectable difference", "difference": 0.069, "ci95": [-0.007, 0.153], "n_tasks": 48,
             "split": "val", "decision": "reverted",
             "more_evidence": {"likely_better_unproven": True, "splits": [
                 {"split": "train", "tasks": 24, "role": "evidence"}, {"split": "test", "tasks": 48,
                                                                       "role": "confirmation"}],
                 "pooled_tasks": 72, "tasks_likely_needed": 160, "commands": []}}
    with (ready.parent / ".agl" / "journal.jsonl").open("a") as journal:
        journal.write(json.dumps(entry) + "\n")
    doc = advise_json(str(ready))
    (item,) = doc["undecided"]
    assert item["change"] == "prompt v3: examples from train" and item["pooled_tasks"] == 72
    text = CliRunner().invoke(app, ["advise", str(ready)]).stdout
    assert "likely better, unproven: prompt v3: examples from train (reverted): +6.9 points [-0.7, +15.3] at n=48" \
        in " ".join(text.split())
    assert "train (24 tasks)" in text


def test_the_projection_fits_what_an_experiment_budget_left(ready: Path) -> None:
    # The fixture's runs started 80 rollouts; training would start 400.
    _rewrite(ready, budget={"rollouts": 450})
    assert criterion(advise_json(str(ready)), "projection")["status"] == "pass"
    _rewrite(ready, budget={"rollouts": 450, "scope": "experiment"})
    projection = criterion(advise_json(str(ready)), "projection")
    assert projection["status"] == "fail" and "budget.rollouts left 370" in projection["threshold"]
    assert statuses(advise_json(str(ready)))["projection"] == "fail"
