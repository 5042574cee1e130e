"""Every report has a plot: one variant gets its reward and latency distributions; accuracy is plotted against
tokens when no variant has a known cost above zero; variants with unpriced calls are left out of the cost plot, and
its caption says so."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from agl_cli.report import write_report
from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord, RewardSource, Rollout, RolloutStatus
from tests.helpers.make_runs import make_scored_run

T0 = 1_750_000_000.0
SVG = "{http://www.w3.org/2000/svg}"


def _bars(svg_text: str) -> list[str]:
    """The tooltips of a histogram's bars (`variant: count in [lo, hi)`)."""
    root = ET.fromstring(svg_text)
    return [g.findtext(f"{SVG}title") or "" for g in root.iter(f"{SVG}g") if g.find(f"{SVG}rect") is not None]


def test_a_single_variant_report_plots_its_reward_and_latency_distributions(tmp_path: Path) -> None:
    run = make_scored_run(tmp_path, "one", [1.0, 0.0, 1.0, 1.0, None])  # no model calls: no spend plot either
    paths = write_report(run)
    names = {p.name for p in paths}
    assert {"dist_reward.svg", "dist_latency.svg"} <= names
    md = (run / "report" / "report.md").read_text()
    assert "![Rewards — all tasks](dist_reward.svg)" in md and "(n = 4)" in md
    assert "![Rollout latency — all tasks](dist_latency.svg)" in md
    html = (run / "report" / "report.html").read_text()
    assert html.count("<svg") >= 2 and "Rewards — all tasks" in html
    bars = _bars((run / "report" / "dist_reward.svg").read_text())
    assert sorted(bars) == ["baseline: 1 in [0, 0.1)", "baseline: 3 in [0.9, 1)"]
    latency = _bars((run / "report" / "dist_latency.svg").read_text())
    assert sum(int(t.split(": ")[1].split(" in ")[0]) for t in latency) == 5  # every finished rollout, scored or not


def _priced_run(root: Path, costs: dict[str, float | None]) -> Path:
    """An eval of one variant per entry of `costs`: two tasks, one call per rollout costing that much (None: no
    price), the variant named first right on both tasks, the others on one."""
    names = list(costs)
    variants = [{"name": n, "settings": {"v": n}, "hash": f"h{i}"} for i, n in enumerate(names)]
    path = root / "priced"
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("name: fixture\n")
    (path / "manifest.json").write_text(json.dumps({
        "run_id": "priced", "created_at": T0, "kind": "eval", "spec_name": "priced", "seeds": 1, "status": "completed",
        "task_ids": ["a", "b"], "variants": variants}))
    store = RunStore(path / "store.sqlite")
    for i, name in enumerate(names):
        store.upsert_variant(name, f"h{i}", {"v": name})
        for j, task in enumerate(("a", "b")):
            rid = f"r{i}{j}"
            reward = 1.0 if i == 0 or j == 0 else 0.0
            store.put_rollout(Rollout(id=rid, key=f"h{i}/{task}/0", variant=name, task_id=task,
                                      status=RolloutStatus.succeeded, reward=reward,
                                      reward_source=RewardSource.grader, started_at=T0 + j, ended_at=T0 + j + 1 + i))
            store.insert_call(CallRecord(call_id=f"c{i}{j}", rollout_id=rid, api=Api.openai_chat, upstream="u",
                                         request_model="m", model=f"m{i}", input_tokens=100 * (i + 1),
                                         output_tokens=10, cost_usd=costs[name], started_at=T0 + j,
                                         ended_at=T0 + j + 1))
    store.close()
    return path


def test_unpriced_variants_are_left_out_of_the_cost_plot_and_named(tmp_path: Path) -> None:
    run = _priced_run(tmp_path, {"cheap": 0.001, "dear": 0.02, "mystery": None})
    write_report(run)
    md = (run / "report" / "report.md").read_text()
    assert "pareto_cost.svg" in md and "Left out, their cost unknown: mystery (2 unpriced calls)." in md
    plotted = ET.fromstring((run / "report" / "pareto_cost.svg").read_text())
    tips = [t.text or "" for t in plotted.iter(f"{SVG}title")]
    assert any(t.startswith("cheap:") for t in tips) and any(t.startswith("dear:") for t in tips)
    assert not any(t.startswith("mystery") for t in tips)
    assert "— (2 unpriced calls)" in md  # the table: unknown, never $0


def test_free_or_unknown_costs_plot_accuracy_against_tokens(tmp_path: Path) -> None:
    run = _priced_run(tmp_path, {"local": 0.0, "other": 0.0, "mystery": None})
    write_report(run)
    report = run / "report"
    assert not (report / "pareto_cost.svg").exists() and (report / "pareto_tokens.svg").is_file()
    md = (report / "report.md").read_text()
    assert "Accuracy vs tokens per task" in md and "because their cost is zero or unknown" in md
    tips = [t.text or "" for t in ET.fromstring((report / "pareto_tokens.svg").read_text()).iter(f"{SVG}title")]
    assert any(t.startswith("mystery: 310,") for t in tips)  # 300 in + 10 out per rollout
