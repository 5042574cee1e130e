"""The run store (SQLite) and the records it holds."""

from rl_backend.store.db import RunStore, StoreError
from rl_backend.store.records import (
    Api,
    CallRecord,
    FailureKind,
    RewardSource,
    Rollout,
    RolloutStatus,
)

__all__ = ["Api", "CallRecord", "FailureKind", "RewardSource", "Rollout", "RolloutStatus", "RunStore", "StoreError"]
