"""`agl compare` end to end on runs of the synthetic agent: references, pairing, verdicts, Holm, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scipy import stats as sps

from rl_backend.store.db import RunStore
from tests.helpers import invoke_agl, run_agl
from tests.test_optimize import write_synth_spec


def _json(folder: Path, *args: str) -> dict[str, Any]:
    result = run_agl(list(args) + ["--json"], cwd=folder)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    folder = tmp_path_factory.mktemp("compare")
    write_synth_spec(folder, [0.3, 0.95, 0.35], n_val=20, n_test=10)
    first = _json(folder, "eval", "agl.yaml", "-v", "baseline", "-v", "p=0.95", "-v", "p=0.35", "-q")
    second = _json(folder, "eval", "agl.yaml", "-v", "p=0.95", "--split", "test", "-q")
    return folder, first["run_id"], second["run_id"]


def test_paired_verdict_matches_the_store(runs: tuple[Path, str, str]) -> None:
    folder, run, _ = runs
    doc = _json(folder, "compare", f"{run}:baseline", f"{run}:p=0.95")
    (result,) = doc["comparisons"]
    assert doc["verdict"] == result["verdict"] == "better" and doc["correction"] == "none"
    assert result["n_tasks"] == 30 and result["test"] == "mcnemar_exact"
    store = RunStore(folder / ".agl" / "runs" / run / "store.sqlite")
    rewards: dict[str, dict[str, float]] = {}
    for r in store.rollouts(latest_only=True):
        rewards.setdefault(r.variant, {})[r.task_id] = r.reward  # type: ignore[assignment]
    b_wins = sum(1 for t, a in rewards["baseline"].items() if rewards["p=0.95"][t] > a)
    a_wins = sum(1 for t, a in rewards["baseline"].items() if rewards["p=0.95"][t] < a)
    assert result["discordant"] == {"candidate_better": b_wins, "baseline_better": a_wins}
    assert result["p_value"] == pytest.approx(sps.binomtest(b_wins, b_wins + a_wins).pvalue)
    lo, hi = result["difference"]["ci95"]
    assert 0 < lo <= result["difference"]["mean"] <= hi
    assert result["cost_usd_per_task"]["difference"]["mean"] == 0.0 and result["latency_s"]["n_pairs"] == 30


def test_worse_and_fail_on_worse(runs: tuple[Path, str, str]) -> None:
    folder, run, _ = runs
    plain = run_agl(["compare", f"{run}:p=0.95", f"{run}:baseline"], cwd=folder)
    assert plain.returncode == 0 and "worse" in plain.stdout
    gated = run_agl(["compare", f"{run}:p=0.95", f"{run}:baseline", "--fail-on-worse"], cwd=folder)
    assert gated.returncode == 3


def test_several_candidates_are_holm_corrected_and_bare_names_resolve(runs: tuple[Path, str, str]) -> None:
    folder, run, _ = runs
    doc = _json(folder, "compare", "baseline", "p=0.95", "p=0.35", "--run", run, "--split", "val")
    assert doc["correction"] == "holm" and doc["verdict"] is None
    strong, similar = doc["comparisons"]
    assert strong["candidate"]["variant"] == "p=0.95" and strong["n_tasks"] == 20
    assert similar["verdict"] == "no detectable difference" and similar["p_adjusted"] >= similar["p_value"]
    assert strong["p_value"] < similar["p_value"]
    assert strong["p_adjusted"] == pytest.approx(min(1.0, 2 * strong["p_value"]))  # Holm: the smallest p times 2
    text = run_agl(["compare", f"{run}:baseline", f"{run}:p=0.35"], cwd=folder).stdout
    assert "no detectable difference" in text and "more tasks would likely decide it" in text


def test_runs_compare_on_shared_tasks_only(runs: tuple[Path, str, str]) -> None:
    folder, run, other = runs
    doc = _json(folder, "compare", f"{run}:baseline", other)
    (result,) = doc["comparisons"]
    assert result["n_tasks"] == 10 and result["candidate"]["run_id"] == other


@pytest.mark.parametrize("refs,message", [
    (["{run}:baseline"], "at least one candidate"),
    (["{run}:nope", "{run}:baseline"], "no variant 'nope'"),
    (["{run}", "{run}:baseline"], "holds 3 variants"),
    (["{run}:baseline", "{run}:p=0.95", "--split", "train"], "no finished rollouts in split 'train'"),
])
def test_usage_errors(runs: tuple[Path, str, str], refs: list[str], message: str) -> None:
    folder, run, _ = runs
    result = invoke_agl(["compare", *(r.format(run=run) for r in refs)], cwd=folder)
    assert result.returncode == 2 and message in result.stderr, result.stderr
