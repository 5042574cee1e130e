"""The gateway's spend ceiling: once the calls it has recorded cost as much as the budget, it refuses new ones.

Launch checks (the study's ledger, the eval runner) stop starting rollouts at the budget, but rollouts already
running keep calling the model; this is the backstop that makes the budget a hard ceiling. A refused call gets
HTTP 402 with code `budget_exhausted` (no SDK retries a 402), is recorded with that error, and its rollout is
remembered so the runner reports it as stopped by the budget, never as a wrong answer.

Calls already admitted finish (an answer half-streamed is not cut off), so the spend can pass the budget by what
was in flight when it was reached; no new call starts after that.
"""

from __future__ import annotations

import threading

REFUSAL_CODE = "budget_exhausted"
REFUSAL_STATUS = 402


class SpendLimit:
    """Spend against a ceiling in USD, charged by the gateway's calls as they are recorded.

    Charged on the gateway's event loop and read from the runner's thread: the lock keeps the refused set and the
    total consistent for readers on other threads.
    """

    def __init__(self, limit_usd: float, *, spent_usd: float = 0.0, hint: str = "") -> None:
        if limit_usd < 0:
            raise ValueError(f"a budget must be non-negative, got {limit_usd:g}")
        self.limit_usd = limit_usd
        self.spent_usd = spent_usd
        self.hint = hint
        self.refused_calls = 0
        self._refused_rollouts: set[str] = set()
        self._lock = threading.Lock()

    @property
    def exhausted(self) -> bool:
        return self.spent_usd >= self.limit_usd

    def charge(self, cost_usd: float | None) -> None:
        if cost_usd:
            with self._lock:
                self.spent_usd += cost_usd

    def refuse(self, rollout_id: str) -> str | None:
        """The message for a call this rollout may not make now, else None (the call may go ahead)."""
        if not self.exhausted:
            return None
        with self._lock:
            self.refused_calls += 1
            self._refused_rollouts.add(rollout_id)
        message = (
            f"the budget of ${self.limit_usd:g} is spent (${self.spent_usd:.4f} so far): agl refuses further model "
            "calls"
        )
        return message + (f"; {self.hint}" if self.hint else "")

    def was_refused(self, rollout_id: str) -> bool:
        with self._lock:
            return rollout_id in self._refused_rollouts

    def as_dict(self) -> dict[str, float | int]:
        return {"limit_usd": self.limit_usd, "spent_usd": self.spent_usd, "refused_calls": self.refused_calls}
