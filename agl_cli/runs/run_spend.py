"""What a run spent itself, apart from what it reused.

The result cache copies finished rollouts, and their model calls with the cost they had, from earlier runs into
a new one. Those copies cost the new run nothing: every spend total (the run's budget, its `--json`, its report,
the skill's spend script) counts them apart, so money and rollouts are never counted twice. The store's meta
`cache_imported` maps each copied rollout id to the run it came from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rl_backend.store.db import RunStore
from rl_backend.store.records import Rollout

IMPORTED_META = "cache_imported"  # meta key: {rollout id in this store: source run id}


def reused_sources(store: RunStore) -> dict[str, str]:
    """Rollout id -> the run it was copied from, for every rollout this run reused."""
    return dict(store.get_meta(IMPORTED_META, {}))


def imported_ids(store: RunStore) -> set[str]:
    return set(reused_sources(store))


def reused_among(store: RunStore, keys: list[str], *, skip: set[str] | frozenset[str] = frozenset()
                 ) -> list[tuple[Rollout, str]]:
    """The finished rollouts of these keys (in their order, `skip` left out) that the result cache copied from
    earlier runs, each with the run it came from."""
    sources = reused_sources(store)
    latest = {r.key: r for r in store.rollouts(latest_only=True)}
    return [(r, sources[r.id]) for key in keys
            if key not in skip and (r := latest.get(key)) is not None and r.id in sources]


def from_runs(reused: list[tuple[Rollout, str]]) -> str:
    """'run X', or 'runs X (8), Y (4)'."""
    return _runs_phrase(Counter(source for _, source in reused))


def _runs_phrase(counts: dict[str, int]) -> str:
    runs = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"run {runs[0][0]}" if len(runs) == 1 else "runs " + ", ".join(f"{r} ({n})" for r, n in runs)


def own_usd(store: RunStore) -> float:
    """The priced cost of this run's own model calls (cheap: one aggregate query; for a check before every
    launch)."""
    sources = reused_sources(store)
    return sum(t.priced_usd for rid, t in store.call_totals_by_rollout().items() if rid not in sources)


@dataclass
class RunSpend:
    launched: int  # rollout attempts this run started itself
    priced_usd: float  # the cost of this run's own priced model calls
    reused: int  # rollouts copied from earlier runs
    reused_usd: float  # what the copies' priced calls cost when they first ran: spent there, not again
    reused_from: dict[str, int] = field(default_factory=dict)  # source run id -> rollouts copied from it
    unpriced_calls: int = 0  # this run's own calls without a price: its cost is then unknown

    @property
    def usd(self) -> float | None:
        """This run's own cost; None (unknown) when any of its calls has no price."""
        return None if self.unpriced_calls else self.priced_usd

    def as_json(self) -> dict[str, Any]:
        return {"rollouts_launched": self.launched, "usd": None if self.usd is None else round(self.usd, 6),
                "priced_usd": round(self.priced_usd, 6), "unpriced_calls": self.unpriced_calls,
                "reused_rollouts": self.reused, "reused_usd": round(self.reused_usd, 6),
                "reused_from": self.reused_from}

    def reuse_line(self) -> str | None:
        """'12 rollouts reused from run X' (or from several runs), or None when nothing was reused."""
        if not self.reused:
            return None
        from agl_cli.metrics.fmt import plural, usd

        return (f"{plural(self.reused, 'rollout')} reused from {_runs_phrase(self.reused_from)}: "
                f"not run again, and their {usd(self.reused_usd)} not spent again")


def run_spend(store: RunStore) -> RunSpend:
    sources = reused_sources(store)
    rollout_ids = {r.id for r in store.rollouts()}
    totals = store.call_totals_by_rollout()
    own = [t for rid, t in totals.items() if rid not in sources]
    reused_usd = sum(t.priced_usd for rid, t in totals.items() if rid in sources)
    # A mark without its row (a crash between the two writes) reused nothing.
    present = {rid: run for rid, run in sources.items() if rid in rollout_ids}
    return RunSpend(
        launched=len(rollout_ids - set(sources)), priced_usd=sum(t.priced_usd for t in own), reused=len(present),
        reused_usd=reused_usd, reused_from=dict(Counter(present.values())),
        unpriced_calls=sum(t.unpriced_calls for t in own),
    )
