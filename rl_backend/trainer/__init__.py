"""From recorded model calls to policy updates (imports nothing heavy: each module loads torch/verl itself).

- trajectory.py   calls -> training sequences on exact token ids, with a report of merges, breaks and drops (no torch)
- advantage.py    GRPO advantage once per rollout (verl's core_algos)
- loss.py         PPO-clip policy loss with rollout / token-mean / seq-mean-token-mean normalization (verl's core_algos)
- batch.py        rows, mini-batches by rollout, micro-batches by token budget, padding
- torch_backend.py the embedded CPU/GPU trainer (full fine-tuning or LoRA); checkpoint.py its checkpoints
- loop.py         the synchronous loop (rollouts -> update -> new weights served -> curves); curves.py the store table
- toy.py          a toy two-call task on a tiny random Llama, for tests and bench/train
"""
