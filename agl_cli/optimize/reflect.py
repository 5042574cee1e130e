"""The `reflect` strategy of `agl optimize`: an LLM proposer reads a prompt and transcripts of its failing rollouts
and writes a new prompt; the new prompt is a variant like any candidate file, and it is kept only when the paired
rule says `better` than its parent on the search split.

One round per proposal:
1. parent: drawn (seeded) from the per-task Pareto front of the kept candidates (pareto.py);
2. minibatch: a seeded sample of `proposer.minibatch` search tasks; the parent's failing rollouts there are shown;
3. proposal: the proposer's reply, written to `<study>/proposals/reflect-<n>.<ext>`, or rejected with its reason
   (no prompt, identical to its parent, too long, the call failed);
4. screen: the child runs on the minibatch first and goes on only if it scores more than its parent there (GEPA's
   cheap filter: most bad proposals cost a minibatch, not the whole split);
5. verdict: the child runs on every search task; `compare(parent, child)` at alpha / rounds (a union bound over
   the planned proposals, as racing does over its rounds) must say `better` for the child to be kept.

Every proposal is recorded in the store's meta (`reflect.proposals`) as soon as it is made. A resumed study replays
the rounds: a recorded proposal is never requested again, and screen and verdict are recomputed from the rollouts
already in the store (the executor runs only what is missing), so they come out the same.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from agl_cli.errors import UsageError
from agl_cli.metrics.fmt import points
from agl_cli.metrics.paired import ALPHA, BETTER, PairKey, compare
from agl_cli.metrics.run import latest_by_variant, scores_of
from agl_cli.optimize.execute import Executor
from agl_cli.optimize.pareto import Front, choose_parent, pareto_front, task_means
from agl_cli.optimize.proposer import (
    ProposerClient,
    build_request,
    check_proposal,
    extract_prompt,
    outcome,
    reflect_settings,
    render_transcript,
)
from agl_cli.optimize.study import PROPOSER_SCOPE, Study
from agl_cli.spec.variants import Variant, make_variant
from rl_backend.store.db import RunStore
from rl_backend.store.records import Rollout

PROPOSALS_META = "reflect.proposals"
PROPOSALS_DIR = "proposals"
@dataclass
class Proposal:
    """One round, as recorded in the store; `file` is None when the reply gave nothing worth running."""

    n: int
    parent: str
    minibatch: list[str]
    scope: str  # the gateway scope the proposer's call is recorded under
    shown: list[str]  # rollout ids of the transcripts the proposer saw
    file: str | None = None
    sha256: str | None = None  # of the proposed text
    variant: str | None = None
    variant_hash: str | None = None
    status: str = "proposed"  # proposed -> accepted | rejected | incomplete
    reason: str | None = None
    reply_excerpt: str | None = None
    cost_usd: float | None = 0.0  # None: the proposer's model has no price
    screen: dict[str, Any] | None = None
    verdict: str | None = None
    difference: float | None = None
    ci95: list[float] | None = None
    p_value: float | None = None
    n_tasks: int | None = None
    partial: bool = False

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    def reset(self) -> None:
        """Forget a previous evaluation: a replay recomputes it from the store (a resume may have more budget)."""
        self.status, self.reason, self.screen, self.verdict = "proposed", None, None, None
        self.difference, self.ci95, self.p_value, self.n_tasks, self.partial = None, None, None, None, False

    def as_report(self) -> dict[str, Any]:
        return {**asdict(self), "accepted": self.accepted}


@dataclass
class ReflectResult:
    survivors: list[str]
    stopped_for_budget: bool
    doc: dict[str, Any] = field(default_factory=dict)


class ReflectSearch:
    """The rounds of one study. `on_round(doc)` gets a racing-shaped round (so the report marks rejected
    proposals as dropped in that round)."""

    def __init__(self, study: Study, store: RunStore, executor: Executor, console: Console, *,
                 on_round: Callable[[dict[str, Any]], None]) -> None:
        self.study = study
        self.store = store
        self.executor = executor
        self.console = console
        self.on_round = on_round
        self.settings, self.knob = reflect_settings(study.spec)
        self.alpha = ALPHA / self.settings.rounds
        self.order = [t.id for t in study.search_tasks]
        self.tasks = {t.id: t for t in study.search_tasks}
        self.variants = {v.name: v for v in study.variants}
        self.records = {int(r["n"]): Proposal(**r) for r in store.get_meta(PROPOSALS_META, [])}
        self.pool = [v.name for v in study.variants]  # the kept candidates: the seeds, then accepted proposals
        self.incumbent = study.baseline.name
        self.stopped: str | None = None
        self.budget_hit = False
        self._client: ProposerClient | None = None  # made on first use: a replay may never call the proposer

    # -- the loop -------------------------------------------------------------------------------------------------

    def run(self) -> ReflectResult:
        if self._run([self.variants[n] for n in self.pool], self.order, "reflect: seeds"):
            for n in range(1, self.settings.rounds + 1):
                if not self._round(n):
                    break
        proposals = [self.records[n].as_report() for n in sorted(self.records)]
        doc = {
            "knob": self.knob, "proposer": self.settings.model, "rounds": self.settings.rounds,
            "minibatch": self.settings.minibatch, "alpha": self.alpha, "proposals": proposals,
            "pareto_front": self._front().as_list(), "incumbent": self.incumbent, "stopped": self.stopped,
            "proposer_cost_usd": None if any(p["cost_usd"] is None for p in proposals)
            else sum(p["cost_usd"] for p in proposals),
        }
        return ReflectResult(list(self.pool), self.budget_hit, doc)

    def _round(self, n: int) -> bool:
        """One proposal, made or replayed; False ends the search."""
        record = self.records.get(n)
        if record is None:
            if not self.executor.ledger.can_launch():
                self.budget_hit = True
                self.stopped = f"the budget was reached before proposal {n}"
                return False
            record = self._propose(n)
            if record is None:
                return False
            self._save(record)
        if record.file is None:
            self._announce(record)
            return True
        child = self._adopt(record)
        record.reset()
        if self._screened_out(record, child):
            self._save(record)
            self._announce(record)
            return record.status != "incomplete"
        completed = self._run([child], self.order, f"reflect: proposal {n}")
        self._judge(record, child.name, partial=not completed)
        self._save(record)
        if record.accepted:
            self.pool.append(child.name)
            self.incumbent = child.name
        self._announce(record)
        return completed

    # -- steps ----------------------------------------------------------------------------------------------------

    def _run(self, variants: list[Variant], task_ids: list[str], label: str) -> bool:
        completed = self.executor.run(variants, [self.tasks[t] for t in task_ids], label=label)
        if not completed:
            self.budget_hit = True
            self.stopped = f"the budget stopped the search during {label.removeprefix('reflect: ')}"
        return completed

    def _scores(self) -> dict[str, dict[PairKey, float]]:
        grouped = latest_by_variant(self.store, split=self.study.options.search_split)
        return {name: scores_of(grouped.get(name, [])) for name in self.variants}

    def _front(self) -> Front:
        scores = self._scores()
        return pareto_front({name: task_means(scores[name]) for name in self.pool})

    def _failing(self, parent: str, task_ids: list[str]) -> list[Rollout]:
        wanted = set(task_ids)
        position = {t: i for i, t in enumerate(self.order)}
        rollouts = latest_by_variant(self.store, split=self.study.options.search_split, tasks=wanted).get(parent, [])
        failing = [r for r in rollouts if r.reward is None or r.reward < 1.0]
        failing.sort(key=lambda r: (r.reward if r.reward is not None else -1.0, position[r.task_id], r.seed))
        return failing[: self.settings.max_transcripts]

    def _prompt_text(self, variant: Variant) -> str:
        return self.study.spec.resolve(str(variant.settings[self.knob])).read_text(encoding="utf-8", errors="replace")

    def _propose(self, n: int) -> Proposal | None:
        front = self._front()
        if not front.members:
            self.stopped = "no kept candidate has a scored search task to reflect on"
            return None
        rng = random.Random(f"reflect:{self.settings.seed}:{n}")
        parent = choose_parent(front, rng)
        size = self.settings.minibatch
        minibatch = sorted(rng.sample(self.order, size), key=self.order.index) if 0 < size < len(self.order) else []
        failing = self._failing(parent, minibatch or self.order) or self._failing(parent, self.order)
        if not failing:
            self.stopped = f"{parent} is right on every {self.study.options.search_split} task: nothing to reflect on"
            return None
        record = Proposal(n=n, parent=parent, minibatch=minibatch, scope=f"{PROPOSER_SCOPE}{n}", shown=[r.id for r in failing])
        parent_text = self._prompt_text(self.variants[parent])
        limit = self.settings.max_transcript_chars
        transcripts = [{"task_id": r.task_id, "outcome": outcome(r),
                        "text": render_transcript(r, self.tasks[r.task_id].data, self.store.calls(r.id), limit)}
                       for r in failing]
        shown = f"{len(failing)} failing transcript" + ("s" if len(failing) != 1 else "")
        self.console.print(f"proposal {n}: asking {self.settings.model} (parent {parent}, {shown})", markup=False)
        if self._client is None:
            self._client = ProposerClient(self.executor.runner.services, self.settings)
        reply = self._client.ask(record.scope, build_request(self.knob, parent_text, transcripts))
        used = self.store.call_totals_by_rollout().get(record.scope)
        record.cost_usd = 0.0 if used is None else used.cost_usd
        gateway = self.executor.runner.services.gateway
        ceiling = gateway.spend_limit if gateway is not None else None
        if reply.text is None and ceiling is not None and ceiling.was_refused(record.scope):
            # The budget could not pay this call's worst case: a budget stop, not a rejected proposal (unsaved, so a
            # resume with more budget asks again).
            self.budget_hit = True
            self.stopped = f"the budget could not pay for proposal {n}"
            return None
        if reply.text is None:
            record.status, record.reason = "rejected", f"the proposer call failed: {reply.error}"
            return record
        record.reply_excerpt = reply.text[:300]
        text, problem = extract_prompt(reply.text)
        if text is not None:
            others = {name: self._prompt_text(v) for name, v in self.variants.items() if name != parent}
            problem = check_proposal(text, parent_text, others, self.settings.max_prompt_chars)
        if problem is not None or text is None:
            record.status, record.reason = "rejected", problem
            return record
        suffix = Path(str(self.variants[parent].settings[self.knob])).suffix or ".md"
        path = self.study.run.path / PROPOSALS_DIR / f"reflect-{n}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n", encoding="utf-8")
        record.file, record.sha256 = str(path.resolve()), hashlib.sha256(path.read_bytes()).hexdigest()
        return record

    def _adopt(self, record: Proposal) -> Variant:
        """The proposal as a variant of the study: its parent's settings with the knob set to the proposal's file."""
        assert record.file is not None
        path = Path(record.file)
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != record.sha256:
            raise UsageError(
                f"proposal {record.n}'s file {path} is missing or was edited since the study made it",
                hint="resuming would mix two different prompts; restore it or start a new study",
            )
        knob = self.study.spec.knobs[self.knob]
        assert knob.files is not None
        if record.file not in knob.option_files():
            knob.add_file(record.file)  # the working spec offers it, like a --candidate file
        settings = dict(self.variants[record.parent].settings)
        settings[self.knob] = record.file
        variant = make_variant(self.study.spec, settings)
        known = self.variants.get(variant.name)
        if known is not None and known.hash != variant.hash:
            variant = Variant(f"{variant.name}@{variant.hash[:6]}", variant.settings, variant.hash)
        if variant.name not in self.variants:
            self.variants[variant.name] = variant
            self.study.variants.append(variant)
            self.store.upsert_variant(variant.name, variant.hash, variant.settings)
        record.variant, record.variant_hash = variant.name, variant.hash
        return self.variants[variant.name]

    def _screened_out(self, record: Proposal, child: Variant) -> bool:
        """GEPA's filter: on the minibatch the child must score more than its parent to run on the whole split."""
        if not record.minibatch:
            return False
        if not self._run([child], record.minibatch, f"reflect: proposal {record.n} (minibatch)"):
            record.status, record.reason = "incomplete", "the budget stopped its minibatch"
            return True
        scores = self._scores()
        wanted = set(record.minibatch)
        parent = {k: v for k, v in scores[record.parent].items() if k[0] in wanted}
        mine = {k: v for k, v in scores[child.name].items() if k[0] in wanted}
        shared = set(parent) & set(mine)
        parent_sum, child_sum = sum(parent[k] for k in shared), sum(mine[k] for k in shared)
        passed = child_sum > parent_sum
        record.screen = {"tasks": len(wanted), "pairs": len(shared), "parent": parent_sum, "child": child_sum,
                         "passed": passed}
        if not passed:
            record.status = "rejected"
            record.reason = (f"not better than its parent on the {len(wanted)} minibatch tasks "
                             f"(total reward {child_sum:g} vs the parent's {parent_sum:g})")
        return not passed

    def _judge(self, record: Proposal, child: str, *, partial: bool) -> None:
        scores = self._scores()
        result = compare(scores[record.parent], scores[child], alpha=self.alpha)
        record.verdict, record.difference, record.p_value = result.verdict, result.difference, result.p_value
        record.ci95 = list(result.ci95) if result.ci95 else None
        record.n_tasks, record.partial = result.n_tasks, partial
        record.status = "accepted" if result.verdict == BETTER else "rejected"
        record.reason = None if record.accepted else f"{result.verdict} vs its parent (kept only when `better`)"

    # -- bookkeeping ----------------------------------------------------------------------------------------------

    def _save(self, record: Proposal) -> None:
        self.records[record.n] = record
        self.store.set_meta(PROPOSALS_META, [asdict(self.records[n]) for n in sorted(self.records)])

    def _announce(self, record: Proposal) -> None:
        head = f"proposal {record.n} (parent {record.parent})"
        if record.verdict is not None:
            body = (f"{record.variant}: {record.verdict} vs parent, {points(record.difference, record.ci95)}, "
                    f"p={record.p_value:.3g}, n={record.n_tasks}")
        elif record.screen is not None:
            body = f"{record.variant}: {record.reason}"
        else:
            body = str(record.reason)
        state = "accepted" if record.accepted else "rejected" if record.status == "rejected" else record.status
        self.executor.ledger.refresh()  # the proposer's call is spent too
        self.console.print(f"{head}: {body}: {state} | {self.executor.ledger.describe()}", markup=False)
        dropped = [] if record.accepted or record.variant is None else [
            {"variant": record.variant, "reason": "rejected", "why": record.reason}]
        self.on_round({
            "round": record.n, "proposal": record.n, "parent": record.parent, "tasks": record.n_tasks or 0,
            "alpha": self.alpha, "leader": self.incumbent, "survivors": list(self.pool), "dropped": dropped,
            "partial": record.partial or record.status == "incomplete",
        })
