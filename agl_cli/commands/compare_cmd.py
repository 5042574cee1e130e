"""`agl compare A B [C ...]`: each candidate judged against the baseline A on the tasks and seeds both have.

A reference is a run (`RUN`, when it holds one variant), a variant of a run or study (`RUN:variant`), or a bare
variant name, looked up in `--run`, else in the run another reference names, else in the latest run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from agl_cli.cli_support import handle_errors
from agl_cli.metrics.fmt import pct, points, seconds, usd

if TYPE_CHECKING:
    from agl_cli.evaluation.served import ServedModels
    from agl_cli.runs.rundir import RunDir
    from agl_cli.spec.task_content import Pairing, RunTasks
    from agl_cli.spec.volume import Volume
    from rl_backend.store.records import CallTotals, ModelUse, Rollout

TESTS = {"mcnemar_exact": "McNemar exact", "sign_test": "sign test", "none": "no test"}


@dataclass
class Side:
    ref: str
    run: RunDir
    variant: str
    rollouts: list[Rollout]
    totals: dict[str, CallTotals]
    uses: dict[str, list[ModelUse]]
    knobs: dict[str, Any]
    task_hashes: dict[str, str]

    @property
    def label(self) -> str:
        return f"{self.run.run_id}:{self.variant}"

    @property
    def tasks(self) -> RunTasks:
        from agl_cli.errors import UsageError
        from agl_cli.spec.task_content import RunTasks

        try:
            manifest = self.run.manifest()
        except UsageError:  # a damaged manifest: the store alone still compares
            manifest = {}
        return RunTasks(self.label, {r.task_id for r in self.rollouts}, self.task_hashes, manifest)

    @property
    def served(self) -> ServedModels:
        from agl_cli.evaluation.served import served_models

        return served_models(self.rollouts, self.uses)


def _variants_in(run: RunDir) -> list[str]:
    store = run.open_store(read_only=True)
    try:
        names = list(store.variants())
        seen = {r.variant for r in store.rollouts(latest_only=True)}
    finally:
        store.close()
    return [n for n in names if n in seen] + sorted(seen - set(names))


def _pick(run: RunDir, name: str, ref: str) -> str:
    names = _variants_in(run)
    if name in names:
        return name
    from agl_cli.errors import UsageError

    raise UsageError(f"{ref!r}: run {run.run_id} has no variant {name!r}; its variants: {', '.join(names) or 'none'}")


def _try_run(text: str, runs_dir: Path | None) -> RunDir | None:
    from agl_cli.errors import UsageError
    from agl_cli.runs.rundir import find_run

    try:
        return find_run(text, runs_dir)
    except UsageError:
        return None


def resolve(refs: list[str], context: str | None, runs_dir: Path | None) -> list[tuple[str, RunDir, str]]:
    """Each reference as (ref, run, variant name)."""
    from agl_cli.errors import UsageError
    from agl_cli.runs.rundir import find_run

    resolved: list[tuple[str, RunDir, str] | None] = []
    runs_seen: list[RunDir] = []
    for ref in refs:
        run_part, sep, variant_part = ref.partition(":")
        run = _try_run(run_part, runs_dir) if sep else None
        if run is not None:
            resolved.append((ref, run, _pick(run, variant_part, ref)))
            runs_seen.append(run)
            continue
        run = _try_run(ref, runs_dir)
        if run is not None:
            names = _variants_in(run)
            if len(names) != 1:
                raise UsageError(
                    f"{ref!r}: run {run.run_id} holds {len(names)} variants ({', '.join(names) or 'none'})",
                    hint=f"name one: {run.run_id}:VARIANT",
                )
            resolved.append((ref, run, names[0]))
            runs_seen.append(run)
            continue
        resolved.append(None)
    if any(r is None for r in resolved):
        home = find_run(context, runs_dir) if context else runs_seen[0] if runs_seen else _try_run("latest", runs_dir)
        if home is None:
            raise UsageError(f"{refs[[r is None for r in resolved].index(True)]!r} is neither a run nor a variant "
                             "of one", hint="`agl runs` lists runs; name a variant as RUN:variant")
        resolved = [r if r is not None else (ref, home, _pick(home, ref, ref)) for r, ref in zip(resolved, refs,
                                                                                                   strict=True)]
    return [r for r in resolved if r is not None]


def load_side(ref: str, run: RunDir, variant: str, split: str | None) -> Side:
    from agl_cli.errors import UsageError
    from agl_cli.spec.tasks import split_names

    store = run.open_store(read_only=True)
    try:
        wanted = split_names(split) if split is not None else None
        rollouts = [r for r in store.rollouts(variant=variant, latest_only=True)
                    if r.status.terminal and (wanted is None or r.split in wanted)]
        totals = store.call_totals_by_rollout()
        uses = store.model_use_by_rollout()
        knobs = store.variants().get(variant, {}).get("knobs", {})
        task_hashes = store.task_hashes()
    finally:
        store.close()
    if not rollouts:
        where = f" in split {split!r}" if split else ""
        raise UsageError(f"{ref!r}: variant {variant!r} of run {run.run_id} has no finished rollouts{where}")
    return Side(ref, run, variant, rollouts, totals, uses, knobs, task_hashes)


def check_task_content(base: Side, candidates: list[Side], *, allow_different: bool) -> list[Pairing]:
    """Per candidate, what is known of the content of the tasks it shares with the baseline (see task_content);
    a pairing of different tasks under the same ids is refused unless `allow_different`."""
    from agl_cli.spec.task_content import Pairing, pairing, refuse_mismatch

    found = []
    for side in candidates:
        if side.run.path == base.run.path:  # variants of one run ran one task set
            found.append(Pairing(len(base.tasks.task_ids & side.tasks.task_ids), [], False, []))
            continue
        result = pairing(base.tasks, side.tasks)
        if result.mismatched and not allow_different:
            refuse_mismatch(base.tasks, side.tasks, result, flag="--allow-different-tasks")
        found.append(result)
    return found


def compare_sides(base: Side, candidates: list[Side], volume: Volume | None = None) -> list[dict[str, Any]]:
    from agl_cli.metrics.cost import difference_at_volume
    from agl_cli.metrics.paired import compare_many, difference
    from agl_cli.metrics.rollout_costs import latencies, paired_cost
    from agl_cli.metrics.run import scores_of

    base_scores = scores_of(base.rollouts)
    cand_scores = {str(i): scores_of(side.rollouts) for i, side in enumerate(candidates)}
    results = compare_many(base_scores, cand_scores)
    docs = []
    for i, side in enumerate(candidates):
        shared = {(r.task_id, r.seed) for r in base.rollouts} & {(r.task_id, r.seed) for r in side.rollouts}
        result = results[str(i)]
        cost = paired_cost(base.rollouts, side.rollouts, base.totals, side.totals)
        docs.append({
            "candidate": {"ref": side.ref, "run_id": side.run.run_id, "variant": side.variant},
            **result.as_dict(),
            "unscored_pairs": len(shared) - result.n_pairs,
            "cost_usd_per_task": cost,
            "cost_usd_per_month": difference_at_volume(cost, volume),
            "latency_s": difference(latencies(base.rollouts), latencies(side.rollouts)).as_dict(),
            "fully_right": fully_right(base_scores, cand_scores[str(i)]),
            "served_by": {"baseline": base.served.served, "candidate": side.served.served},
            "model_warnings": base.served.warnings(base.label) + side.served.warnings(side.label),
        })
    return docs


def fully_right(base: dict[tuple[str, int], float], candidate: dict[tuple[str, int], float]) -> dict[str, Any]:
    """The share of rollouts at reward 1 on each side, over the (task, seed) pairs both scored, with intervals, and
    its paired difference: what a partial-credit grader's mean alone does not say (`partial_credit`)."""
    from agl_cli.metrics.paired import pair_up, paired_interval
    from agl_cli.metrics.stats import proportion

    shared = sorted(base.keys() & candidate.keys())
    tasks = [task for task, _ in shared]
    a = {key: float(base[key] == 1.0) for key in shared}
    b = {key: float(candidate[key] == 1.0) for key in shared}
    paired = pair_up(a, b)
    return {
        "partial_credit": any(0.0 < side[key] < 1.0 for side in (base, candidate) for key in shared),
        "baseline": proportion([a[key] for key in shared], tasks).as_dict(),
        "candidate": proportion([b[key] for key in shared], tasks).as_dict(),
        "difference": {"mean": paired.difference if shared else None,
                       "ci95": list(paired_interval(paired)) if shared else None},
    }


def add_more_evidence(base: Side, candidates: list[Side], docs: list[dict[str, Any]], split: str | None) -> None:
    """Each undecided comparison that leans better gets `more_evidence`: the splits that could decide it."""
    from agl_cli.metrics.more_evidence import evidence, split_sizes

    spec_path = base.run.manifest().get("spec_path")
    splits: dict[str, list[str]] | None = None
    for side, doc in zip(candidates, docs, strict=True):
        doc["more_evidence"] = None
        if doc["verdict"] != "no detectable difference":
            continue
        if splits is None:
            splits = split_sizes(spec_path)
        judged = {r.task_id for r in base.rollouts} & {r.task_id for r in side.rollouts}
        doc["more_evidence"] = evidence(doc, split=split, judged=judged, splits=splits, base_variant=base.variant,
                                        candidate_variant=side.variant, same_run=side.run.path == base.run.path,
                                        spec_path=spec_path)


def same_model_problems(base: Side, candidates: list[Side]) -> list[str]:
    """Candidates that asked for another model than the baseline but were served by the very same one."""
    from agl_cli.evaluation.served import same_model

    problems = []
    for side in candidates:
        why = same_model(base.label, base.served, base.knobs, side.label, side.served, side.knobs)
        if why:
            problems.append(why)
    return problems


def sentence(label: str, doc: dict[str, Any]) -> str:
    """One line a person can read: the verdict, the effect with its interval, the test and, if undecided, how
    many more tasks would likely decide it."""
    diff = doc["difference"]
    p = f"p={doc['p_value']:.3g}" + (f", Holm {doc['p_adjusted']:.3g}" if doc["p_adjusted"] != doc["p_value"] else "")
    text = (
        f"{label}: {doc['verdict']} — accuracy {points(diff['mean'], diff['ci95'])} over "
        f"{doc['n_tasks']} tasks ({doc['n_pairs']} pairs; {TESTS.get(doc['test'], doc['test'])} {p})"
    )
    full = doc.get("fully_right")
    if full and full["partial_credit"]:
        text += (f"; fully right {pct(full['baseline']['mean'], full['baseline']['ci95'])} -> "
                 f"{pct(full['candidate']['mean'], full['candidate']['ci95'])} "
                 f"({points(full['difference']['mean'], full['difference']['ci95'])})")
    cost = doc.get("cost_usd_per_task")
    from agl_cli.metrics.rollout_costs import cost_unknown_reason

    unknown = cost_unknown_reason(cost) if cost else None
    if unknown:
        text += f"; cost/task unknown ({unknown})"
    elif cost and cost["difference"]["mean"]:
        text += f"; cost/task {usd(cost['difference']['mean'], cost['difference']['ci95'], signed=True)}"
        from agl_cli.metrics.cost import month_difference_text

        monthly = month_difference_text(doc.get("cost_usd_per_month"))
        if monthly:
            text += f", {monthly}"
    latency = doc.get("latency_s")
    if latency and latency["difference"]["mean"] is not None:
        text += f"; latency {seconds(latency['difference']['mean'], latency['difference']['ci95'], signed=True)}"
    if doc.get("decide_with"):
        text += f"; {doc['decide_with']}"
    elif doc.get("more_tasks"):  # a document written before `decide_with` existed
        text += f"; about {doc['more_tasks']} more tasks would likely decide it"
    if doc.get("why"):
        text += f"\n  why: {doc['why']}"
    return text


def _volume(text: str | None, sides: list[Side]) -> Volume | None:
    """--volume, else the volume the baseline's run was made with, else the first candidate run's."""
    from agl_cli.metrics.run import run_volume
    from agl_cli.spec.volume import parse_volume

    if text is not None:
        return parse_volume(text)
    return next((v for side in sides if (v := run_volume(side.run.path)) is not None), None)


@handle_errors
def compare_command(
    refs: Annotated[list[str], typer.Argument(help="A (the baseline), then B [C ...]: RUN, RUN:variant or a variant name.",
                                              show_default=False)],
    split: Annotated[Optional[str], typer.Option(help="Only rollouts of this split (e.g. val or test), or of several (val,train).")] = None,  # noqa: UP045,E501
    run: Annotated[Optional[str], typer.Option("--run", help="Where bare variant names are looked up.")] = None,  # noqa: UP045
    fail_on_worse: Annotated[bool, typer.Option("--fail-on-worse", help="Exit 3 when a candidate is worse.")] = False,
    allow_different_tasks: Annotated[bool, typer.Option(
        "--allow-different-tasks", help="Pair tasks by id even where the two runs' tasks of that id differ in content "
        "(refused by default: exit 2, naming them).")] = False,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where runs live (default .agl/runs or $AGL_HOME/runs).")] = None,  # noqa: UP045,E501
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    volume: Annotated[Optional[str], typer.Option(help="Tasks the agent handles in production, e.g. 40000/month (default: the `volume:` the runs were made with): adds the cost difference per month.")] = None,  # noqa: UP045,E501
) -> None:
    """Judge B against A (paired, on shared tasks and seeds): better, worse or no detectable difference."""
    from rich.table import Table
    from rich.text import Text

    from agl_cli.console import print_json, print_table, stdout_console
    from agl_cli.errors import AglError, UsageError
    from agl_cli.metrics.paired import ALPHA, WORSE

    if len(refs) < 2:
        raise UsageError("give a baseline and at least one candidate: agl compare A B [C ...]")
    sides = [load_side(ref, r, variant, split) for ref, r, variant in resolve(refs, run, runs_dir)]
    base, candidates = sides[0], sides[1:]
    same = same_model_problems(base, candidates)
    if same:
        raise UsageError("; ".join(same), hint="a model name the gateway does not know goes to the default `model`; "
                         "name the model as upstream/model (or use the `model` knob via gateway) and run again")
    content = check_task_content(base, candidates, allow_different=allow_different_tasks)
    at_volume = _volume(volume, sides)
    docs = compare_sides(base, candidates, at_volume)
    warnings = []
    for doc, found in zip(docs, content, strict=True):
        doc["task_content"] = found.as_json()
        warnings += found.warnings(doc["candidate"]["ref"])
    empty = [d["candidate"]["ref"] for d in docs if d["n_pairs"] == 0]
    if empty:
        raise AglError(f"{', '.join(empty)} and {base.ref} share no scored (task, seed): nothing to compare",
                       hint="compare runs over the same tasks (and --split), or variants of one run")
    add_more_evidence(base, candidates, docs, split)
    worse = any(d["verdict"] == WORSE for d in docs)
    document = {
        "baseline": {"ref": base.ref, "run_id": base.run.run_id, "variant": base.variant},
        "volume": at_volume.as_dict() if at_volume is not None else None,
        "split": split, "alpha": ALPHA, "correction": "holm" if len(docs) > 1 else "none",
        "comparisons": docs, "verdict": docs[0]["verdict"] if len(docs) == 1 else None,
    }
    if json_output:
        print_json(document)
    else:
        table = Table(title=f"against {base.label}" + (f" ({split})" if split else ""), title_justify="left")
        for column in ("candidate", "tasks", "A", "B", "B - A [95% CI]", "p", "verdict", "served by (A / B)"):
            table.add_column(column, justify="left" if column in ("candidate", "verdict") else "right")
        def short(side: Side) -> str:
            return side.variant if side.run.path == base.run.path else side.label

        for side, d in zip(candidates, docs, strict=True):
            table.add_row(
                Text(short(side)), str(d["n_tasks"]), pct(d["baseline_mean"]), pct(d["candidate_mean"]),
                points(d["difference"]["mean"], d["difference"]["ci95"]), f"{d['p_adjusted']:.3g}",
                Text(d["verdict"]), Text(f"{base.served.label()} / {side.served.label()}"),
            )
        out = stdout_console()
        print_table(out, table)
        for side, d in zip(candidates, docs, strict=True):
            out.print(sentence(short(side), d), markup=False)
            if d.get("more_evidence"):
                from agl_cli.metrics.more_evidence import sentence as evidence_sentence

                out.print(f"  {short(side)}: {evidence_sentence(d['more_evidence'])}", markup=False)
    from agl_cli.console import stderr_console

    for line in dict.fromkeys([*warnings, *(w for d in docs for w in d["model_warnings"])]):
        stderr_console().print(f"warning: {line}", markup=False, highlight=False)
    if fail_on_worse and worse:
        raise typer.Exit(3)
