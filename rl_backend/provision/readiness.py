"""Is the train up, and if not, why: pure checks on the API's JSON for the gateway Deployment, its Service's
endpoints, and the trainer (a Job's pod, or a RayJob's head and workers).

A check is ready, waiting (with what it waits on), or failed. Failed means waiting longer will not help without a
change by the user: an image that cannot be pulled, a container that keeps crashing, a Secret or key that does not
exist, a Deployment past its progress deadline, a trainer that ended in failure. Unschedulable is only waiting (a
cluster autoscaler may be adding a GPU node) until the overall timeout, unless the autoscaler says it will not help.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_backend.provision.plan import TRAINER_RUNS
from rl_backend.rollout.k8s_status import job_outcome

# Waiting reasons that persist until the user changes something.
FATAL_WAITING = {"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CrashLoopBackOff",
                 "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
WITH_LOGS = {"CrashLoopBackOff", "RunContainerError", "Error"}
# A RayJob's jobDeploymentStatus once KubeRay is done with it; every other one (New, Initializing, Running, Waiting,
# Retrying, Suspending, Suspended) may still change.
FINAL_DEPLOYMENT = {"Complete", "Failed", "ValidationFailed"}


@dataclass
class PodProblem:
    pod: str
    reason: str
    message: str
    fatal: bool
    container: str | None = None

    def text(self) -> str:
        message = f": {self.message}" if self.message else ""
        where = f" (container {self.container})" if self.container else ""
        return f"pod {self.pod}{where}: {self.reason}{message}"


@dataclass
class Check:
    key: str
    label: str
    ready: bool = False
    detail: str = ""
    failure: str | None = None
    problems: list[PodProblem] = field(default_factory=list)
    objects: set[str] = field(default_factory=set)  # names whose events explain this check

    def state(self) -> str:
        return "failed" if self.failure else "ready" if self.ready else "waiting"


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("metadata") or {})


def _conditions(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []}


def pod_problem(pod: Mapping[str, Any]) -> PodProblem | None:
    """The most telling thing wrong with a pod, or None."""
    name = _meta(pod).get("name", "?")
    status = pod.get("status") or {}
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for cs in containers:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in FATAL_WAITING:
            return PodProblem(name, reason, waiting.get("message") or "", True, cs.get("name"))
    if status.get("phase") == "Failed":
        for cs in containers:
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if terminated and terminated.get("exitCode") not in (None, 0):
                message = terminated.get("message") or f"exit code {terminated.get('exitCode')}"
                return PodProblem(name, terminated.get("reason") or "Error", message, True, cs.get("name"))
        return PodProblem(name, status.get("reason") or "Failed", status.get("message") or "", True)
    scheduled = _conditions(pod).get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return PodProblem(name, "Unschedulable", scheduled.get("message") or "", False)
    for cs in containers:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "ErrImagePull":  # retried by the kubelet; ImagePullBackOff follows if it persists
            return PodProblem(name, "ErrImagePull", waiting.get("message") or "", False, cs.get("name"))
    return None


def _pods_part(check: Check, pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        check.objects.add(_meta(pod).get("name", ""))
        problem = pod_problem(pod)
        if problem is None:
            continue
        check.problems.append(problem)
        if problem.fatal and check.failure is None:
            check.failure = problem.text()
    waiting = [p.text() for p in check.problems if not p.fatal]
    if waiting and not check.failure:
        check.detail = f"{check.detail}; {waiting[0]}" if check.detail else waiting[0]


def deployment_check(deployment: Mapping[str, Any] | None, pods: list[dict[str, Any]], name: str) -> Check:
    check = Check("gateway", f"gateway Deployment {name}", objects={name})
    if deployment is None:
        check.failure = f"Deployment {name} does not exist (deleted meanwhile?)"
        return check
    wanted = int((deployment.get("spec") or {}).get("replicas", 1))
    status = deployment.get("status") or {}
    available = int(status.get("availableReplicas") or 0)
    conditions = _conditions(deployment)
    check.detail = f"{available}/{wanted} available"
    if (conditions.get("Available") or {}).get("status") == "True" and available >= wanted:
        check.ready = True
        return check
    progressing = conditions.get("Progressing") or {}
    if progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded":
        check.failure = f"Deployment {name}: ProgressDeadlineExceeded: {progressing.get('message') or ''}".rstrip(": ")
    replica_failure = conditions.get("ReplicaFailure") or {}
    if replica_failure.get("status") == "True":
        check.failure = f"Deployment {name}: {replica_failure.get('reason') or 'ReplicaFailure'}: " \
                        f"{replica_failure.get('message') or ''}".rstrip(": ")
    _pods_part(check, pods)
    return check


def endpoints_check(service: str, slices: list[dict[str, Any]]) -> Check:
    """Ready once the Service has a ready endpoint (a gateway pod passing its readiness probe)."""
    check = Check("endpoints", f"Service {service} endpoints", objects={service})
    ready = 0
    for endpoint_slice in slices:
        for endpoint in endpoint_slice.get("endpoints") or []:
            if endpoint.get("addresses") and (endpoint.get("conditions") or {}).get("ready") is not False:
                ready += 1
    check.ready = ready > 0
    check.detail = f"{ready} ready endpoint{'s' if ready != 1 else ''}"
    return check


def trainer_finished(trainer: Mapping[str, Any]) -> tuple[str, str] | None:
    """('succeeded' | 'failed', detail) once the trainer Job or RayJob is over, else None."""
    if trainer.get("kind") == "RayJob":
        # Only the operator's verdict is final: KubeRay 1.7 reports a failed attempt as jobStatus FAILED while
        # jobDeploymentStatus goes Retrying (a new cluster, resuming from the checkpoints) until backoffLimit.
        status = trainer.get("status") or {}
        job_status = str(status.get("jobStatus") or "").upper()
        deployment = str(status.get("jobDeploymentStatus") or "")
        message = status.get("message") or status.get("reason") or ""
        if deployment not in FINAL_DEPLOYMENT:
            return None
        if job_status == "SUCCEEDED" or (deployment == "Complete" and job_status not in ("FAILED", "STOPPED")):
            return "succeeded", message
        return "failed", f"{job_status or deployment}: {message}".rstrip(": ")
    outcome = job_outcome(trainer)
    if outcome is None:
        return None
    return ("succeeded", "") if outcome.kind == "succeeded" else ("failed", outcome.detail)


def _running(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def trainer_check(trainer: Mapping[str, Any] | None, pods: list[dict[str, Any]], *, name: str, kind: str,
                  nodes: int) -> Check:
    """`pods`: the train's trainer pods (component trainer / trainer-worker), newest last."""
    check = Check("trainer", f"trainer {kind} {name}", objects={name})
    if trainer is None:
        check.failure = f"{kind} {name} does not exist (deleted meanwhile?)"
        return check
    finished = trainer_finished(trainer)
    if finished is not None and finished[0] == "failed":
        check.failure = f"{kind} {name} failed: {finished[1]}".rstrip(": ")
    elif finished is not None:
        check.ready, check.detail = True, "finished"
        return check
    if kind == "RayJob":
        heads = [p for p in pods if _meta(p).get("labels", {}).get("agl.dev/ray-node") == "head"]
        workers = [p for p in pods if _meta(p).get("labels", {}).get("agl.dev/ray-node") == "worker"]
        current = [*heads[-1:], *workers[-nodes:]] if nodes else heads[-1:]
        up = sum(1 for p in workers if _running(p))
        head = "head Running" if any(_running(p) for p in heads) else "head not running"
        status = trainer.get("status") or {}
        state = status.get("jobDeploymentStatus") or "no status yet"
        check.detail = f"{head}, {up}/{nodes} workers Running, RayJob {state}"
        failed = int(status.get("failed") or 0)
        if failed and finished is None:
            attempts = int((trainer.get("spec") or {}).get("backoffLimit", TRAINER_RUNS - 1)) + 1
            check.detail += (f"; attempt {failed} of {attempts} failed"
                             + (", KubeRay is retrying on a new cluster" if state == "Retrying" else ""))
        running = any(_running(p) for p in heads) and up >= nodes
    else:
        current = pods[-1:]  # the Job's newest pod: older ones are restarts already replaced
        phase = (current[0].get("status") or {}).get("phase", "Pending") if current else "no pod yet"
        check.detail = f"pod {_meta(current[0]).get('name')} {phase}" if current else "no pod yet"
        running = bool(current) and _running(current[0])
    # A pod in CrashLoopBackOff is phase Running between restarts: its containers, not its phase, tell.
    _pods_part(check, current)
    check.ready = check.failure is None and running
    return check
