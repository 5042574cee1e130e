"""From a rollout's recorded model calls to training sequences, on the exact token ids the model saw and sampled.

A rollout's calls are taken in the order they started. A call is merged into the sequence built so far only when
its prompt token ids extend that sequence (earlier prompt + completion + whatever the harness appended) exactly;
otherwise a new sequence starts, and the report says why ("prompt diverged at token k", "prompt is shorter than the
sequence so far"...). Text is never retokenized: every id comes from the gateway's record of the call.

Tokens the model did not sample in this call (the prompt, tool results, harness text) get loss mask 0; the sampled
completion tokens get mask 1 and carry their recorded logprobs as the old policy's logprobs. A call whose logprobs are
missing keeps its tokens trainable with NaN old logprobs, which the backend replaces by the current policy's own
(so the first update of that call is exactly on-policy).

Pure Python: no torch here, so the CLI can build and show a report without the training stack.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rl_backend.store.db import RunStore
from rl_backend.store.records import CallRecord, Rollout

MergeMode = Literal["previous", "any"]


@dataclass
class TokenSequence:
    """One training row: token ids with a loss mask and the old policy's logprobs (0.0 where the mask is 0)."""

    rollout_id: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)
    model_versions: list[str | None] = field(default_factory=list)

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)

    def __len__(self) -> int:
        return len(self.token_ids)

    def extends(self, prompt: list[int]) -> bool:
        n = len(self.token_ids)
        return len(prompt) >= n and prompt[:n] == self.token_ids

    def append_call(self, call: CallRecord, prompt: list[int], completion: list[int], logprobs: list[float]) -> None:
        new_context = prompt[len(self.token_ids) :]
        self.token_ids += new_context + completion
        self.loss_mask += [0] * len(new_context) + [1] * len(completion)
        self.old_logprobs += [0.0] * len(new_context) + logprobs
        self.call_ids.append(call.call_id)
        self.model_versions.append(call.model_version)


@dataclass
class RolloutTrajectory:
    """A rollout ready for training: its reward, its group (for GRPO) and its sequences in call order."""

    rollout_id: str
    group: str
    reward: float
    sequences: list[TokenSequence]
    task_id: str = ""

    @property
    def trained_tokens(self) -> int:
        return sum(s.trained_tokens for s in self.sequences)


@dataclass(frozen=True)
class MergeBreak:
    rollout_id: str
    call_index: int  # index of the call that started the new sequence, in start order
    call_id: str
    kind: str  # prompt_diverged | prompt_shorter
    cause: str  # for a person: "prompt diverged at token 17 (sequence so far: 40 tokens)"


@dataclass(frozen=True)
class SkippedCall:
    rollout_id: str
    call_index: int
    call_id: str
    kind: str  # call_failed | missing_token_ids
    reason: str


@dataclass(frozen=True)
class DroppedRollout:
    rollout_id: str
    kind: str  # no_reward | no_calls | no_token_ids | no_trained_tokens | not_found
    reason: str


@dataclass
class TrajectoryReport:
    """What happened to one batch on its way to training rows."""

    rollouts: int = 0
    kept: int = 0
    sequences_per_rollout: dict[str, int] = field(default_factory=dict)
    breaks: list[MergeBreak] = field(default_factory=list)
    skipped_calls: list[SkippedCall] = field(default_factory=list)
    dropped: list[DroppedRollout] = field(default_factory=list)
    calls_without_logprobs: int = 0  # trainable calls whose old logprobs the backend recomputes
    first_token_unmasked: int = 0  # sequences whose first token was sampled with no context: cannot be trained

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest: counts, causes grouped by kind, and a few examples of each."""
        seqs = list(self.sequences_per_rollout.values())
        return {
            "rollouts": self.rollouts,
            "kept": self.kept,
            "sequences": sum(seqs),
            "sequences_per_rollout": {
                "mean": (sum(seqs) / len(seqs)) if seqs else 0.0,
                "max": max(seqs, default=0),
                "histogram": {str(k): v for k, v in sorted(Counter(seqs).items())},
            },
            "merge_breaks": dict(Counter(b.kind for b in self.breaks)),
            "merge_break_examples": [b.cause for b in self.breaks[:5]],
            "skipped_calls": dict(Counter(s.kind for s in self.skipped_calls)),
            "dropped": dict(Counter(d.kind for d in self.dropped)),
            "dropped_examples": [f"{d.rollout_id}: {d.reason}" for d in self.dropped[:5]],
            "calls_without_logprobs": self.calls_without_logprobs,
            "first_token_unmasked": self.first_token_unmasked,
        }


def default_group(rollout: Rollout) -> str:
    """GRPO groups: the rollouts of one task under one variant (their seeds differ)."""
    return f"{rollout.variant}/{rollout.task_id}"


def _call_problem(call: CallRecord) -> tuple[str, str] | None:
    if call.error or (call.status_code is not None and call.status_code >= 400):
        return "call_failed", f"the call failed ({call.status_code}): {(call.error or '')[:120]}"
    missing = [n for n in ("prompt_token_ids", "completion_token_ids") if getattr(call, n) is None]
    if missing:
        return "missing_token_ids", f"missing token ids ({', '.join(missing)}); upstream {call.upstream!r}"
    return None


def _break_cause(seq: TokenSequence, prompt: list[int]) -> tuple[str, str]:
    n = len(seq.token_ids)
    for k, (a, b) in enumerate(zip(seq.token_ids, prompt, strict=False)):
        if a != b:
            return "prompt_diverged", f"prompt diverged at token {k} (sequence so far: {n} tokens)"
    return "prompt_shorter", f"prompt is shorter than the sequence so far ({len(prompt)} < {n} tokens): context was cut"


def build_rollout_sequences(
    rollout_id: str, calls: Iterable[CallRecord], report: TrajectoryReport, *, merge: MergeMode = "previous"
) -> list[TokenSequence]:
    """The sequences of one rollout; breaks and skipped calls are appended to `report`.

    merge="previous" tries only the sequence the previous call extended (the rule of Agent Lightning v1.0);
    merge="any" also tries older sequences of the rollout, so a main agent resuming after a subagent's calls
    continues its own sequence.
    """
    ordered = sorted(calls, key=lambda c: c.started_at)  # stable: equal start times keep store order
    sequences: list[TokenSequence] = []
    current: TokenSequence | None = None
    for index, call in enumerate(ordered):
        problem = _call_problem(call)
        if problem is not None:
            report.skipped_calls.append(SkippedCall(rollout_id, index, call.call_id, *problem))
            continue
        prompt = list(call.prompt_token_ids or [])
        completion = list(call.completion_token_ids or [])
        logprobs = [float(x) for x in call.logprobs] if call.logprobs is not None else None
        if logprobs is None or len(logprobs) != len(completion):
            # Still trainable: the backend uses the current policy's logprobs as the old ones.
            report.calls_without_logprobs += 1
            logprobs = [math.nan] * len(completion)
        target: TokenSequence | None = None
        if current is not None and current.extends(prompt):
            target = current
        elif merge == "any":
            fits = [s for s in sequences if s.extends(prompt)]
            target = max(fits, key=len) if fits else None
        if target is None:
            if current is not None:
                report.breaks.append(MergeBreak(rollout_id, index, call.call_id, *_break_cause(current, prompt)))
            target = TokenSequence(rollout_id)
            sequences.append(target)
        target.append_call(call, prompt, completion, logprobs)
        current = target
    for seq in sequences:
        if seq.loss_mask and seq.loss_mask[0] == 1:
            # A token sampled from an empty prompt has no position that predicts it.
            seq.loss_mask[0] = 0
            seq.old_logprobs[0] = 0.0
            report.first_token_unmasked += 1
    return sequences


def build_trajectories(
    rollouts: Iterable[Rollout],
    calls_by_rollout: Mapping[str, list[CallRecord]],
    *,
    group_of: Callable[[Rollout], str] = default_group,
    merge: MergeMode = "previous",
) -> tuple[list[RolloutTrajectory], TrajectoryReport]:
    """Trajectories for the rollouts that can be trained, and a report on all of them (drops included)."""
    report = TrajectoryReport()
    out: list[RolloutTrajectory] = []
    for rollout in rollouts:
        report.rollouts += 1
        rid = rollout.id
        if rollout.reward is None:
            why = rollout.error or (rollout.failure.value if rollout.failure else f"status {rollout.status.value}")
            report.dropped.append(DroppedRollout(rid, "no_reward", f"no reward: {why}"))
            continue
        calls = calls_by_rollout.get(rid, [])
        if not calls:
            report.dropped.append(DroppedRollout(rid, "no_calls", "the rollout made no recorded model call"))
            continue
        sequences = build_rollout_sequences(rid, calls, report, merge=merge)
        if not sequences:
            report.dropped.append(
                DroppedRollout(rid, "no_token_ids", f"none of its {len(calls)} calls has usable token ids")
            )
            continue
        traj = RolloutTrajectory(rid, group_of(rollout), float(rollout.reward), sequences, rollout.task_id)
        if traj.trained_tokens == 0:
            report.dropped.append(DroppedRollout(rid, "no_trained_tokens", "its calls sampled no tokens"))
            continue
        report.kept += 1
        report.sequences_per_rollout[rid] = len(sequences)
        out.append(traj)
    return out, report


def trajectories_from_store(
    store: RunStore, rollout_ids: Iterable[str], **kwargs: Any
) -> tuple[list[RolloutTrajectory], TrajectoryReport]:
    """build_trajectories over rollouts read from a RunStore; unknown ids are reported as dropped."""
    rollouts: list[Rollout] = []
    missing: list[str] = []
    calls: dict[str, list[CallRecord]] = {}
    for rid in rollout_ids:
        rollout = store.get_rollout(rid)
        if rollout is None:
            missing.append(rid)
            continue
        rollouts.append(rollout)
        calls[rid] = store.calls(rid)
    trajectories, report = build_trajectories(rollouts, calls, **kwargs)
    for rid in missing:
        report.rollouts += 1
        report.dropped.append(DroppedRollout(rid, "not_found", "no such rollout in the run store"))
    return trajectories, report
