"""Kubernetes rollout controller: each rollout is one Job, watched to its end, its results read from the pod log.

`run(job)` renders the Job (templates/k8s/job.yaml.j2 or the user's own), validates it offline, waits for a token
of the creation rate limit, and creates it under a name derived from (run, rollout): a repeated create gets 409
and adopts the existing Job. One shared list+watch (k8s_watch.JobWatcher) reports the Job's states; the rollout
ends on the Job's Complete or Failed condition, on its disappearance, or — if the cluster never ends it —
`deadline_grace_s` after its activeDeadlineSeconds, when agl deletes it itself. Then the pod's exit code and log
are read: the wrapper script prints the output file at the end of the log (k8s_output), and agl writes it to the
local AGL_OUTPUT_FILE, where the grader finds it as with local processes.

Mapping to ProcessResult: Complete → exit 0; Failed/DeadlineExceeded → timed_out; other Failed → the container's
exit code (else the wrapper's, else None with the reason as the last stderr line); vanished → None and a reason.
Cancelling `run` deletes its Job; `close()` deletes every Job (and the NetworkPolicy) carrying the run's label.

The `kubernetes` package (the `k8s` extra) is imported only when a controller is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_backend.rollout.base import ProcessResult, RolloutJob
from rl_backend.rollout.k8s_client import KubeApi, KubernetesConfigError, api_message, load_client
from rl_backend.rollout.k8s_env import PodEnvError, UnreachableGatewayError, build_pod_env
from rl_backend.rollout.k8s_manifest import (
    ANNOTATION_MARKER,
    CONTAINER,
    LABEL_RUN,
    ManifestError,
    deadline_seconds,
    job_name,
    policy_name,
    render_job,
    render_policy,
    run_selector,
)
from rl_backend.rollout.k8s_output import LogReader, PodOutput
from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.k8s_status import container_exit_code, job_outcome, newest_pod
from rl_backend.rollout.k8s_watch import JobWatcher, TokenBucket
from rl_backend.rollout.local import TAIL_BYTES

RETRYABLE = {429, 500, 502, 503, 504}
CREATE_ATTEMPTS = 5


@dataclass
class _Ending:
    job: dict[str, Any] | None  # the Job's final state; None when it vanished or agl gave up on it
    reason: str = ""
    overdue: bool = False


@dataclass
class _Waiter:
    future: asyncio.Future[_Ending]
    confirmed_at: float | None = None  # when our create (or adoption) returned: absences are judged after it
    deleted_early: bool = False  # a DELETED event came before that: ours, or an older Job of the same name?


@dataclass
class _Counters:
    created: int = 0
    adopted: int = 0
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
                           max_workers)
        self.selector = run_selector(run_id)
        self.bucket = TokenBucket(spec.create_qps, spec.create_burst)
        self.counters = _Counters()
        self.watcher: JobWatcher | None = None
        self._waiters: dict[str, _Waiter] = {}
        self._start_lock: asyncio.Lock | None = None
        self._closed = False

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
            return self._result_without_job(started, str(exc))
        waiter = _Waiter(asyncio.get_running_loop().create_future())
        self._waiters[name] = waiter
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
                    reason += f" and could not delete it ({exc}); close() will retry"
                ending = _Ending(None, overdue=True, reason=reason)
            return await self._result(job, name, marker, ending, started)
        except asyncio.CancelledError:
            if not self._closed:  # once closed, close() has deleted every Job of the run
                # A failed delete must not replace the cancellation; close() deletes by label again.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.api.delete_job(name))
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
                await self.api.apply_policy(policy)
            watcher = JobWatcher(
                self.api.batch, self.spec.namespace, self.selector, asyncio.get_running_loop(), self._on_event,
                self._on_list, watch_timeout_s=self.spec.watch_timeout_s, resync_s=self.spec.resync_s,
                read_slack_s=self.watch_read_slack_s,
            )
            watcher.start()
            self.watcher = watcher

    async def _create(self, name: str, manifest: dict[str, Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        namespace = self.spec.namespace
        for attempt in range(CREATE_ATTEMPTS):
            try:
                created = await self.api.json(self.api.batch.create_namespaced_job, namespace, manifest)
                self.counters.created += 1
                return created
            except ApiException as exc:
                if exc.status == 409:
                    return await self._adopt(name)
                if exc.status not in RETRYABLE or attempt == CREATE_ATTEMPTS - 1:
                    raise KubernetesConfigError(
                        f"cannot create Job {name} in namespace {namespace}: {exc.status} {exc.reason}: "
                        f"{api_message(exc)}"
                    ) from None
            except (HTTPError, OSError) as exc:
                if attempt == CREATE_ATTEMPTS - 1:
                    raise KubernetesConfigError(f"cannot reach the Kubernetes API: {exc}") from None
            await asyncio.sleep(min(8.0, 0.5 * 2**attempt))
        raise AssertionError("unreachable")

    async def _adopt(self, name: str) -> dict[str, Any]:
        existing = await self.api.json(self.api.batch.read_namespaced_job, name, self.spec.namespace)
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
        present = set()
        for job in jobs:
            present.add((job.get("metadata") or {}).get("name"))
            self._on_event("MODIFIED", job)
        for name, waiter in self._waiters.items():
            if name in present or waiter.future.done() or waiter.confirmed_at is None:
                continue
            if waiter.confirmed_at < started:  # it existed before this list began, and the list lacks it
                waiter.future.set_result(_Ending(None, reason=f"Job {name} disappeared before it finished"))

    # -- results ---------------------------------------------------------------------------------------------------

    def _result_without_job(self, started: float, reason: str, *, timed_out: bool = False) -> ProcessResult:
        note = f"agl: {reason}\n"
        return ProcessResult(
            exit_code=None, timed_out=timed_out, duration_s=time.monotonic() - started, stdout_tail="",
            stderr_tail=note, stdout_bytes=0, stderr_bytes=len(note),
        )

    async def _result(
        self, job: RolloutJob, name: str, marker: str, ending: _Ending, started: float
    ) -> ProcessResult:
        if ending.job is None:
            return self._result_without_job(started, ending.reason, timed_out=ending.overdue)
        outcome = job_outcome(ending.job)
        assert outcome is not None
        notes: list[str] = []
        pod, out = await self._read_pod(name, marker, notes)
        code = container_exit_code(pod, CONTAINER) if pod is not None else None
        if out.output is not None and job.env.get("AGL_OUTPUT_FILE"):
            _write_output(Path(job.env["AGL_OUTPUT_FILE"]), out.output)
            if out.output_size is not None and out.output_size > len(out.output):
                notes.append(f"the output file has {out.output_size} bytes; only the first {len(out.output)} came "
                             "back (kubernetes.max_output_bytes)")
        timed_out = outcome.kind == "deadline"
        exit_code: int | None = None
        if outcome.kind == "succeeded":
            exit_code = 0
        elif not timed_out:
            exit_code = code if code is not None else out.exit_code
            if not exit_code:  # unknown, or a failed Job whose container claims success: say why it failed
                exit_code = None
                notes.append(f"Job {name} failed: {outcome.detail}")
        notes.extend(out.problems)
        stderr = out.stderr if out.stderr is not None else ""
        stderr_bytes = out.stderr_size if out.stderr_size is not None else len(stderr.encode())
        if notes:
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + "".join(f"agl: {n}\n" for n in notes)
        return ProcessResult(
            exit_code=exit_code, timed_out=timed_out, duration_s=time.monotonic() - started,
            stdout_tail=out.log_tail, stderr_tail=stderr, stdout_bytes=out.log_bytes, stderr_bytes=stderr_bytes,
        )

    async def _read_pod(self, name: str, marker: str, notes: list[str]) -> tuple[dict[str, Any] | None, PodOutput]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            pods = await self.api.json(
                self.api.core.list_namespaced_pod, self.spec.namespace, label_selector=f"job-name={name}"
            )
            pod = newest_pod(pods.get("items") or [], name)
        except (ApiException, HTTPError, OSError) as exc:
            notes.append(f"cannot list the pods of Job {name}: {exc}")
            return None, PodOutput()
        if pod is None:
            notes.append(f"Job {name} has no pod left to read its log from")
            return None, PodOutput()
        reader = LogReader(marker, self.tail_bytes, (self.spec.max_output_bytes + self.tail_bytes) * 2 + 65536)
        pod_name = pod["metadata"]["name"]
        try:
            await self.api.call(self.api.stream_log, pod_name, CONTAINER, reader.feed)
        except (ApiException, HTTPError, OSError) as exc:
            notes.append(f"cannot read the log of pod {pod_name}: {exc}")
        result = reader.result()
        if marker and not result.complete and not notes:
            notes.append(f"the log of pod {pod_name} has no complete output block (was the agent killed?)")
        return pod, result

    # -- cleanup ---------------------------------------------------------------------------------------------------

    async def delete_run_jobs(self) -> int:
        """Delete every Job of this run (by its label), with their pods."""
        return await self.api.delete_jobs(self.selector)

    async def close(self) -> None:
        """Stop watching; delete the run's Jobs and NetworkPolicy. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for waiter in self._waiters.values():
            if not waiter.future.done():
                waiter.future.set_result(_Ending(None, reason="the rollout controller was closed"))
        if self.watcher is not None:
            await self.api.call(self.watcher.stop)
        try:
            await self.delete_run_jobs()
            if self.spec.network_policy is not None and self.spec.network_policy.enabled:
                await self.api.delete_policy(policy_name(self.run_id))
        finally:
            self.api.close(self._own_client)


def _write_output(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    partial.write_bytes(data)
    partial.replace(path)


__all__ = ["KubernetesConfigError", "KubernetesController", "KubernetesSpec"]
