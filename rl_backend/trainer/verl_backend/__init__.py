"""The `verl` training backend: verl's own trainer (Ray workers, FSDP engine, rollout servers, weight sync,
checkpoints) making the updates, on the same trajectories, advantages and rollout-normalized loss as the torch backend.

- config.py          VerlSettings (what of agl's options reaches verl) and the check of the rendered config
                     (templates/verl/) against verl's packaged defaults and config dataclasses, on any machine
- trainer.py         AglPPOTrainer (verl's RayPPOTrainer, fed agl's rollouts) and the VerlTrainer / VerlWeightSink
                     adapters agl's TrainingLoop drives
- data.py            training rows (rl_backend.trainer.batch) <-> `verl.DataProto`
- loss.py            the `agl_rollout` policy loss, registered in verl's policy-loss registry
- embedded_policy.py agl's embedded engine as a verl rollout backend (`agl_embedded`): the policy server on a CPU
- vllm_cpu.py        verl's own vLLM replica on vLLM's CPU build (`--device cpu --policy-server vllm`)
- vllm_tools.py      which vLLM tool-call parser reads the trained model's tool calls
- cpu.py             a `cpu` platform for verl's platform registry, and verl's FSDP engine registered for it
- plugins.py         what every verl process registers (the Ray workers' setup hook)
- listen.py          where the rollout servers listen (loopback under a Ray of the trainer's own)
- worker.py          verl's ActorRolloutRefWorker, joining a gloo process group first on the CPU
- export.py          the trained model (and LoRA adapter) out of verl's checkpoint
- runtime.py         what a launch needs (verl, Ray, vLLM, CUDA for GPUs) and the message when it is missing

Nothing here imports torch or verl at module level except data.py, worker.py and the modules they are loaded from.
"""
