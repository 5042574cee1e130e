"""What a reward means to agl: the grader's (or the agent's) score of a finished rollout, a finite number (1 for
right, 0 for wrong from the usual grader). Accuracy is the mean reward. A rollout *passes* when its reward is at
least the pass threshold: agl.yaml's `pass_threshold`, DEFAULT_PASS_THRESHOLD when it says nothing. Every count of
passes uses it: training's pass rate, pass^k and pass@k, and the reports' "wrong" rollouts. A rollout without a
reward neither passes nor fails: it is missing, with its reason."""

from __future__ import annotations

DEFAULT_PASS_THRESHOLD = 0.5


def passed(reward: float, threshold: float) -> bool:
    return reward >= threshold
