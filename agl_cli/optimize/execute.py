"""Running a batch of a study: copy what the cache already has, run the rest under the ledger's ceiling, and
show progress with the spend so far on stderr."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agl_cli.evaluation.agent_version import AgentVersion
from agl_cli.evaluation.reuse import ReuseReport
from agl_cli.evaluation.runner import make_plan
from agl_cli.optimize.cache import ResultCache
from agl_cli.optimize.study import Ledger, Study, StudyRunner
from agl_cli.runs.run_spend import from_runs, reused_among
from agl_cli.spec.tasks import Task
from agl_cli.spec.variants import Variant
from rl_backend.store.db import RunStore
from rl_backend.store.records import Rollout


class SpendProgress:
    """A bar on a terminal, else one line per finished rollout; both carry the spend against the budget."""

    def __init__(self, console: Console, ledger: Ledger, *, label: str, total: int, quiet: bool) -> None:
        self.console = console
        self.ledger = ledger
        self.label = label
        self.total = total
        self.done = 0
        self.quiet = quiet
        self.live = console.is_terminal and not quiet
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> SpendProgress:
        if self.live:
            self._progress = Progress(
                TextColumn(f"[bold]{self.label}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                TimeElapsedColumn(), console=self.console,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.ledger.describe(), total=self.total)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def on_event(self, kind: str, rollout: Rollout) -> None:
        if kind != "finished":
            return
        self.done += 1
        self.ledger.refresh()
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self.done, description=self.ledger.describe())
        elif not self.quiet:
            outcome = f"reward {rollout.reward:g}" if rollout.reward is not None else f"no reward ({rollout.failure})"
            self.console.print(
                f"[{self.label} {self.done}/{self.total}] {rollout.variant} {rollout.task_id} seed {rollout.seed}: "
                f"{outcome} | {self.ledger.describe()}",
                markup=False,
            )


class Executor:
    def __init__(self, study: Study, store: RunStore, runner: StudyRunner, ledger: Ledger, console: Console, *,
                 cache: ResultCache | None, quiet: bool) -> None:
        self.study = study
        self.store = store
        self.runner = runner
        self.ledger = ledger
        self.console = console
        self.cache = cache
        self.quiet = quiet
        self.reused = 0
        self.reuse = ReuseReport(enabled=cache is not None)  # every batch's: why rollouts were not reused

    def run(self, variants: list[Variant], tasks: list[Task], *, label: str) -> bool:
        """Run what is missing of variants x tasks x seeds; False when the budget stopped it."""
        plan = make_plan(variants, tasks, self.study.seeds)
        if self.cache is not None:
            copied = self.cache.import_into(self.store, plan, run_id=self.study.run.run_id)
            if copied:
                self.reused += copied
                reused = reused_among(self.store, [item.key for item in plan])
                self.console.print(f"{label}: {copied} rollouts reused from {from_runs(reused)} (same variant, task, "
                                   "seed and agent: not run again, and not counted as spent)")
            batch = self.cache.explain(self.study.spec, self.store, plan,
                                       current=AgentVersion.read(self.study.run.path))
            self.reuse.add(batch)
            for line in batch.lines():
                self.console.print(f"{label}: {line}", markup=False)
        todo = self.runner.pending(plan)
        if not todo:
            return True
        self.runner.stopped_for_budget = False
        with SpendProgress(self.console, self.ledger, label=label, total=len(todo), quiet=self.quiet) as progress:
            self.runner.on_event = progress.on_event
            asyncio.run(self.runner.run(plan))
        if self.runner.stopped_for_budget:
            self.console.print(f"{label}: stopped at the budget ({self.ledger.describe()})")
        return not self.runner.stopped_for_budget


@contextlib.contextmanager
def session(study: Study, *, quiet: bool, use_cache: bool, console: Console) -> Iterator[Executor]:
    """The study's store, ledger, model services and runner, for as long as the block runs."""
    from agl_cli.evaluation.services import running_services
    from agl_cli.spec.task_content import check_and_record
    from rl_backend.rollout.local import LocalController

    store = study.run.open_store()
    try:
        # Like with like: a resume after the task file changed is refused before anything runs, so the confirmation
        # never pairs the baseline's answers to old tasks with the winner's answers to new ones.
        check_and_record(store, study.run, study.run.manifest(), study.search_tasks + study.confirm_tasks,
                         tasks_path=str(study.spec.resolve(study.spec.tasks.path)),
                         start_again=f"agl optimize {study.spec_path}")
        for variant in study.variants:
            store.upsert_variant(variant.name, variant.hash, variant.settings)
        opts = study.options
        ledger = Ledger(
            store,
            max_rollouts=study.spec.budget.run_rollouts(opts.max_rollouts),  # the flag's, else the spec's; with
            max_usd=study.spec.budget.run_usd(opts.budget_usd),  # budget.scope experiment, at most what is left
        )
        cache = ResultCache(study.run.path.parent, study.agent_version, exclude=study.run.path,
                            reuse_failures=opts.reuse_failures) if use_cache else None
        spend_limit = None
        if ledger.max_usd is not None:
            from rl_backend.gateway.budget import SpendLimit

            hint = f"raise it with: agl optimize --resume {study.run.run_id} --budget-usd AMOUNT"
            spend_limit = SpendLimit(ledger.max_usd, spent_usd=ledger.spent_usd, hint=hint)
        with running_services(study.spec, store, log=console.print, spend_limit=spend_limit) as services:
            runner = StudyRunner(study.spec, study.run, store, services, LocalController(), log=console.print)
            runner.ledger = ledger
            yield Executor(study, store, runner, ledger, console, cache=cache, quiet=quiet)
    finally:
        store.close()
