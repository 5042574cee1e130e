"""The trainer's step metrics, as `agl train --on kubernetes` follows them: one row (a JSON object with a `step`
key) per step, printed as a table row, or as one JSON object per line with `--json`.

The rows come from the train's metrics ConfigMap (rl_backend/provision/metric_rows.py), which the trainer patches
after each step: it survives the kubelet's log rotation (10 MiB, then only the newest file is served) and a
restarted container. agl polls it and prints each step it has not printed yet, in step order, once.

A train whose plan an older agl rendered has no such ConfigMap: then the rows come from the log of the pod that
carries the driver (the Job's pod, or a RayJob's submitter, which relays the driver's output), as before: every line
that is a JSON object with a `step` key. agl reconnects until the trainer is over and goes on after the last line it
read, found by the time the runtime stamped on it (never by counting lines, which a rotation would break); rows
rotated out while agl was not connected are named, not recovered.
"""
from __future__ import annotations

import datetime
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from rl_backend.provision.metric_rows import parse_rows
from rl_backend.provision.options import LABEL_COMPONENT, Names
from rl_backend.provision.plan import Topology
from rl_backend.provision.readiness import trainer_finished
from rl_backend.provision.resources import Resources, fatal

MAX_COLUMNS = 8
COLUMN_WIDTH = 12


def metric_row(line: str) -> dict[str, Any] | None:
    """The row a log line carries, or None. Tolerates a prefix before the object (a logger's, or Ray's)."""
    text = line.strip()
    start = text.find("{")
    if start < 0 or not text.endswith("}"):
        return None
    try:
        value = json.loads(text[start:])
    except ValueError:
        return None
    return value if isinstance(value, dict) and "step" in value else None


_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def log_time(stamped: str) -> tuple[tuple[int, int] | None, str]:
    """((seconds since the epoch, nanoseconds), the line) from a line read with `timestamps=true`, or (None, the
    line as it came). RFC 3339 with nanoseconds drops the fraction's trailing zeros, so its text does not sort."""
    head, _, line = stamped.partition(" ")
    match = _STAMP.fullmatch(head)
    if match is None:
        return None, stamped
    seconds, fraction, zone = match.groups()
    when = datetime.datetime.fromisoformat(seconds + ("+00:00" if zone == "Z" else zone))
    return (int(when.timestamp()), int((fraction or "0").ljust(9, "0"))), line


def last_metrics(log_text: str) -> dict[str, Any] | None:
    rows = [row for line in log_text.splitlines() if (row := metric_row(line)) is not None]
    return rows[-1] if rows else None


def _cell(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}" if math.isfinite(value) else str(value)
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, separators=(",", ":"))
    else:
        text = str(value)
    return text if len(text) <= COLUMN_WIDTH else text[: COLUMN_WIDTH - 1] + "…"


@dataclass
class MetricsPrinter:
    """Rows to stdout: a header from the first row's keys (`step` first), then aligned rows; or JSON lines."""

    out: Console
    json_output: bool = False
    columns: list[str] = field(default_factory=list)
    last: dict[str, Any] | None = None
    count: int = 0

    def row(self, row: dict[str, Any]) -> None:
        self.last, self.count = row, self.count + 1
        if self.json_output:
            self.out.print(json.dumps(row, default=str), markup=False, highlight=False, soft_wrap=True)
            return
        if not self.columns:
            self.columns = ["step", *[k for k in row if k != "step"]][:MAX_COLUMNS]
            self.out.print("  ".join(f"{c[:COLUMN_WIDTH]:>{COLUMN_WIDTH}}" for c in self.columns), markup=False,
                           highlight=False)
        cells = [_cell(row[c]) if c in row else "—" for c in self.columns]
        self.out.print("  ".join(f"{c:>{COLUMN_WIDTH}}" for c in cells), markup=False, highlight=False)


def log_source(res: Resources, names: Names, topology: Topology) -> tuple[str, str, int] | None:
    """(pod, container, restarts) of the newest pod relaying the trainer's output, or None while there is none."""
    component, container = ("trainer", "trainer") if topology.kind == "job" else ("trainer-driver", "ray-job-submitter")
    pods = [p for p in res.objects("Pod", names.selector())
            if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_COMPONENT) == component]
    if not pods:
        return None
    pod = pods[-1]
    restarts = sum(int(cs.get("restartCount") or 0) for cs in (pod.get("status") or {}).get("containerStatuses") or [])
    return pod["metadata"]["name"], container, restarts


def follow(res: Resources, names: Names, topology: Topology, printer: MetricsPrinter, *, poll_s: float = 2.0,
           sleep: Callable[[float], None] = time.sleep, note: Callable[[str], None] = lambda _: None,
           ) -> tuple[str, str]:
    """Print rows until the trainer is over; return ('succeeded' | 'failed', detail). Rows from the metrics
    ConfigMap where the train has one, else from the log (see the module doc); what could not be read is said
    through `note`."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    kind = "Job" if topology.kind == "job" else "RayJob"
    from_log = LogRows(res, names, topology, printer, note)
    from_store = StoredRows(printer, note)
    while True:
        try:
            trainer = res.read(kind, names.trainer)
            if trainer is None:
                return "failed", f"{kind} {names.trainer} was deleted"
            # Whether it is over is read before the rows: the rows of its last step were written before it ended.
            finished = trainer_finished(trainer)
            stored = res.read("ConfigMap", names.metrics)
            if stored is not None:
                from_store.read(stored)
            elif not from_store.seen:  # (once seen, a ConfigMap gone means `stop`: the log would repeat rows)
                from_log.read()
            if finished is None and stored is None:
                finished = trainer_finished(res.read(kind, names.trainer) or {"kind": kind})
            if finished is not None:
                return finished
        except (ApiException, HTTPError, OSError) as exc:
            if fatal(exc):
                raise
            # a dropped stream or a blip of the API: read again after a pause
        sleep(poll_s)


@dataclass
class StoredRows:
    """The ConfigMap's rows not printed yet: each step once, in step order (a step trained again after a resume
    was printed already: the row it replaced)."""

    printer: MetricsPrinter
    note: Callable[[str], None]
    printed_up_to: int | None = None
    said_dropped: bool = False
    seen: bool = False

    def read(self, config_map: dict[str, Any]) -> None:
        self.seen = True
        rows, dropped = parse_rows(config_map)
        new = [r for r in rows if self.printed_up_to is None or r["step"] > self.printed_up_to]
        gap = bool(new) and (self.printed_up_to is None or new[0]["step"] > self.printed_up_to + 1)
        if dropped and gap and not self.said_dropped:
            self.said_dropped = True
            self.note(f"the {dropped} oldest step rows no longer fit in ConfigMap {config_map['metadata']['name']} "
                      "(1 MiB) and are not printed; every step is in the run's store on the checkpoint volume (and "
                      "its train_metrics.jsonl once the train ends)")
        for row in new:
            self.printed_up_to = row["step"]
            self.printer.row(row)


@dataclass
class LogRows:
    """The rows of the trainer's log, for a train without a metrics ConfigMap (see the module doc)."""

    res: Resources
    names: Names
    topology: Topology
    printer: MetricsPrinter
    note: Callable[[str], None]
    read_up_to: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # per container instance
    last_step: dict[tuple[str, int], int] = field(default_factory=dict)

    def read(self) -> None:
        source = log_source(self.res, self.names, self.topology)
        if source is None:
            return
        pod, container, restarts = source
        for stamped in self.res.follow_log(pod, container, timestamps=True):
            stamp, line = log_time(stamped)
            if stamp is None or stamp <= self.read_up_to.get((pod, restarts), (0, -1)):
                continue
            self.read_up_to[(pod, restarts)] = stamp
            if (row := metric_row(line)) is None:
                continue
            step, before = row.get("step"), self.last_step.get((pod, restarts))
            if isinstance(step, int) and isinstance(before, int) and step > before + 1:
                missed = f"{before + 1}" if step == before + 2 else f"{before + 1}-{step - 1}"
                self.note(f"the rows of step(s) {missed} were rotated out of the trainer's log before agl read "
                          "them; every step is in the run's store on the checkpoint volume (and its "
                          "train_metrics.jsonl once the train ends)")
            if isinstance(step, int):
                self.last_step[(pod, restarts)] = step
            self.printer.row(row)
