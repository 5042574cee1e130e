"""Where the rollout servers verl starts for agl (the embedded engine's, vLLM's) listen: on loopback when the trainer
started a Ray of its own (only this machine's gateway calls them; Ray itself refuses a loopback node address), else
on the node's address, which the gateway of a cluster reaches. A trainer Job's pod (its own Ray, the gateway in
another pod) says its own address in $AGL_POLICY_HOST (the downward API's status.podIP): that one is kept."""

from __future__ import annotations

import os
from collections.abc import Mapping

# Set in the Ray job's environment by the trainer (trainer.py) when its Ray is its own.
POLICY_HOST_ENV = "AGL_POLICY_HOST"


def policy_host() -> str:
    """The address a rollout server started in this Ray worker listens on."""
    import ray

    return os.environ.get(POLICY_HOST_ENV) or ray.util.get_node_ip_address().strip("[]")


def own_ray_policy_host(environ: Mapping[str, str]) -> str:
    """For a Ray of the trainer's own: the address its rollout servers listen on. $AGL_POLICY_HOST when the pod sets
    it (the gateway is another pod's), else loopback."""
    return environ.get(POLICY_HOST_ENV, "").strip() or "127.0.0.1"
