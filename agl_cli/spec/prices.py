"""The spec's price table (`prices:` over agl's shipped prices), the models a spec will call, and the refusal of a
budget in USD that agl could not count because one of those models has no price."""

from __future__ import annotations

from agl_cli.errors import ConfigError
from agl_cli.spec.schema import REFERENCE, ExperimentSpec
from rl_backend.gateway.pricing import PriceTable
from rl_backend.gateway.resolver import describe


def price_table(spec: ExperimentSpec) -> PriceTable:
    return PriceTable(spec.prices)


def models_in_use(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """(upstream, model) pairs the spec names: the default model, the `model` knob's values, the proposer's model,
    and each upstream's own model."""
    names: list[str] = []
    if spec.model:
        names.append(spec.model)
    knob = spec.knobs.get("model")
    if knob is not None and knob.via == "gateway":
        names += [str(v) for v in knob.options]
    if spec.proposer is not None:
        names.append(spec.proposer.model)
    names += [f"{name}/{up.model}" for name, up in spec.upstreams.items() if up.model]
    pairs: list[tuple[str, str]] = []
    for name in names:
        head, _, tail = name.partition("/")
        upstream = spec.upstreams.get(head)
        model = tail or (upstream.model if upstream is not None else None)
        if upstream is not None and model and (head, model) not in pairs:
            pairs.append((head, model))
    return pairs


def unpriced_models(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """The models the spec names that would cost something but have no price."""
    table = price_table(spec)
    return [(up, model) for up, model in models_in_use(spec)
            if not table.knows(describe(up, spec.upstreams[up]), model)]


def check_budget_prices(spec: ExperimentSpec, budget_usd: float | None, *, source: str = "budget.usd") -> None:
    """Refuse (exit 2) a budget in USD when a model the spec calls has no price and its upstream is not free: its
    calls could not be counted, so the ceiling would not hold."""
    if budget_usd is None:
        return
    missing = unpriced_models(spec)
    if not missing:
        return
    names = ", ".join(f"{up}/{model}" for up, model in missing)
    entries = "\n".join(f"    {up}/{model}: {{input: 0.0, cached_input: 0.0, output: 0.0}}" for up, model in missing)
    raise ConfigError(
        f"{source} (${budget_usd:g}) cannot be enforced: {names} has no price and its upstream is not free, so "
        "agl could not count what its calls cost",
        hint=f"add the price (USD per 1M tokens) to agl.yaml:\n  prices:\n{entries}\nor mark the upstream "
        f"`free: true`, or drop {source} (see {REFERENCE})",
    )
