"""Progress of a run on stderr: a rich bar on a terminal, one plain line per finished rollout otherwise. A rollout
reused from an earlier run says so, on its line and in the bar, so it is never mistaken for one that ran."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from agl_cli.console import safe_text
from agl_cli.metrics.fmt import seconds
from rl_backend.store.records import Rollout


class RolloutProgress:
    def __init__(self, console: Console, *, total: int, done: int = 0, quiet: bool = False) -> None:
        self.console = console
        self.total = total
        self.done = done
        self.scored = 0
        self.correct = 0.0
        self.reused = 0
        self.quiet = quiet
        self.live = console.is_terminal and not quiet
        self._progress: Progress | None = None
        self._task_id = None

    def __enter__(self) -> RolloutProgress:
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]rollouts"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
            )
            self._progress.start()
            self._task_id = self._progress.add_task("", total=self.total, completed=self.done)  # type: ignore[assignment]
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def on_event(self, kind: str, rollout: Rollout) -> None:
        if kind == "finished":
            self._finished(rollout, None)

    def on_reused(self, rollout: Rollout, source_run: str) -> None:
        """A rollout copied from `source_run` by the result cache: counted as done, marked as reused."""
        self.reused += 1
        self._finished(rollout, source_run)

    def _finished(self, rollout: Rollout, source_run: str | None) -> None:
        self.done += 1
        if rollout.reward is not None:
            self.scored += 1
            self.correct += rollout.reward
        mean = f"mean reward {self.correct / self.scored:.2f} over {self.scored}" if self.scored else "no reward yet"
        if self.reused:
            mean += f" ({self.reused} reused)"
        if self._progress is not None and self._task_id is not None:
            self._progress.update(self._task_id, completed=self.done, description=mean)
        elif not self.quiet:
            outcome = f"reward {rollout.reward:g}" if rollout.reward is not None else f"no reward: {rollout.error}"
            if source_run is not None:
                how = f"reused from run {source_run}, not run again"
            else:
                how = seconds(rollout.duration_s, digits=1)
            self.console.print(
                safe_text(f"[{self.done}/{self.total}] {rollout.variant} {rollout.task_id} seed {rollout.seed}: "
                          f"{outcome} ({how})"),
                markup=False,
            )
