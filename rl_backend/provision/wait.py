"""Waiting for a train to come up, shown as it happens on stderr, and saying why when it does not.

Polling (every `poll_s`), not watching: three objects and a few pods, read once a second or two, cost the API
server nothing, and a poll survives dropped connections and servers that ignore label selectors alike. On a
terminal the checks are a live table; elsewhere each change is one line. A failure is explained with the failing
object's Warning events and, for a container that exited or keeps crashing, its last log lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rl_backend.provision.options import LABEL_COMPONENT, Names, ProvisionError
from rl_backend.provision.plan import Topology
from rl_backend.provision.readiness import (
    WITH_LOGS,
    Check,
    PodProblem,
    deployment_check,
    endpoints_check,
    trainer_check,
)
from rl_backend.provision.resources import Resources, fatal

LOG_LINES = 20
EVENTS_SHOWN = 5
_SYMBOL = {"ready": "[green]✓[/]", "waiting": "[yellow]…[/]", "failed": "[red]✗[/]"}
HINTS = {
    "ImagePullBackOff": "check the image name and tag (--image, --gateway-image) and that the cluster may pull it "
                        "(kubernetes.image_pull_secrets in agl.yaml)",
    "ErrImagePull": "check the image name and tag (--image, --gateway-image) and registry access",
    "InvalidImageName": "the image reference is malformed: check --image / --gateway-image",
    "CreateContainerConfigError": "a Secret or key the pod reads is missing: create it (kubectl create secret generic "
                                  "agl-upstream-keys --from-literal=OPENAI_API_KEY=… -n NAMESPACE) or map it with "
                                  "--key-secret ENV=SECRET:KEY",
    "CrashLoopBackOff": "the container keeps exiting; its last log lines are above",
    "Unschedulable": "no node offers what the pod requests (GPUs, CPU, memory): lower --gpus or add nodes",
}


def trainer_kind(topology: Topology) -> str:
    return "Job" if topology.kind == "job" else "RayJob"


def gather(res: Resources, names: Names, topology: Topology) -> list[Check]:
    """Read the train's objects once and judge them."""
    pods = res.objects("Pod", names.selector())
    by_component: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        component = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_COMPONENT, "")
        by_component.setdefault(component, []).append(pod)
    slices = res.objects("EndpointSlice", {"kubernetes.io/service-name": names.gateway})
    kind = trainer_kind(topology)
    trainer_pods = by_component.get("trainer", []) + by_component.get("trainer-worker", [])
    return [
        deployment_check(res.read("Deployment", names.gateway), by_component.get("gateway", []), names.gateway),
        endpoints_check(names.gateway, slices),
        trainer_check(res.read(kind, names.trainer), trainer_pods, name=names.trainer, kind=kind,
                      nodes=topology.nodes if topology.kind == "rayjob" else 1),
    ]


class Display:
    """The checks on stderr: a live table on a terminal, one line per change otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self.shown: dict[str, tuple[str, str]] = {}

    def __enter__(self) -> Display:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.live is not None:
            self.live.stop()

    def show(self, checks: list[Check], note: str = "") -> None:
        if self.live is not None:
            table = Table(show_header=False, box=None, pad_edge=False)
            for check in checks:
                # Text, not markup: details quote the cluster (image names, messages) and may hold brackets.
                table.add_row(_SYMBOL[check.state()], Text(check.label), Text(check.failure or check.detail))
            if note:
                table.add_row("", Text(note, style="dim"), "")
            self.live.update(table)
            return
        for check in checks:
            now = (check.state(), check.failure or check.detail)
            if self.shown.get(check.key) != now:
                self.shown[check.key] = now
                self.console.print(f"{now[0]:>7}  {check.label}: {now[1]}", markup=False, highlight=False)


@dataclass
class Waiter:
    res: Resources
    names: Names
    topology: Topology
    console: Console
    timeout_s: float = 1800.0
    poll_s: float = 2.0
    sleep: Callable[[float], None] = time.sleep

    def wait(self) -> list[Check]:
        """Return once every check is ready; raise ProvisionError (explained) on a failure or at the timeout."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        deadline = time.monotonic() + self.timeout_s
        checks: list[Check] = []
        with Display(self.console) as display:
            while True:
                note = ""
                try:
                    checks = gather(self.res, self.names, self.topology)
                    self._autoscaler_verdict(checks)
                except (ApiException, HTTPError, OSError) as exc:  # a blip of the API: keep polling to the deadline
                    if fatal(exc):
                        raise
                    note = f"cannot read the train's state ({getattr(exc, 'status', None) or exc}); retrying"
                display.show(checks, note)
                failed = next((c for c in checks if c.failure), None)
                if failed is not None:
                    raise ProvisionError(self.explain(failed), hint=_hint(failed))
                if checks and all(c.ready for c in checks):
                    return checks
                if time.monotonic() > deadline:
                    waiting = [c for c in checks if not c.ready] or checks
                    text = "; ".join(f"{c.label}: {c.detail}" for c in waiting) or note
                    first = waiting[0] if waiting else None
                    raise ProvisionError(
                        f"the train was not ready after {self.timeout_s:g} s — still waiting on {text}"
                        + (self._events(first) if first else ""),
                        hint=(_hint(first) if first else None) or "raise --timeout, or look at `agl train status`")
                self.sleep(self.poll_s)

    def _autoscaler_verdict(self, checks: list[Check]) -> None:
        """Unschedulable is a wait, unless the cluster autoscaler has said a new node would not help either."""
        for check in checks:
            for problem in check.problems:
                if problem.reason != "Unschedulable" or check.failure:
                    continue
                for event in self.res.events_for({problem.pod}):
                    if event.get("reason") == "NotTriggerScaleUp":
                        check.failure = f"{problem.text()} (cluster autoscaler: {event.get('message', '')})"

    def explain(self, check: Check) -> str:
        lines = [f"{check.label} failed: {check.failure}"]
        for problem in check.problems:
            if problem.fatal and (problem.reason in WITH_LOGS or problem.reason in ("Error", "OOMKilled")):
                tail = self._log_tail(problem)
                if tail:
                    lines.append(f"last log lines of {problem.pod}:")
                    lines += [f"  | {line}" for line in tail]
                break
        return "\n".join(lines) + self._events(check)

    def _log_tail(self, problem: PodProblem) -> list[str]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            # The crashed run's log is the previous container's; a pod that failed outright has only the current one.
            text = self.res.pod_log(problem.pod, problem.container, tail_lines=LOG_LINES, previous=True)
            text = text or self.res.pod_log(problem.pod, problem.container, tail_lines=LOG_LINES)
        except (ApiException, HTTPError, OSError):
            return []
        return text.rstrip("\n").splitlines()[-LOG_LINES:]

    def _events(self, check: Check) -> str:
        names = set(check.objects) | {p.pod for p in check.problems}
        warnings = [e for e in self.res.events_for(names) if e.get("type") == "Warning"]
        seen: list[str] = []
        for event in reversed(warnings):
            text = f"{(event.get('involvedObject') or {}).get('name')}: {event.get('reason')}: {event.get('message')}"
            if text not in seen:
                seen.append(text)
        if not seen:
            return ""
        return "\nevents:\n" + "\n".join(f"  {t}" for t in reversed(seen[:EVENTS_SHOWN]))


def _hint(check: Check) -> str | None:
    for problem in check.problems:
        if problem.reason in HINTS:
            return HINTS[problem.reason]
    return None
