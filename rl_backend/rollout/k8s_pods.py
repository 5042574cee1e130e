"""Noticing a rollout pod that cannot start, while its Job still counts as running.

A Job whose pod waits on an image that does not exist, on a Secret that is missing, or on a node that no pool
offers stays active until its deadline, and the Job controller says nothing about why. So while rollouts wait, one
list of the run's pods (by the run's label: one request for the whole run) every `interval_s` looks at each pod's
waiting reasons and scheduling condition (k8s_status.start_problem). A definite problem (ImagePullBackOff,
CreateContainerConfigError, ...) is reported at once; one the cluster may still resolve once it has lasted its
grace: `grace_s` for ErrImagePull, `unschedulable_s` for Unschedulable (an autoscaler adding a node takes minutes).
The controller then ends the rollout with that reason and message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from rl_backend.rollout.k8s_client import KubeApi
from rl_backend.rollout.k8s_status import StartProblem, job_name_of, start_problem
from rl_backend.rollout.k8s_watch import labels_match

log = logging.getLogger(__name__)


class PodInspector:
    """`watched()` names the Jobs whose rollouts are waiting; `on_stuck(job, pod, problem)` is told about each
    stuck pod once."""

    def __init__(self, api: KubeApi, selector: Mapping[str, str], *, interval_s: float, grace_s: float,
                 watched: Callable[[], set[str]], on_stuck: Callable[[str, str, StartProblem], None],
                 unschedulable_s: float | None = None) -> None:
        self.api, self.selector = api, dict(selector)
        self.interval_s, self.grace_s = interval_s, grace_s
        self.unschedulable_s = grace_s if unschedulable_s is None else unschedulable_s
        self.watched, self.on_stuck = watched, on_stuck
        self._since: dict[tuple[str, str], float] = {}  # (pod, reason) -> when first seen
        self._reported: set[str] = set()
        self.checks = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="agl-k8s-pods")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not self.watched():
                continue
            try:
                await self.check()
            except Exception as exc:  # noqa: BLE001 - a failed look is retried at the next tick
                log.debug("pod check failed: %s", exc)

    async def check(self) -> None:
        text = ",".join(f"{k}={v}" for k, v in self.selector.items())
        body = await self.api.json(self.api.core.list_namespaced_pod, self.api.namespace, label_selector=text)
        self.checks += 1
        watched, now, seen = self.watched(), time.monotonic(), set()
        for pod in body.get("items") or []:
            job, name = job_name_of(pod), (pod.get("metadata") or {}).get("name", "")
            if job not in watched or name in self._reported or not labels_match(pod, self.selector):
                continue
            problem = start_problem(pod)
            if problem is None:
                continue
            key = (name, problem.reason)
            seen.add(key)
            first = self._since.setdefault(key, now)
            grace = self.unschedulable_s if problem.reason == "Unschedulable" else self.grace_s
            if problem.definite or now - first >= grace:
                self._reported.add(name)
                self.on_stuck(str(job), name, problem)
        self._since = {k: v for k, v in self._since.items() if k in seen}


def stuck_reason(pod: str, problem: StartProblem) -> str:
    message = f": {problem.message}" if problem.message else ""
    return f"pod {pod} could not start: {problem.reason}{message}"

