"""verl's trainer config for `agl train --backend verl`: rendered from agl.yaml and the train options through
templates/verl/ppo_trainer.yaml.j2, then checked against verl's own schema before anything is launched.

The check merges the rendered overrides onto verl's packaged defaults (trainer/config/_generated_ppo_trainer.yaml) in
OmegaConf struct mode, so a key verl does not have is an error, then instantiates verl's config dataclasses for the
actor, the rollout and the algorithm (their `__post_init__` checks run: batch sizes, loss aggregation modes...), and
checks that the policy loss is in verl's registry. All of it runs on a CPU: a typo fails here, not on the GPU.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TEMPLATE = "verl/ppo_trainer.yaml.j2"
# agl's rollout normalization, as a verl policy loss (loss.py): advantages arrive pre-weighted, summed over tokens.
ROLLOUT_LOSS = "agl_rollout"
# A known model name of the embedded server -> the Hugging Face repository vLLM and verl load it from.
HF_NAMES = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


class VerlConfigError(ValueError):
    """The verl config agl rendered (or the options it came from) is not one verl accepts; the message says why."""


@dataclass(frozen=True)
class VerlSettings:
    """Everything the template reads; one place that says what of agl's options reaches verl."""

    spec_name: str
    model_path: str
    steps: int = 8
    tasks_per_step: int = 4
    group_size: int = 4
    lr: float = 1e-5
    temperature: float = 1.0
    loss_agg: str = "rollout"
    kl_coef: float = 0.0
    clip_ratio: float = 0.2
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    lora_rank: int = 0  # 0: full fine-tuning
    lora_alpha: int = 32
    micro_batch_tokens: int = 16384
    max_prompt_length: int = 4096
    max_response_length: int = 2048
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.4  # the policy server shares the GPUs with the FSDP trainer
    nnodes: int = 1
    gpus_per_node: int = 1
    checkpoint_dir: str = "checkpoints"
    keep_checkpoints: int = 2
    resume: bool = False

    @property
    def policy_loss(self) -> str:
        return ROLLOUT_LOSS if self.loss_agg == "rollout" else "vanilla"

    @property
    def verl_loss_agg_mode(self) -> str:
        return "token-sum" if self.loss_agg == "rollout" else self.loss_agg

    def check(self) -> None:
        """What verl's dataclasses cannot know about agl's options."""
        if self.loss_agg not in ("rollout", "token-mean", "seq-mean-token-mean"):
            raise VerlConfigError(f"loss_agg {self.loss_agg!r}: use rollout, token-mean or seq-mean-token-mean")
        if self.loss_agg == "rollout" and self.kl_coef > 0:
            # verl's actor adds its KL term aggregated by loss_agg_mode (token-sum here) without agl's per-rollout
            # weights, which would make the KL dwarf the policy loss.
            raise VerlConfigError("--kl-coef > 0 with --loss-agg rollout is not supported by the verl backend: use "
                                  "--kl-coef 0, or --loss-agg token-mean with a KL penalty")
        if self.gpus_per_node < 1 or self.nnodes < 1:
            raise VerlConfigError(f"need at least one GPU on one node, got {self.nnodes} x {self.gpus_per_node}")
        if self.gpus_per_node % self.tensor_parallel:
            raise VerlConfigError(f"tensor parallel size {self.tensor_parallel} must divide the {self.gpus_per_node} "
                                  "GPUs per node")
        if not 0.05 <= self.gpu_memory_utilization <= 0.95:
            raise VerlConfigError(f"gpu_memory_utilization {self.gpu_memory_utilization} must be in [0.05, 0.95]")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_path_for(model: str, base_dir: Path) -> str:
    """What vLLM and verl load: a local directory (relative to agl.yaml's folder), a known name's Hugging Face
    repository, or the name as given (a Hugging Face repository id, fetched into HF_HOME)."""
    local = (base_dir / model).expanduser()
    if local.is_dir():
        return str(local.resolve())
    return HF_NAMES.get(model, model)


def render(settings: VerlSettings) -> str:
    """The YAML overrides agl hands verl (not yet checked: see `validate`)."""
    from agl_cli.templates import render as render_template

    settings.check()
    return render_template(TEMPLATE, s=settings, verl_version=verl_version())


def verl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("verl")
    except PackageNotFoundError:
        return "(not installed)"


def defaults() -> Any:
    """verl's packaged trainer defaults as an OmegaConf DictConfig."""
    from omegaconf import OmegaConf

    try:
        source = importlib.resources.files("verl") / "trainer/config/_generated_ppo_trainer.yaml"
    except ModuleNotFoundError:
        raise VerlConfigError("verl is not installed: pip install 'agl[verl]'") from None
    return OmegaConf.load(str(source))


def validate(rendered: str, settings: VerlSettings) -> Any:
    """The full verl config (DictConfig): defaults + `rendered`, with verl's dataclasses built from it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    base = defaults()
    OmegaConf.set_struct(base, True)
    try:
        merged = OmegaConf.merge(base, OmegaConf.create(rendered))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or ""
        raise VerlConfigError(f"verl has no config key {key!r} (templates/verl/ppo_trainer.yaml.j2): "
                              f"{str(exc).splitlines()[0]}") from None
    _check_dataclasses(merged, settings)
    return merged


def _check_dataclasses(cfg: Any, settings: VerlSettings) -> None:
    from rl_backend.trainer.verl_backend.loss import register
    from rl_backend.trainer.verl_compat import verl

    register()
    from verl.utils.config import omega_conf_to_dataclass

    built: dict[str, Any] = {}
    for where in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm"):
        node = cfg
        for part in where.split("."):
            node = node[part]
        try:
            built[where] = omega_conf_to_dataclass(node)
        except Exception as exc:  # noqa: BLE001 - hydra wraps verl's own checks; their message is what to fix
            cause = exc.__cause__ or exc
            raise VerlConfigError(f"verl rejects `{where}`: {cause}") from None
    actor = built["actor_rollout_ref.actor"]
    try:
        # The actor's own runtime check: the mini-batch (in prompts) against the batch per step.
        actor.validate(settings.nnodes * settings.gpus_per_node, cfg.data.train_batch_size)
    except (ValueError, AssertionError) as exc:
        raise VerlConfigError(f"verl rejects the actor's batch sizes: {exc}") from None
    loss_mode = actor.policy_loss.loss_mode
    if loss_mode not in verl().core_algos.POLICY_LOSS_REGISTRY:
        raise VerlConfigError(f"policy loss {loss_mode!r} is not in verl's registry")
    if cfg.algorithm.adv_estimator != "grpo":
        raise VerlConfigError("agl computes GRPO advantages per rollout: algorithm.adv_estimator must be grpo")


def rendered_config(settings: VerlSettings) -> tuple[str, Any]:
    """(the YAML overrides, the validated full config)."""
    text = render(settings)
    return text, validate(text, settings)
