"""`agl transcript RUN [ROLLOUT]`: what the model saw and answered, for one rollout or for every rollout of a run
that a filter picks (`--failing`, `--variant`, `--split`, `--task`), in one call. `--replies-only` keeps each
rollout's last model reply beside the agent's output: where a parser that misreads the reply shows itself.
`--raw` gives the stored records instead of readable turns: the rollout, its task, each call's request and response."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors

if TYPE_CHECKING:
    from agl_cli.report.transcripts import Transcript
    from rl_backend.store.records import CallRecord, Rollout


def _pick(rollouts: list[Rollout], *, failing: bool, below: float, variant: str | None, split: str | None,
          task: str | None) -> list[Rollout]:
    chosen = []
    for r in rollouts:
        if (variant is not None and r.variant != variant) or (split is not None and r.split != split):
            continue
        if task is not None and r.task_id != task:
            continue
        if failing and not (r.status.terminal and (r.reward is None or r.reward < below)):
            continue
        chosen.append(r)
    return chosen


def _document(rollout: Rollout, view: Transcript, reply: str | None, *, replies_only: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "rollout_id": rollout.id, "variant": rollout.variant, "task_id": rollout.task_id, "seed": rollout.seed,
        "split": rollout.split, "status": rollout.status.value, "reward": rollout.reward,
        "failure": rollout.failure.value if rollout.failure else None, "error": view.error, "output": view.output,
        "grader_detail": view.grader, "model_calls": len(view.calls), "last_reply": reply,
    }
    if not replies_only:
        doc["calls"] = [{
            "call": c.index, "api": c.api, "model": c.model, "status": c.status, "tokens": c.tokens,
            "latency": c.latency, "cost": c.cost, "earlier_turns_skipped": c.earlier,
            "turns": [{"role": t.role, "text": t.text} for t in c.turns],
        } for c in view.calls]
        doc["stderr_tail"] = view.stderr
    return doc


def _raw_document(rollout: Rollout, calls: list[CallRecord], task_file: Path) -> dict[str, Any]:
    """The stored records of one rollout, secrets removed; calls without their token ids and logprobs."""
    import json

    from agl_cli.report.redact import scrub

    try:
        task = json.loads(task_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        task = None  # a rollout that never started has no task file
    return {
        "rollout": scrub({**rollout.model_dump(mode="json"), "duration_s": rollout.duration_s}),
        "task": scrub(task),
        "calls": [scrub(c.model_dump(mode="json", exclude={"prompt_token_ids", "completion_token_ids", "logprobs"}))
                  for c in calls],
    }


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines()) or "    (empty)"


def _text(doc: dict[str, Any]) -> str:
    reward = "no reward" + (f" ({doc['failure']})" if doc["failure"] else "") if doc["reward"] is None \
        else f"reward {doc['reward']:g}"
    from agl_cli.console import safe_text

    lines = [safe_text(f"== {doc['rollout_id']}  variant {doc['variant']}  task {doc['task_id']}  seed {doc['seed']}  ")
             + f"{reward}  ({doc['model_calls']} model call{'' if doc['model_calls'] == 1 else 's'})"]
    for call in doc.get("calls", []):
        skipped = f", {call['earlier_turns_skipped']} earlier turns not repeated" if call["earlier_turns_skipped"] else ""
        lines.append(f"-- call {call['call']}: {call['api']} {call['model']}, {call['status']}, {call['tokens']}, "
                     f"{call['latency']}, {call['cost']}{skipped}")
        for turn in call["turns"]:
            lines += [f"  {turn['role']}:", _indent(turn["text"])]
    if "calls" not in doc:
        lines += ["  last reply:", _indent(doc["last_reply"]) if doc["last_reply"] is not None
                  else "    (no model reply recorded)"]
    lines += ["  output:", _indent(doc["output"]) if doc["output"] is not None else "    (no output)"]
    for key in ("error", "grader_detail", "stderr_tail"):
        if doc.get(key):
            lines += [f"  {key.replace('_', ' ')}:", _indent(doc[key])]
    return "\n".join(lines)


@handle_errors
def transcript_command(
    run: Annotated[str, typer.Argument(help="A run or study: its id, a unique id prefix, its folder, or `latest`.",
                                       show_default=False)],
    rollout: Annotated[Optional[str], typer.Argument(help="One rollout: its id or a unique prefix (default: the rollouts the filters pick).")] = None,  # noqa: UP045,E501
    failing: Annotated[bool, typer.Option("--failing", help="Only finished rollouts with no reward or a reward below --below.")] = False,  # noqa: E501
    replies_only: Annotated[bool, typer.Option("--replies-only", help="Per rollout only the model's last reply, the agent's output and the reward.")] = False,  # noqa: E501
    raw: Annotated[bool, typer.Option("--raw", help="With --json: per rollout the stored records (secrets removed): the rollout, its task, and each call's request and response as sent and received.")] = False,  # noqa: E501
    variant: Annotated[Optional[str], typer.Option(help="Only this variant.")] = None,  # noqa: UP045
    split: Annotated[Optional[str], typer.Option(help="Only rollouts of this split.")] = None,  # noqa: UP045
    task: Annotated[Optional[str], typer.Option(help="Only this task id.")] = None,  # noqa: UP045
    below: Annotated[Optional[float], typer.Option(help="With --failing: a reward below this is a failure (default: the run's pass_threshold, 0.5 unless its agl.yaml set another).")] = None,  # noqa: UP045,E501
    limit: Annotated[Optional[int], typer.Option(help="At most N rollouts (default: all that match).")] = None,  # noqa: UP045,E501
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """Show transcripts (secrets removed): one rollout, or every rollout a filter picks, e.g. all failing ones'
    last replies at once: agl transcript RUN --failing --replies-only --json."""
    import sys

    from agl_cli.console import print_json, stderr_console
    from agl_cli.errors import UsageError
    from agl_cli.metrics.run import run_pass_threshold
    from agl_cli.report.markup import anchor
    from agl_cli.report.transcripts import last_reply, transcript
    from agl_cli.runs.rundir import find_run

    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}")
    if raw and (replies_only or not json_output):
        raise UsageError("--raw goes with --json, and not with --replies-only")
    if rollout is not None and (failing or variant or split or task):
        raise UsageError("give either one ROLLOUT or filters (--failing, --variant, --split, --task), not both")
    target = find_run(run, runs_dir)
    if below is None:
        below = run_pass_threshold(target.path)
    store = target.open_store(read_only=True)
    try:
        if rollout is not None:
            attempts = [r for r in store.rollouts() if r.id.startswith(rollout)]
            ids = sorted({r.id for r in attempts})
            if len(ids) != 1:
                raise UsageError(f"{rollout!r} matches {len(ids)} rollouts in run {target.run_id}",
                                 hint=f"list them: agl transcript {target.run_id} --replies-only")
            chosen = attempts[-1:]
        else:
            chosen = _pick(store.rollouts(latest_only=True), failing=failing, below=below, variant=variant,
                           split=split, task=task)
        matched = len(chosen)
        chosen = chosen[:limit] if limit is not None else chosen
        docs = []
        for r in chosen:
            calls = store.calls(rollout_id=r.id)
            if raw:
                docs.append(_raw_document(r, calls, target.path / "rollouts" / r.id / "task.json"))
                continue
            docs.append(_document(r, transcript(r, calls, anchor(r.id)), last_reply(calls), replies_only=replies_only))
    finally:
        store.close()
    if json_output:
        print_json({
            "run_id": target.run_id, "run_dir": str(target.path),
            "filter": {"rollout": rollout, "failing": failing, "below": below if failing else None,
                       "variant": variant, "split": split, "task": task},
            "matched": matched, "shown": len(docs), "rollouts": docs,
        })
        return
    if not docs:
        stderr_console().print(f"no rollout of run {target.run_id} matches", markup=False)
        return
    sys.stdout.write("\n\n".join(_text(d) for d in docs) + "\n")
    if matched > len(docs):
        stderr_console().print(f"{len(docs)} of {matched} matching rollouts shown (--limit)", markup=False)
