"""What a finished rollout left behind, read back as a ProcessResult: its pod, the container's exit code, and the
log, which carries the agent's stderr tail and its output file between the wrapper's markers (k8s_output). The
output file is written back to the local AGL_OUTPUT_FILE, where the grader finds it as with local processes.

Reads ride out an outage like every other call (KubeApi.retrying); what cannot be read is said in the rollout's
stderr, never taken for an empty result.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rl_backend.rollout.base import ProcessResult, RolloutJob
from rl_backend.rollout.k8s_client import KubeApi, describe
from rl_backend.rollout.k8s_manifest import CONTAINER
from rl_backend.rollout.k8s_output import LogReader, PodOutput
from rl_backend.rollout.k8s_spec import KubernetesSpec
from rl_backend.rollout.k8s_status import container_exit_code, job_outcome, newest_pod


class RolloutResults:
    def __init__(self, api: KubeApi, spec: KubernetesSpec, tail_bytes: int) -> None:
        self.api, self.spec, self.tail_bytes = api, spec, tail_bytes

    def without_job(self, started: float, reason: str, *, timed_out: bool = False) -> ProcessResult:
        """A rollout that left nothing to read: its Job vanished, never ended, or its pod could not start."""
        note = f"agl: {reason}\n"
        return ProcessResult(
            exit_code=None, timed_out=timed_out, duration_s=time.monotonic() - started, stdout_tail="",
            stderr_tail=note, stdout_bytes=0, stderr_bytes=len(note),
        )

    async def collect(self, job: RolloutJob, name: str, marker: str, final: dict[str, Any],
                      started: float) -> ProcessResult:
        """The result of Job `name`, whose final state is `final` (it has a Complete or Failed condition)."""
        outcome = job_outcome(final)
        assert outcome is not None
        notes: list[str] = []
        pod, out = await self._read_pod(name, marker, notes)
        code = container_exit_code(pod, CONTAINER) if pod is not None else None
        if out.output is not None and job.env.get("AGL_OUTPUT_FILE"):
            write_output(Path(job.env["AGL_OUTPUT_FILE"]), out.output)
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

        async def list_pods() -> dict[str, Any]:
            return await self.api.json(
                self.api.core.list_namespaced_pod, self.spec.namespace, label_selector=f"job-name={name}"
            )

        try:
            pod = newest_pod((await self.api.retrying(f"listing the pods of Job {name}", list_pods)).get("items")
                             or [], name)
        except (ApiException, HTTPError, OSError) as exc:
            notes.append(f"cannot list the pods of Job {name}: {describe(exc)}")
            return None, PodOutput()
        if pod is None:
            notes.append(f"Job {name} has no pod left to read its log from")
            return None, PodOutput()
        limit = (self.spec.max_output_bytes + self.tail_bytes) * 2 + 65536
        pod_name = pod["metadata"]["name"]

        async def read() -> LogReader:
            reader = LogReader(marker, self.tail_bytes, limit)  # a fresh one per try: a retry reads from the start
            await self.api.call(self.api.stream_log, pod_name, CONTAINER, reader.feed)
            return reader

        try:
            result = (await self.api.retrying(f"reading the log of pod {pod_name}", read)).result()
        except (ApiException, HTTPError, OSError) as exc:
            notes.append(f"cannot read the log of pod {pod_name}: {describe(exc)}")
            result = LogReader(marker, self.tail_bytes, limit).result()
        if marker and not result.complete and not notes:
            notes.append(f"the log of pod {pod_name} has no complete output block (was the agent killed?)")
        return pod, result


def write_output(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    partial.write_bytes(data)
    partial.replace(path)
