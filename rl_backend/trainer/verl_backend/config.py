"""verl's trainer config for `agl train --backend verl`: the settings agl derives from agl.yaml and the train options,
and the check of the rendered config against verl's own schema before anything is launched.

agl_cli renders templates/verl/ppo_trainer.yaml.j2 from a `VerlSettings`; `validate` merges the result onto verl's
packaged defaults (trainer/config/_generated_ppo_trainer.yaml) in OmegaConf struct mode, so a key verl does not
have is an error, then instantiates verl's config dataclasses for the actor, the rollout and the rollout correction
(their `__post_init__` checks run) and checks that the policy loss is in verl's registry. All of it runs
on a CPU: a typo fails here, not on the GPU.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl_backend.trainer.verl_backend.loss import ROLLOUT_LOSS, register

TEMPLATE = "verl/ppo_trainer.yaml.j2"
# vLLM's --max-lora-rank accepts only these (an adapter it loads may have any rank up to the one set).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEVICES = ("cuda", "cpu")
POLICY_SERVERS = ("vllm", "embedded")
ROLLOUT_DTYPES = ("bfloat16", "float16", "float32")


DEFAULT_PROMPT_LENGTH = 4096
DEFAULT_RESPONSE_LENGTH = 2048


class VerlConfigError(ValueError):
    """The verl config agl rendered (or the options it came from) is not one verl accepts; the message says why."""


def default_attention() -> str:
    """flash_attention_2 when flash-attn imports (verl's default), else PyTorch's SDPA, which needs nothing else."""
    return "flash_attention_2" if importlib.util.find_spec("flash_attn") is not None else "sdpa"


@dataclass(frozen=True)
class VerlSettings:
    """Everything the template reads: one place that says what of agl's options reaches verl."""

    spec_name: str
    model_path: str
    steps: int = 8
    lr: float = 1e-5
    loss_agg: str = "rollout"
    kl_coef: float = 0.0
    clip_ratio: float = 0.2
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    lora_rank: int = 0  # 0: full fine-tuning
    lora_alpha: int = 32
    micro_batch_tokens: int = 16384
    max_prompt_length: int = DEFAULT_PROMPT_LENGTH
    max_response_length: int = DEFAULT_RESPONSE_LENGTH
    model_max_len: int | None = None  # the model's max_position_embeddings, when its config.json is at hand
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.4  # the rollout servers share the GPUs with the FSDP trainer
    nnodes: int = 1
    gpus_per_node: int = 1
    device: str = "cuda"  # cuda or cpu (CI, and machines without a GPU)
    # What serves the policy: vllm (GPUs), or agl's embedded engine (the CPU's, and a GPU machine without vLLM).
    policy_server: str = "vllm"
    attn_implementation: str = "sdpa"
    rollout_is: str | None = "token"  # verl's rollout correction: truncated importance weights per token
    rollout_is_threshold: float = 2.0
    # vLLM's tool-call parser (its --tool-call-parser), None: tool calls off (vllm_tools.py picks one per family).
    tool_call_parser: str | None = None
    rollout_dtype: str | None = None  # what vLLM computes in; None: float32 on a CPU (as the actor), else bfloat16
    # The training sampler's temperature (--temperature). The policy servers record raw logprobs (vLLM's
    # logprobs_mode raw_logprobs, the embedded engine's only kind) and the actor recomputes at temperature 1, so
    # only 1 describes the distribution the tokens are drawn from.
    temperature: float = 1.0

    @property
    def policy_loss(self) -> str:
        return ROLLOUT_LOSS if self.loss_agg == "rollout" else "vanilla"

    @property
    def verl_loss_agg_mode(self) -> str:
        return "token-sum" if self.loss_agg == "rollout" else self.loss_agg

    @property
    def rollout_name(self) -> str:
        """verl's rollout backend: vLLM, or agl's embedded engine (embedded_policy.py)."""
        from rl_backend.trainer.verl_backend.embedded_policy import ROLLOUT_NAME

        return "vllm" if self.policy_server == "vllm" else ROLLOUT_NAME

    @property
    def lora_merge(self) -> bool:
        """vLLM's OpenAI server (what the gateway calls) cannot select an adapter verl loads into its engine, so on
        GPUs the adapter is merged into the weights verl syncs; the embedded server takes the adapter itself."""
        return self.rollout_name == "vllm"

    @property
    def vllm_dtype(self) -> str:
        return self.rollout_dtype or ("float32" if self.device == "cpu" else "bfloat16")

    @property
    def max_model_len(self) -> int:
        """vLLM's context: the longest prompt plus the longest answer."""
        return self.max_prompt_length + self.max_response_length

    @property
    def token_budget(self) -> int:
        """verl's per-GPU token budgets (update and logprob recompute): `micro_batch_tokens`, raised to the longest
        sequence the policy servers can produce, since verl needs each sequence whole in one micro-batch."""
        return max(self.micro_batch_tokens, self.max_model_len)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def ray_num_cpus(self) -> int | None:
        """A local Ray on a CPU gets room for the worker, the rollout server and verl's router (Ray's own count of
        cores is too small for them on a 2-core machine); on GPUs Ray counts the machine."""
        return max(4, os.cpu_count() or 1) if self.device == "cpu" else None

    def check(self) -> None:
        """What verl's dataclasses cannot know about agl's options."""
        if self.loss_agg not in ("rollout", "token-mean", "seq-mean-token-mean"):
            raise VerlConfigError(f"loss_agg {self.loss_agg!r}: use rollout, token-mean or seq-mean-token-mean")
        if self.loss_agg == "rollout" and self.kl_coef > 0:
            # verl's actor adds its KL term aggregated by loss_agg_mode (token-sum here) without agl's per-rollout
            # weights, which would make the KL dwarf the policy loss.
            raise VerlConfigError("--kl-coef > 0 with --loss-agg rollout is not supported by the verl backend: use "
                                  "--kl-coef 0, or --loss-agg token-mean with a KL penalty")
        if self.temperature != 1.0:
            # Tokens drawn at another temperature come from a distribution neither the recorded nor the recomputed
            # logprobs describe: the rollout correction would see weights near 1 and the gradient would be biased.
            raise VerlConfigError(
                f"--temperature {self.temperature:g}: the verl backend records the policy's raw (temperature 1) "
                "logprobs and recomputes them at temperature 1, so its loss cannot account for tokens sampled at "
                f"{self.temperature:g}; use --temperature 1 (the default)")
        for flag, value in (("--max-prompt-length", self.max_prompt_length),
                            ("--max-response-length", self.max_response_length)):
            if value < 1:
                raise VerlConfigError(f"{flag} must be at least 1 token, got {value}")
        if self.model_max_len is not None and self.max_model_len > self.model_max_len:
            raise VerlConfigError(
                f"max prompt length {self.max_prompt_length} + max response length {self.max_response_length} = "
                f"{self.max_model_len} tokens, more than the model's max_position_embeddings ({self.model_max_len}): "
                "lower --max-prompt-length/--max-response-length (or the trained upstream's max_prompt_length/"
                "max_response_length in agl.yaml)")
        if self.device not in DEVICES:
            raise VerlConfigError(f"device {self.device!r}: use one of {', '.join(DEVICES)}")
        if self.gpus_per_node < 1 or self.nnodes < 1:
            raise VerlConfigError(f"need at least one GPU on one node, got {self.nnodes} x {self.gpus_per_node}")
        if self.gpus_per_node % self.tensor_parallel:
            raise VerlConfigError(f"tensor parallel size {self.tensor_parallel} must divide the {self.gpus_per_node} "
                                  "GPUs per node")
        if self.policy_server not in POLICY_SERVERS:
            raise VerlConfigError(f"policy server {self.policy_server!r}: use one of {', '.join(POLICY_SERVERS)}")
        if self.device == "cpu" and self.policy_server == "vllm" and self.tensor_parallel != 1:
            raise VerlConfigError("vLLM on a CPU serves the policy from one process: use --tensor-parallel 1")
        if self.rollout_dtype not in (None, *ROLLOUT_DTYPES):
            raise VerlConfigError(f"rollout dtype {self.rollout_dtype!r}: use one of {', '.join(ROLLOUT_DTYPES)}")
        if self.policy_server == "embedded" and self.tensor_parallel != 1:
            raise VerlConfigError("the embedded policy server has no tensor parallelism: use --tensor-parallel 1")
        # With the adapter merged into the synced weights vLLM never loads a LoRA, so any rank works; unmerged,
        # verl rounds the rank up to vLLM's next --max-lora-rank, which stops at the largest.
        if (self.lora_rank and self.rollout_name == "vllm" and not self.lora_merge
                and self.lora_rank > max(VLLM_LORA_RANKS)):
            raise VerlConfigError(f"LoRA rank {self.lora_rank}: vLLM serves adapters of rank up to "
                                  f"{max(VLLM_LORA_RANKS)}")
        if self.lora_rank < 0:
            raise VerlConfigError(f"LoRA rank must be positive, got {self.lora_rank}")
        if not 0.05 <= self.gpu_memory_utilization <= 0.95:
            raise VerlConfigError(f"gpu_memory_utilization {self.gpu_memory_utilization} must be in [0.05, 0.95]")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rollout_name": self.rollout_name, "lora_merge": self.lora_merge,
                "vllm_dtype": self.vllm_dtype}


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
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    settings.check()
    base = defaults()
    OmegaConf.set_struct(base, True)
    # Free-form in verl: Hugging Face config overrides (agl sets the attention implementation there).
    OmegaConf.set_struct(base.actor_rollout_ref.model.override_config, False)
    # Free-form too: vLLM's own engine and server arguments (agl sets the tool-call parser there).
    OmegaConf.set_struct(base.actor_rollout_ref.rollout.engine_kwargs.vllm, False)
    # A field of verl's FSDPEngineConfig that its packaged YAML leaves out (None: bfloat16 parameters).
    for role in ("actor", "ref"):  # the reference of a KL penalty is built like the actor (ref.fsdp_config)
        with open_dict(base.actor_rollout_ref[role].fsdp_config):
            base.actor_rollout_ref[role].fsdp_config.mixed_precision = None
    # And one of its RolloutConfig (vLLM's --enable-sleep-mode; True there), which vLLM's CPU build does not have.
    with open_dict(base.actor_rollout_ref.rollout):
        base.actor_rollout_ref.rollout.enable_sleep_mode = True
    try:
        merged = OmegaConf.merge(base, OmegaConf.create(rendered))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or ""
        raise VerlConfigError(f"verl has no config key {key!r} (templates/verl/ppo_trainer.yaml.j2): "
                              f"{str(exc).splitlines()[0]}") from None
    _check_dataclasses(merged)
    return merged


def _check_dataclasses(cfg: Any) -> None:
    from rl_backend.trainer.verl_compat import verl

    register()
    from verl.utils.config import omega_conf_to_dataclass

    built: dict[str, Any] = {}
    # Not the model's config: building verl's HFModelConfig reads the model's own files (from the Hub for a repository
    # id), which a dry run on a laptop for a GPU cluster must not need.
    for where in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm.rollout_correction"):
        node = cfg
        for part in where.split("."):
            node = node[part]
        try:
            built[where] = omega_conf_to_dataclass(node) if "_target_" in node else node
        except Exception as exc:  # noqa: BLE001 - hydra wraps verl's own checks; their message is what to fix
            cause = exc.__cause__ or exc
            raise VerlConfigError(f"verl rejects `{where}`: {cause}") from None
    loss_mode = built["actor_rollout_ref.actor"].policy_loss.loss_mode
    if loss_mode not in verl().core_algos.POLICY_LOSS_REGISTRY:
        raise VerlConfigError(f"policy loss {loss_mode!r} is not in verl's registry")


def model_max_len(model_path: str) -> int | None:
    """The model's own context limit (max_position_embeddings, of its text model for a multimodal one), read from
    its config.json when the model is a local folder; None for a Hub id (nothing is downloaded to find out)."""
    import json

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for node in (config, config.get("text_config") or {}):
        value = node.get("max_position_embeddings") if isinstance(node, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def fit_lengths(prompt: int | None, response: int | None, limit: int | None) -> tuple[int, int]:
    """(prompt, response) lengths: the ones given kept as they are (`check` refuses them if they do not fit), the
    ones not given at their defaults, shrunk to what the model's context `limit` leaves (512 positions: 384 + 128)."""
    if limit is None:
        return (DEFAULT_PROMPT_LENGTH if prompt is None else prompt,
                DEFAULT_RESPONSE_LENGTH if response is None else response)
    if response is None:
        response = max(1, min(DEFAULT_RESPONSE_LENGTH, limit // 4 if prompt is None else limit - prompt))
    if prompt is None:
        prompt = max(1, min(DEFAULT_PROMPT_LENGTH, limit - response))
    return prompt, response


def model_path_for(model: str, base_dir: Path) -> str:
    """What verl (and vLLM) load: a local directory (relative to agl.yaml's folder), a known name's local copy (the
    same weights `agl eval` serves, converted once from the packaged GGUF; nothing is downloaded), or the name as
    given (a Hugging Face repository id, fetched into HF_HOME on the trainer)."""
    local = (base_dir / model).expanduser()
    if local.is_dir():
        return str(local.resolve())
    from rl_backend.serving.model_store import KNOWN_MODELS, resolve_model_dir

    if model in KNOWN_MODELS:
        return str(resolve_model_dir(model))
    return model
