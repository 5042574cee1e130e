"""A study: a run directory (manifest kind "study") whose one store holds every rollout of every variant, plus
its budget ledger and the runner that stops launching at the ceiling.

The manifest keeps what a resume needs (spec path, candidate files, variants with their hashes, task order,
options, agent version); rounds and results go to the store's `meta`.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agl_cli.errors import UsageError
from agl_cli.evaluation.agent_version import AgentVersion, describe_agent
from agl_cli.evaluation.preflight import check_commands
from agl_cli.evaluation.runner import EvalRunner, PlannedRollout
from agl_cli.metrics.fmt import usd
from agl_cli.optimize.cache import imported_ids
from agl_cli.optimize.space import (
    CandidateFile,
    ExtraOption,
    build_variants,
    parse_candidate,
    parse_option,
    variants_from_manifest,
    with_base,
    with_candidates,
    with_options,
)
from agl_cli.runs.rundir import RunDir, find_run, git_sha, runs_root
from agl_cli.spec.prices import check_budget_prices
from agl_cli.spec.schema import ExperimentSpec, load_spec
from agl_cli.spec.tasks import Task, load_tasks, select_tasks, task_set_hash
from agl_cli.spec.variants import Variant, baseline
from agl_cli.spec.volume import Volume
from rl_backend.store.db import RunStore
from rl_backend.store.records import Rollout
from rl_backend.version import installed_version

KIND = "study"
PROPOSER_SCOPE = "proposer-"  # the gateway scope (in place of a rollout id) of the reflect proposer's calls


@dataclass
class StudyOptions:
    """Everything the command line chose; stored in the manifest so a resume continues the same study."""

    strategy: str | None = None
    variants: list[str] = field(default_factory=list)
    candidates: list[dict[str, str]] = field(default_factory=list)
    grid: bool = False
    sample: int | None = None
    sample_seed: int = 0
    budget_usd: float | None = None
    max_rollouts: int | None = None
    max_cost_per_task: float | None = None
    max_p95_latency: float | None = None
    seeds: int | None = None
    search_split: str = "val"
    confirm_split: str = "test"
    first_batch: int | None = None
    limit: int | None = None  # search on the first N tasks of the (shuffled) search split
    confirm_limit: int | None = None  # confirm on the first N tasks of the held-out split
    order_seed: int = 0
    no_cache: bool = False
    reuse_failures: bool = False  # the cache also reuses rollouts that failed by the agent's own doing
    across: list[str] = field(default_factory=list)  # search these knobs' combinations, the rest at the baseline
    base: str | None = None  # the study's baseline setting (knob=option[,...]): the setting kept so far
    extra_options: list[dict[str, Any]] = field(default_factory=list)  # --option: {knob, value} added to a knob
    volume: dict[str, Any] | None = None  # --volume, as agl_cli.spec.volume.Volume's fields


@dataclass
class Study:
    run: RunDir
    spec: ExperimentSpec  # with the candidate files added to their knobs
    spec_path: Path
    variants: list[Variant]
    search_tasks: list[Task]  # in racing order (a seeded shuffle)
    confirm_tasks: list[Task]
    seeds: int
    options: StudyOptions
    agent_version: str
    version: AgentVersion | None = None  # its detail, written beside the manifest (which files, which keys)

    @property
    def baseline(self) -> Variant:
        return self.variants[0]

    @property
    def strategy(self) -> str:
        return self.options.strategy or ("racing" if len(self.variants) > 2 else "grid")

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


def _split_tasks(spec: ExperimentSpec, options: StudyOptions) -> tuple[list[Task], list[Task]]:
    tasks = load_tasks(spec)
    if not any(t.split for t in tasks):
        raise UsageError(
            "agl optimize searches on a validation split and confirms on a held-out test split, "
            "but the spec defines no splits",
            hint="add to agl.yaml:  tasks: {split: {fractions: {train: 0.6, val: 0.2, test: 0.2}}}",
        )
    if options.search_split == options.confirm_split:
        raise UsageError("--search-split and --confirm-split must differ: the test split is held out from the search")
    search = select_tasks(tasks, split=options.search_split, limit=None)
    confirm = select_tasks(tasks, split=options.confirm_split, limit=None)
    order = sorted(search, key=lambda t: t.id)
    random.Random(options.order_seed).shuffle(order)  # racing's growing prefix must be a random sample
    # Both limits take a seeded random sample, not the file's first lines (which may be the easy ones).
    held_out = sorted(confirm, key=lambda t: t.id)
    random.Random(options.order_seed + 1).shuffle(held_out)
    return order[: options.limit], held_out[: options.confirm_limit]


def _study_spec(spec: ExperimentSpec, options: StudyOptions, candidates: list[CandidateFile]) -> ExperimentSpec:
    """The spec as the study sees it: the extra options and candidate files added, the --base setting first, and
    the --volume."""
    extra = [ExtraOption(o["knob"], o["value"]) for o in options.extra_options]
    working = with_base(with_candidates(with_options(spec, extra), candidates), options.base)
    if options.volume is not None:
        working.volume = Volume.model_validate(options.volume)
    return working


def prepare(config: Path, options: StudyOptions, candidate_texts: list[str], cwd: Path,
            option_texts: list[str] | None = None) -> Study:
    """Everything a new study needs, without creating its directory yet (a dry run may not need one)."""
    spec_path = (config / "agl.yaml" if config.is_dir() else config).resolve()
    spec = load_spec(spec_path)
    check_commands(spec, spec_path=spec_path)
    options.extra_options = [parse_option(spec, text, cwd).as_dict() for text in option_texts or []]
    extended = with_options(spec, [ExtraOption(o["knob"], o["value"]) for o in options.extra_options])
    candidates = [parse_candidate(extended, text, cwd) for text in candidate_texts]
    options.candidates = [c.as_dict() for c in candidates]
    working = _study_spec(spec, options, candidates)
    budget_flag = options.budget_usd is not None
    check_budget_prices(working, options.budget_usd if budget_flag else spec.budget.usd,
                        source="--budget-usd" if budget_flag else "budget.usd")
    reflect = options.strategy == "reflect"
    if reflect:
        from agl_cli.optimize.proposer import reflect_settings

        reflect_settings(working)  # without a proposer: a usage error showing the YAML to add
    if reflect and not (options.variants or candidates or options.sample is not None or options.grid):
        # reflect writes its own candidates: it starts from the baseline alone unless given others to start from
        variants = [baseline(working)]
    else:
        variants = build_variants(
            working, explicit=options.variants, candidates=candidates, use_grid=options.grid,
            sample=options.sample, sample_seed=options.sample_seed, across_knobs=options.across,
        )
    if len(variants) < 2 and not reflect:
        raise UsageError(
            "nothing to optimize: only the baseline is left to try",
            hint="give the spec knobs with several options, or name candidates with --variant or --candidate",
        )
    seeds = options.seeds if options.seeds is not None else spec.seeds
    if seeds < 1:
        raise UsageError(f"--seeds must be at least 1, got {seeds}")
    search, confirm = _split_tasks(working, options)
    version = describe_agent(working, spec_path)  # the candidate files count in their variants, not in the agent
    return Study(RunDir(Path()), working, spec_path, variants, search, confirm, seeds, options, version.digest,
                 version)


def create(study: Study, runs_dir: Path | None, *, status: str = "running") -> Study:
    study.run = RunDir.create(
        runs_root(runs_dir),
        spec_data=study.spec.model_dump(mode="json", exclude_none=True),
        manifest={
            "kind": KIND,
            "spec_path": str(study.spec_path),
            "spec_name": study.spec.name,
            "git_sha": git_sha(study.spec.base_dir),
            "agent_version": study.agent_version,
            "seeds": study.seeds,
            "variants": [{"name": v.name, "settings": v.settings, "hash": v.hash} for v in study.variants],
            "search_task_ids": [t.id for t in study.search_tasks],
            "confirm_task_ids": [t.id for t in study.confirm_tasks],
            "tasks_hash": task_set_hash(study.search_tasks + study.confirm_tasks),
            "options": asdict(study.options),
            "agl_version": installed_version(),
            "status": status,
        },
    )
    if study.version is not None:
        study.version.write(study.run.path)
    return study


def reopen(reference: str, runs_dir: Path | None) -> Study:
    """A study from its directory, refusing to resume one whose agent or variants changed since."""
    run = find_run(reference, runs_dir)
    manifest = run.manifest()
    if manifest.get("kind") != KIND:
        raise UsageError(f"run {run.run_id} is a {manifest.get('kind')!r} run, not a study",
                         hint="agl eval --resume finishes eval runs")
    run.require(manifest, "options", "spec_path", "agent_version", "search_task_ids", "confirm_task_ids",
                "variants", "seeds")
    options = StudyOptions(**manifest["options"])
    spec = load_spec(Path(manifest["spec_path"]))
    check_commands(spec, spec_path=Path(manifest["spec_path"]))
    working = _study_spec(spec, options, [CandidateFile(c["knob"], c["path"]) for c in options.candidates])
    current = describe_agent(working, Path(manifest["spec_path"]))
    version = current.digest
    if version != manifest["agent_version"]:
        before = AgentVersion.read(run.path)
        changed = current.changes_since(before) if before is not None else []
        raise UsageError(
            f"study {run.run_id}: the agent changed since it started (agent version {manifest['agent_version']} "
            f"is now {version}" + (f": {', '.join(changed[:6])}" if changed else "") + ")",
            hint="resuming would mix two agents; start a new study",
        )
    by_id = {t.id: t for t in load_tasks(working)}
    wanted = manifest["search_task_ids"] + manifest["confirm_task_ids"]
    missing = [tid for tid in wanted if tid not in by_id]
    if missing:
        raise UsageError(f"study {run.run_id} used tasks that are no longer in {spec.tasks.path}: "
                         f"{', '.join(missing[:5])}", hint="restore the task file, or start a new study")
    return Study(
        run=run, spec=working, spec_path=Path(manifest["spec_path"]),
        variants=variants_from_manifest(working, manifest["variants"]),
        search_tasks=[by_id[t] for t in manifest["search_task_ids"]],
        confirm_tasks=[by_id[t] for t in manifest["confirm_task_ids"]],
        seeds=int(manifest["seeds"]), options=options, agent_version=version,
    )


class Ledger:
    """What this study spent (rollouts it launched and their model cost; cached copies cost it nothing) against
    its ceiling. During the search a reserve is held back so the confirmation on the test split can still run."""

    def __init__(self, store: RunStore, *, max_rollouts: int | None, max_usd: float | None) -> None:
        self.store = store
        self.max_rollouts = max_rollouts
        self.max_usd = max_usd
        self.confirm_rollouts = 0  # rollouts to keep back for the confirmation while searching
        imported = imported_ids(store)
        self.launched = sum(1 for r in store.rollouts() if r.id not in imported)
        self.spent_usd = 0.0  # of the priced calls
        self.unpriced_calls = 0  # calls without a price (none when there is a budget in USD: see agl_cli.spec.prices)
        self.mean_cost = 0.0
        self.refresh()

    def refresh(self) -> None:
        imported = imported_ids(self.store)
        totals = self.store.call_totals_by_rollout()
        # Priced spend: a budget in USD only starts when every model it calls has a price (agl_cli.spec.prices).
        own = {rid: t.priced_usd for rid, t in totals.items() if rid not in imported}
        self.spent_usd = float(sum(own.values()))
        self.unpriced_calls = sum(t.unpriced_calls for rid, t in totals.items() if rid not in imported)
        # The reflect proposer's calls are spent, but are no rollout's: they must not inflate the reserve per rollout.
        rollouts_usd = sum(cost for rid, cost in own.items() if not rid.startswith(PROPOSER_SCOPE))
        self.mean_cost = rollouts_usd / self.launched if self.launched else 0.0

    @property
    def reserve_rollouts(self) -> int:
        if self.max_rollouts is None:
            return 0
        return min(self.confirm_rollouts, self.max_rollouts // 2)

    @property
    def reserve_usd(self) -> float:
        if self.max_usd is None:
            return 0.0
        return min(self.max_usd / 2, self.confirm_rollouts * self.mean_cost)

    def can_launch(self) -> bool:
        self.refresh()
        if self.max_rollouts is not None and self.launched + self.reserve_rollouts >= self.max_rollouts:
            return False
        return not (self.max_usd is not None and self.spent_usd + self.reserve_usd >= self.max_usd)

    def describe(self) -> str:
        spent = usd(self.spent_usd) + (f" of ${self.max_usd:g}" if self.max_usd is not None else "")
        if self.unpriced_calls:
            spent += f" (+ {self.unpriced_calls} calls without a price)"
        launched = f"{self.launched}" + (f" of {self.max_rollouts}" if self.max_rollouts is not None else "")
        return f"spent {spent}, {launched} rollouts"

    def as_dict(self) -> dict[str, Any]:
        return {"rollouts": self.launched, "usd": None if self.unpriced_calls else self.spent_usd,
                "priced_usd": self.spent_usd, "unpriced_calls": self.unpriced_calls,
                "budget": {"rollouts": self.max_rollouts, "usd": self.max_usd}}


class StudyRunner(EvalRunner):
    """EvalRunner whose launch check is the study's ledger, so the ceiling holds across rounds and resumes."""

    ledger: Ledger

    def _budget_left(self, started: int) -> bool:
        return self.ledger.can_launch()

    async def run_one(self, item: PlannedRollout, attempt: int) -> Rollout:
        # Counted before the first await: a concurrent launch check already sees this rollout.
        self.ledger.launched += 1
        return await super().run_one(item, attempt)
