"""Train the toy task (rl_backend/trainer/toy.py) end to end and print one line of metrics per step.

Run:  /work/venv/bin/python bench/train/toy_train.py [--steps 40] [--group 16] [--lr 5e-3] [--loss-agg rollout]
      [--lora] [--kl 0.01] [--threads 2]  (see --help for the rest)
Prints the step at which the batch's mean reward first reaches --target (default 0.9) and the time it took.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--loss-agg", default="rollout", choices=["rollout", "token-mean", "seq-mean-token-mean"])
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--kl", type=float, default=0.0)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--entropy", type=float, default=0.0)
    parser.add_argument("--summarize", type=float, default=0.5, help="chance the harness cuts the context")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from rl_backend.trainer.advantage import grpo_advantages
    from rl_backend.trainer.batch import make_batch
    from rl_backend.trainer.loss import LossConfig
    from rl_backend.trainer.torch_backend import LoraSettings, TorchTrainer, TrainerConfig
    from rl_backend.trainer.toy import make_tasks, run_rollouts, tiny_llama
    from rl_backend.trainer.trajectory import build_trajectories

    config = TrainerConfig(
        lr=args.lr, loss=LossConfig(loss_agg=args.loss_agg, kl_coef=args.kl, entropy_coef=args.entropy),  # type: ignore[arg-type]
        lora=LoraSettings(r=8, alpha=16) if args.lora else None, seed=args.seed,
    )
    trainer = TorchTrainer(tiny_llama(args.vocab, args.hidden, seed=args.seed), config)
    tasks = make_tasks(args.tasks, args.vocab, seed=args.seed)
    started = time.perf_counter()
    reached = None
    for step in range(args.steps):
        batch = run_rollouts(trainer.model, tasks, args.group, step=step, version=f"step-{trainer.step}",
                             seed=args.seed, summarize_prob=args.summarize)
        trajs, report = build_trajectories(batch.rollouts, batch.calls)
        adv = grpo_advantages(trajs)
        metrics = trainer.train_step(make_batch(trajs, adv.advantages))
        line = {"step": step, "reward": round(batch.mean_reward, 3), "seq/rollout": report.summary()[
            "sequences_per_rollout"]["mean"], **{k: round(metrics[k], 4) for k in ("loss", "entropy", "grad_norm")},
            "elapsed_s": round(time.perf_counter() - started, 2)}
        print(json.dumps(line), file=sys.stderr)
        if reached is None and batch.mean_reward >= args.target:
            reached = step
            break
    print(json.dumps({"reached_target_at_step": reached, "seconds": round(time.perf_counter() - started, 2)}))
    return 0 if reached is not None else 1


if __name__ == "__main__":
    sys.exit(main())
