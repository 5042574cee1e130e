"""The experiment spec (`agl.yaml`): typed, validated, with errors that name the file, line and field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from agl_cli.errors import ConfigError
from agl_cli.spec.command_template import placeholders
from agl_cli.spec.env_values import expand as expand_env
from agl_cli.spec.volume import FORMS as VOLUME_FORMS
from agl_cli.spec.volume import Volume, volume_input
from agl_cli.spec.yaml_source import YamlDocument
from rl_backend.gateway.config import PriceSpec, UpstreamSpec
from rl_backend.gateway.knobs import KNOBS, check_models
from rl_backend.rewards import DEFAULT_PASS_THRESHOLD
from rl_backend.rollout.k8s_spec import KubernetesSpec

AGENT_PLACEHOLDERS = {"task_file", "output_file", "rollout_dir", "rollout_id", "python"}
GRADER_PLACEHOLDERS = {"task_file", "output_file", "rollout_dir", "python"}
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REFERENCE = "docs/agl-yaml.md"  # every key of agl.yaml, generated from these models (agl_cli/docgen.py)


class _Strict(BaseModel):
    # `.inf` and `.nan` are YAML floats; no setting of agl's means anything with them.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _FieldError(ValueError):
    """A cross-field check's error that knows which field it is about, so the message can name its line."""

    def __init__(self, message: str, location: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.location = location


def _check_placeholders(template: str, allowed: set[str]) -> None:
    unknown = placeholders(template) - allowed
    if unknown:
        raise ValueError(
            f"unknown placeholder {{{sorted(unknown)[0]}}}; valid ones are "
            + ", ".join("{" + p + "}" for p in sorted(allowed))
        )


class AgentSpec(_Strict):
    """`agent:`: the unchanged agent, run once per rollout. Give `command` or `entry`."""

    command: str | None = Field(
        default=None,
        description="shell command run in the spec's folder; placeholders: {task_file}, {output_file}, "
        "{rollout_dir}, {rollout_id}, {python} (agl's own interpreter)",
    )
    entry: str | None = Field(
        default=None, description="package.module:function taking (task: dict) and returning the output"
    )
    timeout_s: float = Field(
        default=120.0, gt=0, description="seconds before the rollout's process group is killed (status timed_out)"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables for the agent")

    @model_validator(mode="after")
    def _one_form(self) -> AgentSpec:
        if bool(self.command) == bool(self.entry):
            raise ValueError("give exactly one of `command` (a shell command) or `entry` (module:function)")
        if self.command:
            _check_placeholders(self.command, AGENT_PLACEHOLDERS)
        if self.entry and not _ENTRY.match(self.entry):
            raise ValueError(f"`entry` must look like package.module:function, found {self.entry!r}")
        return self


class SplitByField(_Strict):
    """`tasks.split: {field: NAME}`: each task names its split in a field."""

    field: str = Field(description="the task field holding its split name (train, val, test...)")


NEAR_DUPLICATES = "near_duplicates"  # `group_by:` this keeps each cluster of near-duplicate tasks in one split


class SplitByFractions(_Strict):
    """`tasks.split: {fractions: {...}, seed: N}`: a seeded random split, of tasks or of groups of tasks."""

    fractions: dict[str, float] = Field(description="split name -> share of the tasks; the shares add up to 1")
    seed: int = Field(default=0, description="seed of the random assignment")
    group_by: str | None = Field(
        default=None,
        description="keep groups of tasks in one split: the name of a task field (tasks with equal values go "
        f"together), or `{NEAR_DUPLICATES}` (each cluster of tasks that `agl tasks` calls near-duplicates goes "
        "together); the shares then hold to within a group's size",
    )

    @field_validator("group_by")
    @classmethod
    def _named(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(f"name a task field, or `{NEAR_DUPLICATES}`")
        return value

    @field_validator("fractions")
    @classmethod
    def _sum_to_one(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("give at least one split, for example {train: 0.6, val: 0.2, test: 0.2}")
        if any(f < 0 for f in value.values()):
            raise ValueError("fractions must be non-negative")
        total = sum(value.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"fractions must add up to 1, they add up to {total:g}")
        return value


class TasksSpec(_Strict):
    """`tasks:`: the task set, one JSON object per line."""

    path: str = Field(description="the JSONL file, relative to agl.yaml's folder")
    split: SplitByField | SplitByFractions | None = Field(
        default=None, description="how tasks divide into splits: {field: NAME} or {fractions: {...}, seed: N}"
    )
    id_field: str = Field(default="id", description="the field naming each task (else its line number)")


class GraderSpec(_Strict):
    """`grader:`: how a rollout is scored. Give exactly one of `command`, `entry`, `reported: true`."""

    command: str | None = Field(
        default=None,
        description="shell command printing a score from 0 to 1 (1 right, 0 wrong), or JSON {\"score\": x, ...}; "
        "placeholders: {task_file}, "
        "{output_file}, {rollout_dir}, {python}",
    )
    entry: str | None = Field(
        default=None, description="package.module:function (task: dict, output: str) -> float | dict"
    )
    reported: bool = Field(default=False, description="the agent POSTs its reward to $AGL_REWARD_URL")
    timeout_s: float = Field(default=60.0, gt=0, description="seconds before the grader is killed")

    @model_validator(mode="after")
    def _one_form(self) -> GraderSpec:
        forms = [bool(self.command), bool(self.entry), self.reported]
        if sum(forms) != 1:
            raise ValueError(
                "give exactly one of `command` (prints a number or JSON), `entry` (module:function), "
                "or `reported: true` (the agent POSTs its reward)"
            )
        if self.command:
            _check_placeholders(self.command, GRADER_PLACEHOLDERS)
        if self.entry and not _ENTRY.match(self.entry):
            raise ValueError(f"`entry` must look like package.module:function, found {self.entry!r}")
        return self


UNSET = "unset"  # how an option `null` (the knob not applied) is named in variant names and tables
_SHORT_NAME = re.compile(r"^[^\s,=]+$")


def option_text(value: Any) -> str:
    """A value option as written in a variant name: a string as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


class KnobSpec(_Strict):
    """One entry of `knobs:`: a setting to compare. Its first option is the baseline; an option `null` leaves the
    setting alone (not sent, not set, not written), so the agent keeps its own."""

    values: list[Any] | dict[str, Any] | None = Field(
        default=None,
        description="the options, as values; or a mapping of short name to value (`{vote3: \"a,b,c\"}`), the "
        "names naming the variants",
    )
    files: list[str | None] | dict[str, str | None] | None = Field(
        default=None,
        description="the options, as files (relative to agl.yaml), each named by its file's stem; or a mapping of "
        "short name to file",
    )
    via: Literal["gateway", "env", "file"] = Field(
        description=f"gateway: the gateway rewrites each request ({', '.join(KNOBS)}); env: an environment "
        "variable; file: a file the agent reads"
    )
    name: str | None = Field(default=None, description="via env: the variable name, e.g. AGENT_MAX_TURNS")
    path: str | None = Field(
        default=None, description="via file: where to write it, e.g. '{rollout_dir}/prompt.md'"
    )
    mode: Literal["replace", "prepend"] = Field(
        default="replace", description="system_prompt: replace every system and developer message of every call "
        "with the file's text, or prepend it to the first one"
    )
    models: list[str] | None = Field(
        default=None,
        description="via gateway: apply the knob only to the calls served by these models (`upstream/model`, or a "
        "model name on any upstream; `*` matches anything); the other calls keep what the agent sent",
    )

    @model_validator(mode="after")
    def _check(self) -> KnobSpec:
        if (self.values is None) == (self.files is None):
            raise ValueError("give exactly one of `values` (a list of settings) or `files` (a list of paths)")
        if not self.options:
            raise ValueError("a knob needs at least one value; its first is the baseline")
        if all(option is None for option in self.options) and len(self.options) > 1:
            raise ValueError("`null` can be one option (the setting left alone), not every one")
        if self.via == "env" and (not self.name or not _ENV_NAME.match(self.name)):
            raise ValueError("a knob `via: env` needs `name`, the environment variable, e.g. AGENT_MAX_TURNS")
        if self.via == "file":
            if not self.path:
                raise ValueError("a knob `via: file` needs `path`, where to write it, e.g. '{rollout_dir}/prompt.md'")
            _check_placeholders(self.path, {"rollout_dir"})
        if self.models is not None and self.via != "gateway":
            raise ValueError("`models` limits a `via: gateway` knob to some models; an env or file knob reaches the "
                             "agent whatever model it calls")
        self._check_labels()
        return self

    def _check_labels(self) -> None:
        mapping = self.values if isinstance(self.values, dict) else self.files if isinstance(self.files, dict) else None
        for short in mapping or {}:
            if not _SHORT_NAME.match(short):
                raise ValueError(f"short name {short!r}: use no spaces, commas or `=` (it is typed in "
                                 "`--variant knob=NAME`)")
        labels = self.labels()
        for label in labels:
            if labels.count(label) > 1:
                which = "values" if self.values is not None else "files"
                raise ValueError(f"two options are both named {label!r}; give them short names, e.g. "
                                 f"{which}: {{a: ..., b: ...}}")

    @property
    def options(self) -> list[Any]:
        """The options in order, as the variants hold them: values, file paths, or None for `null`."""
        chosen = self.values if self.values is not None else self.files
        return list(chosen.values() if isinstance(chosen, dict) else chosen or [])

    def labels(self) -> list[str]:
        """What names each option in variant names, tables and `--variant`: its short name when the options are a
        mapping; else `unset` for `null`, a file's stem (its path when two stems are alike), a value as written."""
        chosen = self.values if self.values is not None else self.files
        if isinstance(chosen, dict):
            return list(chosen)
        if self.files is None:
            return [UNSET if o is None else option_text(o) for o in self.options]
        stems = [Path(f).stem for f in self.files if f is not None]
        return [UNSET if f is None else Path(f).stem if stems.count(Path(f).stem) == 1 else f for f in self.files]

    def label(self, option: Any) -> str:
        """The label of one option; an option the knob does not list (a `--candidate` file, `no-knobs`' unset) is
        named the same way."""
        for known, label in zip(self.options, self.labels(), strict=True):
            if known == option:
                return label
        if option is None:
            return UNSET
        return Path(str(option)).stem if self.files is not None else option_text(option)

    def option_files(self) -> list[str]:
        """The files among the options (not `null`)."""
        return [o for o in self.options if o is not None] if self.files is not None else []

    def add_file(self, path: str) -> None:
        """Offer one more file as an option (a `--candidate`, a reflect proposal), after the knob's own."""
        assert self.files is not None
        if isinstance(self.files, dict):
            name, n = Path(path).stem, 2
            while name in self.files:
                name, n = f"{Path(path).stem}-{n}", n + 1
            self.files[name] = path
        else:
            self.files.append(path)


def _check_gateway_knob(name: str, knob: KnobSpec) -> None:
    """A `via: gateway` knob against the gateway's knob table: a knob it applies, options it would accept."""
    gateway_knob = KNOBS.get(name)
    if gateway_knob is None:
        raise _FieldError(
            f"knob {name!r} is `via: gateway`, but the gateway can only set {', '.join(sorted(KNOBS))}; use "
            "`via: env` or `via: file` for anything else",
            ("knobs", name, "via"),
        )
    if gateway_knob.from_files and knob.files is None:
        raise _FieldError(f"knob {name!r} takes `files:` (one prompt file per option)", ("knobs", name))
    if not gateway_knob.from_files and knob.values is None:
        raise _FieldError(f"knob {name!r} takes `values:` ({gateway_knob.takes})", ("knobs", name))
    if knob.models is not None:
        try:
            check_models(name, knob.models)
        except ValueError as exc:
            raise _FieldError(str(exc), ("knobs", name, "models")) from None
    if knob.values is None:
        return
    keys: list[str | int] = list(knob.values) if isinstance(knob.values, dict) else list(range(len(knob.values)))
    for key, value in zip(keys, knob.options, strict=True):
        if value is None:
            continue  # not sent: the request keeps what the agent wrote
        try:
            gateway_knob.check(value)
        except ValueError as exc:
            raise _FieldError(str(exc), ("knobs", name, "values", key)) from None


class ProposerSpec(_Strict):
    """`proposer:`: the LLM that `agl optimize --strategy reflect` asks for new prompts, through the gateway."""

    model: str = Field(description="upstream/model, the upstream declared under `upstreams:`")
    knob: str | None = Field(default=None, description="the file-valued knob whose file the proposals replace")
    rounds: int = Field(default=8, ge=1, le=500, description="proposals to request, one per round")
    minibatch: int = Field(default=8, ge=0, description="tasks a proposal is screened on first (0: no screen)")
    max_transcripts: int = Field(default=4, ge=1, le=50, description="failing transcripts shown per proposal")
    max_transcript_chars: int = Field(default=4000, ge=200, description="each transcript is cut to this length")
    temperature: float | None = Field(default=None, ge=0, le=2, description="unset: the model's default")
    max_tokens: int = Field(default=2048, ge=16, description="the proposer's reply length limit")
    max_prompt_chars: int = Field(default=20000, ge=1, description="longer proposals are rejected")
    seed: int = Field(default=0, description="seed of the parent draws")

    @field_validator("model")
    @classmethod
    def _upstream_slash_model(cls, value: str) -> str:
        head, sep, tail = value.partition("/")
        if not (head and sep and tail):
            raise ValueError(
                f"write the proposer's model as upstream/model, e.g. openai/gpt-4.1-mini, found {value!r}"
            )
        return value


class BudgetSpec(_Strict):
    """`budget:`: hard ceilings, for each run or study on its own, or for all the runs of this spec together
    (`scope: experiment`)."""

    usd: float | None = Field(
        default=None, ge=0,
        description="model spend in USD; the gateway refuses calls past it. Every model that is not free needs a "
        "price (shipped, or under `prices:`)",
    )
    rollouts: int | None = Field(default=None, ge=1, description="rollouts started")
    scope: Literal["run", "experiment"] = Field(
        default="run",
        description="`run`: each run or study has these ceilings of its own. `experiment`: every run of this spec "
        "(eval, optimize, train) counts against them together: a run starts with what the others left, stops "
        "there, and is refused when nothing is left; rollouts reused from earlier runs are not counted again. "
        "`agl spend agl.yaml` shows what is spent and left",
    )
    # What the spec's other runs spent, when scope is experiment (agl_cli/runs/experiment_budget.py fills them in).
    _others_usd: float = PrivateAttr(default=0.0)
    _others_rollouts: int = PrivateAttr(default=0)

    def count_others(self, usd: float, rollouts: int) -> None:
        """Charge what the spec's other runs spent against an experiment's ceilings (scope `run`: ignored)."""
        if self.scope == "experiment":
            self._others_usd, self._others_rollouts = usd, rollouts

    def run_usd(self, flag: float | None = None) -> float | None:
        """What this run may spend itself: a flag's ceiling (`--budget-usd`) or `usd`; with scope `experiment`
        never more than the others left."""
        ceiling = flag if flag is not None else self.usd
        if self.scope == "experiment" and self.usd is not None:
            left = max(self.usd - self._others_usd, 0.0)
            ceiling = left if ceiling is None else min(ceiling, left)
        return ceiling

    def run_rollouts(self, flag: int | None = None) -> int | None:
        """The rollouts this run may start itself, the same way as run_usd."""
        ceiling = flag if flag is not None else self.rollouts
        if self.scope == "experiment" and self.rollouts is not None:
            left = max(self.rollouts - self._others_rollouts, 0)
            ceiling = left if ceiling is None else min(ceiling, left)
        return ceiling


class ExperimentSpec(_Strict):
    """agl.yaml: the experiment spec. Only `agent`, `tasks` and `grader` are required."""

    name: str = Field(default="experiment", description="the study's name, shown in reports")
    agent: AgentSpec = Field(description="the agent, run unchanged once per rollout")
    tasks: TasksSpec = Field(description="the task set")
    grader: GraderSpec = Field(description="how a rollout is scored")
    upstreams: dict[str, UpstreamSpec] = Field(
        default_factory=dict,
        description="where model names are served, by upstream name; a call naming `upstream/model` goes there",
    )
    model: str | None = Field(
        default=None,
        description="the default upstream/model: a call whose model name matches no upstream goes here (agl shows "
        "which calls fell back to it); default: the only upstream, when there is one (its `model`, else the name "
        "the agent asked for)",
    )
    prices: dict[str, PriceSpec] = Field(
        default_factory=dict,
        description="USD per 1M tokens, keyed by upstream/model (or a model name, for every upstream); wins over "
        "agl's shipped prices and makes a loopback upstream's calls priced. A call with no price has an unknown "
        "cost, shown as such, never $0",
    )
    knobs: dict[str, KnobSpec] = Field(default_factory=dict, description="the settings to compare, by knob name")
    seeds: int = Field(default=1, ge=1, description="runs per task (more seeds measure reliability, pass^k)")
    pass_threshold: float = Field(
        default=DEFAULT_PASS_THRESHOLD, allow_inf_nan=False, ge=0.0, le=1.0,
        description="a rollout passes when its reward is at least this: what pass^k, pass@k, training's pass rate and "
        "the reports' count of wrong answers count (accuracy is the mean reward, whatever this says)",
    )
    concurrency: int = Field(default=4, ge=1, le=1024, description="rollouts at once")
    budget: BudgetSpec = Field(default_factory=BudgetSpec, description="hard ceilings")
    volume: Volume | None = Field(
        default=None,
        description=f"the tasks the agent handles in production: {VOLUME_FORMS}. eval, compare, optimize and the "
        "reports then show cost per month beside cost per task, both with 95% intervals",
    )
    runner: Literal["local", "kubernetes"] = Field(
        default="local", description="local processes, or one Kubernetes Job per rollout"
    )
    kubernetes: KubernetesSpec | None = Field(default=None, description="with `runner: kubernetes`")
    proposer: ProposerSpec | None = Field(
        default=None, description="the LLM that writes prompts for `agl optimize --strategy reflect`"
    )

    # Where the spec file lives; relative paths in it resolve from here. Not a YAML key.
    base_dir: Path = Field(default=Path("."), exclude=True)

    @field_validator("volume", mode="before")
    @classmethod
    def _volume_text(cls, value: Any) -> Any:
        return volume_input(value)

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentSpec:
        if self.runner == "kubernetes" and self.kubernetes is None:
            raise ValueError("`runner: kubernetes` needs a `kubernetes:` section, at least `image:`")
        for name, knob in self.knobs.items():
            if knob.via == "gateway":
                _check_gateway_knob(name, knob)
        if self.model is not None and "/" in self.model and self.upstreams:
            upstream = self.model.split("/", 1)[0]
            if upstream not in self.upstreams:
                raise _FieldError(
                    f"`model: {self.model}` names upstream {upstream!r}, which is not in `upstreams` "
                    f"({', '.join(self.upstreams)})",
                    ("model",),
                )
        return self

    def proposer_knob(self) -> str:
        """The file-valued knob the reflect proposals replace: `proposer.knob`, else the spec's only one."""
        file_knobs = [name for name, knob in self.knobs.items() if knob.files is not None]
        named = self.proposer.knob if self.proposer is not None else None
        if named is not None:
            if named not in file_knobs:
                raise ValueError(
                    f"{named!r} is not a file-valued knob; the proposals replace a prompt file, so name one of: "
                    + (", ".join(file_knobs) or "none (declare one with `files:` under `knobs:`)")
                )
            return named
        if len(file_knobs) != 1:
            raise ValueError(
                f"the spec has {len(file_knobs)} file-valued knobs; say which one the proposals replace with "
                "`proposer.knob`, one of: "
                + (", ".join(file_knobs) or "none (declare one, e.g. knobs: {prompt: {files: [prompt.md], via: file, "
                   "path: '{rollout_dir}/prompt.md'}})")
            )
        return file_knobs[0]

    def resolve(self, relative: str) -> Path:
        path = Path(relative).expanduser()
        return path if path.is_absolute() else (self.base_dir / path)


def _describe_input(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _format_error(doc: YamlDocument, error: dict[str, Any]) -> str:
    located = (error.get("ctx") or {}).get("error")
    loc = located.location if isinstance(located, _FieldError) else error["loc"]
    loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith(("function-", "tagged-union"))))
    # pydantic adds the union member's class name to the location; it means nothing to the user.
    loc = tuple(p for p in loc if p not in {"SplitByField", "SplitByFractions"})
    line = doc.line_of(loc)
    where = f"{doc.path}:{line}" if line else str(doc.path)
    field = ".".join(str(p) for p in loc) or "(top level)"
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{where}: `{field}` is not a key agl knows; check its spelling against {REFERENCE}"
    if error["type"] == "missing":
        return f"{where}: `{field}` is required but missing"
    found = "" if error["type"].startswith("value_error") else f" (found {_describe_input(error.get('input'))})"
    return f"{where}: `{field}`: {msg}{found}"


def _check_proposer(doc: YamlDocument, spec: ExperimentSpec) -> None:
    """The proposer's cross-references (its upstream, its knob), named by file, line and field."""
    assert spec.proposer is not None
    upstream = spec.proposer.model.partition("/")[0]
    if upstream not in spec.upstreams:
        line = doc.line_of(("proposer", "model"))
        declared = ", ".join(spec.upstreams) or "none"
        raise ConfigError(
            f"{doc.path}:{line}: `proposer.model`: {spec.proposer.model!r} names upstream {upstream!r}, which is not "
            f"in `upstreams` (declared: {declared})",
            hint=f"declare it, e.g.  upstreams: {{{upstream}: {{kind: openai, api_key_env: OPENAI_API_KEY}}}}",
        )
    try:
        spec.proposer_knob()
    except ValueError as exc:
        field = ("proposer", "knob") if spec.proposer.knob is not None else ("proposer",)
        line = doc.line_of(field)
        raise ConfigError(f"{doc.path}:{line}: `{'.'.join(field)}`: {exc}") from None


def load_spec(path: Path | str) -> ExperimentSpec:
    """Read and validate an agl.yaml; any problem raises ConfigError listing every bad field with its line."""
    spec_path = Path(path)
    if spec_path.is_dir():
        spec_path = spec_path / "agl.yaml"
    doc = YamlDocument.load(spec_path)
    data = expand_env(doc, os.environ)
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        problems = [_format_error(doc, e) for e in exc.errors()]  # type: ignore[arg-type]
        raise ConfigError(
            f"{spec_path} is not a valid experiment spec:\n  " + "\n  ".join(problems),
            hint=f"every key is described in {REFERENCE}; `agl init` writes a commented starter agl.yaml",
        ) from None
    spec.base_dir = spec_path.resolve().parent
    if not spec.resolve(spec.tasks.path).is_file():
        line = doc.line_of(("tasks", "path"))
        raise ConfigError(
            f"{spec_path}:{line}: `tasks.path`: {spec.resolve(spec.tasks.path)} does not exist",
            hint="paths in agl.yaml are relative to the folder of agl.yaml",
        )
    for upstream_name, upstream in spec.upstreams.items():
        if upstream.kind == "replay" and not spec.resolve(str(upstream.path)).is_file():
            line = doc.line_of(("upstreams", upstream_name, "path"))
            raise ConfigError(
                f"{spec_path}:{line}: `upstreams.{upstream_name}.path`: {spec.resolve(str(upstream.path))} does not exist",
                hint="record one by running against the live upstream with `record_to:` set on it",
            )
    if spec.proposer is not None:
        _check_proposer(doc, spec)
    for knob_name, knob in spec.knobs.items():
        files = knob.files.items() if isinstance(knob.files, dict) else enumerate(knob.files or [])
        for index, file_name in files:
            if file_name is not None and not spec.resolve(file_name).is_file():
                line = doc.line_of(("knobs", knob_name, "files", index))
                raise ConfigError(f"{spec_path}:{line}: `knobs.{knob_name}.files`: {spec.resolve(file_name)} does not exist")
    return spec
