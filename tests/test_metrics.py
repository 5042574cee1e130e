"""One metrics module: one VariantMetrics behind `agl eval`, the reports and `agl optimize`; one pass threshold, an
agl.yaml key, counted the same way by training, pass^k, the reports' wrong answers and `agl transcript --failing`;
one set of number formatters for every surface."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agl_cli.commands.compare_cmd import sentence
from agl_cli.errors import ConfigError
from agl_cli.metrics.fmt import count, pct, plural, points, seconds, usd
from agl_cli.metrics.run import run_pass_threshold
from agl_cli.metrics.variant import measure
from agl_cli.report import write_report
from agl_cli.report.collect import collect
from agl_cli.runs.rundir import RunDir
from agl_cli.spec.schema import ExperimentSpec, load_spec
from rl_backend.rewards import DEFAULT_PASS_THRESHOLD
from rl_backend.store.records import CallTotals, FailureKind, RewardSource, Rollout, RolloutStatus
from tests.helpers import invoke_agl, write_spec
from tests.helpers.make_runs import make_scored_run

EVAL_KEYS = {"name", "n", "planned", "finished", "accuracy", "missing", "missing_reasons", "error_rate",
             "timeout_rate", "latency_s", "tokens", "calls", "cost_usd", "unpriced_calls", "knobs", "served_by",
             "models", "model_warnings", "fully_right", "partial_credit"}
STUDY_KEYS = {"name", "n_tasks", "rollouts", "accuracy", "cost_per_task_usd", "unpriced_calls", "latency_p95_s",
              "pass_k", "tokens", "fully_right"}


def _rollout(task: str, seed: int, reward: float | None, *, status: RolloutStatus = RolloutStatus.succeeded,
             failure: FailureKind | None = None) -> Rollout:
    return Rollout(id=f"{task}-{seed}", key=f"v/{task}/{seed}", variant="v", task_id=task, seed=seed, status=status,
                   reward=reward, reward_source=RewardSource.grader if reward is not None else RewardSource.none,
                   failure=failure, started_at=0.0, ended_at=2.0 + seed)


def test_the_pass_threshold_is_an_agl_yaml_key_with_a_stated_default(tmp_path: Path) -> None:
    path = write_spec(tmp_path, [{"id": "a"}])
    assert load_spec(path).pass_threshold == DEFAULT_PASS_THRESHOLD == 0.5
    write_spec(tmp_path, [{"id": "a"}], pass_threshold=0.8)
    assert load_spec(path).pass_threshold == 0.8
    for bad in (".inf", "high"):
        path.write_text(path.read_text().replace("pass_threshold: 0.8", f"pass_threshold: {bad}"))
        with pytest.raises(ConfigError, match="pass_threshold"):
            load_spec(path)
        path.write_text(path.read_text().replace(f"pass_threshold: {bad}", "pass_threshold: 0.8"))
    reference = (Path(__file__).parent.parent / "docs" / "agl-yaml.md").read_text()
    assert "| `pass_threshold` | number | `0.5` |" in reference


def test_one_measure_gives_eval_its_summary_and_optimize_its_objectives() -> None:
    """Two seeds of three tasks, one rollout crashed, one call unpriced: the same object answers both documents."""
    rollouts = [_rollout("t1", 0, 1.0), _rollout("t1", 1, 0.6), _rollout("t2", 0, 0.6), _rollout("t2", 1, 0.0),
                _rollout("t3", 0, None, status=RolloutStatus.failed, failure=FailureKind.agent_crashed),
                _rollout("t3", 1, 1.0)]
    totals = {r.id: CallTotals(1, 100, 10, 0.001, 0) for r in rollouts}
    loose = measure("v", rollouts, totals, planned=7, k=2)
    strict = measure("v", rollouts, totals, planned=7, k=2, pass_threshold=0.8)
    summary, objectives = loose.summary_json(), loose.objectives_json()
    assert set(summary) == EVAL_KEYS and set(objectives) == STUDY_KEYS
    assert summary["accuracy"]["mean"] == objectives["accuracy"]["mean"] == pytest.approx(3.2 / 5)
    assert summary["n"] == objectives["accuracy"]["n"] == 5 and objectives["rollouts"] == summary["finished"] == 6
    assert summary["missing"] == 2 and summary["missing_reasons"] == {"agent_crashed": 1, "not_run": 1}
    assert summary["error_rate"] == pytest.approx(1 / 6) and loose.error_rate.ci95 is not None
    assert objectives["cost_per_task_usd"] == pytest.approx(0.001) and summary["cost_usd"] == pytest.approx(0.006)
    # The threshold decides passes, never the accuracy.
    assert strict.accuracy == loose.accuracy
    assert (loose.wrong, strict.wrong) == (1, 3)
    assert objectives["pass_k"] == {"k": 2, "mean": 0.5, "n_tasks": 2}  # t1 passed both seeds at 0.5, t2 did not
    assert strict.pass_k.mean == 0.0 and strict.pass_k.ci95 is not None


def test_a_run_is_reported_and_filtered_at_its_own_threshold(tmp_path: Path) -> None:
    run = make_scored_run(tmp_path, "graded", [1.0, 0.7, 0.6, 0.0])
    assert run_pass_threshold(run) == 0.5  # a run whose spec said nothing
    (run / "config.yaml").write_text(yaml.safe_dump({"name": "fixture", "pass_threshold": 0.75}))
    assert run_pass_threshold(run) == 0.75
    data = collect(RunDir(run))
    assert data.pass_threshold == 0.75 and data.primary.rows[0].wrong == 3
    report = next(p for p in write_report(run) if p.name == "report.md").read_text()
    assert "wrong (\\<0.75)" in report and "3 got a reward below 0.75" in report  # `<` escaped for Markdown
    listed = invoke_agl(["transcript", "graded", "--failing", "--replies-only", "--json", "--runs-dir", str(tmp_path)],
                        cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert doc["filter"]["below"] == 0.75 and doc["matched"] == 3
    (run / "config.yaml").write_text("pass_threshold: [unclosed\n")
    damaged = invoke_agl(["transcript", "graded", "--failing", "--runs-dir", str(tmp_path)], cwd=tmp_path)
    assert damaged.returncode == 2 and "config.yaml is damaged" in damaged.stdout + damaged.stderr


def test_training_counts_a_pass_as_everything_else_does(tmp_path: Path) -> None:
    """The sync loop's pass rate at the default threshold, and at the spec's when agl_cli hands it over."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agl_cli.training.sync_job import TrainOptions, loop_config
    from rl_backend.store.db import RunStore
    from rl_backend.trainer.loop import LoopConfig, TrainingLoop
    from rl_backend.trainer.torch_backend import TorchTrainer, TrainerConfig
    from rl_backend.trainer.toy import tiny_llama

    store = RunStore(tmp_path / "store.sqlite")
    rewards = [1.0, 0.5, 0.0, 0.7]
    for i, reward in enumerate(rewards):
        store.put_rollout(_rollout(f"t{i}", 0, reward))
    trainer = TorchTrainer(tiny_llama(), TrainerConfig())
    ids = [f"t{i}-0" for i in range(len(rewards))]
    default = TrainingLoop(store, trainer, lambda i: ids, config=LoopConfig(iterations=1)).run()[0]
    assert default.pass_rate == 0.75  # 1.0, 0.5 and 0.7 pass at 0.5; no rollout has a call, so nothing is trained
    spec = ExperimentSpec.model_validate({"agent": {"command": "x"}, "tasks": {"path": "t.jsonl"},
                                          "grader": {"command": "y"}, "pass_threshold": 0.8})
    config = loop_config(spec, TrainOptions(), iterations=1, checkpoints=tmp_path / "ckpt")
    strict = TrainingLoop(store, trainer, lambda i: ids, config=config).run()[0]
    assert config.pass_threshold == 0.8 and strict.pass_rate == 0.25
    store.close()


def test_every_surface_writes_numbers_the_same_way() -> None:
    # A tiny cost keeps two significant digits: the report's old formatter wrote 4e-7 as $0.000000, i.e. free.
    assert usd(4e-7) == "$0.00000040" and usd(0.0000062) == "$0.0000062" and usd(0.00042) == "$0.000420"
    assert usd(0) == "$0.00" and usd(0.4) == "$0.4000" and usd(12.5) == "$12.50"
    assert usd(0.25, unpriced_calls=3) == "— (3 unpriced calls)" and usd(None) == "—"
    assert usd(-0.0009, [-0.0012, -0.0006], signed=True) == "-$0.000900 [-$0.001200, -$0.000600]"
    assert pct(0.45, (0.15, 0.75)) == "45.0% [15.0, 75.0]" and pct(0.333, digits=0) == "33%" and pct(None) == "—"
    assert points(0.125, [0.025, 0.225]) == "+12.5 points [+2.5, +22.5]"
    assert seconds(3.344) == "3.34s" and seconds(4.04, digits=1) == "4.0s"
    assert seconds(0.12, [-0.05, 0.3], signed=True) == "+0.12s [-0.05, +0.30]"
    assert count(16512) == "16,512" and plural(1, "task") == "1 task" and plural(3, "task") == "3 tasks"
    # `agl compare`'s sentence (also in `agl train --json`) states a difference exactly as the report does.
    doc = {"verdict": "better", "difference": {"mean": 0.125, "ci95": [0.025, 0.225]}, "n_tasks": 12, "n_pairs": 24,
           "test": "sign_test", "p_value": 0.0078, "p_adjusted": 0.0078, "more_tasks": None,
           "cost_usd_per_task": {"difference": {"mean": 0.0009, "ci95": [0.0006, 0.0012]}, "unpriced_calls": {}},
           "latency_s": {"difference": {"mean": 0.12, "ci95": [-0.05, 0.3]}}}
    text = sentence("B", doc)
    assert "accuracy +12.5 points [+2.5, +22.5] over 12 tasks" in text
    assert "cost/task +$0.000900 [+$0.000600, +$0.001200]" in text and "latency +0.12s [-0.05, +0.30]" in text
