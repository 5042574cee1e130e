"""Which model served a variant's calls, and the warning when the agent asked for one model and another answered.

The gateway sends a name that matches no upstream to the default model on purpose (an agent that hard-codes
`gpt-4o-mini` runs unchanged on the embedded model), so a variant meant to measure `large-1` can be measuring
`small-1`. Summaries, reports and `agl compare` show the served model of every variant and say when that happened.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_backend.store.records import ModelUse, Rollout


@dataclass
class ServedModels:
    """A variant's calls grouped by (requested, served, route, reported), most calls first."""

    uses: list[ModelUse] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(u.calls for u in self.uses)

    @property
    def served(self) -> list[str]:
        """The upstream/model names that served the calls, most calls first."""
        counts: Counter[str] = Counter()
        for use in self.uses:
            counts[use.served] += use.calls
        return [name for name, _ in counts.most_common()]

    @property
    def requested(self) -> list[str]:
        counts: Counter[str] = Counter()
        for use in self.uses:
            if use.requested:
                counts[use.requested] += use.calls
        return [name for name, _ in counts.most_common()]

    def label(self) -> str:
        """What served this variant: `triage/small-1`, or each model with its share of the calls."""
        served = self.served
        if not served:
            return "—"
        if len(served) == 1:
            return served[0]
        counts = Counter[str]()
        for use in self.uses:
            counts[use.served] += use.calls
        return ", ".join(f"{name} ({counts[name]} calls)" for name in served)

    def fallbacks(self) -> list[tuple[str, str, int]]:
        """(requested, served, calls) where the requested name matched no upstream and another model answered."""
        counts: Counter[tuple[str, str]] = Counter()
        for use in self.uses:
            if use.fell_back and use.requested:
                counts[(use.requested, use.served)] += use.calls
        return [(requested, served, n) for (requested, served), n in counts.most_common()]

    def warnings(self, variant: str) -> list[str]:
        lines = []
        for requested, served, n in self.fallbacks():
            upstream = served.partition("/")[0]
            lines.append(
                f"variant {variant}: {n} of {self.calls} calls asked for {requested!r} and were served by {served} "
                f"(the default model: {requested!r} names no upstream; write it as {upstream}/{requested}, or set it "
                "with the `model` knob via gateway)"
            )
        return lines

    def as_json(self) -> list[dict[str, Any]]:
        return [{"requested": u.requested, "served": u.served, "route": u.route.value if u.route else None,
                 "reported": u.reported, "calls": u.calls} for u in self.uses]


def served_models(rollouts: Iterable[Rollout], uses: Mapping[str, list[ModelUse]]) -> ServedModels:
    counts: Counter[tuple[Any, ...]] = Counter()
    for r in rollouts:
        for use in uses.get(r.id, []):
            counts[(use.requested, use.served, use.route, use.reported)] += use.calls
    return ServedModels([ModelUse(req, served, route, reported, n)
                         for (req, served, route, reported), n in counts.most_common()])


def same_model(base: str, base_served: ServedModels, base_knobs: Mapping[str, Any], candidate: str,
               cand_served: ServedModels, cand_knobs: Mapping[str, Any]) -> str | None:
    """Why comparing these two is not the model comparison it looks like, or None: they asked for different models
    (by the names the agent sent, or by the `model` knob) but one and the same model served every call of both."""
    if len(base_served.served) != 1 or base_served.served != cand_served.served:
        return None
    asked_a, asked_b = set(base_served.requested), set(cand_served.requested)
    knob_a, knob_b = base_knobs.get("model"), cand_knobs.get("model")
    if asked_a == asked_b and knob_a == knob_b:
        return None
    if asked_a != asked_b:
        asked = " vs ".join(", ".join(sorted(s)) or "—" for s in (asked_a, asked_b))
    else:
        asked = f"model knob {knob_a} vs {knob_b}"
    return (f"{base} and {candidate} asked for different models ({asked}), but every call of both was served by "
            f"{base_served.served[0]}: this is not a comparison of two models")
