"""`agl advise`: is this agent ready for weight training? Each criterion with its measured value and threshold,
all read from the run store (advise_evidence); no model is called.

Criteria, in the order a team usually satisfies them:

- open_weight_model: an upstream of kind `embedded`, or `openai-compatible` with `weights:` naming the served
  model's open weights, served scored rollouts of the agent. Training changes weights, so the agent must already
  run on a model whose weights we hold. An openai-compatible upstream without `weights:` may as well be a
  proprietary hosted API: its weights are unknown, never assumed open.
- verifiable_reward: a grader program (`grader.command` or `grader.entry`) scores nearly every finished rollout.
  A reward the agent reports itself (`grader.reported`) does not pass: the policy under training shapes what the
  agent reports, so it can learn to please the report instead of doing the task.
- plateau (advise_plateau.py): the last few prompt-level attempts (studies and journal entries) gained less than
  a threshold along the chain of kept baselines. Fewer attempts than that is "unknown".
- headroom (advise_failures.py): pass@k exceeds pass@1 on tasks sampled several times (by the open-weight model
  when it has such samples): the model can sometimes solve what it usually fails, which is what reinforcement
  learning sharpens. Repeats that never vary fail it: seeds would buy the same answer again.
- remaining_failures (advise_failures.py): the failures left under the best configuration measured are mostly
  behaviour (no answer, an answer in another form than the passing ones) or sometimes right; well-formed wrong
  answers on tasks never solved are missing knowledge, which RL does not add.
- train_tasks: enough distinct tasks in the `train` split, none duplicating a val or test task.
- compute: a Kubernetes context, or a GPU (nvidia-smi, else torch.cuda in a subprocess); CPU only is a warning for
  a small model (<= CPU_MAX_PARAMS_B billion parameters) and a failure otherwise.
- projection: rollouts, tokens and time for TRAIN_EPOCHS epochs of ROLLOUTS_PER_TASK rollouts per training task,
  from the measured rollouts/min, tokens/s and cost per rollout; over the spec's budget fails (with
  `budget.scope: experiment`, over what the spec's runs left of it).

Beside the verdict, `undecided` lists journal entries that lean better without being decided ("likely better,
unproven"), with the evidence that could decide them: they are put to the user, never dropped in silence.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from agl_cli.metrics.fmt import pct, usd
from agl_cli.spec.schema import ExperimentSpec
from agl_cli.training.advise_criterion import FAIL, PASS, UNKNOWN, WARN, Criterion
from agl_cli.training.advise_evidence import Evidence, RolloutRow
from agl_cli.training.advise_failures import headroom, open_upstreams, pass_at, remaining_failures
from agl_cli.training.advise_plateau import plateau, undecided

MIN_OPEN_ROLLOUTS = 10
MIN_REWARD_COVERAGE = 0.95
MIN_TRAIN_TASKS = 100
CPU_MAX_PARAMS_B = 1.0
ROLLOUTS_PER_TASK = 4
TRAIN_EPOCHS = 1

TRAIN, NOT_YET = "train", "not yet"
_open_upstreams = open_upstreams
_pass_at = pass_at  # re-exported: the estimator the headroom criterion uses


def _label(name: str, spec: ExperimentSpec) -> str:
    up = spec.upstreams[name]
    if up.kind == "openai-compatible":
        return f"{name} ({up.kind}, weights {up.weights or 'unknown'})"
    return f"{name} ({up.kind})"


def open_weight_model(spec: ExperimentSpec, ev: Evidence) -> Criterion:
    title = "an open-weight model serves the agent"
    threshold = (f"an embedded upstream, or an openai-compatible one naming its open `weights`, served >= "
                 f"{MIN_OPEN_ROLLOUTS} scored rollouts")
    open_ups = _open_upstreams(spec)
    if not open_ups:
        kinds = ", ".join(_label(n, spec) for n in spec.upstreams) or "none"
        unknown = [n for n, u in spec.upstreams.items() if u.kind == "openai-compatible"]
        if unknown:
            return Criterion("open_weight_model", title, UNKNOWN, 0, threshold, f"upstreams in agl.yaml: {kinds}",
                             f"say where the model behind {unknown[0]!r} comes from: if it serves open weights (vLLM, "
                             f"a local server), add `weights: <Hugging Face id or folder>` under upstreams.{unknown[0]} "
                             "in agl.yaml; a proprietary hosted API cannot be trained, so add an embedded or "
                             "open-weight upstream and measure the agent on it")
        return Criterion("open_weight_model", title, FAIL, 0, threshold, f"upstreams in agl.yaml: {kinds}",
                         "add an upstream of kind embedded (small models on this machine) or openai-compatible "
                         "(vLLM) with `weights:`, then measure the agent on it with `agl eval` and `agl compare` "
                         "against today's model")
    served = [r for r in ev.rollouts if r.reward is not None and r.upstreams and r.upstreams <= set(open_ups)]
    use = ev.upstream_use()
    calls = sum(use[n].calls for n in open_ups if n in use)
    ids = sum(use[n].with_token_ids for n in open_ups if n in use)
    names = ", ".join(_label(n, spec) for n in open_ups)
    detail = f"{names}: {calls} calls, {len(served)} scored rollouts served only by them"
    if served:
        detail += f", mean reward {sum(r.reward or 0.0 for r in served) / len(served):.2f}"
    if len(served) < MIN_OPEN_ROLLOUTS:
        status = UNKNOWN if not ev.rollouts else FAIL
        return Criterion("open_weight_model", title, status, len(served), threshold, detail,
                         f"run the agent on {next(iter(open_ups))}: `agl eval` with the spec's model (or a model "
                         "knob) pointing at it")
    if calls and ids < calls:
        return Criterion("open_weight_model", title, WARN, len(served), threshold,
                         detail + f"; only {pct(ids / calls, digits=0)} of its calls carry token ids, which training needs",
                         "serve the model with vLLM or the embedded server, which return token ids")
    return Criterion("open_weight_model", title, PASS, len(served), threshold, detail)


def verifiable_reward(spec: ExperimentSpec, ev: Evidence) -> Criterion:
    title = "a verifiable reward"
    threshold = f"grader command or entry; >= {pct(MIN_REWARD_COVERAGE, digits=0)} of finished rollouts scored"
    if spec.grader.reported:
        return Criterion("verifiable_reward", title, FAIL, "reported", threshold,
                         "the agent reports its own reward (grader.reported)",
                         "move the check into grader.command or grader.entry, so one program scores every "
                         "training rollout and the policy cannot shape its own reward")
    form = "command" if spec.grader.command else "entry"
    finished = ev.rollouts
    if not finished:
        return Criterion("verifiable_reward", title, UNKNOWN, None, threshold,
                         f"grader {form}; no finished rollouts yet", "run `agl eval` once to measure the grader")
    coverage = sum(1 for r in finished if r.reward is not None) / len(finished)
    detail = f"grader {form}; {pct(coverage, digits=0)} of {len(finished)} finished rollouts scored"
    if coverage < MIN_REWARD_COVERAGE:
        return Criterion("verifiable_reward", title, FAIL, round(coverage, 4), threshold, detail,
                         "fix what leaves rollouts unscored first (the failures script lists the reasons)")
    return Criterion("verifiable_reward", title, PASS, round(coverage, 4), threshold, detail)


def _content_hash(data: dict[str, Any], spec: ExperimentSpec) -> str:
    split_field = getattr(spec.tasks.split, "field", None)
    body = {k: v for k, v in data.items() if k not in (spec.tasks.id_field, split_field)}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def train_tasks(spec: ExperimentSpec) -> Criterion:
    from agl_cli.spec.tasks import load_tasks

    title = "enough distinct training tasks"
    threshold = f">= {MIN_TRAIN_TASKS} distinct tasks in the train split, none also in val or test"
    tasks = load_tasks(spec)
    if not any(t.split for t in tasks):
        return Criterion("train_tasks", title, FAIL, 0, threshold, f"{len(tasks)} tasks, no splits",
                         "add to agl.yaml:  tasks: {split: {fractions: {train: 0.6, val: 0.2, test: 0.2}}}")
    train = {_content_hash(t.data, spec) for t in tasks if t.split == "train"}
    held_out = {_content_hash(t.data, spec) for t in tasks if t.split in ("val", "test")}
    leaked = len(train & held_out)
    detail = f"{len(train)} distinct train tasks of {len(tasks)}"
    if leaked:
        return Criterion("train_tasks", title, FAIL, len(train), threshold,
                         detail + f"; {leaked} also appear in val or test",
                         "remove the duplicates from the train split: training on held-out tasks inflates the result")
    if len(train) < MIN_TRAIN_TASKS:
        return Criterion("train_tasks", title, FAIL, len(train), threshold, detail,
                         f"collect at least {MIN_TRAIN_TASKS - len(train)} more training tasks with the same grader")
    return Criterion("train_tasks", title, PASS, len(train), threshold, detail)


def probe_compute(spec: ExperimentSpec) -> dict[str, Any]:
    """What could run training: a Kubernetes context, GPUs, or only this CPU. Subprocesses keep torch out of agl."""
    config = Path(os.environ.get("KUBECONFIG", str(Path.home() / ".kube" / "config")))
    if spec.runner == "kubernetes" or os.environ.get("KUBERNETES_SERVICE_HOST") or config.is_file():
        where = "in-cluster" if os.environ.get("KUBERNETES_SERVICE_HOST") else f"kubeconfig {config}"
        return {"kind": "cluster", "detail": where}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=False)
            gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            gpus = []
        if gpus:
            return {"kind": "gpu", "detail": "; ".join(gpus)}
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
        count = int(out.stdout.strip() or 0) if out.returncode == 0 else 0
    except (OSError, subprocess.TimeoutExpired, ValueError):
        count = 0
    if count:
        return {"kind": "gpu", "detail": f"{count} CUDA device(s) visible to torch"}
    return {"kind": "cpu", "detail": f"no GPU or Kubernetes context; {os.cpu_count()} CPU cores"}


def model_size_b(spec: ExperimentSpec) -> float | None:
    """Billions of parameters, read from the open-weight model's name (smollm2-135m -> 0.135); None if unknown."""
    for up in spec.upstreams.values():
        if up.kind == "embedded" and up.model:
            match = re.search(r"(\d+(?:\.\d+)?)\s*([mb])\b", up.model.lower().replace("-", " ").replace("_", " "))
            if match:
                return float(match.group(1)) / (1000.0 if match.group(2) == "m" else 1.0)
    return None


def compute(spec: ExperimentSpec, found: dict[str, Any]) -> Criterion:
    title = "a GPU or cluster reachable"
    threshold = f"a GPU or Kubernetes context; CPU only for models <= {CPU_MAX_PARAMS_B:g}B parameters (slow)"
    if found["kind"] in ("gpu", "cluster"):
        return Criterion("compute", title, PASS, found["kind"], threshold, found["detail"])
    size = model_size_b(spec)
    if size is not None and size <= CPU_MAX_PARAMS_B:
        return Criterion("compute", title, WARN, "cpu", threshold,
                         found["detail"] + f"; the {size:g}B embedded model trains on CPU, slowly",
                         "a GPU would make each training step many times faster")
    return Criterion("compute", title, FAIL, "cpu", threshold, found["detail"],
                     "get a GPU machine or a Kubernetes context (`agl doctor` shows what is reachable)")


def projection(spec: ExperimentSpec, ev: Evidence, n_train: int) -> Criterion:
    title = "projected training cost and time"
    # With budget.scope experiment these are what the spec's runs left (advise_cmd counts them).
    max_rollouts, max_usd = spec.budget.run_rollouts(), spec.budget.run_usd()
    left = " left" if spec.budget.scope == "experiment" else ""
    limits = []
    if max_rollouts is not None:
        limits.append(f"budget.rollouts{left} {max_rollouts}")
    if max_usd is not None:
        limits.append(f"budget.usd{left} {max_usd:g}")
    threshold = "within " + (", ".join(limits) if limits else "the spec's budget (none set)")
    timed = [r for r in ev.rollouts if r.started_at is not None and r.ended_at is not None]
    spans: dict[str, list[RolloutRow]] = {}
    for r in timed:
        spans.setdefault(r.run_id, []).append(r)
    seconds = sum(max(r.ended_at or 0.0 for r in rs) - min(r.started_at or 0.0 for r in rs) for rs in spans.values())
    if not timed or seconds <= 0:
        return Criterion("projection", title, UNKNOWN, None, threshold, "no timed rollouts in the store",
                         "run `agl eval` once so throughput and cost are measured")
    per_min = 60.0 * len(timed) / seconds
    use = ev.upstream_use()
    open_use = [use[n] for n in _open_upstreams(spec) if n in use]
    out_tokens = sum(u.output_tokens for u in open_use)
    latency = sum(u.latency_s for u in open_use)
    cost = sum(u.cost_usd for u in use.values())
    unpriced = sum(u.unpriced_calls for u in use.values())
    rollouts = n_train * ROLLOUTS_PER_TASK * TRAIN_EPOCHS
    projected = None if unpriced else round(cost / len(timed) * rollouts, 4)
    value: dict[str, Any] = {
        "rollouts": rollouts, "rollouts_per_min": round(per_min, 2),
        "tokens_per_s": round(out_tokens / latency, 1) if latency > 0 else None,
        "hours": round(rollouts / per_min / 60.0, 2),
        "usd": projected,
    }
    money = (f"an unknown cost ({unpriced} calls without a price; declare them under `prices:`)" if projected is None
             else usd(projected))
    detail = (f"{rollouts} rollouts ({n_train} train tasks x {ROLLOUTS_PER_TASK} x {TRAIN_EPOCHS} epoch) at "
              f"{per_min:.1f} rollouts/min: about {value['hours']} h of rollouts plus the updates, {money}")
    over = []
    if max_rollouts is not None and rollouts > max_rollouts:
        over.append(f"{rollouts} rollouts > {max_rollouts}")
    if max_usd is not None and projected is not None and projected > max_usd:
        over.append(f"{usd(projected)} > ${max_usd:g}")
    if over:
        return Criterion("projection", title, FAIL, value, threshold, detail + "; over budget: " + ", ".join(over),
                         "raise the budget in agl.yaml, or train on fewer tasks")
    if projected is None and max_usd is not None:
        return Criterion("projection", title, UNKNOWN, value, threshold, detail,
                         "declare the price of every model under `prices:` in agl.yaml so the cost can be projected")
    return Criterion("projection", title, PASS, value, threshold, detail)


def advise(spec: ExperimentSpec, ev: Evidence, found: dict[str, Any]) -> dict[str, Any]:
    """The verdict document: `train` only when every criterion passes (warnings allowed)."""
    tasks_criterion = train_tasks(spec)
    n_train = tasks_criterion.value if isinstance(tasks_criterion.value, int) else 0
    criteria = [
        open_weight_model(spec, ev), verifiable_reward(spec, ev), plateau(ev), headroom(spec, ev),
        remaining_failures(spec, ev), tasks_criterion, compute(spec, found), projection(spec, ev, n_train),
    ]
    ready = all(c.status in (PASS, WARN) for c in criteria)
    return {
        "verdict": TRAIN if ready else NOT_YET,
        "spec": str(ev.spec_path),
        "run": ev.focus_run,
        "evidence": {"runs": len(ev.runs), "studies": sum(1 for r in ev.runs if r.kind == "study"),
                     "rollouts": len(ev.rollouts), "journal_entries": len(ev.journal)},
        "criteria": [c.as_dict() for c in criteria],
        "next_steps": [c.hint for c in criteria if c.status in (FAIL, UNKNOWN) and c.hint],
        "warnings": [c.detail for c in criteria if c.status == WARN],
        "undecided": undecided(ev),
    }
