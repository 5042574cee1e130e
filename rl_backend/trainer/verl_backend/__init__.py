"""The `verl` training backend: the same trajectories, advantages and rollout-normalized loss as the torch backend,
trained by verl's FSDP engine on GPUs, with the policy served by a vLLM OpenAI server the trainer starts.

- config.py    verl's trainer config rendered from agl.yaml + TrainOptions (templates/verl/), validated against
               verl's packaged defaults and config dataclasses on any machine (no GPU needed)
- data.py      training rows (rl_backend.trainer.batch) <-> `verl.DataProto` with the keys verl's actor reads
- loss.py      the `agl_rollout` policy loss, registered in verl's policy-loss registry
- runtime.py   what a GPU launch needs (CUDA, vLLM, Ray) and the message when it is missing
- policy.py    the vLLM OpenAI server the gateway forwards to (AGL_POLICY_URL), and pushing new weights to it
- driver.py    the GPU loop: rollouts through the gateway -> verl update -> weights to vLLM (needs CUDA; untested
               here for lack of a GPU)

Nothing here imports torch or verl at module level except data.py and loss.py, which the GPU path and the tests load.
"""
