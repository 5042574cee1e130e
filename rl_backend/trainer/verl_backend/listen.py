"""Where the rollout servers verl starts for agl (the embedded engine's, vLLM's) listen: on loopback when the trainer
started a Ray of its own (only this machine's gateway calls them; Ray itself refuses a loopback node address), else
on the node's address, which the gateway of a cluster reaches."""

from __future__ import annotations

import os

# Set in the Ray job's environment by the trainer (trainer.py) when its Ray is its own.
POLICY_HOST_ENV = "AGL_POLICY_HOST"


def policy_host() -> str:
    """The address a rollout server started in this Ray worker listens on."""
    import ray

    return os.environ.get(POLICY_HOST_ENV) or ray.util.get_node_ip_address().strip("[]")
