"""From recorded model calls to policy updates (imports nothing heavy: each module loads torch/verl itself).

- trajectory.py   calls -> training sequences on exact token ids, with a report of merges, breaks and drops (no torch)
- advantage.py    GRPO advantage once per rollout (verl's core_algos)
- loss.py         PPO-clip policy loss with rollout / token-mean / seq-mean-token-mean normalization (verl's core_algos)
- batch.py        rows, mini-batches by rollout, micro-batches by token budget, padding
- torch_backend.py the embedded CPU/GPU trainer (full fine-tuning or LoRA); checkpoint.py its checkpoints
- interfaces.py   what the loops ask of their caller: a PolicyTrainer, a WeightSink, a rollout source (BatchRollouts,
                  or RolloutSource and Gate for the collocated-async loop); agl_cli fills them in
- loop.py         the synchronous loop (rollouts -> update -> new weights served -> curves); curves.py the store table
- async_loop.py   the collocated-async loop (rollouts keep running while the policy trains)
- toy.py          a toy two-call task on a tiny random Llama, for tests and bench/train
"""
