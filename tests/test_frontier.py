"""The user's volume and the frontier they choose from: `volume:` / `--volume`, cost per task and per month with
intervals (unknown stays unknown), the non-dominated set with its ends and decided steps, racing that keeps a
variant decidedly cheaper than every one that beats it, and the one command that re-tests levers under a kept
setting (`--base`, `--across`, `--option`).

The end-to-end test plays a user's project in small: a ticket-triage agent on a provider with two models at two
prices (tests/helpers/triage_provider.py, a stand-in whose answers depend on the model, the prompt and the ticket),
where a prompt lever helps the large model far more than the small one.
"""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from agl_cli.display import variant_table
from agl_cli.errors import UsageError
from agl_cli.metrics.cost import at_volume, cost_fields, difference_at_volume
from agl_cli.metrics.stats import Estimate
from agl_cli.metrics.variant import measure
from agl_cli.optimize.frontier import ends, frontier, members
from agl_cli.optimize.objectives import pareto_front
from agl_cli.optimize.racing import decide_round
from agl_cli.optimize.space import parse_option
from agl_cli.optimize.study import StudyOptions, prepare
from agl_cli.spec.schema import load_spec
from agl_cli.spec.volume import DAYS_PER_MONTH, parse_volume
from rl_backend.store.records import CallTotals, RewardSource, Rollout, RolloutStatus
from tests.helpers import FIXTURES, invoke_agl, run_agl, write_tasks
from tests.helpers.triage_provider import (
    BASIC_PROMPT,
    CAREFUL_PROMPT,
    KEY,
    TriageProvider,
    answer,
    make_tickets,
)

SMALL = {"input": 0.10, "output": 0.40}  # USD per 1M tokens, as the user's provider charges
LARGE = {"input": 2.00, "output": 8.00}
VOLUME = 40_000


# -- the volume ---------------------------------------------------------------------------------------------------


def test_volume_is_read_in_its_forms_and_a_bad_one_says_how_to_write_it(tmp_path: Path) -> None:
    assert parse_volume("40000/month").per_month == 40_000
    assert parse_volume("40,000 tasks per month").per_month == 40_000
    assert parse_volume("1300/day").per_month == pytest.approx(1300 * DAYS_PER_MONTH)
    assert parse_volume("12000/year").per_month == pytest.approx(1000)
    for bad, why in [("40000", "per what"), ("40000/fortnight", "not a period"), ("lots", "cannot read"),
                     ("0/month", "greater than 0")]:
        with pytest.raises(UsageError, match=why):
            parse_volume(bad)
    write_tasks(tmp_path / "tasks.jsonl", [{"id": "a"}])
    spec = {"agent": {"command": "true"}, "tasks": {"path": "tasks.jsonl"}, "grader": {"command": "echo 1"}}
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({**spec, "volume": "2500/week"}))
    assert load_spec(tmp_path / "agl.yaml").volume.per_month == pytest.approx(2500 * DAYS_PER_MONTH / 7)
    (tmp_path / "agl.yaml").write_text(yaml.safe_dump({**spec, "volume": 40000}))
    result = invoke_agl(["eval", "agl.yaml"], cwd=tmp_path)
    assert result.returncode == 2 and "volume" in result.stderr and "40000/month" in result.stderr, result.stderr
    result = invoke_agl(["eval", "agl.yaml", "--volume", "many"], cwd=tmp_path)
    assert result.returncode == 2 and "--volume 'many'" in result.stderr, result.stderr


def _rollouts(variant: str, rewards: list[float]) -> list[Rollout]:
    return [Rollout(id=f"{variant}-{i}", key=f"{variant}/t{i}/0", variant=variant, task_id=f"t{i}", reward=r,
                    status=RolloutStatus.succeeded, reward_source=RewardSource.grader, started_at=0.0, ended_at=1.0)
            for i, r in enumerate(rewards)]


def _totals(rollouts: list[Rollout], costs: list[float | None]) -> dict[str, CallTotals]:
    return {r.id: CallTotals(1, 10, 5, cost or 0.0, 1 if cost is None else 0) for r, cost in zip(rollouts, costs,
                                                                                                 strict=True)}


def test_cost_per_month_is_cost_per_task_at_the_volume_and_unknown_stays_unknown() -> None:
    volume = parse_volume("40000/month")
    priced = _rollouts("a", [1.0, 0.0, 1.0, 1.0])
    costs = [0.001, 0.002, 0.001, 0.004]
    m = measure("a", priced, _totals(priced, costs))
    fields = cost_fields(m, volume)
    assert fields["cost_usd_per_task"]["mean"] == pytest.approx(0.002)
    month = fields["cost_usd_per_month"]
    assert month["mean"] == pytest.approx(80.0) and month["tasks_per_month"] == 40_000 and month["n"] == 4
    low, high = m.cost_per_task.ci95 or (0, 0)
    assert month["ci95"] == pytest.approx([low * 40_000, high * 40_000]) and low < 0.002 < high
    assert cost_fields(m, None)["cost_usd_per_month"] is None  # no volume, no month
    unpriced = _rollouts("b", [1.0, 1.0])
    mb = measure("b", unpriced, _totals(unpriced, [0.001, None]))
    fields = cost_fields(mb, volume)
    assert fields["cost_usd_per_task"]["mean"] is None and fields["cost_usd_per_month"]["mean"] is None
    assert at_volume(Estimate(None, None, 2), volume) == Estimate(None, None, 2)
    # A paired difference per month keeps its interval; an unknown one has none, and is never decided.
    paired = {"difference": {"mean": 0.001, "ci95": [0.0005, 0.0015]}, "baseline_mean": 0.001, "candidate_mean": 0.002}
    doc = difference_at_volume(paired, volume)
    assert doc == {"mean": 40.0, "ci95": [20.0, 60.0], "decided": True, "baseline_mean": 40.0, "candidate_mean": 80.0,
                   "tasks_per_month": 40_000}
    unknown = difference_at_volume({"difference": {"mean": None, "ci95": None}}, volume)
    assert unknown is not None and unknown["mean"] is None and unknown["decided"] is False
    # The eval table: a month column at the volume; the unpriced variant's cells carry no dollar figure.
    out = Console(file=io.StringIO(), width=300, no_color=True)
    out.print(variant_table([m, mb], title="t", volume=volume))
    lines = {line.split("│")[1].strip(): line for line in out.file.getvalue().splitlines() if "│" in line}
    assert "cost/month at 40,000 tasks/month" in out.file.getvalue()
    assert "$80.00 [$40.00, $130.00]" in lines["a"] and "$0.002000 [" in lines["a"]
    assert "$" not in lines["b"] and lines["b"].count("— (1 unpriced call)") == 2


# -- the frontier ---------------------------------------------------------------------------------------------------


def _variant(name: str, rewards: list[float], cost: float | None, seconds: float = 1.0) -> tuple[list[Rollout], dict]:
    rollouts = [r.model_copy(update={"ended_at": seconds}) for r in _rollouts(name, rewards)]
    return rollouts, _totals(rollouts, [cost] * len(rollouts))


def test_the_frontier_keeps_what_no_other_beats_and_names_its_ends() -> None:
    n = 20
    table = {
        "baseline": ([1.0] * 10 + [0.0] * 10, 0.001),  # the setting kept so far: 50%
        "cheaper-worse": ([1.0] * 6 + [0.0] * 14, 0.0005),  # cheapest of all, but worse than the baseline
        "mid": ([1.0] * 14 + [0.0] * 6, 0.002),
        "dominated": ([1.0] * 12 + [0.0] * 8, 0.003),  # less accurate and dearer than mid
        "rich": ([1.0] * 19 + [0.0], 0.04),
        "unknown": ([1.0] * 15 + [0.0] * 5, None),  # an unpriced model: its cost is compared with nothing
    }
    rollouts, totals = {}, {}
    for name, (rewards, cost) in table.items():
        rollouts[name], more = _variant(name, rewards, cost)
        totals.update(more)
    metrics = [measure(name, rollouts[name], totals) for name in table]
    assert [m.name for m in members(metrics)] == ["rich", "unknown", "mid", "baseline", "cheaper-worse"]
    # The report's Pareto front too: the unpriced variant, more accurate, does not push the cheaper baseline off.
    assert {"baseline", "unknown", "rich"} <= set(pareto_front(metrics))
    base = next(m for m in metrics if m.name == "baseline")
    assert ends(members(metrics), base) == ("rich", "baseline")  # cheaper-worse is worse than what the user has
    volume = parse_volume("40000/month")
    doc = frontier(metrics, rollouts, totals, baseline="baseline", settings={}, split="val", volume=volume)
    by_name = {m["name"]: m for m in doc["members"]}
    assert doc["choice"] and doc["most_accurate"] == "rich" and doc["cheapest_good"] == "baseline"
    assert by_name["rich"]["ends"] == ["most accurate"] and by_name["baseline"]["ends"] == ["cheapest good"]
    assert by_name["rich"]["cost_usd_per_month"]["mean"] == pytest.approx(0.04 * VOLUME)
    assert by_name["unknown"]["cost_usd_per_month"]["mean"] is None
    steps = {(s["from"], s["to"]): s for s in doc["steps"]}
    # mid -> unknown: the cost step is unknown, not $0; baseline -> mid: +20 points on 20 tasks is not decided.
    assert steps[("mid", "unknown")]["cost_usd_per_task"] is None
    assert steps[("baseline", "mid")]["accuracy"]["decided"] is False
    assert steps[("baseline", "mid")]["cost_usd_per_month"]["mean"] == pytest.approx(0.001 * VOLUME)
    ends_doc = doc["ends"]
    assert (ends_doc["from"], ends_doc["to"]) == ("baseline", "rich") and ends_doc["accuracy"]["decided"] is True
    assert ends_doc["n_tasks"] == n
    # Constraints: only what meets them; a frontier of one has no choice to make.
    alone = frontier(metrics, rollouts, totals, baseline="baseline", settings={}, split="val", volume=volume,
                     feasible={"baseline", "dominated"})
    assert [m["name"] for m in alone["members"]] == ["dominated", "baseline"]
    one = frontier([metrics[0]], rollouts, totals, baseline="baseline", settings={}, split="val", volume=None)
    assert not one["choice"] and one["ends"] is None and one["objectives"][1] == "cost per task"


def test_racing_keeps_a_variant_decidedly_cheaper_than_every_one_that_beats_it() -> None:
    tasks = {f"t{i}" for i in range(30)}
    scores = {
        "small": {(f"t{i}", 0): float(i % 2) for i in range(30)},  # 50%
        "small-long-prompt": {(f"t{i}", 0): float(i % 10 == 0) for i in range(30)},  # 10%, dearer than small
        "large": {(f"t{i}", 0): 1.0 for i in range(30)},  # 100%, twenty times small's cost
    }
    costs = {"small": {(t, 0): 0.001 for t in tasks}, "small-long-prompt": {(t, 0): 0.002 for t in tasks},
             "large": {(t, 0): 0.02 for t in tasks}}
    old_rule = decide_round(scores, list(scores), tasks, alpha=0.05)
    assert old_rule.survivors == ["large"]  # judged on accuracy alone, the cheap end is gone
    decision = decide_round(scores, list(scores), tasks, alpha=0.05, costs=costs)
    assert decision.survivors == ["small", "large"] and decision.leader == "large"
    (drop,) = decision.dropped
    assert drop.variant == "small-long-prompt" and drop.detail["against"] == "small"  # worse, and no cheaper
    # A cost nobody knows is no evidence of being cheaper: such a variant is judged against the leader.
    unknown = decide_round(scores, list(scores), tasks, alpha=0.05, costs={**costs, "small": None})
    assert "small" not in unknown.survivors
    # Equal costs (an agent calling no paid model) race as before.
    free = {name: {(t, 0): 0.0 for t in tasks} for name in scores}
    assert decide_round(scores, list(scores), tasks, alpha=0.05, costs=free).survivors == ["large"]


# -- the one command: a kept setting x the levers rejected before -----------------------------------------------------


def _two_knob_spec(folder: Path) -> Path:
    shutil.copy(FIXTURES / "synthetic_agent.py", folder / "synthetic_agent.py")
    write_tasks(folder / "tasks.jsonl", [{"id": f"v{i}", "split": "val"} for i in range(4)]
                + [{"id": f"x{i}", "split": "test"} for i in range(2)])
    (folder / "prompts").mkdir()
    for name in ("old", "kept", "new"):
        (folder / "prompts" / f"{name}.md").write_text(name)
    spec = {
        "agent": {"command": "python synthetic_agent.py {task_file} {output_file}"},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"entry": "synthetic_agent:grade"},
        "knobs": {"p": {"values": [0.5, 0.9], "via": "env", "name": "SYNTH_P"},
                  "prompt": {"files": ["prompts/old.md", "prompts/kept.md"], "via": "env", "name": "SYNTH_PROMPT"},
                  "effort": {"values": ["low", "high"], "via": "env", "name": "SYNTH_EFFORT"}},
    }
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_base_across_and_option_make_the_kept_setting_times_the_levers(tmp_path: Path) -> None:
    path = _two_knob_spec(tmp_path)
    study = prepare(path, StudyOptions(base="prompt=kept", across=["p"]), [], tmp_path, ["p=0.7"])
    assert [v.name for v in study.variants] == ["baseline", "p=0.9", "p=0.7"]
    kept = {"prompt": "prompts/kept.md", "effort": "low"}
    assert [v.settings for v in study.variants] == [{"p": 0.5, **kept}, {"p": 0.9, **kept}, {"p": 0.7, **kept}]
    spec = load_spec(path)
    assert parse_option(spec, "effort=no", tmp_path).value == "no"  # a knob of strings takes the text as typed
    assert parse_option(spec, "p=1", tmp_path).value == 1
    both = prepare(path, StudyOptions(base="prompt=kept", across=["p", "prompt"]), [], tmp_path,
                   ["prompt=prompts/new.md"])
    assert len(both.variants) == 2 * 3 and both.variants[0].settings["prompt"] == "prompts/kept.md"
    assert both.variants[0].name == "baseline" and "prompt=old" in {v.name for v in both.variants}
    for args, message in [
        (["--across", "temperature"], "no knob named 'temperature'"),
        (["--base", "prompt=missing"], "--base 'prompt=missing': 'missing' is not an option"),
        (["--option", "temperature=0.7"], "no knob named 'temperature'"),
        (["--option", "prompt=prompts/absent.md"], "does not exist"),
        (["--option", "p"], "expected knob=VALUE"),
    ]:
        result = invoke_agl(["optimize", "agl.yaml", "--dry-run", "--pilot", "0", *args], cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    dry = invoke_agl(["optimize", "agl.yaml", "--base", "prompt=kept", "--across", "p", "--option", "p=0.7",
                      "--dry-run", "--pilot", "0", "--json"], cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    projection = json.loads(dry.stdout)
    assert [v["name"] for v in projection["variants"]] == ["baseline", "p=0.9", "p=0.7"]
    assert projection["projected"]["racing_at_most"]["rollouts"] == 3 * 4 + 2 * 2


# -- the user's project in small, end to end ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def provider() -> Iterator[TriageProvider]:
    p = TriageProvider().start()
    yield p
    p.stop()


def _triage_project(folder: Path) -> list[dict[str, Any]]:
    tickets = make_tickets(40, seed=0)
    for i, t in enumerate(tickets):
        t["id"] = f"t{t.pop('i'):02d}"
        t["split"] = "val" if i < 20 else "test"
    write_tasks(folder / "tasks.jsonl", tickets)
    shutil.copy(FIXTURES / "ticket_agent.py", folder / "ticket_agent.py")
    (folder / "prompts").mkdir()
    (folder / "prompts" / "basic.md").write_text(BASIC_PROMPT)
    (folder / "prompts" / "careful.md").write_text(CAREFUL_PROMPT)
    spec = {
        "name": "triage",
        "agent": {"command": "python ticket_agent.py {task_file} {output_file}", "timeout_s": 120},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": {"entry": "ticket_agent:grade"},
        "upstreams": {"triage": {"kind": "openai-compatible", "base_url": "${TRIAGE_URL}", "api_key_env": "TRIAGE_KEY"}},
        "model": "triage/small-1",
        "prices": {"triage/small-1": SMALL, "triage/large-1": LARGE},
        "knobs": {"model": {"values": ["triage/small-1", "triage/large-1"], "via": "gateway"},
                  "system_prompt": {"files": ["prompts/basic.md", "prompts/careful.md"], "via": "gateway",
                                    "mode": "replace"}},
        "volume": f"{VOLUME}/month",
        "budget": {"usd": 1.0},
        "concurrency": 4,
    }
    (folder / "agl.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return tickets


def _true_cost_per_task(study_dir: Path, variant: str, split: str) -> float:
    """Ground truth from the calls the provider answered: tokens times the declared prices, per rollout."""
    with sqlite3.connect(study_dir / "store.sqlite") as conn:
        rows = conn.execute(
            "SELECT r.id, c.model, c.input_tokens, c.output_tokens FROM rollouts r JOIN calls c ON c.rollout_id = r.id "
            "WHERE r.variant = ? AND r.split = ?", (variant, split)).fetchall()
    per_rollout: dict[str, float] = {}
    for rid, model, tokens_in, tokens_out in rows:
        price = LARGE if model == "large-1" else SMALL
        per_rollout[rid] = per_rollout.get(rid, 0.0) + (tokens_in * price["input"] + tokens_out * price["output"]) / 1e6
    return sum(per_rollout.values()) / len(per_rollout)


@pytest.mark.slow
def test_optimize_over_model_and_prompt_prices_the_frontier_at_the_users_volume(tmp_path: Path,
                                                                                 provider: TriageProvider) -> None:
    tickets = _triage_project(tmp_path)
    env = {"TRIAGE_URL": provider.base_url, "TRIAGE_KEY": KEY, "COLUMNS": "250"}
    result = run_agl(["optimize", "agl.yaml", "-q"], cwd=tmp_path, env=env, timeout=1200)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "frontier on val" in text and "cost/month at 40,000 tasks/month" in text
    rows = {line.split("│")[1].strip(): line for line in text.split("frontier on val")[1].splitlines()
            if line.count("│") > 5}
    large_careful = "model=triage/large-1,system_prompt=careful"
    assert "most accurate" in rows[large_careful]
    assert "cheapest good" in rows["baseline"]
    assert "note: a choice for the user" in text and "put the frontier to them" in text
    # The large model with the new prompt is the accuracy end because of what the models answered: each variant's
    # accuracy is what the provider's answers to its tickets give, computed here without agl.
    truth = {(model, careful): sum(answer(model, CAREFUL_PROMPT if careful else BASIC_PROMPT, t["ticket"])
                                   == t["label"] for t in tickets if t["split"] == "val") / 20
             for model in ("small-1", "large-1") for careful in (False, True)}
    assert max(truth, key=truth.__getitem__) == ("large-1", True)
    assert {(model, "mentioned in passing" in system) for model, system in provider.requests} == set(truth)

    again = run_agl(["optimize", "agl.yaml", "-q", "--json"], cwd=tmp_path, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["spend"]["rollouts"] == 0  # every rollout reused: the same study, free
    front = doc["frontier"]
    assert front["volume"]["tasks_per_month"] == VOLUME and front["choice"] is True
    by_knobs = {(m["knobs"]["model"], m["knobs"]["system_prompt"]): m for m in front["members"]}
    accurate = by_knobs[("triage/large-1", "prompts/careful.md")]
    assert accurate["ends"] == ["most accurate"] and front["most_accurate"] == accurate["name"] == large_careful
    assert accurate["accuracy"]["mean"] == pytest.approx(truth[("large-1", True)])
    variants = {v["name"]: v for v in doc["variants"]}
    for row in doc["variants"]:
        model = "large-1" if row["knobs"]["model"].endswith("large-1") else "small-1"
        assert row["accuracy"]["mean"] == pytest.approx(truth[(model, row["knobs"]["system_prompt"].endswith(
            "careful.md"))])
    study_dir = Path(doc["study_dir"])
    first_dir = next(p for p in (tmp_path / ".agl" / "runs").iterdir() if p != study_dir)
    for member in front["members"]:
        per_task = _true_cost_per_task(first_dir, member["name"], "val")
        month = member["cost_usd_per_month"]
        assert member["cost_usd_per_task"]["mean"] == pytest.approx(per_task, rel=1e-9)
        assert month["mean"] == pytest.approx(per_task * VOLUME, rel=1e-9)
        low, high = month["ci95"]
        assert low <= month["mean"] <= high and month["n"] == 20
        assert variants[member["name"]]["cost_usd_per_month"] == month
    cheap = front["cheapest_good"]
    assert by_knobs[("triage/small-1", "prompts/basic.md")]["name"] == cheap == "baseline"
    held = front["held_out"]
    assert (held["from"], held["to"], held["split"]) == (cheap, large_careful, "test")
    assert held["accuracy"]["verdict"] == "better" and held["accuracy"]["decided"]
    assert held["cost_usd_per_month"]["decided"] and held["cost_usd_per_month"]["mean"] > 0
    assert any(m.startswith("a choice for the user") for m in doc["messages"])
    report = (study_dir / "report" / "report.md").read_text()
    assert "Frontier on the val split at 40,000 tasks/month" in report and "most accurate" in report
    rewritten = run_agl(["report", study_dir.name, "--volume", "1000/day", "-f", "md", "-o", "again"], cwd=tmp_path)
    assert rewritten.returncode == 0, rewritten.stderr
    assert "cost/month at 1,000 tasks/day" in (tmp_path / "again" / "report.md").read_text()

    # The kept prompt x the models, in one command: the models are re-tested under the setting kept so far.
    kept = run_agl(["optimize", "agl.yaml", "--base", "system_prompt=careful", "--across", "model", "-q", "--json"],
                   cwd=tmp_path, env=env, timeout=1200)
    assert kept.returncode == 0, kept.stderr
    kept_doc = json.loads(kept.stdout)
    assert [v["name"] for v in kept_doc["variants"]] == ["baseline", "model=triage/large-1"]
    assert kept_doc["variants"][0]["knobs"] == {"model": "triage/small-1", "system_prompt": "prompts/careful.md"}
    assert kept_doc["spend"]["rollouts"] == 20  # only the kept baseline on test is new; the rest is reused
    kept_front = kept_doc["frontier"]
    assert (kept_front["cheapest_good"], kept_front["most_accurate"]) == ("baseline", "model=triage/large-1")
    assert kept_doc["confirmation"]["verdict"] == "better" and kept_doc["recommendation"] == "adopt"

    # compare and eval price the same runs per month; --volume overrides the spec's.
    compared = run_agl(["compare", f"{first_dir.name}:baseline", f"{first_dir.name}:{large_careful}", "--split",
                        "test", "--volume", "1000/day", "--json"], cwd=tmp_path, env=env)
    assert compared.returncode == 0, compared.stderr
    comparison = json.loads(compared.stdout)["comparisons"][0]
    per_month = comparison["cost_usd_per_month"]
    assert per_month["tasks_per_month"] == pytest.approx(1000 * 365.25 / 12)
    assert per_month["mean"] == pytest.approx(comparison["cost_usd_per_task"]["difference"]["mean"] * 30437.5)
    assert per_month["decided"] is True
    text = run_agl(["compare", f"{first_dir.name}:baseline", f"{first_dir.name}:{large_careful}", "--split", "test"],
                   cwd=tmp_path, env=env).stdout
    assert "cost/month +$" in text and "at 40,000 tasks/month" in text  # the run's own volume: agl.yaml's
    evaluated = run_agl(["eval", "agl.yaml", "--split", "val", "-v", "baseline", "-v", large_careful, "--json"],
                        cwd=tmp_path, env=env)
    assert evaluated.returncode == 0, evaluated.stderr
    eval_doc = json.loads(evaluated.stdout)
    assert eval_doc["volume"]["tasks_per_month"] == VOLUME
    for v in eval_doc["variants"]:
        assert v["cost_usd_per_month"]["mean"] == pytest.approx(v["cost_usd_per_task"]["mean"] * VOLUME)
        assert v["cost_usd_per_month"]["ci95"] is not None
