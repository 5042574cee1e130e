"""The training flags `agl train --on kubernetes` passes through to the trainer it deploys.

The cluster trainer runs `agl train CONFIG --backend verl --resume` plus the flags the user set here (and only
those: an unset flag keeps the trainer's own default). They are checked before anything is rendered, so a value the
trainer would refuse minutes later, on a GPU, is refused now with the allowed values (exit 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

LOOPS = ("sync",)  # the verl trainer collects a batch, updates, syncs the weights (collocated-async is the torch one's)
LOSS_AGGS = ("rollout", "token-mean", "seq-mean-token-mean")
ROLLOUT_DTYPES = ("bfloat16", "float16", "float32")


class TrainerArgsError(ValueError):
    """A flag value the trainer would refuse."""


@dataclass
class TrainerArgs:
    """None: not given, the trainer's default applies."""

    steps: int | None = None
    tasks_per_step: int | None = None
    group_size: int | None = None
    lr: float | None = None
    temperature: float | None = None
    lora: bool | None = None
    lora_rank: int | None = None
    loss_agg: str | None = None
    kl_coef: float | None = None
    loop: str | None = None
    heldout_limit: int | None = None
    heldout_split: str | None = None
    train_split: str | None = None
    # The policy servers' prompt and answer lengths (the trainer checks their sum against the model's own context
    # when it loads the model; the trained upstream's agl.yaml keys apply where these are unset).
    max_prompt_length: int | None = None
    max_response_length: int | None = None
    # vLLM's tool-call parser for agents that send `tools`, and the dtype vLLM computes in.
    tool_call_parser: str | None = None
    rollout_dtype: str | None = None

    def check(self) -> None:
        for flag, value in (("--steps", self.steps), ("--tasks-per-step", self.tasks_per_step),
                            ("--heldout-limit", self.heldout_limit), ("--max-prompt-length", self.max_prompt_length),
                            ("--max-response-length", self.max_response_length)):
            if value is not None and value < 1:
                raise TrainerArgsError(f"{flag} must be at least 1, got {value}")
        if self.group_size is not None and self.group_size < 2:
            raise TrainerArgsError("--group-size must be at least 2: a group of one rollout has no advantage to "
                                   "learn from")
        for flag, number in (("--lr", self.lr), ("--temperature", self.temperature), ("--kl-coef", self.kl_coef)):
            if number is not None and not (math.isfinite(number) and number >= 0):
                raise TrainerArgsError(f"{flag} must be a non-negative number, got {number}")
        if self.temperature is not None and self.temperature != 1.0:
            # The cluster trainer is verl's, which refuses this at start-up, on a GPU, minutes from now.
            raise TrainerArgsError(f"--temperature {self.temperature:g}: the cluster's verl trainer records the "
                                   "policy's raw (temperature 1) logprobs and recomputes them at temperature 1, so its "
                                   "loss cannot account for tokens sampled at another temperature; use --temperature 1 "
                                   "(the default)")
        if self.rollout_dtype is not None and self.rollout_dtype not in ROLLOUT_DTYPES:
            raise TrainerArgsError(f"--rollout-dtype {self.rollout_dtype!r}: use {', '.join(ROLLOUT_DTYPES)}")
        if self.tool_call_parser is not None and not self.tool_call_parser.strip():
            raise TrainerArgsError("--tool-call-parser must name a parser (hermes, llama3_json, mistral, ...; none: "
                                   "no tool calls)")
        if self.lr is not None and self.lr == 0:
            raise TrainerArgsError("--lr must be above 0")
        if self.lora_rank is not None:
            # The trainer merges the adapter into the weights vLLM serves: any positive rank works.
            if self.lora_rank < 1:
                raise TrainerArgsError(f"--lora-rank {self.lora_rank}: a LoRA rank is at least 1")
            if self.lora is False:
                raise TrainerArgsError("--lora-rank needs --lora (with --no-lora the trainer updates all weights)")
        if self.loss_agg is not None and self.loss_agg not in LOSS_AGGS:
            raise TrainerArgsError(f"--loss-agg {self.loss_agg!r}: use {', '.join(LOSS_AGGS)}")
        if self.loop is not None and self.loop not in LOOPS:
            raise TrainerArgsError(f"--loop {self.loop!r}: the cluster's verl trainer trains with the sync loop "
                                   "(collect a batch, update, sync the weights)")
        if self.kl_coef and self.loss_agg in (None, "rollout"):
            raise TrainerArgsError("--kl-coef > 0 needs --loss-agg token-mean or seq-mean-token-mean: under the "
                                   "rollout normalization the verl trainer's KL term would outweigh the policy loss")
        for flag, split in (("--heldout-split", self.heldout_split), ("--train-split", self.train_split)):
            if split is not None and not split.strip():
                raise TrainerArgsError(f"{flag} must name a split")

    def argv(self) -> list[str]:
        """The flags, in a fixed order, for the trainer's command line."""
        args: list[str] = []
        for item in fields(self):
            value = getattr(self, item.name)
            flag = "--" + item.name.replace("_", "-")
            if value is None:
                continue
            if isinstance(value, bool):
                args.append(flag if value else f"--no-{item.name.replace('_', '-')}")
            else:
                args += [flag, repr(value) if isinstance(value, float) else str(value)]
        return args
