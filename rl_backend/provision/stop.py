"""`agl train stop`: delete a train so that nothing of it is left, rollout Jobs its trainer starts while dying too.

Deleting the trainer (its Job or RayJob) does not stop it at once: its pods get SIGTERM and keep running for their
grace period (terminationGracePeriodSeconds, 30 s by default), and a trainer mid-batch may create rollout Jobs in
that time, after a one-pass delete has listed the train's Jobs. Those would run to their deadline and stay. So the
trainer goes first, with its pods, and the rollout Jobs are swept again until the trainer's last pod is gone (the
trainer also deletes its own on SIGTERM: rl_backend/rollout/kubernetes.py's `close()`); then everything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rl_backend.provision.apply import delete_train
from rl_backend.provision.options import LABEL_COMPONENT, Names
from rl_backend.provision.resources import Resources

TRAINER_COMPONENTS = ("trainer", "trainer-worker", "trainer-driver")  # plan.pod_labels: every pod that runs agl
DEFAULT_GRACE_S = 30.0  # Kubernetes' terminationGracePeriodSeconds when a pod does not set one
SLACK_S = 15.0  # past the grace period: the kubelet's SIGKILL and its report to the API server


def _trainer_pods(res: Resources, names: Names) -> list[dict[str, Any]]:
    return [p for p in res.objects("Pod", names.selector())
            if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_COMPONENT) in TRAINER_COMPONENTS]


def _grace_s(pod: dict[str, Any]) -> float:
    value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return float(value) if isinstance(value, (int, float)) else DEFAULT_GRACE_S


def _sweep_jobs(res: Resources, names: Names, deleted: list[str], log: Callable[[str], None]) -> None:
    for obj in res.objects("Job", names.selector()):
        name = obj["metadata"]["name"]
        if not obj["metadata"].get("deletionTimestamp") and res.delete("Job", name):
            deleted.append(f"Job/{name}")
            log(f"deleted Job/{name}")


def stop_train(res: Resources, names: Names, *, keep_volumes: bool = False, log: Callable[[str], None] = lambda _: None,
               poll_s: float = 1.0, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Delete every object of the train; return `Kind/name` of each deleted, the trainer's first."""
    from kubernetes.client.exceptions import ApiException

    deleted: list[str] = []
    for kind in ("RayJob", "Job"):  # the trainer, and the rollout Jobs it made so far (they carry its label)
        for obj in res.objects(kind, names.selector()):
            name = obj["metadata"]["name"]
            if not obj["metadata"].get("deletionTimestamp") and res.delete(kind, name):
                deleted.append(f"{kind}/{name}")
                log(f"deleted {kind}/{name}")
    try:
        pods = _trainer_pods(res, names)
        for pod in pods:  # the Job's garbage collector would too, but not before this wait would begin
            res.delete("Pod", pod["metadata"]["name"])
    except ApiException as exc:
        if exc.status not in (401, 403):
            raise
        log("cannot list or delete the trainer's pods (no permission): rollout Jobs it starts while it shuts down "
            "may stay; run `agl train stop` again in a minute")
        pods = []
    if pods:
        limit = max(_grace_s(p) for p in pods) + SLACK_S
        deadline = time.monotonic() + limit
        log(f"waiting for the trainer's pods to end (up to {limit:g} s): a trainer shutting down may still start "
            "rollout Jobs")
        while True:
            _sweep_jobs(res, names, deleted, log)
            if not _trainer_pods(res, names):
                break
            if time.monotonic() > deadline:
                log(f"the trainer's pods were still there after {limit:g} s; run `agl train stop` again once they "
                    "are gone to delete any rollout Job they started")
                break
            sleep(poll_s)
        _sweep_jobs(res, names, deleted, log)  # one created as the last pod went
    deleted += delete_train(res, names, keep_volumes=keep_volumes, log=log)
    return deleted
