"""The trainer's step rows in a ConfigMap of the train: written by the trainer, read by `agl train` and `status`.

A container's log is no record: the kubelet rotates it at 10 MiB and serves only the newest file, and a restarted
container's log starts empty. So the trainer (the process that prints the `{"step": ...}` lines, in the container
that holds the train's API token) also keeps every row in the ConfigMap the plan pre-created for it, named by
METRICS_ENV: after each step it sends the whole `rows.jsonl` value as one JSON merge patch (the Role grants `get`
and `patch` on that one ConfigMap, nothing else). A ConfigMap holds at most 1 MiB: the newest rows that fit are kept
and DROPPED_KEY counts the older ones left out (every step stays in the run's store on the checkpoint volume).

The writer never stops the train: a failed patch (an API blip, a token being rotated) is said once on stderr and
the rows go out with the next step's patch. A restarted trainer reads the ConfigMap before its first patch, so the
rows of the previous container stay; a step it trains again (resumed from an earlier checkpoint) replaces the
row it had.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

METRICS_ENV = "AGL_METRICS_CONFIGMAP"  # set by the plan (rl_backend/provision/plan.py) on the controller's container
NAMESPACE_ENV = "AGL_NAMESPACE"
ROWS_KEY = "rows.jsonl"
DROPPED_KEY = "dropped"
# Under the API server's 1 MiB object limit, with room for the metadata and the other key.
MAX_ROWS_BYTES = 900 * 1024
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def parse_rows(config_map: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """(rows in step order, how many older rows were dropped) from the ConfigMap as read from the API."""
    data = config_map.get("data") or {}
    rows = []
    for line in str(data.get(ROWS_KEY) or "").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # never written by agl; not a reason to lose the others
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    try:
        dropped = int(data.get(DROPPED_KEY) or 0)
    except ValueError:
        dropped = 0
    return rows, dropped


def pack(lines: list[str], dropped: int, max_bytes: int = MAX_ROWS_BYTES) -> tuple[list[str], int]:
    """The newest lines whose text fits in `max_bytes`, and the dropped count grown by the ones left out."""
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        size += len(line.encode()) + 1
        if size > max_bytes:
            break
        kept.append(line)
    kept.reverse()
    return kept, dropped + len(lines) - len(kept)


class RowWriter:
    """Keeps the step rows in one ConfigMap; `append` after each step, `close` at the end (see the module doc)."""

    def __init__(self, api_client: Any, namespace: str, name: str, *, max_bytes: int = MAX_ROWS_BYTES,
                 log: Callable[[str], None] = lambda _: None, request_timeout_s: float = 10.0) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.api_client, self.namespace, self.name = api_client, namespace, name
        self.max_bytes, self.log, self.timeout = max_bytes, log, request_timeout_s
        self.lines: list[str] | None = None  # None until the ConfigMap's rows were read (a restart keeps them)
        self.dropped = 0
        self.pending: list[dict[str, Any]] = []
        self.failing = False
        self.patches = 0  # the patches that went through, for diagnostics and tests

    def append(self, row: dict[str, Any]) -> bool:
        """Queue the row and send every queued one; False (said once per streak) when the API did not take them."""
        self.pending.append(row)
        return self.flush()

    def flush(self) -> bool:
        if not self.pending:
            return True
        try:
            if self.lines is None:
                self._load()
            lines, dropped = self._merged()
            self.core.patch_namespaced_config_map(
                self.name, self.namespace, {"data": {ROWS_KEY: "".join(f"{line}\n" for line in lines),
                                                     DROPPED_KEY: str(dropped)}},
                _content_type="application/merge-patch+json", _request_timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - whatever the API or the network does, the train goes on
            if not self.failing:
                self.log(f"could not write the step rows to ConfigMap {self.name} ({_reason(exc)}); retrying at the "
                         "next step (the rows are in the log and the run's store meanwhile)")
            self.failing = True
            return False
        if self.failing:
            self.log(f"the step rows are written to ConfigMap {self.name} again")
        self.lines, self.dropped, self.pending, self.failing = lines, dropped, [], False
        self.patches += 1
        return True

    def close(self) -> None:
        self.flush()

    def _load(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            current = self.api_client.sanitize_for_serialization(self.core.read_namespaced_config_map(
                self.name, self.namespace, _request_timeout=self.timeout))
        except ApiException as exc:
            if exc.status != 404:
                raise
            current = {}  # the patch below then fails (404) and is retried: the plan creates it
        rows, self.dropped = parse_rows(current)
        self.lines = [json.dumps(r, default=str, separators=(",", ":")) for r in rows]

    def _merged(self) -> tuple[list[str], int]:
        assert self.lines is not None
        lines = list(self.lines)
        for row in self.pending:
            step = row.get("step")
            if isinstance(step, int):  # a step trained again after a resume replaces its row and any later one
                lines = [line for line in lines if _step(line) < step]
            lines.append(json.dumps(row, default=str, separators=(",", ":")))
        return pack(lines, self.dropped, self.max_bytes)


def _step(line: str) -> int:
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return -1
    return step if isinstance(step, int) else -1


def _reason(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    return f"{status} {getattr(exc, 'reason', '')}".strip() if status else (str(exc) or type(exc).__name__)


def writer_from_env(log: Callable[[str], None]) -> RowWriter | None:
    """The writer the plan asked for (METRICS_ENV set, in a pod), or None: locally nothing is written."""
    name = os.environ.get(METRICS_ENV)
    if not name:
        return None
    try:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        namespace = os.environ.get(NAMESPACE_ENV) or NAMESPACE_FILE.read_text().strip()
        return RowWriter(client.ApiClient(configuration), namespace, name, log=log)
    except Exception as exc:  # noqa: BLE001 - no credentials here: the rows stay in the log, the train goes on
        log(f"{METRICS_ENV} is set but the Kubernetes API is not reachable from here ({exc}); the step rows go to "
            "the log only")
        return None
