"""Reading Job and Pod objects (as the API's JSON): is the Job over and how, which pod ran it, its exit code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Outcome:
    kind: Literal["succeeded", "failed", "deadline"]
    detail: str = ""


def job_outcome(job: Mapping[str, Any]) -> Outcome | None:
    """The Job's final outcome, or None while it runs. The Complete and Failed conditions are authoritative
    (the Job controller sets them once the pods are gone); the counters are a fallback for servers that set no
    conditions. With backoffLimit 0 one failed pod fails the Job."""
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return Outcome("succeeded")
        if condition.get("type") == "Failed":
            reason = condition.get("reason") or "Failed"
            detail = f"{reason}: {condition.get('message') or ''}".rstrip(": ")
            return Outcome("deadline" if reason == "DeadlineExceeded" else "failed", detail)
    if status.get("active"):
        return None
    if (status.get("succeeded") or 0) >= 1:
        return Outcome("succeeded")
    if (status.get("failed") or 0) >= 1:
        return Outcome("failed", "its pod failed")
    return None


def _job_name_of(pod: Mapping[str, Any]) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")


def newest_pod(pods: list[dict[str, Any]], job_name: str) -> dict[str, Any] | None:
    """The Job's most recent pod (with backoffLimit 0 normally its only one). Checked by label here too: a
    server may ignore the label selector."""
    mine = [p for p in pods if _job_name_of(p) == job_name]
    mine.sort(key=lambda p: ((p.get("metadata") or {}).get("creationTimestamp") or "", p["metadata"]["name"]))
    return mine[-1] if mine else None


def container_exit_code(pod: Mapping[str, Any], container: str) -> int | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") != container:
            continue
        for key in ("state", "lastState"):
            terminated = (status.get(key) or {}).get("terminated")
            if terminated and terminated.get("exitCode") is not None:
                return int(terminated["exitCode"])
    return None


# A pod in one of these will not start without a change by the user: its rollout fails at once.
CANNOT_START = {"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                "CreateContainerError"}
# These the cluster may still resolve (a registry blip, an autoscaler adding a node): failed once they last.
MAY_NOT_START = {"ErrImagePull", "Unschedulable"}


@dataclass(frozen=True)
class StartProblem:
    reason: str
    message: str
    definite: bool  # True: fail now; False: fail once it has lasted `unstartable_after_s`


def start_problem(pod: Mapping[str, Any]) -> StartProblem | None:
    """Why a pod is not starting, if it is stuck: a container waiting on an image or on its config, or no node to
    schedule it on."""
    status = pod.get("status") or {}
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in CANNOT_START or reason in MAY_NOT_START:
            return StartProblem(str(reason), str(waiting.get("message") or ""), reason in CANNOT_START)
    for condition in status.get("conditions") or []:
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            return StartProblem("Unschedulable", str(condition.get("message") or ""), False)
    return None


def job_name_of(pod: Mapping[str, Any]) -> str | None:
    return _job_name_of(pod)
