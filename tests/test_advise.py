"""`agl advise`: the training-readiness verdict from fixture run stores (built with RunStore), one criterion
failing at a time; each criterion reports its measured value and threshold; usage errors exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from agl_cli.main import app
from agl_cli.runs.rundir import RunDir
from agl_cli.training import advise as advise_module
from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord, RewardSource, Rollout, RolloutStatus

GPU = {"kind": "gpu", "detail": "NVIDIA H200, 141 GiB"}
CPU = {"kind": "cpu", "detail": "no GPU or Kubernetes context; 2 CPU cores"}


def write_spec(folder: Path, *, n_train: int = 100, upstream: dict | None = None, grader: dict | None = None,
               budget: dict | None = None, duplicate: int = 0) -> Path:
    tasks = [{"id": f"t{i}", "q": f"question {i}", "split": "train"} for i in range(n_train)]
    tasks += [{"id": f"v{i}", "q": f"val question {i}", "split": "val"} for i in range(10)]
    tasks += [{"id": f"x{i}", "q": f"test question {i}", "split": "test"} for i in range(10)]
    for i in range(duplicate):  # a training task whose content is also a test task's
        tasks[i] = {"id": f"t{i}", "q": f"test question {i}", "split": "train"}
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    spec = {
        "name": "fixture",
        "agent": {"command": "python agent.py --task {task_file} --out {output_file}"},
        "tasks": {"path": "tasks.jsonl", "split": {"field": "split"}},
        "grader": grader or {"command": "python grade.py {task_file} {output_file}"},
        "upstreams": {"local": upstream or {"kind": "embedded", "model": "smollm2-135m-instruct"}},
        "model": "local/smollm2-135m-instruct",
    }
    if budget:
        spec["budget"] = budget
    path = folder / "agl.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def right_or_wrong(task: str, seed: int, reward: float | None) -> str | None:
    """The agent's answer: one word, "4" when it passed and "5" when not (a well-formed wrong answer)."""
    return None if reward is None else "4" if reward >= 0.5 else "5"


def add_run(root: Path, spec: Path, *, kind: str = "eval", created_at: float = 1000.0,
            rewards: dict[str, list[float | None]] | None = None, split: str = "train",
            result: dict[str, Any] | None = None, upstream: str = "local", token_ids: bool = True,
            output: Any = right_or_wrong) -> RunDir:
    """A finished run: for each task, one rollout per listed reward (seed = position), each with one model call
    and the agent's output `output(task, seed, reward)`."""
    run = RunDir.create(root, spec_data={}, manifest={"kind": kind, "spec_path": str(spec.resolve()),
                                                      "status": "completed"})
    manifest = run.manifest()
    manifest["created_at"] = created_at
    run.write_manifest(manifest)
    store = RunStore(run.store_path)
    clock = 0.0
    for task, seeds in (rewards or {}).items():
        for seed, reward in enumerate(seeds):
            rid = f"{run.run_id}-{task}-{seed}"
            clock += 1.0
            store.put_rollout(Rollout(
                id=rid, key=f"baseline/{task}/{seed}", variant="baseline", task_id=task, split=split, seed=seed,
                status=RolloutStatus.succeeded if reward is not None else RolloutStatus.failed, reward=reward,
                reward_source=RewardSource.grader if reward is not None else RewardSource.none,
                started_at=clock, ended_at=clock + 1.0, output=output(task, seed, reward),
            ))
            store.insert_call(CallRecord(
                call_id=f"c-{rid}", rollout_id=rid, api=Api.openai_chat, upstream=upstream, model="m",
                output_tokens=50, latency_s=0.5, cost_usd=0.0, started_at=clock, status_code=200,
                completion_token_ids=[1, 2, 3] if token_ids else None,
            ))
    if result is not None:
        store.set_meta("study.result", result)
    store.close()
    return run


def sampled(n_tasks: int = 20) -> dict[str, list[float | None]]:
    """Four seeds per training task: half the tasks solved once in four, a fifth always, the rest never
    (pass@1 about 0.33, pass@4 0.7)."""
    rewards: dict[str, list[float | None]] = {}
    for i in range(n_tasks):
        rewards[f"t{i}"] = [1.0, 0.0, 0.0, 0.0] if i < n_tasks // 2 else [1.0] * 4 if i < n_tasks * 7 // 10 else [0.0] * 4
    return rewards


def plateaued_journal(folder: Path, gains: tuple[float, ...] = (0.0, 0.0, 0.01)) -> None:
    lines = [{"time": 2000.0 + i, "change": f"attempt {i}", "lever": "prompt", "difference": g,
              "verdict": "better" if g else "no detectable difference", "decision": "kept" if g else "reverted"}
             for i, g in enumerate(gains)]
    (folder / ".agl").mkdir(exist_ok=True)
    (folder / ".agl" / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


@pytest.fixture
def ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A spec and store that pass every criterion (on a GPU machine)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGL_HOME", raising=False)
    monkeypatch.setattr(advise_module, "probe_compute", lambda spec: GPU)
    spec = write_spec(tmp_path)
    root = tmp_path / ".agl" / "runs"
    add_run(root, spec, rewards=sampled())
    add_run(root, spec, kind="study", created_at=1500.0,
            result={"recommendation": "adopt", "confirmation": {"difference": {"mean": 0.06}}})
    plateaued_journal(tmp_path)
    return spec


def advise_json(target: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["advise", target, "--json"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def statuses(doc: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in doc["criteria"]}


def test_ready_agent_gets_train(ready: Path) -> None:
    doc = advise_json(str(ready))
    assert doc["verdict"] == "train", doc
    assert set(statuses(doc).values()) == {"pass"}
    for criterion in doc["criteria"]:
        assert criterion["threshold"] and criterion["detail"], criterion
    headroom = next(c for c in doc["criteria"] if c["id"] == "headroom")["value"]
    assert headroom["k"] == 4 and headroom["pass_at_1"] == pytest.approx(0.325) and headroom["pass_at_k"] == 0.7
    projection = next(c for c in doc["criteria"] if c["id"] == "projection")["value"]
    assert projection["rollouts"] == 100 * advise_module.ROLLOUTS_PER_TASK * advise_module.TRAIN_EPOCHS
    assert projection["tokens_per_s"] == 100.0
    assert doc["next_steps"] == []


def test_headroom_counts_a_pass_at_the_specs_threshold(ready: Path) -> None:
    """A sample passes at agl.yaml's `pass_threshold`, as in optimize, reports and training: ten more tasks whose
    best sample scored 0.6 were solved once in four at the default 0.5, and never at 0.7."""
    add_run(ready.parent / ".agl" / "runs", ready, created_at=1200.0,
            rewards={f"p{i}": [0.6, 0.0, 0.0, 0.0] for i in range(10)})

    def pass_at_1() -> float:
        return float(next(c for c in advise_json(str(ready))["criteria"] if c["id"] == "headroom")["value"]["pass_at_1"])

    assert pass_at_1() == pytest.approx((6.5 + 2.5) / 30, abs=1e-4)  # the value is rounded to 4 places
    _rewrite(ready, pass_threshold=0.7)
    assert pass_at_1() == pytest.approx(6.5 / 30, abs=1e-4)


def test_study_id_resolves_to_its_spec_and_text_output(ready: Path) -> None:
    study = next(p.name for p in (ready.parent / ".agl" / "runs").iterdir()
                 if json.loads((p / "manifest.json").read_text())["kind"] == "study")
    doc = advise_json(study)
    assert doc["verdict"] == "train" and doc["run"] == study and doc["spec"] == str(ready.resolve())
    text = CliRunner().invoke(app, ["advise", str(ready)])
    assert text.exit_code == 0 and "verdict: train" in text.stdout


def _rewrite(spec: Path, **changes: Any) -> None:
    data = yaml.safe_load(spec.read_text())
    data.update(changes)
    spec.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize("case", ["reported", "hosted", "unscored", "plateau_unknown", "still_gaining",
                                  "no_samples", "no_headroom", "few_tasks", "leak", "big_model_on_cpu",
                                  "over_budget"])
def test_each_failing_criterion_gives_not_yet(ready: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    folder, root = ready.parent, ready.parent / ".agl" / "runs"
    expect = {
        "reported": "verifiable_reward", "hosted": "open_weight_model", "unscored": "verifiable_reward",
        "plateau_unknown": "plateau", "still_gaining": "plateau", "no_samples": "headroom",
        "no_headroom": "headroom", "few_tasks": "train_tasks", "leak": "train_tasks",
        "big_model_on_cpu": "compute", "over_budget": "projection",
    }[case]
    if case == "reported":
        _rewrite(ready, grader={"reported": True})
    elif case == "hosted":
        _rewrite(ready, upstreams={"openai": {"kind": "openai"}}, model="openai/gpt-4.1-mini")
    elif case == "unscored":
        add_run(root, ready, rewards={f"t{i}": [None] for i in range(20)})
    elif case == "plateau_unknown":
        plateaued_journal(folder, gains=(0.0,))
    elif case == "still_gaining":
        plateaued_journal(folder, gains=(0.0, 0.03, 0.0))
    elif case in ("no_samples", "no_headroom"):
        for run in root.iterdir():
            if json.loads((run / "manifest.json").read_text())["kind"] == "eval":
                (run / "store.sqlite").unlink()
        samples = {f"t{i}": [1.0] if i % 2 else [0.0] for i in range(30)} if case == "no_samples" else \
            {f"t{i}": [1.0] * 4 if i % 2 else [0.0] * 4 for i in range(30)}
        # The failures are in another form than the right answers (behaviour, which training can shape), so
        # that only headroom is at stake here.
        add_run(root, ready, rewards=samples, output=lambda task, seed, reward: "4" if reward else "no idea, sorry")
    elif case == "few_tasks":
        write_spec(folder, n_train=40)
    elif case == "leak":
        write_spec(folder, duplicate=3)
    elif case == "big_model_on_cpu":
        monkeypatch.setattr(advise_module, "probe_compute", lambda spec: CPU)
        _rewrite(ready, upstreams={"local": {"kind": "embedded", "model": "qwen2.5-7b-instruct"}})
    elif case == "over_budget":
        _rewrite(ready, budget={"rollouts": 100})
    doc = advise_json(str(ready))
    assert doc["verdict"] == "not yet", statuses(doc)
    assert statuses(doc)[expect] in ("fail", "unknown"), statuses(doc)
    assert [c for c in doc["criteria"] if c["status"] in ("fail", "unknown")] == \
        [c for c in doc["criteria"] if c["id"] == expect], "only the criterion under test fails"
    assert doc["next_steps"], "a not-yet verdict says what to do first"


def test_small_model_on_cpu_is_a_warning_not_a_failure(ready: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advise_module, "probe_compute", lambda spec: CPU)
    doc = advise_json(str(ready))
    assert doc["verdict"] == "train"
    assert statuses(doc)["compute"] == "warn" and doc["warnings"]


def test_missing_token_ids_warn(ready: Path) -> None:
    add_run(ready.parent / ".agl" / "runs", ready, rewards={"t0": [1.0]}, token_ids=False)
    doc = advise_json(str(ready))
    assert statuses(doc)["open_weight_model"] == "warn"


def test_no_runs_at_all_is_not_yet_with_unknowns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(advise_module, "probe_compute", lambda spec: GPU)
    spec = write_spec(tmp_path)
    doc = advise_json(str(spec))
    assert doc["verdict"] == "not yet"
    assert statuses(doc)["plateau"] == "unknown" and statuses(doc)["headroom"] == "unknown"
    assert doc["evidence"]["runs"] == 0


def test_usage_errors_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["advise", "no-such-thing"]).exit_code == 2
    assert CliRunner().invoke(app, ["advise"]).exit_code == 2
    (tmp_path / "agl.yaml").write_text("agent: {command: x}\n")
    assert CliRunner().invoke(app, ["advise", str(tmp_path / "agl.yaml")]).exit_code == 2


def test_pass_at_k_estimator() -> None:
    assert advise_module._pass_at(4, 1, 1) == pytest.approx(0.25)
    assert advise_module._pass_at(4, 1, 4) == 1.0
    assert advise_module._pass_at(4, 0, 2) == 0.0
    assert advise_module._pass_at(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert advise_module.model_size_b(advise_module.ExperimentSpec.model_validate({
        "agent": {"command": "a"}, "tasks": {"path": "t"}, "grader": {"command": "g"},
        "upstreams": {"l": {"kind": "embedded", "model": "Qwen2.5-0.5B-Instruct"}}})) == 0.5


# -- an openai-compatible upstream's weights are unknown unless agl.yaml names them --------------------------------


def _hosted(spec: Path, **extra: Any) -> None:
    """The agent's calls served by an openai-compatible upstream named `local`, as the ready fixture's runs record."""
    _rewrite(spec, upstreams={"local": {"kind": "openai-compatible", "base_url": "https://api.example.com/v1", **extra}},
             model="local/some-model")


def test_an_openai_compatible_upstream_without_weights_is_unknown_not_open(ready: Path) -> None:
    _hosted(ready)
    doc = advise_json(str(ready))
    criterion = next(c for c in doc["criteria"] if c["id"] == "open_weight_model")
    assert criterion["status"] == "unknown" and doc["verdict"] == "not yet"
    assert "weights unknown" in criterion["detail"] and "open-weight" not in criterion["detail"]
    assert "weights: <Hugging Face id or folder>" in criterion["hint"]


def test_named_weights_make_an_openai_compatible_upstream_open(ready: Path) -> None:
    _hosted(ready, weights="Qwen/Qwen2.5-7B-Instruct")
    criterion = next(c for c in advise_json(str(ready))["criteria"] if c["id"] == "open_weight_model")
    assert criterion["status"] == "pass" and "weights Qwen/Qwen2.5-7B-Instruct" in criterion["detail"]


def test_weights_on_a_closed_kind_is_a_config_error(ready: Path) -> None:
    _rewrite(ready, upstreams={"openai": {"kind": "openai", "weights": "x"}})
    result = CliRunner().invoke(app, ["advise", str(ready)])
    assert result.exit_code == 2 and "weights" in result.output


# -- plateau: gains add up only along the chain of kept baselines -------------------------------------------------


def _journal(folder: Path, entries: list[tuple[float, str, str, str, str]]) -> None:
    """Kept entries: (gain, baseline run, baseline variant, candidate run, candidate variant)."""
    lines = [{"time": 2000.0 + i, "change": f"attempt {i}", "lever": "prompt", "difference": gain, "verdict": "better",
              "decision": "kept", "baseline_run": b_run, "baseline_variant": b_var, "candidate_run": c_run,
              "candidate_variant": c_var} for i, (gain, b_run, b_var, c_run, c_var) in enumerate(entries)]
    (folder / ".agl" / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def _plateau(spec: Path) -> dict[str, Any]:
    criterion: dict[str, Any] = next(c for c in advise_json(str(spec))["criteria"] if c["id"] == "plateau")
    return criterion


R1, R2, R3, R4 = (f"20260101-00000{i}-abcd" for i in range(1, 5))


def test_gains_against_different_baselines_are_not_added_up(ready: Path) -> None:
    # The trial: a fix (+30, run against run), a prompt on the new default (+10), then the original baseline
    # again (+3.3). The third already contains the first two: the chain gained +40, never "+43.3 in all".
    _journal(ready.parent, [(0.30, R1, "baseline", R2, "baseline"), (0.10, R3, "baseline", R3, "system_prompt=v2"),
                            (0.033, R1, "baseline", R4, "baseline")])
    criterion = _plateau(ready)
    assert criterion["status"] == "fail" and criterion["value"] == pytest.approx(0.40)
    assert "+40.0 points" in criterion["detail"] and "43.3" not in criterion["detail"]
    assert f"+30.0 points kept (journal: attempt 0 vs {R1}:baseline)" in criterion["detail"]


def test_small_gains_along_a_chain_add_up_and_off_it_do_not(ready: Path) -> None:
    chained = [(0.0, R1, "baseline", R1, "baseline"), (0.01, R1, "baseline", R1, "v2"), (0.01, R2, "baseline", R2, "v3")]
    _journal(ready.parent, chained)
    assert _plateau(ready)["status"] == "fail"  # +1 then +1 on top of it: +2 points, still gaining
    each_against_the_first = [(0.01, R1, "baseline", R1, "v2"), (0.01, R1, "baseline", R1, "v3"),
                              (0.01, R1, "baseline", R1, "v4")]
    _journal(ready.parent, each_against_the_first)
    criterion = _plateau(ready)
    assert criterion["status"] == "pass" and criterion["value"] == pytest.approx(0.01)
