"""Kubernetes rollout controller: each rollout is one Job, watched to its end, its results read from the pod log.

`run(job)` renders the Job (templates/k8s/job.yaml.j2 or the user's own), validates it offline, waits for a token
of the creation rate limit, and creates it under a name derived from (run, rollout): a repeated create gets 409
and adopts the existing Job. One shared list+watch (k8s_watch.JobWatcher) reports the Job's states; the rollout
ends on the Job's Complete or Failed condition, on its disappearance, or — if the cluster never ends it —
`deadline_grace_s` after its activeDeadlineSeconds, when agl deletes it itself. Then the pod's exit code and log
are read (k8s_results): the wrapper script prints the output file at the end of the log (k8s_output), and agl
writes it to the local AGL_OUTPUT_FILE, where the grader finds it as with local processes.

Mapping to ProcessResult: Complete → exit 0; Failed/DeadlineExceeded → timed_out; other Failed → the container's
exit code (else the wrapper's, else None with the reason as the last stderr line); vanished → None and a reason;
a pod that cannot start (k8s_pods: ImagePullBackOff, CreateContainerConfigError, Unschedulable, ...) → None, with
the waiting reason and its message, within seconds rather than at the deadline.
Cancelling `run` returns at once and deletes its Job in the background; `close()` finishes those deletes and
deletes every Job (and the NetworkPolicy) carrying the run's label.

The API server is not trusted to answer: every request has a timeout, creates and result reads ride out an outage
for `api_retry_s` (k8s_client.KubeApi.retrying), and a rollout ends at its deadline (plus `deadline_grace_s`)
whatever the API does. A run resumed after a crash adopts the Jobs its dead predecessor left (same run label): its
first list finds them, and they are deleted, since their attempts are run again (their gateway tokens died with
that process) and would otherwise run to their deadline beside the new ones.

The `kubernetes` package (the `k8s` extra) is imported only when a controller is built.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_backend.rollout.base import ProcessResult, RolloutJob
from rl_backend.rollout.k8s_client import (
    KubeApi,
    KubernetesConfigError,
    KubernetesUnavailableError,
    api_message,
    check_not_service_ips,
    describe,
    load_client,
    transient,
)
from rl_backend.rollout.k8s_env import PodEnvError, UnreachableGatewayError, build_pod_env
from rl_backend.rollout.k8s_manifest import (
    ANNOTATION_MARKER,
    LABEL_RUN,
    ManifestError,
    deadline_seconds,
    job_name,
    policy_name,
    render_job,
    render_policy,
    run_selector,
)
from rl_backend.rollout.k8s_pods import PodInspector, stuck_reason
from rl_backend.rollout.k8s_results import RolloutResults
from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.k8s_status import StartProblem, job_outcome
from rl_backend.rollout.k8s_watch import JobWatcher, TokenBucket
from rl_backend.rollout.local import TAIL_BYTES

log = logging.getLogger(__name__)


@dataclass
class _Ending:
    job: dict[str, Any] | None  # the Job's final state; None when it vanished or agl gave up on it
    reason: str = ""
    overdue: bool = False
    stuck: bool = False  # its pod cannot start


@dataclass
class _Waiter:
    future: asyncio.Future[_Ending]
    confirmed_at: float | None = None  # when our create (or adoption) returned: absences are judged after it
    deleted_early: bool = False  # a DELETED event came before that: ours, or an older Job of the same name?


@dataclass
class _Counters:
    created: int = 0
    adopted: int = 0
    orphans_deleted: int = 0  # Jobs a crashed process of this run left behind
    create_times: list[float] = field(default_factory=list)  # when each creation got its rate-limit token


class KubernetesController:
    """A RolloutController running each rollout as a Kubernetes Job. One per run; `close()` it at the end.

    `pass_env`: names (or globs) of the agent's own variables to forward (agl.yaml's `agent.env` and env knobs);
    `deny_env`: names never to forward (the upstreams' `api_key_env`). `api_client` replaces the credentials
    lookup (tests point it at an in-memory API server)."""

    def __init__(
        self,
        spec: KubernetesSpec,
        *,
        run_id: str,
        base_dir: Path = Path("."),
        pass_env: Iterable[str] = (),
        deny_env: Iterable[str] = (),
        api_client: Any = None,
        tail_bytes: int = TAIL_BYTES,
        max_workers: int = 8,
        watch_read_slack_s: float = 30.0,
    ) -> None:
        try:
            import kubernetes  # noqa: F401 - only to fail early, with the remedy
        except ImportError:
            raise KubernetesConfigError("runner: kubernetes needs the Kubernetes client: pip install 'agl[k8s]'") from None
        self.spec, self.run_id, self.base_dir = spec, run_id, base_dir
        self.pass_env = [*spec.pass_env, *pass_env]
        self.deny_env = set(deny_env)
        self.tail_bytes = tail_bytes
        self.watch_read_slack_s = watch_read_slack_s
        self._own_client = api_client is None
        self.api = KubeApi(api_client if api_client is not None else load_client(spec, base_dir), spec.namespace,
                           max_workers, request_timeout_s=spec.request_timeout_s, api_retry_s=spec.api_retry_s,
                           backoff_max_s=spec.api_backoff_max_s)
        self.selector = run_selector(run_id)
        self.bucket = TokenBucket(spec.create_qps, spec.create_burst)
        self.counters = _Counters()
        self.watcher: JobWatcher | None = None
        self.pods: PodInspector | None = None
        self.results = RolloutResults(self.api, spec, tail_bytes)
        self._waiters: dict[str, _Waiter] = {}
        self._mine: set[str] = set()  # Jobs this process made or took over; others of the run are a dead one's
        self._orphans_checked = False
        self._cleanups: set[asyncio.Task[Any]] = set()
        self._start_lock: asyncio.Lock | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """After `close()`: a closed controller runs nothing more (its watch belonged to an event loop now gone)."""
        return self._closed

    async def __aenter__(self) -> KubernetesController:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the rollout -----------------------------------------------------------------------------------------------

    async def run(self, job: RolloutJob) -> ProcessResult:
        if self._closed:
            raise RuntimeError("this KubernetesController is closed")
        started = time.monotonic()
        name = job_name(self.run_id, job.rollout_id)
        try:
            # Rendering and schema validation take milliseconds of CPU: off the event loop, like the API calls.
            manifest = await self.api.call(self._manifest, job)
        except PodEnvError as exc:
            return self.results.without_job(started, str(exc))
        waiter = _Waiter(asyncio.get_running_loop().create_future())
        self._waiters[name] = waiter
        self._mine.add(name)
        try:
            await self._ensure_started()
            await self.bucket.acquire()
            self.counters.create_times.append(time.monotonic())
            current = await self._create(name, manifest)
            waiter.confirmed_at = time.monotonic()
            self._on_event("ADDED", current)
            if waiter.deleted_early:
                await self._check_exists(name, waiter)
            marker = ((current.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_MARKER, "")
            limit = deadline_seconds(job.timeout_s, self.spec) + self.spec.deadline_grace_s
            try:
                ending = await asyncio.wait_for(waiter.future, limit)
            except TimeoutError:
                reason = f"the cluster did not end Job {name} at its deadline; agl gave up after {limit:g} s"
                try:
                    await self.api.delete_job(name)
                except Exception as exc:  # noqa: BLE001 - the rollout is over either way; say what happened
                    reason += f" and could not delete it ({describe(exc)}); close() will retry"
                ending = _Ending(None, overdue=True, reason=reason)
            if ending.job is None and ending.stuck:
                self._delete_later(name)  # its pod will never start: the Job goes now, not at its deadline
            if ending.job is None:
                return self.results.without_job(started, ending.reason, timed_out=ending.overdue)
            return await self.results.collect(job, name, marker, ending.job, started)
        except asyncio.CancelledError:
            if not self._closed:  # once closed, close() has deleted every Job of the run
                # In the background: a cancelled rollout returns now, even when the API does not answer.
                self._delete_later(name)
            raise
        finally:
            self._waiters.pop(name, None)

    def _manifest(self, job: RolloutJob) -> dict[str, Any]:
        try:
            pod = build_pod_env(
                job.env, job.rollout_id, job.rollout_dir, gateway_url=self.spec.gateway_url,
                fixed_env=self.spec.env, pass_env=self.pass_env, deny_env=self.deny_env,
            )
            return render_job(
                self.spec, run_id=self.run_id, rollout_id=job.rollout_id, command=job.command,
                timeout_s=job.timeout_s, rollout_dir=job.rollout_dir, output_file=job.env.get("AGL_OUTPUT_FILE"),
                job_labels=job.labels, env=pod.env, files=pod.files, withheld=pod.withheld,
                marker=secrets.token_hex(8), base_dir=self.base_dir, tail_bytes=self.tail_bytes,
            )
        except (ManifestError, UnreachableGatewayError) as exc:
            raise KubernetesConfigError(str(exc)) from None

    async def _ensure_started(self) -> None:
        if self.watcher is not None:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self.watcher is not None:
                return
            if self.spec.network_policy is not None and self.spec.network_policy.enabled:
                try:
                    policy = render_policy(self.spec, self.run_id, self.base_dir)
                except ManifestError as exc:
                    raise KubernetesConfigError(str(exc)) from None
                await check_not_service_ips(self.api, policy)
                await self.api.retrying("creating the run's NetworkPolicy", lambda: self.api.apply_policy(policy))
            self.pods = PodInspector(self.api, self.selector, interval_s=self.spec.pod_check_s,
                                     grace_s=self.spec.unstartable_after_s, watched=self._watched,
                                     unschedulable_s=self.spec.unschedulable_after_s,
                                     on_stuck=self._on_stuck)
            self.pods.start()
            watcher = JobWatcher(
                self.api.batch, self.spec.namespace, self.selector, asyncio.get_running_loop(), self._on_event,
                self._on_list, watch_timeout_s=self.spec.watch_timeout_s, resync_s=self.spec.resync_s,
                read_slack_s=self.watch_read_slack_s, backoff_max_s=self.spec.api_backoff_max_s,
            )
            watcher.start()
            self.watcher = watcher

    async def _create(self, name: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the Job; a 409 adopts the existing one (a create retried after an answer that never came, or a
        rollout run again under the same id). Transient failures are retried through an outage."""
        from kubernetes.client.exceptions import ApiException

        namespace = self.spec.namespace

        async def attempt() -> dict[str, Any]:
            try:
                created = await self.api.json(self.api.batch.create_namespaced_job, namespace, manifest)
            except ApiException as exc:
                if exc.status == 409:
                    return await self._adopt(name)
                raise
            self.counters.created += 1
            return created

        try:
            return await self.api.retrying(f"creating Job {name}", attempt)
        except ApiException as exc:
            raise KubernetesConfigError(
                f"cannot create Job {name} in namespace {namespace}: {exc.status} {exc.reason}: {api_message(exc)}"
            ) from None

    async def _adopt(self, name: str) -> dict[str, Any]:
        existing = await self.api.retrying(
            f"reading Job {name}", lambda: self.api.json(self.api.batch.read_namespaced_job, name, self.spec.namespace))
        labels = (existing.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_RUN) != self.selector[LABEL_RUN]:
            raise KubernetesConfigError(f"Job {name} exists and belongs to another run ({labels.get(LABEL_RUN)})")
        self.counters.adopted += 1
        return existing

    # -- watch callbacks (on the event loop) -----------------------------------------------------------------------

    def _on_event(self, kind: str, job: dict[str, Any]) -> None:
        name = (job.get("metadata") or {}).get("name", "")
        waiter = self._waiters.get(name)
        if waiter is None or waiter.future.done():
            return
        if job_outcome(job) is not None:
            waiter.future.set_result(_Ending(job))
        elif kind == "DELETED" and waiter.confirmed_at is None:
            waiter.deleted_early = True
        elif kind == "DELETED":
            waiter.future.set_result(_Ending(None, reason=f"Job {name} was deleted before it finished"))

    async def _check_exists(self, name: str, waiter: _Waiter) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            await self.api.json(self.api.batch.read_namespaced_job, name, self.spec.namespace)
        except ApiException as exc:
            if exc.status == 404 and not waiter.future.done():
                waiter.future.set_result(_Ending(None, reason=f"Job {name} was deleted before it finished"))

    def _on_list(self, jobs: list[dict[str, Any]], started: float) -> None:
        if not self._orphans_checked:
            self._orphans_checked = True
            orphans = [n for job in jobs if (n := (job.get("metadata") or {}).get("name")) and n not in self._mine]
            for name in orphans:
                log.info("deleting Job %s, left by an earlier process of run %s", name, self.run_id)
                self._mine.add(name)
                self.counters.orphans_deleted += 1
                self._delete_later(name)
        present = set()
        for job in jobs:
            present.add((job.get("metadata") or {}).get("name"))
            self._on_event("MODIFIED", job)
        for name, waiter in self._waiters.items():
            if name in present or waiter.future.done() or waiter.confirmed_at is None:
                continue
            if waiter.confirmed_at < started:  # it existed before this list began, and the list lacks it
                waiter.future.set_result(_Ending(None, reason=f"Job {name} disappeared before it finished"))

    def _watched(self) -> set[str]:
        return {name for name, w in self._waiters.items() if w.confirmed_at is not None and not w.future.done()}

    def _on_stuck(self, name: str, pod: str, problem: StartProblem) -> None:
        waiter = self._waiters.get(name)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(_Ending(None, reason=stuck_reason(pod, problem), stuck=True))

    def _delete_later(self, name: str) -> None:
        """Delete a Job without waiting for it; close() waits for what is still pending."""

        async def delete() -> None:
            try:
                await self.api.delete_job(name)
            except Exception as exc:  # noqa: BLE001 - close() deletes by label again
                log.debug("could not delete Job %s: %s", name, exc)

        task = asyncio.get_running_loop().create_task(delete())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    # -- cleanup ---------------------------------------------------------------------------------------------------

    async def delete_run_jobs(self) -> int:
        """Delete every Job of this run (by its label), with their pods."""
        return await self.api.delete_jobs(self.selector)

    async def close(self) -> None:
        """Stop watching; delete the run's Jobs and NetworkPolicy. Safe to call twice. Bounded: with an API that
        does not answer it gives up after a few request timeouts and says so in the log (the Jobs' deadlines and
        TTL end them; `agl train stop` deletes a train's by label)."""
        if self._closed:
            return
        self._closed = True
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_result(_Ending(None, reason="the rollout controller was closed"))
        if self.pods is not None:
            await self.pods.stop()
        if self.watcher is not None:
            # A watch blocked on a silent server ends at its own read timeout: its thread is not waited for longer.
            await self.api.call(self.watcher.stop, min(5.0, self.spec.request_timeout_s))
        if self._cleanups:  # deletes started by cancelled rollouts: each bounded by the request timeout
            await asyncio.wait(list(self._cleanups), timeout=self.spec.request_timeout_s + 1)
        try:
            await self.delete_run_jobs()
            if self.spec.network_policy is not None and self.spec.network_policy.enabled:
                await self.api.delete_policy(policy_name(self.run_id))
        except Exception as exc:
            if not transient(exc):
                raise
            log.warning("could not delete the Jobs of run %s (%s): their deadlines and TTL end them", self.run_id,
                        describe(exc))
        finally:
            self.api.close(self._own_client)



__all__ = ["KubernetesConfigError", "KubernetesController", "KubernetesSpec", "KubernetesUnavailableError"]
