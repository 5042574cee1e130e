"""A toy agent task that exercises the whole training path on a tiny random model in seconds.

The "agent" makes two calls per rollout. Call 1 sees [BOS, p] and should answer first[p]; the harness appends a
tool-result token TOOL, and call 2 should answer second[p]. Half the time the harness "summarizes" its context
before call 2 (prompt [BOS, p, TOOL], dropping the first answer), so that call's prompt does not extend call 1 and
the rollout is split into two sequences, as real harnesses do. Reward: 0.5 per right answer.

Calls are sampled by `sample()`, which records what the embedded engine records (prompt and completion token ids,
raw temperature-1 logprobs, model version) as CallRecords, so the toy goes through the same trajectory, advantage
and loss code as real rollouts.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_backend.store.db import RunStore
from rl_backend.store.records import Api, CallRecord, RewardSource, Rollout, RolloutStatus

BOS, TOOL = 0, 1


def tiny_llama(vocab_size: int = 12, hidden: int = 64, layers: int = 2, seed: int = 0) -> Any:
    """A randomly initialised Llama small enough to train on a laptop CPU in seconds."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=True,
        bos_token_id=BOS, eos_token_id=None, pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


@torch.no_grad()
def sample_next(model: Any, prompts: list[list[int]], generator: torch.Generator) -> list[tuple[int, float]]:
    """One token for each prompt at temperature 1, with log_softmax of the raw logits (what the engine reports).

    Prompts of equal length share one forward pass.
    """
    was_training = model.training
    model.eval()
    out: list[tuple[int, float]] = [(0, 0.0)] * len(prompts)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    for rows in by_length.values():
        ids = torch.tensor([prompts[i] for i in rows], device=model.device)
        lp = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), dim=-1).cpu()
        tokens = torch.multinomial(lp.exp(), 1, generator=generator)[:, 0]
        for j, i in enumerate(rows):
            out[i] = (int(tokens[j]), float(lp[j, tokens[j]]))
    model.train(was_training)
    return out


@dataclass
class ToyTask:
    """Prompt token p with its two right answers."""

    prompt_token: int
    first: int
    second: int

    @property
    def id(self) -> str:
        return f"p{self.prompt_token}"


def make_tasks(n: int = 2, vocab_size: int = 12, seed: int = 0) -> list[ToyTask]:
    # Every answer belongs to one task only: an answer rewarded on several tasks lets a tiny model collapse onto it
    # everywhere, and a group with no right answer left has no signal to get out again.
    if vocab_size < 3 * n + 2:
        raise ValueError(f"{n} tasks need a vocabulary of at least {3 * n + 2} tokens")
    answers = random.Random(seed).sample(range(2 + n, vocab_size), 2 * n)
    return [ToyTask(2 + i, answers[2 * i], answers[2 * i + 1]) for i in range(n)]


@dataclass
class ToyBatch:
    rollouts: list[Rollout] = field(default_factory=list)
    calls: dict[str, list[CallRecord]] = field(default_factory=dict)

    @property
    def mean_reward(self) -> float:
        rewards = [r.reward for r in self.rollouts if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else 0.0


def run_rollouts(
    model: Any, tasks: list[ToyTask], group_size: int, *, step: int, version: str, seed: int = 0,
    summarize_prob: float = 0.5, id_prefix: str = "",
) -> ToyBatch:
    """group_size rollouts of each task with the current weights, recorded as the gateway would record them."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    rng = random.Random(seed * 7919 + step)
    batch = ToyBatch()
    plan = [(task, k) for task in tasks for k in range(group_size)]
    prompts1 = [[BOS, task.prompt_token] for task, _ in plan]
    first = sample_next(model, prompts1, gen)
    prompts2 = []
    for (task, _), p1, (a, _) in zip(plan, prompts1, first, strict=True):
        if rng.random() < summarize_prob:
            prompts2.append([BOS, task.prompt_token, TOOL])  # context summarized: the first answer is gone
        else:
            prompts2.append(p1 + [a, TOOL])
    second = sample_next(model, prompts2, gen)
    clock = 1000.0 * step
    for i, (task, k) in enumerate(plan):
        rid = f"{id_prefix}s{step}-{task.id}-{k}"
        (a, lp_a), (b, lp_b) = first[i], second[i]
        batch.calls[rid] = [
            call_record(rid, 0, prompts1[i], [a], [lp_a], version, clock + 2 * i),
            call_record(rid, 1, prompts2[i], [b], [lp_b], version, clock + 2 * i + 1),
        ]
        reward = 0.5 * (a == task.first) + 0.5 * (b == task.second)
        batch.rollouts.append(Rollout(
            id=rid, key=f"toy/{task.id}/{k}", variant="toy", task_id=task.id, seed=k, status=RolloutStatus.succeeded,
            reward=reward, reward_source=RewardSource.grader,
        ))
    return batch


def stored_batches(store: RunStore, trainer: Any, tasks: list[ToyTask], group_size: int) -> Callable[[int], list[str]]:
    """A sync loop's `run_batch` on the toy task: each batch sampled from the trainer's current weights and put in
    the store, as an agent's rollouts through the gateway would be."""

    def run_batch(iteration: int) -> list[str]:
        toy = run_rollouts(trainer.model, tasks, group_size, step=iteration, version=f"step-{trainer.step}")
        for rollout in toy.rollouts:
            store.put_rollout(rollout)
            store.insert_calls(toy.calls[rollout.id])
        return [r.id for r in toy.rollouts]

    return run_batch


def call_record(rid: str, n: int, prompt: list[int], completion: list[int], logprobs: list[float], version: str,
                at: float) -> CallRecord:
    return CallRecord(
        call_id=f"{rid}-{n}", rollout_id=rid, api=Api.openai_completions, upstream="toy", model="tiny-llama",
        started_at=at, ended_at=at + 0.5, prompt_token_ids=prompt, completion_token_ids=completion, logprobs=logprobs,
        model_version=version, input_tokens=len(prompt), output_tokens=len(completion),
    )
