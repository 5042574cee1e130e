"""The whole study: search on the validation split (grid or racing), choose under the constraints, confirm the
choice against the baseline on the held-out test split, price the frontier at the user's volume (and, when the most
accurate and the cheapest good configuration differ, confirm that trade-off on the test split too), write
`agl.best.yaml`, and report.

Everything reads back from the study's store, so a resumed study replays its decisions over what already ran
and only runs what is missing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from agl_cli.console import stderr_console
from agl_cli.metrics.cost import cost_fields
from agl_cli.metrics.fmt import points
from agl_cli.metrics.paired import BETTER, NO_DIFFERENCE, WORSE, Comparison, compare, difference
from agl_cli.metrics.rollout_costs import latencies, paired_cost
from agl_cli.metrics.run import costs_of, latest_by_variant, scores_of
from agl_cli.metrics.variant import VariantMetrics, measure
from agl_cli.optimize.best_config import describe_settings, knob_changes, write_best
from agl_cli.optimize.execute import Executor, session
from agl_cli.optimize.frontier import choice_message, frontier, held_out
from agl_cli.optimize.objectives import Constraints, breach, choose, pareto_front
from agl_cli.optimize.racing import Round, race
from agl_cli.optimize.study import Ledger, Study
from rl_backend.store.db import RunStore

ROUNDS_META = "study.rounds"
RESULT_META = "study.result"


def paired_report(store: RunStore, split: str, base: str, winner: str) -> tuple[Comparison, dict[str, Any]]:
    """The winner against the baseline on one split: accuracy verdict, plus cost and latency differences."""
    grouped = latest_by_variant(store, split=split)
    a, b = grouped.get(base, []), grouped.get(winner, [])
    result = compare(scores_of(a), scores_of(b))
    totals = store.call_totals_by_rollout()
    doc = {
        "split": split, "baseline": base, "candidate": winner, **result.as_dict(),
        "cost_usd_per_task": paired_cost(a, b, totals, totals),
        "latency_s": difference(latencies(a), latencies(b)).as_dict(),
    }
    return result, doc


def describe_round(r: Round) -> str:
    parts = [f"round {r.index}: {r.tasks} tasks, leader {r.leader}"]
    for d in r.dropped:
        if d.reason == "worse":
            parts.append(f"dropped {d.variant} ({points(d.detail['difference'])} vs leader, p={d.detail['p_value']:.3g})")
        else:
            parts.append(f"dropped {d.variant} ({d.detail['why']})")
    parts.append(f"{len(r.survivors)} left" + (" (stopped by the budget)" if r.partial else ""))
    return "; ".join(parts)


class StudyEngine:
    def __init__(self, study: Study, *, quiet: bool, console: Console | None = None) -> None:
        self.study = study
        self.quiet = quiet
        self.console = console or stderr_console()
        self.options = study.options
        self.constraints = Constraints(self.options.max_cost_per_task, self.options.max_p95_latency)
        self.by_name = {v.name: v for v in study.variants}
        self.rounds: list[dict[str, Any]] = []
        self.reflect: dict[str, Any] | None = None  # the reflect strategy's proposals and front

    # -- callbacks for the search ----------------------------------------------------------------------------

    def _read_scores(self, store: RunStore) -> dict[str, dict[tuple[str, int], float]]:
        grouped = latest_by_variant(store, split=self.options.search_split)
        return {name: scores_of(grouped.get(name, [])) for name in self.by_name}

    def _read_costs(self, store: RunStore) -> dict[str, dict[tuple[str, int], float] | None]:
        grouped = latest_by_variant(store, split=self.options.search_split)
        totals = store.call_totals_by_rollout()
        return {name: costs_of(grouped.get(name, []), totals) for name in self.by_name}

    def _metrics(self, store: RunStore, names: list[str], tasks: set[str] | None = None) -> list[VariantMetrics]:
        grouped = latest_by_variant(store, split=self.options.search_split, tasks=tasks)
        totals = store.call_totals_by_rollout()
        return [measure(n, grouped.get(n, []), totals, k=self.study.seeds, pass_threshold=self.study.spec.pass_threshold)
                for n in names]

    def _infeasible(self, store: RunStore, survivors: list[str], tasks: set[str]) -> dict[str, str]:
        if self.constraints == Constraints():
            return {}
        return {m.name: why for m in self._metrics(store, survivors, tasks) if (why := breach(m, self.constraints))}

    # -- phases ----------------------------------------------------------------------------------------------

    def search(self, store: RunStore, executor: Executor) -> tuple[list[str], bool]:
        names = [v.name for v in self.study.variants]
        tasks = {t.id: t for t in self.study.search_tasks}

        def run_batch(variant_names: list[str], task_ids: list[str]) -> bool:
            label = f"search ({len(variant_names)} variants x {len(task_ids)} tasks)"
            return executor.run([self.by_name[n] for n in variant_names], [tasks[t] for t in task_ids], label=label)

        if self.study.strategy == "grid":
            completed = run_batch(names, list(tasks))
            return names, not completed
        if self.study.strategy == "reflect":
            return self._reflect(store, executor)

        def on_round(r: Round) -> None:
            self.console.print(describe_round(r) + f" | {executor.ledger.describe()}")
            self.rounds.append(r.as_dict())
            store.set_meta(ROUNDS_META, self.rounds)

        result = race(
            names, list(tasks), run_batch, lambda: self._read_scores(store), first=self.options.first_batch,
            infeasible=lambda s, t: self._infeasible(store, s, t), on_round=on_round,
            read_costs=lambda: self._read_costs(store),
        )
        return result.survivors, result.stopped_for_budget

    def _reflect(self, store: RunStore, executor: Executor) -> tuple[list[str], bool]:
        from agl_cli.optimize.reflect import ReflectSearch

        def on_round(doc: dict[str, Any]) -> None:
            self.rounds.append(doc)
            store.set_meta(ROUNDS_META, self.rounds)

        result = ReflectSearch(self.study, store, executor, self.console, on_round=on_round).run()
        self.by_name = {v.name: v for v in self.study.variants}  # the proposals joined the study's variants
        self.reflect = result.doc
        return result.survivors, result.stopped_for_budget

    def run(self, store: RunStore, executor: Executor, ledger: Ledger) -> dict[str, Any]:
        study, opts = self.study, self.options
        base = study.baseline.name
        ledger.confirm_rollouts = 2 * len(study.confirm_tasks) * study.seeds
        self.console.print(
            f"study {study.run.run_id}: {len(study.variants)} variants, strategy {study.strategy}, "
            f"{len(study.search_tasks)} {opts.search_split} tasks to search, {len(study.confirm_tasks)} "
            f"{opts.confirm_split} tasks to confirm, {study.seeds} seed(s) | {ledger.describe()}"
        )
        survivors, budget_hit = self.search(store, executor)
        names = [v.name for v in study.variants]
        metrics = self._metrics(store, names)
        front = pareto_front(metrics)
        winner, note = choose([m for m in metrics if m.name in survivors], self.constraints)
        report: dict[str, Any] = {
            "strategy": study.strategy, "rounds": self.rounds, "constraints": self.constraints.as_dict(),
            "volume": study.spec.volume.as_dict() if study.spec.volume is not None else None,
            "pareto_front": front, "variants": self._variant_rows(metrics, survivors, front), "note": note,
            "frontier": self._frontier(store, metrics, survivors),
            "winner": None, "validation": None, "confirmation": None, "best_config": None, "messages": [],
        }
        if self.reflect is not None:
            report["reflect"] = self.reflect
        messages: list[str] = report["messages"]
        if note:
            messages.append(note)
        if winner is None:
            report["recommendation"] = "none"
            return self._finish(report, budget_hit)
        changes = knob_changes(study.spec, study.baseline, self.by_name[winner])
        report["winner"] = {"name": winner, "knobs": self.by_name[winner].settings, "changes": changes}
        if winner == base:
            messages.append("the baseline is the best variant found: nothing to change")
            report["recommendation"] = "keep the baseline"
            budget_hit = not self._confirm_ends(report, store, executor) or budget_hit
            return self._finish(report, budget_hit)
        validation, report["validation"] = paired_report(store, opts.search_split, base, winner)
        ledger.confirm_rollouts = 0
        completed = executor.run([study.baseline, self.by_name[winner]], study.confirm_tasks, label="confirm")
        budget_hit = budget_hit or not completed
        confirmation, report["confirmation"] = paired_report(store, opts.confirm_split, base, winner)
        if not completed:
            messages.append(f"the budget stopped the confirmation after {confirmation.n_tasks} of "
                            f"{len(study.confirm_tasks)} {opts.confirm_split} tasks")
        self._judge(report, validation, confirmation)
        budget_hit = not self._confirm_ends(report, store, executor) or budget_hit
        header = (
            f"Written by agl optimize, study {study.run.run_id}: {winner} ({describe_settings(changes)}).\n"
            f"On {opts.confirm_split}: {confirmation.verdict}, {points(confirmation.difference)} vs the baseline "
            f"over {confirmation.n_tasks} tasks; recommendation: {report['recommendation']}.\n"
            "Each knob's winning option is first, so it is this config's baseline."
        )
        path, diff = write_best(study.spec_path, study.spec, self.by_name[winner], header=header,
                                study_dir=study.run.path)
        report["best_config"] = {"path": str(path), "diff": diff}
        (study.run.path / "best.diff").write_text(diff)
        return self._finish(report, budget_hit)

    def _frontier(self, store: RunStore, metrics: list[VariantMetrics], survivors: list[str]) -> dict[str, Any]:
        """The frontier of the variants still in the search (racing dropped the others as worse than one that costs
        no more) that meet the constraints."""
        study = self.study
        pool = [m for m in metrics if m.name in survivors]
        feasible = {m.name for m in pool if breach(m, self.constraints) is None}
        return frontier(pool, latest_by_variant(store, split=self.options.search_split),
                        store.call_totals_by_rollout(), baseline=study.baseline.name,
                        settings={v.name: v.settings for v in study.variants}, split=self.options.search_split,
                        volume=study.spec.volume, feasible=feasible)

    def _confirm_ends(self, report: dict[str, Any], store: RunStore, executor: Executor) -> bool:
        """When the frontier holds a choice, run its ends on the held-out split too (what the confirmation has not
        run yet) and pair them there; False when the budget stopped that."""
        doc = report["frontier"]
        if not doc["choice"]:
            return True
        ends = [self.by_name[n] for n in (doc["cheapest_good"], doc["most_accurate"])]
        executor.ledger.confirm_rollouts = 0  # the reserve held back for the confirmation is this run's to use
        # What the confirmation already ran is not run again (a baseline or winner among the ends).
        completed = executor.run(ends, self.study.confirm_tasks, label="confirm the frontier's ends")
        split = self.options.confirm_split
        doc["held_out"] = held_out(doc, latest_by_variant(store, split=split), store.call_totals_by_rollout(),
                                   split=split, volume=self.study.spec.volume)
        if not completed:
            report["messages"].append(f"the budget stopped the frontier's ends on {split} before they finished")
        message = choice_message(doc)
        if message:
            report["messages"].append(message)
        return completed

    def _judge(self, report: dict[str, Any], validation: Comparison, confirmation: Comparison) -> None:
        messages: list[str] = report["messages"]
        split = self.options.confirm_split
        if confirmation.verdict == BETTER:
            report["recommendation"] = "adopt"
        elif confirmation.verdict == WORSE:
            report["recommendation"] = "keep the baseline"
            messages.append(f"on the held-out {split} split the winner is worse than the baseline")
        else:
            report["recommendation"] = "inconclusive"
            more = confirmation.more_tasks
            messages.append(
                f"on the held-out {split} split the winner shows {NO_DIFFERENCE} from the baseline"
                + (f"; about {more} more {split} tasks would likely decide it" if more else "")
            )
        if (
            validation.difference is not None
            and confirmation.difference is not None
            and confirmation.difference < validation.difference
        ):
            messages.append(
                f"the {split} gain ({points(confirmation.difference)}) falls short of the validation gain "
                f"({points(validation.difference)}): picking the best of several on the same tasks flatters it"
            )

    def _variant_rows(self, metrics: list[VariantMetrics], survivors: list[str], front: list[str]) -> list[dict]:
        dropped = {d["variant"]: {"round": r["round"], **d} for r in self.rounds for d in r["dropped"]}
        rows = []
        for m in metrics:
            variant = self.by_name[m.name]
            status = "survived" if m.name in survivors else "dropped"
            rows.append({
                **m.objectives_json(), **cost_fields(m, self.study.spec.volume), "hash": variant.hash,
                "knobs": variant.settings, "status": status,
                "dropped": dropped.get(m.name), "pareto": m.name in front, "breach": breach(m, self.constraints),
            })
        return rows

    def _finish(self, report: dict[str, Any], budget_hit: bool) -> dict[str, Any]:
        report["budget_reached"] = budget_hit
        if budget_hit:
            report["messages"].append("the budget was reached: the search or the confirmation is incomplete")
        return report


def execute_study(study: Study, *, quiet: bool, use_cache: bool) -> dict[str, Any]:
    """Run (or resume) a study to its end; returns the report. KeyboardInterrupt leaves it resumable."""
    console = stderr_console()
    opts = study.options
    manifest = study.run.manifest()
    manifest["status"] = "running"
    study.run.write_manifest(manifest)
    engine = StudyEngine(study, quiet=quiet, console=console)
    report: dict[str, Any] = {}
    spend: dict[str, Any] = {}
    try:
        with session(study, quiet=quiet, use_cache=use_cache, console=console) as executor:
            try:
                report = engine.run(executor.store, executor, executor.ledger)
                status = "budget_reached" if report["budget_reached"] else "completed"
            except KeyboardInterrupt:
                status = "interrupted"
                report = {"rounds": engine.rounds}
            spend = {**executor.ledger.as_dict(), "reused_from_cache": executor.reused,
                     "not_reused": executor.reuse.as_json()["not_reused"]}
            report = {
                "study_id": study.run.run_id, "study_dir": str(study.run.path), "status": status,
                "agent_version": study.agent_version, "seeds": study.seeds,
                "splits": {"search": {"name": opts.search_split, "tasks": len(study.search_tasks)},
                           "confirm": {"name": opts.confirm_split, "tasks": len(study.confirm_tasks)}},
                **report, "spend": spend,
            }
            executor.store.set_meta(RESULT_META, report)
    except KeyboardInterrupt:  # a second Ctrl-C while the stack shut down
        status = "interrupted"
        report = {"study_id": study.run.run_id, "study_dir": str(study.run.path), "status": status}
    manifest["status"] = status
    if report.get("winner"):
        manifest["winner"] = report["winner"]["name"]
    study.run.write_manifest(manifest)
    return report
