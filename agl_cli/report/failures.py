"""The failure breakdown: per variant, how many rollouts were wrong, had no reward and why (agent errors,
timeouts, grader failures, missing rewards), and how many model calls failed; plus examples to read."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from agl_cli.report.collect import RunData
from rl_backend.rewards import passed
from rl_backend.store.records import Rollout

EXAMPLES_PER_REASON = 2
WRONG_EXAMPLES = 3


@dataclass
class FailureRow:
    variant: str
    planned: int = 0
    scored: int = 0
    wrong: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    rollouts_with_failed_calls: int = 0
    failed_calls: int = 0

    @property
    def missing(self) -> int:
        return sum(self.reasons.values())


@dataclass
class Example:
    variant: str
    reason: str
    message: str
    rollout_id: str


def _message(r: Rollout) -> str:
    """The most telling line: the error, else the last line of stderr, else the grader's detail."""
    for text in (r.error, r.stderr_tail):
        lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
        if lines:
            return lines[-1][:300]
    if r.grader_detail:
        return json.dumps(r.grader_detail, default=str)[:300]
    return "no message recorded"


def breakdown(data: RunData) -> tuple[list[FailureRow], list[Example]]:
    rows: dict[str, FailureRow] = {}
    examples: list[Example] = []
    seen: dict[tuple[str, str], int] = defaultdict(int)
    for section in data.sections:
        for vrow in section.rows:
            row = rows.setdefault(vrow.name, FailureRow(vrow.name))
            row.planned += vrow.planned
            row.scored += vrow.accuracy.n
            row.wrong += vrow.wrong
            row.reasons.update(vrow.missing_reasons)
            for r in section.rollouts.get(vrow.name, []):
                failed = data.usage.failed_calls.get(r.id, 0)
                row.failed_calls += failed
                row.rollouts_with_failed_calls += 1 if failed else 0
                if r.reward is not None and not passed(r.reward, data.pass_threshold):
                    reason = "wrong answer"
                elif r.reward is None and r.status.terminal:
                    reason = r.failure.value if r.failure else "unknown"
                else:
                    continue
                limit = WRONG_EXAMPLES if reason == "wrong answer" else EXAMPLES_PER_REASON
                if reason == "wrong answer" and section.role_of(vrow.name) == "" and len(section.rows) > 1:
                    continue  # wrong answers are shown for the baseline and the winner only; the counts have all
                if seen[(vrow.name, reason)] < limit:
                    seen[(vrow.name, reason)] += 1
                    message = f"reward {r.reward:g}" if r.reward is not None else _message(r)
                    if r.reward is not None and r.grader_detail:
                        message += f"; grader: {json.dumps(r.grader_detail, default=str)[:200]}"
                    examples.append(Example(vrow.name, reason, message, r.id))
    # Real failures before merely wrong answers: they are what needs fixing first.
    examples.sort(key=lambda e: (e.reason == "wrong answer", e.variant, e.reason))
    return list(rows.values()), examples


def reason_columns(rows: list[FailureRow]) -> list[str]:
    """Only the reasons that occurred, most frequent first, so the table stays narrow."""
    total: Counter[str] = Counter()
    for row in rows:
        total.update(row.reasons)
    return [reason for reason, n in total.most_common() if n]
