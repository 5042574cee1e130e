"""Unknown cost stays unknown, from the store's sums to optimize's objectives; the served model of a variant and the
rule that says when two variants were not a comparison of two models."""

from __future__ import annotations

from pathlib import Path

import pytest

from agl_cli.evaluation.served import ServedModels, same_model, served_models
from agl_cli.metrics.fmt import usd
from agl_cli.metrics.rollout_costs import paired_cost
from agl_cli.metrics.variant import measure
from agl_cli.optimize.objectives import Constraints, breach, choose, pareto_front
from rl_backend.store.db import RunStore
from rl_backend.store.records import (
    Api,
    CallRecord,
    CallTotals,
    ModelUse,
    RewardSource,
    Rollout,
    RolloutStatus,
    RouteKind,
)
from rl_backend.store.schema import SCHEMA_VERSION


def _rollout(rid: str, task: str, variant: str = "v", reward: float = 1.0) -> Rollout:
    return Rollout(id=rid, key=f"{variant}/{task}/0", variant=variant, task_id=task, status=RolloutStatus.succeeded,
                   reward=reward, reward_source=RewardSource.grader, started_at=0.0, ended_at=1.0)


def _call(n: int, rid: str, cost: float | None, *, requested: str = "m", model: str = "m",
          route: RouteKind | None = RouteKind.named, served: str | None = None) -> CallRecord:
    return CallRecord(call_id=f"c{n}", rollout_id=rid, api=Api.openai_chat, upstream="up", request_model=requested,
                      model=model, served_model=served, route=route, input_tokens=10, output_tokens=5, cost_usd=cost)


def test_the_store_counts_unpriced_calls_instead_of_adding_them_as_zero(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "s.sqlite")
    assert store.schema_version == SCHEMA_VERSION
    store.insert_calls([_call(1, "a", 0.25), _call(2, "a", 0.5), _call(3, "b", 0.25), _call(4, "b", None)])
    totals = store.call_totals_by_rollout()
    assert totals["a"] == CallTotals(calls=2, input_tokens=20, output_tokens=10, priced_usd=0.75, unpriced_calls=0)
    assert totals["a"].cost_usd == 0.75
    assert totals["b"].unpriced_calls == 1 and totals["b"].cost_usd is None and totals["b"].priced_usd == 0.25
    both = totals["a"] + totals["b"]
    assert both.cost_usd is None and both.calls == 4 and both.priced_usd == 1.0
    store.close()


def test_summaries_and_objectives_never_show_an_unknown_cost_as_free() -> None:
    totals = {"a1": CallTotals(1, 10, 5, 0.3, 0), "a2": CallTotals(1, 10, 5, 0.1, 0),
              "b1": CallTotals(1, 10, 5, 0.0, 1), "b2": CallTotals(1, 10, 5, 0.0, 1)}
    priced = [_rollout("a1", "t1", "a"), _rollout("a2", "t2", "a")]
    unpriced = [_rollout("b1", "t1", "b"), _rollout("b2", "t2", "b")]
    ma, mb = measure("a", priced, totals), measure("b", unpriced, totals)
    assert ma.cost_usd == pytest.approx(0.4) and ma.unpriced_calls == 0
    assert mb.cost_usd is None and mb.unpriced_calls == 2 and mb.summary_json()["cost_usd"] is None
    assert mb.objectives_json()["cost_per_task_usd"] is None
    assert usd(mb.cost_usd, unpriced_calls=mb.unpriced_calls) == "— (2 unpriced calls)" and usd(0.4) == "$0.4000"
    assert ma.cost_per_task.mean == pytest.approx(0.2) and mb.cost_per_task.mean is None
    # same accuracy: the unknown cost is neither cheaper (it would win the tie) nor dominated on cost
    assert choose([mb, ma], Constraints())[0] == "a"
    assert set(pareto_front([ma, mb])) == {"a", "b"}
    reason = breach(mb, Constraints(max_cost_per_task=1.0))
    assert reason is not None and "unknown" in reason and breach(ma, Constraints(max_cost_per_task=1.0)) is None

    doc = paired_cost(priced, unpriced, totals, totals)
    assert doc["difference"]["mean"] is None and doc["unpriced_calls"] == {"baseline": 0, "candidate": 2}
    known = paired_cost(priced, priced, totals, totals)
    assert known["difference"]["mean"] == 0.0 and known["n_pairs"] == 2


def test_a_fallback_to_the_default_model_is_told_apart_from_a_chosen_model() -> None:
    uses = {
        "r1": [ModelUse("large-1", "triage/small-1", RouteKind.default, "small-1", 2)],
        "r2": [ModelUse("large-1", "triage/small-1", RouteKind.default, "small-1", 2)],
        "r3": [ModelUse("small-1", "triage/small-1", RouteKind.default, "small-1", 2)],  # its own name: no fallback
        "r4": [ModelUse("gpt-4o-mini", "triage/large-1", RouteKind.knob, None, 2)],  # the knob chose: no warning
        "r5": [ModelUse("meta/llama-3", "vllm/meta/llama-3", RouteKind.default, None, 1)],  # slashes in the name
    }
    fell = served_models([_rollout("r1", "t1"), _rollout("r2", "t2")], uses)
    assert fell.served == ["triage/small-1"] and fell.calls == 4
    assert fell.warnings("big") == [
        "variant big: 4 of 4 calls asked for 'large-1' and were served by triage/small-1 (the default model: "
        "'large-1' names no upstream; write it as triage/large-1, or set it with the `model` knob via gateway)"]
    for rid in ("r3", "r4", "r5"):
        assert served_models([_rollout(rid, "t")], uses).warnings("x") == []
    small = served_models([_rollout("r3", "t1")], uses)
    why = same_model("A", small, {}, "B", fell, {})
    assert why is not None and "small-1 vs large-1" in why and "triage/small-1" in why
    assert same_model("A", small, {"p": 1}, "B", small, {"p": 2}) is None  # same model asked for: a prompt change
    assert same_model("A", small, {}, "B", served_models([_rollout("r4", "t")], uses), {}) is None
    knob = ServedModels([ModelUse("m", "u/x", RouteKind.knob, None, 1)])
    assert same_model("A", knob, {"model": "u/x"}, "B", knob, {"model": "u"}) is not None  # u's default is x
