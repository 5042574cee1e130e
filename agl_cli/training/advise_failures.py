"""What training could change, measured from the store: whether repeats of a task vary at all (pass@k above pass@1
needs samples that differ), and what the failures left under the best configuration are.

Reinforcement learning shapes behaviour: the form of an answer, the protocol, when to stop, using tools; and it
sharpens what the model already gets right sometimes. It does not add facts the model lacks. So before training is
called warranted, advise sorts the best configuration's failures into:

- no answer: the agent crashed, timed out, or left no output (behaviour, unless the agent's own code is at fault);
- another form: an answer whose form (advise_evidence.answer_shape) no passing answer has: a format failure;
- sometimes right: a well-formed wrong answer on a task some sample of the model did solve: what RL sharpens;
- wrong content: a well-formed wrong answer on a task no sample ever solved: missing knowledge, which RL cannot add.

Failures of the infrastructure (the grader, the budget, an interruption) are the model's neither way and are left out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from agl_cli.metrics.fmt import pct
from agl_cli.spec.schema import ExperimentSpec
from agl_cli.training.advise_criterion import FAIL, PASS, UNKNOWN, Criterion
from agl_cli.training.advise_evidence import Evidence, RolloutRow
from rl_backend.rewards import passed

HEADROOM_MIN_GAP = 0.10
HEADROOM_MIN_TASKS = 10
HEADROOM_MAX_K = 8
MAX_PASS_AT_1 = 0.95
MIN_VARIED_CHECK = 3  # repeated tasks needed to say that repeats never vary
MIN_CONFIG_ROLLOUTS = 10  # scored rollouts a configuration needs to be judged "the best"
MIN_FAILURES = 5
TRAINABLE_MIN_SHARE = 0.5
NO_ANSWER = ("agent_crashed", "agent_timeout", "no_output", "no_reward_reported")


def open_upstreams(spec: ExperimentSpec) -> dict[str, str]:
    """Upstreams whose weights we hold: embedded ones, and openai-compatible ones that name their `weights`."""
    return {name: up.kind for name, up in spec.upstreams.items()
            if up.kind == "embedded" or (up.kind == "openai-compatible" and up.weights)}


def model_rollouts(spec: ExperimentSpec, ev: Evidence) -> tuple[list[RolloutRow], bool]:
    """The rollouts served only by the open-weight model training would start from, when there are any (True);
    else every rollout (False)."""
    opened = set(open_upstreams(spec))
    own = [r for r in ev.rollouts if r.upstreams and r.upstreams <= opened]
    return (own, True) if own else (ev.rollouts, False)


def pass_at(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _temperature_advice(spec: ExperimentSpec) -> str:
    """How to sample above temperature 0 with this spec: its temperature knob's first such option, or the knob to add."""
    knob = spec.knobs.get("temperature")
    options: Any = getattr(knob, "values", None) or []
    named = options.items() if isinstance(options, dict) else ((f"{v:g}" if isinstance(v, float) else str(v), v)
                                                                for v in options)
    for name, value in named:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return f" with `--variant temperature={name}`"
    return " after adding a knob `temperature: {values: [0.0, 0.7], via: gateway}` (then `--variant temperature=0.7`)"


def repeat_groups(rows: list[RolloutRow]) -> list[list[RolloutRow]]:
    """The scored rollouts of each (run, variant, task) sampled more than once."""
    groups: dict[tuple[str, str, str], list[RolloutRow]] = defaultdict(list)
    for r in rows:
        if r.reward is not None:
            groups[(r.run_id, r.variant, r.task_id)].append(r)
    return [g for g in groups.values() if len(g) >= 2]


def varies(group: list[RolloutRow]) -> bool | None:
    """Whether repeats of one task differ (in output, else in reward); None when no output was kept to tell."""
    if len({r.reward for r in group}) > 1:
        return True
    digests = [r.output_digest for r in group]
    return None if None in digests else len(set(digests)) > 1


def headroom(spec: ExperimentSpec, ev: Evidence) -> Criterion:
    title = "pass@k well above pass@1"
    threshold = f"pass@k - pass@1 >= {100 * HEADROOM_MIN_GAP:.0f} points on >= {HEADROOM_MIN_TASKS} tasks"
    # The model training would start from is the open-weight one: judge its samples when there are any.
    rows, own = model_rollouts(spec, ev)
    groups = repeat_groups(rows)
    train_groups = [g for g in groups if g[0].split == "train"]
    # Training tasks are what training sees; other splits stand in when too few training tasks were sampled.
    chosen = train_groups if len(train_groups) >= HEADROOM_MIN_TASKS else groups
    known = [v for v in (varies(g) for g in chosen) if v is not None]
    if len(known) >= MIN_VARIED_CHECK and not any(known):
        return Criterion(
            "headroom", title, FAIL, {"tasks": len(chosen), "varied": 0}, threshold,
            f"repeats of {len(known)} tasks returned the same output every time: sampling does not vary here",
            "more seeds would pay again for the same answers, and training groups would carry no signal: the "
            "upstream answers deterministically (temperature 0, or an API that ignores temperature or caches "
            "replies). Sample a model that varies at a temperature above 0" + _temperature_advice(spec))
    if len(chosen) < HEADROOM_MIN_TASKS:
        varied = sum(1 for v in known if v)
        if not groups:
            hint = ("check that repeats of a task vary first: `agl eval agl.yaml --split train --limit 5 --seeds 2`"
                    + _temperature_advice(spec) + ", then run `agl advise` again; only when they vary, sample more "
                    "(`--seeds 4`): an API that returns the same reply on every repeat gains nothing from seeds")
        elif varied:
            hint = (f"repeats vary ({varied} of {len(known)} tasks sampled twice or more gave different outputs): "
                    f"sample at least {HEADROOM_MIN_TASKS} training tasks several times, `agl eval agl.yaml --split "
                    "train --seeds 4`" + _temperature_advice(spec))
        else:
            hint = ("the repeats so far gave the same output every time; check that sampling varies"
                    + _temperature_advice(spec) + " before paying for more seeds")
        return Criterion("headroom", title, UNKNOWN, None, threshold,
                         f"{len(chosen)} task(s) sampled more than once", hint)
    samples = [[r.reward for r in g if r.reward is not None] for g in chosen]
    k = min(HEADROOM_MAX_K, min(len(s) for s in samples))
    successes = [(len(s), sum(1 for x in s if passed(x, spec.pass_threshold))) for s in samples]
    p1 = sum(c / n for n, c in successes) / len(successes)
    pk = sum(pass_at(n, c, k) for n, c in successes) / len(successes)
    gap = pk - p1
    value = {"k": k, "pass_at_1": round(p1, 4), "pass_at_k": round(pk, 4), "tasks": len(samples)}
    detail = (f"pass@1 {pct(p1, digits=0)}, pass@{k} {pct(pk, digits=0)} over {len(samples)} tasks"
              + ("" if own else " (any model)"))
    if p1 >= MAX_PASS_AT_1:
        return Criterion("headroom", title, FAIL, value, threshold, detail + ": little left to learn",
                         "harder tasks would show what training could add")
    if gap < HEADROOM_MIN_GAP:
        return Criterion("headroom", title, FAIL, value, threshold, detail,
                         "the model rarely solves what it usually fails; a larger model or better tools first"
                         if pk > 0 else "the model never solves these tasks; training has nothing to reinforce")
    return Criterion("headroom", title, PASS, value, threshold, detail)


def best_configuration(rows: list[RolloutRow]) -> tuple[tuple[str, str], list[RolloutRow]] | None:
    """The (run, variant) with the highest mean reward over at least MIN_CONFIG_ROLLOUTS scored rollouts (the
    latest run on a tie): the best prompt and settings measured so far."""
    configs: dict[tuple[str, str], list[RolloutRow]] = defaultdict(list)
    for r in rows:
        configs[(r.run_id, r.variant)].append(r)

    def mean(key: tuple[str, str]) -> float:
        scored = [r.reward for r in configs[key] if r.reward is not None]
        return sum(scored) / len(scored)

    judged = [k for k, rs in configs.items() if sum(1 for r in rs if r.reward is not None) >= MIN_CONFIG_ROLLOUTS]
    if not judged:
        return None
    best = max(judged, key=lambda key: (mean(key), key[0]))
    return best, configs[best]


def classify(config: list[RolloutRow], population: list[RolloutRow], threshold: float) -> dict[str, int]:
    """The configuration's failures by kind (the module docstring); `unknown_form` when no output was kept or no
    answer passed to compare forms with."""
    forms = {r.output_shape for r in config if r.reward is not None and passed(r.reward, threshold)} - {None}
    solved = {r.task_id for r in population if r.reward is not None and passed(r.reward, threshold)}
    kinds = {"no_answer": 0, "another_form": 0, "sometimes_right": 0, "wrong_content": 0, "unknown_form": 0}
    for r in config:
        if r.reward is None:
            if r.failure in NO_ANSWER:
                kinds["no_answer"] += 1
            continue  # the grader's, the budget's or an interruption's: not the model's failure
        if passed(r.reward, threshold):
            continue
        if r.output_shape is None or not forms:
            kinds["unknown_form"] += 1
        elif r.output_shape not in forms:
            kinds["another_form"] += 1
        elif r.task_id in solved:
            kinds["sometimes_right"] += 1
        else:
            kinds["wrong_content"] += 1
    return kinds


def remaining_failures(spec: ExperimentSpec, ev: Evidence) -> Criterion:
    title = "the failures left are ones training can fix"
    threshold = (f">= {pct(TRAINABLE_MIN_SHARE, digits=0)} of the best configuration's failures are behaviour (no "
                 "answer, another form than the passing answers) or sometimes right")
    rows, _ = model_rollouts(spec, ev)
    found = best_configuration(rows)
    if found is None:
        return Criterion("remaining_failures", title, UNKNOWN, None, threshold,
                         f"no configuration has {MIN_CONFIG_ROLLOUTS} scored rollouts yet",
                         "evaluate the best prompt and settings so far on val (`agl eval agl.yaml --split val`)")
    (run_id, variant), config = found
    kinds = classify(config, rows, spec.pass_threshold)
    scored = [r.reward for r in config if r.reward is not None]
    rate = sum(1 for x in scored if passed(x, spec.pass_threshold)) / len(scored)
    judged = kinds["no_answer"] + kinds["another_form"] + kinds["sometimes_right"] + kinds["wrong_content"]
    trainable = judged - kinds["wrong_content"]
    value = {"configuration": f"{run_id}:{variant}", "pass_rate": round(rate, 4), "n": len(scored), **kinds,
             "trainable_share": round(trainable / judged, 4) if judged else None}
    detail = (f"under {run_id}:{variant} ({pct(rate)} of {len(scored)} scored rollouts passed): "
              f"{kinds['no_answer']} without an answer, {kinds['another_form']} in another form than the passing "
              f"answers, {kinds['sometimes_right']} wrong but right in another sample, {kinds['wrong_content']} "
              "well-formed but wrong on tasks never solved")
    if kinds["unknown_form"]:
        detail += f", {kinds['unknown_form']} of unknown form (no output kept, or no passing answer to compare)"
    if judged < MIN_FAILURES:
        return Criterion("remaining_failures", title, UNKNOWN, value, threshold, detail,
                         f"too few failures to tell what they are ({judged} judged, at least {MIN_FAILURES} needed): "
                         "the agent's output file is what is compared, so keep the agent writing its answer there")
    if trainable / judged < TRAINABLE_MIN_SHARE:
        return Criterion("remaining_failures", title, FAIL, value, threshold, detail,
                         f"{pct(kinds['wrong_content'] / judged, digits=0)} of the failures left are well-formed "
                         "answers with the wrong content on tasks the model never gets right: missing knowledge. "
                         "Reinforcement learning shapes behaviour (format, protocol, when to stop, using tools) and "
                         "sharpens what the model sometimes gets right; it does not add facts. Give the agent the "
                         "facts first (retrieval, a tool, a larger model)")
    return Criterion("remaining_failures", title, PASS, value, threshold, detail)
